"""``overnight bench langgraph``: storage, put / get_tuple latency and the whole graph run of a
message-accumulating LangGraph graph, stored with :class:`~overnight.adapters.langgraph.OvernightSaver` vs LangGraph's own ``SqliteSaver``.

The graph is one node on ``MessagesState``: each turn (one ``invoke``) appends a ~1-2 KB
assistant message (pseudo-random prose, deterministic per turn) to ``messages`` through
``add_messages``, so the state grows by one message per turn -- a chat transcript. Both savers
run the same turns, interleaved turn by turn on the same disk (noise hits both alike), each on its
own SQLite file in a temporary directory:

* **overnight** -- ``OvernightSaver`` on ``sqlite://``: the list is one blob per checkpoint, cut
  into content-defined chunks, so a turn stores the new message's chunks, not the transcript again;
* **LangGraph** -- ``SqliteSaver`` (langgraph-checkpoint-sqlite), which stores each new version
  of the ``messages`` channel as a whole serialized blob.

Measured: the bytes of the database files (``*.db``, ``-wal``, ``-shm``) after the run, each
WAL checkpointed into its database first; the wall time of every ``put`` call (ms), summed per
turn; of every ``get_tuple`` call (ms: the graph reads the thread's latest checkpoint at the start
of each ``invoke``; overnight's is verified); and of the whole invoke loop (s: every turn's
``invoke``, graph work and both savers' calls included). Beside each wall time, the CPU time of
the same calls (``time.thread_time`` of the thread running them: what the saver itself costs,
which a loaded machine inflates far less than wall time). Ratios are overnight / LangGraph.
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.bench.commit import message_text, percentile


@dataclass
class SaverRun:
    """One saver's result: per-turn put time and CPU time (ms), put calls, get_tuple times and CPU
    times (ms), per-turn invoke times (ms), and database bytes on disk."""

    name: str
    turn_ms: list[float] = field(default_factory=list)
    turn_cpu_ms: list[float] = field(default_factory=list)
    puts: int = 0
    get_ms: list[float] = field(default_factory=list)
    get_cpu_ms: list[float] = field(default_factory=list)
    invoke_ms: list[float] = field(default_factory=list)
    stored_bytes: int = 0

    def pct(self, p: float) -> float:
        """The ``p``-th percentile of the per-turn put times (nearest rank, ms)."""
        return percentile(self.turn_ms, p) or 0.0


@dataclass
class LangGraphBench:
    """Result of :func:`run_langgraph_bench`; :meth:`markdown` renders the table."""

    turns: int
    transcript_bytes: int
    directory: str
    ours: SaverRun
    theirs: SaverRun

    def markdown(self) -> str:
        """The result table (one row per saver, ratios against ``SqliteSaver``)."""
        o, t = self.ours, self.theirs
        med = statistics.median
        lines = [
            f"LangGraph, {self.turns} turns appending one ~1-2 KB message each (final transcript "
            f"{self.transcript_bytes / 1024:.0f} KB), disk {self.directory}",
            "",
            "| saver | stored (DB files) | vs SqliteSaver | put ms/turn median | p99 | vs SqliteSaver | "
            "put CPU ms/turn median | vs SqliteSaver | get_tuple ms median | vs SqliteSaver | "
            "get_tuple CPU ms median | vs SqliteSaver | invoke loop s | vs SqliteSaver | put calls |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (o, t):
            lines.append(
                f"| {r.name} | {r.stored_bytes / 1024 / 1024:.2f} MB | {r.stored_bytes / t.stored_bytes:.3f}x | "
                f"{med(r.turn_ms):.2f} | {r.pct(99):.2f} | {med(r.turn_ms) / med(t.turn_ms):.2f}x | "
                f"{med(r.turn_cpu_ms):.2f} | {med(r.turn_cpu_ms) / med(t.turn_cpu_ms):.2f}x | "
                f"{med(r.get_ms):.2f} | {med(r.get_ms) / med(t.get_ms):.2f}x | "
                f"{med(r.get_cpu_ms):.2f} | {med(r.get_cpu_ms) / med(t.get_cpu_ms):.2f}x | "
                f"{sum(r.invoke_ms) / 1000:.2f} | {sum(r.invoke_ms) / sum(t.invoke_ms):.2f}x | {r.puts} |")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON-ready data: per saver the medians (ms, put per turn and get_tuple,
        wall and CPU), the invoke loop (s), bytes stored and put calls; ratios are ours / theirs."""
        med = statistics.median

        def saver(r: SaverRun) -> dict[str, Any]:
            return {"name": r.name, "stored_bytes": r.stored_bytes, "puts": r.puts,
                    "put_ms_median": round(med(r.turn_ms), 4), "put_ms_p99": round(r.pct(99), 4),
                    "put_cpu_ms_median": round(med(r.turn_cpu_ms), 4), "get_tuple_ms_median": round(med(r.get_ms), 4),
                    "get_tuple_cpu_ms_median": round(med(r.get_cpu_ms), 4), "invoke_s": round(sum(r.invoke_ms) / 1000, 4)}

        o, t = self.ours, self.theirs
        return {"turns": self.turns, "transcript_bytes": self.transcript_bytes, "ours": saver(o), "theirs": saver(t),
                "ratio": {"put": round(med(o.turn_ms) / med(t.turn_ms), 4),
                          "get_tuple": round(med(o.get_ms) / med(t.get_ms), 4),
                          "invoke": round(sum(o.invoke_ms) / sum(t.invoke_ms), 4),
                          "stored_smaller": round(t.stored_bytes / o.stored_bytes, 2)}}


def _timed(saver: Any, run: SaverRun, clock: list[float]) -> Any:
    """Wrap ``saver.put`` to add its wall and CPU time to ``clock[0]`` and ``clock[1]`` (ms) and
    count calls, and ``saver.get_tuple`` to record each call's wall and CPU time in ``run``."""
    put, get_tuple = saver.put, saver.get_tuple

    def timed_put(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return put(*args, **kwargs)
        finally:
            clock[0] += (time.perf_counter() - t0) * 1000
            clock[1] += (time.thread_time() - c0) * 1000
            run.puts += 1

    def timed_get_tuple(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return get_tuple(*args, **kwargs)
        finally:
            run.get_ms.append((time.perf_counter() - t0) * 1000)
            run.get_cpu_ms.append((time.thread_time() - c0) * 1000)

    saver.put, saver.get_tuple = timed_put, timed_get_tuple
    return saver


def _db_bytes(path: Path) -> int:
    """Bytes of an SQLite database and its WAL/SHM files, after checkpointing the WAL into it."""
    with sqlite3.connect(str(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def run_langgraph_bench(turns: int = 500, directory: Path | None = None, seed: int = 7) -> LangGraphBench:
    """Run the benchmark; see the module docstring.

    Raises:
        ImportError: langgraph / langgraph-checkpoint-sqlite are not installed
            (``pip install 'overnight[langgraph,bench]'``).
        AssertionError: the two savers ended with different transcripts (a broken run).
    """
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph

    from overnight.adapters.langgraph import OvernightSaver

    def graph(checkpointer: Any) -> Any:
        def reply(state: dict[str, Any]) -> dict[str, Any]:
            n = len(state["messages"])
            rng = random.Random(seed * 1_000_003 + n)
            return {"messages": [AIMessage(message_text(rng, rng.randrange(1024, 2048)), id=f"m{n}")]}

        g = StateGraph(MessagesState)
        g.add_node("reply", reply)
        g.add_edge(START, "reply")
        return g.compile(checkpointer=checkpointer)

    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-lg-", dir=base) as tmp:
        tmpdir = Path(tmp)
        ours, theirs = SaverRun("overnight OvernightSaver"), SaverRun("LangGraph SqliteSaver")
        clock_o, clock_t = [0.0, 0.0], [0.0, 0.0]
        ov = _timed(OvernightSaver.from_url(f"sqlite://{tmpdir / 'overnight.db'}"), ours, clock_o)
        conn = sqlite3.connect(str(tmpdir / "langgraph.db"), check_same_thread=False)
        sq = SqliteSaver(conn)
        sq.setup()
        _timed(sq, theirs, clock_t)
        apps = ((graph(ov), ours, clock_o), (graph(sq), theirs, clock_t))
        cfg = {"configurable": {"thread_id": "bench"}}
        finals = []
        try:
            for _ in range(turns):
                for app, run, clock in apps:
                    clock[0] = clock[1] = 0.0
                    t0 = time.perf_counter()
                    app.invoke({"messages": []}, cfg, durability="sync")
                    run.invoke_ms.append((time.perf_counter() - t0) * 1000)
                    run.turn_ms.append(clock[0])
                    run.turn_cpu_ms.append(clock[1])
            finals = [app.get_state(cfg).values["messages"] for app, _, _ in apps]
        finally:
            ov.close()
            conn.close()
        assert finals[0] == finals[1] and len(finals[0]) == turns, "the two savers disagree on the transcript"
        ours.stored_bytes = _db_bytes(tmpdir / "overnight.db")
        theirs.stored_bytes = _db_bytes(tmpdir / "langgraph.db")
        transcript = sum(len(str(m.content).encode()) for m in finals[0])
        return LangGraphBench(turns=turns, transcript_bytes=transcript, directory=str(base), ours=ours, theirs=theirs)
