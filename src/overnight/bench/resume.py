"""Resume latency against chain length: overnight's runner vs LangGraph's ``get_tuple``.

For each chain length ``L`` (e.g. 10 / 100 / 1000 checkpoints), each system holds one task/thread
whose branch has ``L`` checkpoints, each step having replaced a ~``state_kb`` KB note in the state
and added one entry to the done list. The chain is grown in place from one length to the next.
Then, ``reps`` times each probe:

* **overnight** (``overnight sqlite`` / ``file`` / ``postgres``, store already open), two probes:
  ``load + verify head, every done page`` -- :func:`~overnight.chain.read.load_head`: read the head and verify it
  (record digest, schema, every page and state blob re-hashed), the counterpart of LangGraph's
  read; and ``resume session`` -- one :class:`~overnight.runtime.runner.Runner` session with
  ``max_steps=0``: take the lease, load and verify the head, compare its fingerprint with the world
  (the ``durable`` level's consistency check: code, installed packages, environment), release the
  lease. That is everything a resumed run does before its first step; it commits nothing.
* **LangGraph** (``SqliteSaver`` / ``PostgresSaver``): ``get_tuple`` of the thread's latest
  checkpoint, which is what a graph does on resume (there is no integrity check to run).

Latencies are medians in milliseconds; ratios are against :data:`BASELINE` at the same length.
"""

from __future__ import annotations

import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from overnight.bench.commit import DEFAULT_POSTGRES, langgraph_saver, message_text, open_overnight
from overnight.errors import BenchFailed, ConfigError
from overnight.runtime.outcome import RunEvent
from overnight.runtime.runner import Runner
from overnight.runtime.task import Task
from overnight.chain.read import load_head

#: every system :func:`run_resume_bench` can measure, in table order
SYSTEMS = ("overnight sqlite", "overnight file", "overnight postgres", "LangGraph SqliteSaver",
           "LangGraph PostgresSaver")
#: the baseline of the ratios
BASELINE = "LangGraph SqliteSaver: get_tuple"
#: the task (and thread) id the chains are built under
TASK_ID = "bench-resume"


@dataclass
class ResumeSeries:
    """One probe of one system (``name``: ``"<system>: <probe>"``): resume latency samples (ms) per
    chain length, and the checkpoints really on its branch at each length (read back from the
    store, not assumed)."""

    name: str
    system: str
    samples_ms: dict[int, list[float]] = field(default_factory=dict)
    checkpoints: dict[int, int] = field(default_factory=dict)

    def median(self, length: int) -> float:
        return statistics.median(self.samples_ms[length])


@dataclass
class ResumeBench:
    """Result of :func:`run_resume_bench`; :meth:`markdown` renders the table."""

    lengths: tuple[int, ...]
    reps: int
    state_bytes: int
    series: list[ResumeSeries]

    def baseline(self) -> ResumeSeries | None:
        return next((s for s in self.series if s.name == BASELINE), None)

    def markdown(self) -> str:
        base = self.baseline()
        head = " | ".join(f"{n:,} checkpoints" for n in self.lengths)
        lines = [
            f"resume latency, median of {self.reps} per length, state ~{self.state_bytes / 1024:.1f} KB; "
            f"ms{f' (x {BASELINE})' if base else ''}",
            "",
            f"| system | {head} | {self.lengths[-1]:,} vs {self.lengths[0]:,} |",
            "|---|" + "---:|" * (len(self.lengths) + 1),
        ]
        for s in self.series:
            cells = []
            for n in self.lengths:
                ratio = f" ({s.median(n) / base.median(n):.1f}x)" if base else ""
                cells.append(f"{s.median(n):.2f}{ratio}")
            growth = s.median(self.lengths[-1]) / s.median(self.lengths[0])
            lines.append(f"| {s.name} | " + " | ".join(cells) + f" | {growth:.2f}x |")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        base = self.baseline()
        return {"lengths": list(self.lengths), "reps": self.reps, "state_bytes": self.state_bytes,
                "baseline": BASELINE if base else None,
                "systems": [{"name": s.name, "system": s.system,
                             "by_length": [{"length": n, "checkpoints": s.checkpoints[n],
                                            "median_ms": round(s.median(n), 4),
                                            "vs_baseline": round(s.median(n) / base.median(n), 4) if base else None,
                                            "samples_ms": [round(x, 4) for x in s.samples_ms[n]]}
                                           for n in self.lengths]} for s in self.series]}


def chain_task(state_kb: float, capacity: int) -> Task:
    """A task whose ``capacity`` steps each replace a ``state_kb`` KB note in ``ctx.state``. Each
    step plans the next one, so the to-do list stays one entry long and a resume's cost grows with
    the chain alone (a to-do list of every remaining step -- this bench's task until 2026-12-02 --
    cost ~38 ms per load with 5,000 steps planned, at any chain length)."""
    task = Task(TASK_ID, goal="a long chain of small checkpoints")
    size = int(state_kb * 1024)

    @task.step
    def plan(ctx):
        ctx.add_step("work", position="end", i=0)

    @task.step(planned=False)
    def work(ctx, i):
        ctx.state["note"] = message_text(random.Random(i), size)
        if i + 1 < capacity:
            ctx.add_step("work", position="end", i=i + 1)
        return {"i": i}

    return task


def _overnight(system: str, stack: ExitStack, tmpdir: Path, postgres_url: str, state_kb: float, capacity: int
               ) -> tuple[Callable[[int], int], list[tuple[str, Callable[[], float]]]]:
    """``(grow_to(length) -> checkpoints on the branch, [(probe name, probe() -> ms)])`` for an
    overnight store: the head's load and verification alone, and a whole resume session."""
    store = open_overnight(system, tmpdir, postgres_url, stack)
    task = chain_task(state_kb, capacity)

    def head_seq() -> int:
        cid = store.get_ref(TASK_ID, "main")
        return -1 if cid is None else store.get_checkpoint(cid).seq

    def grow_to(length: int) -> int:
        missing = length - (head_seq() + 1)  # seq 0 is the task's creation
        if missing > 0:
            # the first session creates the task (seq 0) and runs ``plan``: one checkpoint fewer to run
            Runner(task, store, handle_signals=False, max_steps=missing - 1 if head_seq() < 0 else missing).run()
        return head_seq() + 1

    def load() -> float:
        t0 = time.perf_counter()
        loaded, fallback = load_head(store, TASK_ID, "main", key=None)
        ms = (time.perf_counter() - t0) * 1000
        if fallback is not None or loaded.record.seq != head_seq():
            raise BenchFailed(f"{system}: load_head did not load the head")
        return ms

    def session() -> float:
        seen: list[RunEvent] = []
        t0 = time.perf_counter()
        result = Runner(task, store, handle_signals=False, max_steps=0, on_event=seen.append).run()
        ms = (time.perf_counter() - t0) * 1000
        if result.steps_run or not any(e.kind == "resume" for e in seen):
            raise BenchFailed(f"{system}: the resume session did not resume ({result.status}, "
                               f"{result.steps_run} steps run)")
        return ms

    return grow_to, [(f"{system}: load + verify head, every done page", load), (f"{system}: resume session", session)]


def _langgraph(system: str, stack: ExitStack, tmpdir: Path, postgres_url: str, state_kb: float
               ) -> tuple[Callable[[int], int], list[tuple[str, Callable[[], float]]]]:
    """``(grow_to(length) -> checkpoints in the thread, [(probe name, probe() -> ms)])`` for a
    LangGraph saver: ``get_tuple`` of the latest checkpoint."""
    from langgraph.checkpoint.base import empty_checkpoint

    saver, _ = langgraph_saver(system, stack, tmpdir, postgres_url)
    config: dict[str, Any] = {"configurable": {"thread_id": TASK_ID, "checkpoint_ns": ""}}
    thread = {"configurable": {"thread_id": TASK_ID}}
    size = int(state_kb * 1024)
    done: list[dict[str, Any]] = []

    def grow_to(length: int) -> int:
        nonlocal config
        while len(done) < length:
            i = len(done)
            done.append({"i": i})
            cp = empty_checkpoint()
            cp["channel_values"] = {"note": message_text(random.Random(i), size), "done": list(done)}
            cp["channel_versions"] = {"note": i + 1, "done": i + 1}
            config = saver.put(config, cp, {"source": "loop", "step": i}, {"note": i + 1, "done": i + 1})
        return sum(1 for _ in saver.list(thread))

    def resume() -> float:
        t0 = time.perf_counter()
        got = saver.get_tuple(thread)
        ms = (time.perf_counter() - t0) * 1000
        if got is None or len(got.checkpoint["channel_values"]["done"]) != len(done):
            raise BenchFailed(f"{system}: get_tuple did not return the latest checkpoint")
        return ms

    return grow_to, [(f"{system}: get_tuple", resume)]


def run_resume_bench(lengths: tuple[int, ...] = (10, 100, 1000), *, reps: int = 5, state_kb: float = 1.0,
                     systems: tuple[str, ...] = SYSTEMS, directory: Path,
                     postgres_url: str = DEFAULT_POSTGRES) -> ResumeBench:
    """Build the chains and time the resumes; see the module docstring.

    Args:
        lengths: chain lengths (checkpoints on the branch), ascending, each >= 2.
        reps: resumes timed per system and length.
        state_kb: size of the note each step writes (KB).
        systems: names from :data:`SYSTEMS`.
        directory: an existing directory for the SQLite files and the file store.
        postgres_url: server for the PostgreSQL systems (fresh schemas, dropped afterwards).

    Raises:
        ValueError: lengths not ascending or under 2, reps < 1, or an unknown system.
        ImportError: a langgraph checkpointer is not installed (``pip install 'overnight[bench]'``).
        RuntimeError: a system did not resume what it was given (a bench bug, not a timing).
    """
    if not lengths or list(lengths) != sorted(set(lengths)) or lengths[0] < 2:
        raise ConfigError(f"lengths must be ascending, distinct and at least 2, got {lengths}")
    if reps < 1:
        raise ConfigError(f"reps must be at least 1, got {reps}")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
    out: list[ResumeSeries] = []
    with ExitStack() as stack:
        for name in systems:
            grow_to, probes = (_overnight(name, stack, directory, postgres_url, state_kb, lengths[-1])
                               if name.startswith("overnight ") else
                               _langgraph(name, stack, directory, postgres_url, state_kb))
            series = [ResumeSeries(label, system=name) for label, _ in probes]
            for n in lengths:
                checkpoints = grow_to(n)
                for s, (_, probe) in zip(series, probes):
                    s.checkpoints[n] = checkpoints
                    probe()  # warm-up: first read after the writes, not counted
                    s.samples_ms[n] = [probe() for _ in range(reps)]
            out.extend(series)
    return ResumeBench(tuple(lengths), reps, int(state_kb * 1024), out)
