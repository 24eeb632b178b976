"""``overnight bench verify``: how fast ``overnight verify --all`` and ``overnight verify TASK`` run,
and how much memory they take, on stores of growing size.

For each scale, builds a store of ``scale`` tasks of ``checkpoints`` steps each; every step writes
a new artifact, so each task holds ``mb`` MB of distinct artifact content (text-like bytes, so zstd
has work to do). Then it times each check in a fresh process (``python -c``): ``verify --all``
(every task and object of the store) and ``verify TASK`` (the first task): wall and CPU seconds,
the throughput in MB/s of artifact content hashed, and the process's peak RSS, also read just
before the check starts (imports and an open store), so the check's own memory shows. RSS flat
in the store's size means the larger store's peak is about the smaller one's. (A longer chain in
one task is another axis: its head's state -- the pages a load holds -- grows with it.)

The baseline, measured in the same run right before each check, is ``hashlib.sha256`` over as
many bytes held in memory (1 MB buffers, one thread): the floor of any check that re-hashes
content, with no read, decompression or parsing. ``verify`` hashes on a thread pool, so on a
machine with several cores it may pass 1x.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import overnight
from overnight.bench.commit import message_text
from overnight.runtime.runner import Runner
from overnight.runtime.task import Task
from overnight.store.sqlite import SQLiteStore

MODES = ("verify --all", "verify TASK")
"""What is timed on each store: every task and every stored object, or the one task."""

_CHILD = """
import json, resource, sys, time
from overnight.store.sqlite import SQLiteStore
from overnight.verify.fsck import verify_store
from overnight.bench.memory import peak_rss_kb
store = SQLiteStore(sys.argv[1])
task = sys.argv[2] or None
processes = None if sys.argv[3] == "auto" else int(sys.argv[3])
before = peak_rss_kb()
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
report = verify_store(store, [task] if task else None, all_objects=task is None, processes=processes)
seconds, cpu, main = time.perf_counter() - t0, time.process_time() - c0, time.thread_time() - m0
after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the helper processes, ended and waited for
helpers = after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime
print(json.dumps({"seconds": seconds, "cpu_s": cpu + helpers, "main_cpu_s": main, "helpers_cpu_s": helpers,
                  "bytes_verified": report.bytes_verified,
                  "objects_checked": report.objects_checked, "problems": len(report.problems),
                  "rss_before_mb": before / 1024, "rss_mb": peak_rss_kb() / 1024,
                  "helper_rss_mb": after.ru_maxrss / 1024 if helpers else 0.0}))
"""


@dataclass
class VerifyRun:
    """One timed verification (a fresh process).

    Attributes:
        mode: one of :data:`MODES`.
        tasks: tasks in the store (``verify TASK`` checks one).
        checkpoints, artifact_mb: what the check covered (steps; MB of artifact content).
        store_mb: MB stored.
        seconds, cpu_s: wall and CPU time of the check (all threads), seconds; ``main_cpu_s`` the
            CPU time of the calling thread (the record checks; the pool hashes content).
        bytes_verified: artifact content hashed, bytes.
        objects_checked, problems: from the report (problems must be 0).
        rss_mb: the process's peak RSS, MB; ``rss_before_mb`` the same read before the check.
        sha256_mbps: the floor, MB/s, measured right before.
        helpers_cpu_s: CPU seconds of the helper processes hashing content (included in
            ``cpu_s``); ``helper_rss_mb`` the largest one's peak RSS, MB (0: none ran).
        processes: the ``processes`` argument of the check (None: its default).
    """

    mode: str
    tasks: int
    checkpoints: int
    artifact_mb: float
    store_mb: float
    seconds: float
    cpu_s: float
    main_cpu_s: float
    bytes_verified: int
    objects_checked: int
    problems: int
    rss_before_mb: float
    rss_mb: float
    sha256_mbps: float
    helpers_cpu_s: float = 0.0
    helper_rss_mb: float = 0.0
    processes: int | None = None

    @property
    def mbps(self) -> float:
        """Throughput: MB (1e6 bytes) of content hashed per wall second."""
        return self.bytes_verified / 1e6 / self.seconds if self.seconds else float("inf")

    @property
    def cpu_mbps(self) -> float:
        """MB of content hashed per CPU second (all threads): what a loaded machine cannot blur."""
        return self.bytes_verified / 1e6 / self.cpu_s if self.cpu_s else float("inf")

    @property
    def cores2_mbps(self) -> float:
        """MB/s the check's CPU allows on 2 free cores: the calling thread's CPU time, or half of
        all threads', whichever is larger, is the least wall time (an estimate from CPU time,
        for a machine too busy to time the wall)."""
        bound = max(self.main_cpu_s, self.cpu_s / 2)
        return self.bytes_verified / 1e6 / bound if bound else float("inf")


@dataclass
class VerifyBench:
    """Result of :func:`run_verify_bench`: one :class:`VerifyRun` per store size and mode, plus
    the build time (s) of each store."""

    runs: list[VerifyRun] = field(default_factory=list)
    build_s: list[float] = field(default_factory=list)

    @property
    def first(self) -> VerifyRun:
        """``verify --all`` on the smallest store (the headline figure)."""
        return self.runs[0]

    @property
    def checkpoints(self) -> int:
        return self.first.checkpoints

    @property
    def bytes_verified(self) -> int:
        return self.first.bytes_verified

    @property
    def problems(self) -> int:
        return sum(r.problems for r in self.runs)

    @property
    def mbps(self) -> float:
        return self.first.mbps

    @property
    def sha256_mbps(self) -> float:
        return self.first.sha256_mbps

    def rss_growth(self, mode: str = MODES[0]) -> float:
        """Peak RSS on the largest store over that on the smallest, for ``mode`` (flat: ~1.0x)."""
        runs = [r for r in self.runs if r.mode == mode and r.processes == self.runs[0].processes]
        return runs[-1].rss_mb / runs[0].rss_mb

    def to_json(self) -> dict:
        first = self.first
        return {"checkpoints": first.checkpoints, "artifact_mb": round(first.artifact_mb, 3),
                "store_mb": round(first.store_mb, 3), "verify_s": round(first.seconds, 3),
                "bytes_verified": first.bytes_verified, "mbps": round(first.mbps, 3),
                "sha256_mbps": round(first.sha256_mbps, 3), "vs_sha256": round(first.mbps / first.sha256_mbps, 5),
                "problems": self.problems, "build_s": [round(b, 3) for b in self.build_s],
                "runs": [{**asdict(r), "mbps": round(r.mbps, 3), "cpu_mbps": round(r.cpu_mbps, 3),
                          "cores2_mbps": round(r.cores2_mbps, 3)} for r in self.runs]}

    @staticmethod
    def _helpers(r: VerifyRun) -> str:
        if not r.helpers_cpu_s:
            return "none (threads)" if r.processes is None else f"{r.processes} (threads)"
        return f"{'auto' if r.processes is None else r.processes}, {r.helpers_cpu_s:.2f} s, {r.helper_rss_mb:.0f} MB"

    def markdown(self) -> str:
        lines = ["| store | check | wall s | CPU s | MB/s hashed | x floor (sha256 in memory, MB/s) "
                 "| calling thread CPU s | MB/s the CPU allows on 2 free cores | peak RSS MB (before the check) "
                 "| helpers: processes, CPU s, peak RSS MB |",
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in self.runs:
            lines.append(f"| {r.tasks} x {r.checkpoints // r.tasks if r.mode == MODES[0] else r.checkpoints} "
                         f"checkpoints ({r.store_mb:.0f} MB stored, zstd) | {r.mode}: {r.checkpoints} checkpoints, "
                         f"{r.artifact_mb:.0f} MB | {r.seconds:.2f} | {r.cpu_s:.2f} | {r.mbps:.0f} | "
                         f"{r.mbps / r.sha256_mbps:.2f}x ({r.sha256_mbps:.0f}) | {r.main_cpu_s:.2f} | {r.cores2_mbps:.0f} | "
                         f"{r.rss_mb:.0f} ({r.rss_before_mb:.0f}) | {self._helpers(r)} |")
        sizes = sorted({r.tasks for r in self.runs})
        if len(sizes) > 1:
            lines += ["", f"peak RSS with {sizes[-1]} tasks over {sizes[0]}: "
                          + ", ".join(f"{m} {self.rss_growth(m):.2f}x" for m in MODES)]
        lines += ["", f"problems found: {self.problems}"]
        return "\n".join(lines)


def run_verify_bench(checkpoints: int = 1000, mb: float = 100.0, directory: Path | None = None,
                     scales: tuple[int, ...] = (1, 3), processes: tuple[int | None, ...] = (None,)) -> VerifyBench:
    """Build a store per scale (that many tasks) and time each check in :data:`MODES`, once per
    ``processes`` value (``verify_store``'s argument: None its default, 0 threads only); see the
    module docstring."""
    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    bench = VerifyBench()
    for scale in scales:
        with tempfile.TemporaryDirectory(prefix="overnight-bench-verify-", dir=base) as tmp:
            path = Path(tmp) / "store.db"
            per_step = int(mb * 1e6 / checkpoints)
            t0 = time.perf_counter()
            task_ids = [_build(path, f"bench-verify-{k}", checkpoints, per_step, seed=k) for k in range(scale)]
            bench.build_s.append(time.perf_counter() - t0)
            with SQLiteStore(path) as store:
                store_mb = store.stored_bytes() / 1e6
            for mode in MODES:
                for procs in processes:
                    n = checkpoints * (scale if mode == MODES[0] else 1)
                    floor = sha256_mbps(max(64_000_000, per_step * n))
                    got = _child(path, task_ids[0] if mode == "verify TASK" else "", procs)
                    bench.runs.append(VerifyRun(mode, scale, n, per_step * (n - n // checkpoints) / 1e6, store_mb,
                                                got["seconds"], got["cpu_s"], got["main_cpu_s"], got["bytes_verified"],
                                                got["objects_checked"], got["problems"], got["rss_before_mb"], got["rss_mb"],
                                                floor, got["helpers_cpu_s"], got["helper_rss_mb"], procs))
    return bench


def _build(path: Path, task_id: str, checkpoints: int, per_step: int, seed: int) -> str:
    """Add to the store a task whose every step writes a new ``per_step``-byte artifact (distinct
    per ``seed``); returns its task id."""
    task = Task(task_id, goal="many checkpoints, many artifacts")

    @task.step
    def plan(ctx):
        for i in range(checkpoints - 1):
            ctx.add_step("write", i=i)

    @task.step(planned=False)
    def write(ctx, i):
        ctx.write_text(f"artifacts/{i:05d}.txt", message_text(random.Random(seed * 1_000_003 + i), per_step))

    with SQLiteStore(path) as store:
        Runner(task, store, handle_signals=False).run()
    return task.id


def _child(path: Path, task_id: str, processes: int | None = None) -> dict:
    """Run one check in a fresh interpreter (this overnight on its path); its measurements."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(overnight.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), task_id,
                          "auto" if processes is None else str(processes)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sha256_mbps(nbytes: int) -> float:
    """``hashlib.sha256`` throughput (MB/s) over ``nbytes`` (at least 1 MB) hashed in 1 MB buffers."""
    buf = bytes(range(256)) * 4096
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(max(1, nbytes // len(buf))):
        h.update(buf)
    elapsed = time.perf_counter() - t0
    return max(1, nbytes // len(buf)) * len(buf) / 1e6 / elapsed
