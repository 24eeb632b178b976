"""``overnight bench commit``: checkpoint commit latency against LangGraph and the fsync floor.

Three writers, interleaved round-robin on the same disk so that disk noise hits all alike, each
committing the same ~``state_kb`` KB state ``n`` times (every commit appends a 512-byte message and
drops the oldest, so the state keeps its size but changes each time):

* **overnight** -- the full write path of one checkpoint: encode the user state (canonical JSON),
  stage the state blob (SHA-256, dedup lookup, zstd), build, digest and commit the record with the
  ref CAS in one SQLite transaction (WAL, ``synchronous=FULL``);
* **LangGraph** -- ``SqliteSaver.put`` (langgraph-checkpoint-sqlite; its own defaults: WAL, and
  SQLite's default ``synchronous=FULL``), timing serialization and the insert;
* **floor** -- ``os.write`` of the same state bytes plus ``os.fsync`` on an open file: no durable
  checkpointer can commit faster on this disk.

Latencies are in milliseconds; ratios are against LangGraph's and the floor's medians.
"""

from __future__ import annotations

import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.codec.canonical import dumps, to_tree
from overnight.store.sqlite import SQLiteStore
from overnight.verify.chain import ChainWriter
from overnight.verify.records import FORMAT_VERSION, event


@dataclass
class Series:
    """Latency samples of one writer (ms) and the bytes it left on disk."""

    name: str
    samples_ms: list[float] = field(default_factory=list)
    stored_bytes: int = 0

    def pct(self, p: float) -> float:
        xs = sorted(self.samples_ms)
        return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms)


@dataclass
class CommitBench:
    """Result of :func:`run_commit_bench`; :meth:`markdown` renders the table."""

    n: int
    state_bytes: int
    directory: str
    series: list[Series]

    def markdown(self) -> str:
        lg = next(s for s in self.series if s.name.startswith("LangGraph"))
        floor = next(s for s in self.series if s.name.startswith("floor"))
        lines = [
            f"commit latency, {self.n} commits each, state {self.state_bytes / 1024:.1f} KB, disk {self.directory}",
            "",
            "| writer | median ms | p99 ms | mean ms | median vs LangGraph | median vs floor | stored |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for s in self.series:
            lines.append(
                f"| {s.name} | {s.median:.3f} | {s.pct(99):.3f} | {statistics.fmean(s.samples_ms):.3f} | "
                f"{s.median / lg.median:.2f}x | {s.median / floor.median:.2f}x | {s.stored_bytes / 1024:.0f} KB |"
            )
        return "\n".join(lines)


_WORDS = ("checkpoint resume session context budget summary artifact module section report step agent model "
          "token drift fingerprint branch chain verify digest store commit write read parse extract function "
          "class method signature docstring package version environment input output result error retry").split()


def message_text(rng: random.Random, size: int) -> str:
    """Pseudo-random prose of about ``size`` bytes (compresses like text, ~3x, not like a repeat)."""
    words: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(_WORDS) + rng.choice(("", "", "", ",", ".", "s", "ed")) + (str(rng.randrange(100)) if rng.random() < 0.1 else "")
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:size]


def _messages(state_bytes: int, rng: random.Random) -> list[dict[str, Any]]:
    count = max(1, state_bytes // 560)
    return [{"role": "user" if i % 2 else "assistant", "content": message_text(rng, 512)} for i in range(count)]


def run_commit_bench(n: int = 300, state_kb: float = 10.0, directory: Path | None = None) -> CommitBench:
    """Run the benchmark; see the module docstring.

    Raises:
        ImportError: langgraph-checkpoint-sqlite is not installed (``pip install 'overnight[bench]'``).
    """
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-", dir=base) as tmp:
        tmpdir = Path(tmp)
        rng = random.Random(7)
        messages = _messages(int(state_kb * 1024), rng)
        ours, theirs, floor = Series("overnight"), Series("LangGraph SqliteSaver.put"), Series("floor: write+fsync")

        store = SQLiteStore(tmpdir / "overnight.db")
        chain = ChainWriter(store, "bench", "main", key=None, session_id=uuid.uuid4().hex, session_n=1)
        conn = sqlite3.connect(str(tmpdir / "langgraph.db"), check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        config: dict[str, Any] = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        fd = os.open(tmpdir / "floor.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def state_doc(data_tree: Any) -> dict[str, Any]:
            return {"format": FORMAT_VERSION, "task": {"id": "bench", "goal": "bench", "spec": {}}, "todo": [],
                    "done": [], "artifacts": {}, "data": data_tree, "context": {"summary": None, "compactions": 0,
                                                                                  "messages": [], "tokens": 0},
                    "recompute": None}

        state_size = len(dumps(to_tree({"messages": messages})))
        try:
            for i in range(n + 5):  # 5 warm-up rounds, not counted
                messages = messages[1:] + [{"role": "assistant", "content": message_text(rng, 512)}]
                payload = {"messages": messages, "step": i}

                t0 = time.perf_counter()
                chain.commit(state_doc(to_tree(payload, "state.data")), event("step", step=f"s{i}"))
                t1 = time.perf_counter()

                cp = empty_checkpoint()
                cp["channel_values"] = dict(payload)
                cp["channel_versions"] = {"messages": i + 1, "step": i + 1}
                t2 = time.perf_counter()
                config = saver.put(config, cp, {"source": "loop", "step": i}, {"messages": i + 1, "step": i + 1})
                t3 = time.perf_counter()

                raw = dumps(to_tree(payload))
                t4 = time.perf_counter()
                os.write(fd, raw)
                os.fsync(fd)
                t5 = time.perf_counter()
                if i >= 5:
                    ours.samples_ms.append((t1 - t0) * 1000)
                    theirs.samples_ms.append((t3 - t2) * 1000)
                    floor.samples_ms.append((t5 - t4) * 1000)
        finally:
            os.close(fd)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            conn.close()
            ours.stored_bytes = store.stored_bytes()
            store.close()
        theirs.stored_bytes = sum(p.stat().st_size for p in tmpdir.glob("langgraph.db*"))
        floor.stored_bytes = (tmpdir / "floor.bin").stat().st_size
        return CommitBench(n=n, state_bytes=state_size, directory=str(base), series=[ours, theirs, floor])
