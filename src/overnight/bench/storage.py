"""``overnight bench storage``: stored bytes of a growing task, overnight vs LangGraph ``SqliteSaver``.

The workload (issue 6's acceptance test): one task of ``steps`` steps run by overnight's real
:class:`~overnight.runtime.runner.Runner`. A first step writes a ``start_kb`` KB text artifact
(``draft.md``); every later step appends ``append_kb`` KB to it and two messages of
``message_kb / 2`` KB each to ``ctx.state["messages"]``. After ``steps`` steps the artifact is about
``start_kb + steps * append_kb`` KB and the message list ``steps * message_kb`` KB. The text is
pseudo-random prose (:func:`overnight.bench.commit.message_text`), which zstd compresses about 3x,
not a repeated string.

In the same run, after each overnight step, LangGraph's ``SqliteSaver`` (langgraph-checkpoint-
sqlite) ``put``\\ s the identical state -- ``{"artifact": <full text>, "messages": [...]}`` as the
checkpoint's channel values -- into its own SQLite file next to overnight's, so both face the same
disk at the same moment.

Measured, per system:

* **stored bytes**: the database file after ``PRAGMA wal_checkpoint(TRUNCATE)`` plus any ``-wal``
  left (:meth:`overnight.store.sqlite.SQLiteStore.stored_bytes`, and the same for LangGraph's file);
  for a ``file://`` store the bytes of every file under its directory; for PostgreSQL
  ``pg_total_relation_size`` of the schema's tables;
* **commit ms per step**: for overnight the time from the step function's return to the runner's
  ``step_end`` event -- staging (content-defined chunking, SHA-256, zstd), building and digesting the
  record, and the commit transaction with its fsync; for LangGraph the ``SqliteSaver.put`` call.

The ratio is LangGraph's bytes over overnight's (issue 6's target: at least 20x).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from overnight.bench import memory
from overnight.bench.commit import DEFAULT_POSTGRES, langgraph_saver, message_text, open_overnight, percentile
from overnight.errors import BenchFailed, ConfigError
from overnight.runtime.outcome import RunEvent
from overnight.runtime.runner import Runner
from overnight.runtime.task import Task
from overnight.store import location

#: systems this bench can measure besides LangGraph's SqliteSaver (always measured)
MEDIA = ("sqlite", "file", "postgres")
#: the task id the workload runs under
TASK_ID = "bench-storage"


@dataclass
class StorageSeries:
    """One system's result.

    Attributes:
        name: what was measured (``overnight sqlite`` / ``overnight file`` / ``overnight postgres`` /
            ``LangGraph SqliteSaver``).
        stored_bytes: bytes on the medium after the run (see the module docstring for how).
        commit_ms: commit time of every step (ms), in step order.
        where: the file, directory or schema measured.
    """

    name: str
    stored_bytes: int = 0
    commit_ms: list[float] = field(default_factory=list)
    where: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.commit_ms) if self.commit_ms else 0.0

    @property
    def p99_ms(self) -> float:
        return percentile(self.commit_ms, 99) or 0.0


@dataclass
class StorageBench:
    """Result of :func:`run_storage_bench`; :meth:`markdown` renders the table, :meth:`to_json` the data.

    Attributes:
        steps: steps run (each one checkpoint per overnight store, one ``put`` for LangGraph).
        artifact_bytes: size of the artifact after the last step (bytes).
        messages_bytes: total message text after the last step (bytes of content).
        logical_bytes: sum over steps of the state each step stored in full (artifact + messages):
            what a store that keeps a full snapshot per step holds before compression.
        series: overnight's stores first, LangGraph's ``SqliteSaver`` last.
        peak_rss_mb: peak resident memory of the process that ran it (MB,
            :func:`overnight.bench.memory.peak_rss_kb`): every
            medium's run and the ``SqliteSaver`` puts, one after the other in this process.
    """

    steps: int
    artifact_bytes: int
    messages_bytes: int
    logical_bytes: int
    series: list[StorageSeries]
    peak_rss_mb: float = 0.0

    @property
    def baseline(self) -> StorageSeries:
        return self.series[-1]

    def ratio(self, s: StorageSeries) -> float:
        """How many times smaller ``s`` is than LangGraph's ``SqliteSaver`` (bytes / bytes)."""
        return self.baseline.stored_bytes / s.stored_bytes if s.stored_bytes else float("inf")

    def markdown(self) -> str:
        lines = [
            f"storage growth: {self.steps} steps, artifact grows to {self.artifact_bytes / 1024:.0f} KB, "
            f"messages to {self.messages_bytes / 1024:.0f} KB "
            f"({self.logical_bytes / 1e6:.0f} MB if every step's state were stored in full)",
            "",
            "| system | stored | bytes | LangGraph / this | commit median ms | commit p99 ms |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for s in self.series:
            lines.append(f"| {s.name} | {_human(s.stored_bytes)} | {s.stored_bytes:,} | {self.ratio(s):.1f}x | "
                         f"{s.median_ms:.2f} | {s.p99_ms:.2f} |")
        lines += ["", f"peak RSS of the bench process (every run above, one after the other): "
                      f"{self.peak_rss_mb:.0f} MB"]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps, "artifact_bytes": self.artifact_bytes, "messages_bytes": self.messages_bytes,
            "logical_bytes": self.logical_bytes, "baseline": self.baseline.name,
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "systems": [{"name": s.name, "where": s.where, "stored_bytes": s.stored_bytes,
                         "ratio_vs_baseline": round(self.ratio(s), 3), "commit_median_ms": round(s.median_ms, 3),
                         "commit_p99_ms": round(s.p99_ms, 3), "commit_ms": [round(x, 3) for x in s.commit_ms]}
                        for s in self.series],
        }


def _human(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def growth_task(task_id: str, steps: int, *, start_kb: float, append_kb: float, message_kb: float,
                on_state: Callable[[str, list[dict[str, str]]], None]) -> Task:
    """The workload as an overnight task (see the module docstring).

    ``on_state(artifact_text, messages)`` is called at the end of every step function with the
    state that step leaves, so a second system can store exactly the same thing.
    """
    task = Task(task_id, goal="grow a draft by appends, and a message list, one step at a time")
    half = int(message_kb * 1024 / 2)

    @task.step
    def start(ctx):
        text = message_text(random.Random(f"{task_id}/start"), int(start_kb * 1024))
        ctx.write_text("draft.md", text)
        ctx.state["messages"] = []
        for i in range(1, steps):
            ctx.add_step("grow", position="end", i=i)
        on_state(text, [])

    @task.step(planned=False)
    def grow(ctx, i):
        rng = random.Random(f"{task_id}/{i}")
        text = ctx.read_text("draft.md") + "\n" + message_text(rng, int(append_kb * 1024) - 1)
        ctx.write_text("draft.md", text)
        messages = ctx.state["messages"] + [{"role": "user", "content": message_text(rng, half)},
                                            {"role": "assistant", "content": message_text(rng, half)}]
        ctx.state["messages"] = messages
        on_state(text, messages)

    return task


def run_storage_bench(steps: int = 500, *, start_kb: float = 500.0, append_kb: float = 1.0,
                      message_kb: float = 2.0, media: tuple[str, ...] = ("sqlite",),
                      postgres_url: str = DEFAULT_POSTGRES,
                      directory: Path | None = None, keep: bool = False) -> StorageBench:
    """Run the workload on each overnight medium in ``media`` and, in the SQLite run, LangGraph's
    ``SqliteSaver`` beside it; see the module docstring.

    Args:
        steps: steps of the task (>= 2).
        start_kb, append_kb, message_kb: initial artifact size, append per step, message text per
            step (KB, 1024 bytes).
        media: overnight stores to measure, from :data:`MEDIA`; ``sqlite`` is always included.
        postgres_url: server for the ``postgres`` medium (a fresh schema is created and dropped).
        directory: where the stores go, in a new ``overnight-bench-storage-*`` directory (default
            under the current directory).
        keep: leave that directory (the SQLite files, the file store) in place instead of deleting
            it, to inspect it (``overnight verify --store sqlite://PATH``); PostgreSQL schemas are
            always dropped.

    Raises:
        ValueError: ``steps`` < 2 or an unknown medium.
        ImportError: langgraph-checkpoint-sqlite is not installed (``pip install 'overnight[bench]'``).
        ConfigError: the ``postgres`` medium was asked for and the server is unreachable.
    """
    if steps < 2:
        raise ConfigError(f"steps must be at least 2, got {steps}")
    unknown = [m for m in media if m not in MEDIA]
    if unknown:
        raise ConfigError(f"unknown medium {unknown[0]!r}; choose from {', '.join(MEDIA)}")
    from langgraph.checkpoint.base import empty_checkpoint

    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    ordered = ["sqlite"] + [m for m in MEDIA if m in media and m != "sqlite"]
    with ExitStack() as outer:
        tmpdir = Path(tempfile.mkdtemp(prefix="overnight-bench-storage-", dir=base))
        if not keep:
            outer.callback(shutil.rmtree, tmpdir, ignore_errors=True)
        series: list[StorageSeries] = []
        lg = StorageSeries("LangGraph SqliteSaver", where=str(tmpdir / "langgraph.db"))
        totals = {"artifact": 0, "messages": 0, "logical": 0}
        for medium in ordered:
            ours = StorageSeries(f"overnight {medium}")
            with ExitStack() as stack:
                store = open_overnight(ours.name, tmpdir, postgres_url, stack)
                ours.where = location(store.url) if medium != "postgres" else store.url
                saver = lg_bytes = None
                if medium == "sqlite":  # LangGraph beside the SQLite run: same disk, same moments
                    saver, lg_bytes = langgraph_saver(lg.name, stack, tmpdir, postgres_url)
                config: dict[str, Any] = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
                pending: dict[str, Any] = {}

                def on_state(text: str, messages: list[dict[str, str]]) -> None:
                    pending.update(text=text, messages=messages, t=time.perf_counter())

                def on_event(ev: RunEvent) -> None:
                    nonlocal config
                    if ev.kind != "step_end":
                        return
                    ours.commit_ms.append((time.perf_counter() - pending["t"]) * 1000)
                    if saver is None:
                        return
                    totals["artifact"] = len(pending["text"].encode())
                    totals["messages"] = sum(len(m["content"].encode()) for m in pending["messages"])
                    totals["logical"] += totals["artifact"] + totals["messages"]
                    n = len(ours.commit_ms)
                    cp = empty_checkpoint()
                    cp["channel_values"] = {"artifact": pending["text"], "messages": pending["messages"]}
                    cp["channel_versions"] = {"artifact": n, "messages": n}
                    t0 = time.perf_counter()
                    config = saver.put(config, cp, {"source": "loop", "step": n}, {"artifact": n, "messages": n})
                    lg.commit_ms.append((time.perf_counter() - t0) * 1000)

                task = growth_task(TASK_ID, steps, start_kb=start_kb, append_kb=append_kb,
                                   message_kb=message_kb, on_state=on_state)
                result = Runner(task, store, handle_signals=False, on_event=on_event).run()
                if result.status != "complete" or len(ours.commit_ms) != steps:
                    raise BenchFailed(f"bench task ended {result.status} after {len(ours.commit_ms)} of {steps} steps")
                ours.stored_bytes = store.stored_bytes()
                if lg_bytes is not None:
                    lg.stored_bytes = lg_bytes()
            series.append(ours)
        series.append(lg)
        return StorageBench(steps, totals["artifact"], totals["messages"], totals["logical"], series,
                            memory.peak_rss_kb() / 1024)
