"""``overnight bench resume``: the whole ``overnight resume`` process, to its first step, against
chain length -- over a bare ``python -c 'import overnight'``, measured in the same run.

For each chain length ``L`` (checkpoints on the branch), one task in one SQLite store holds a
chain of ``L`` small checkpoints (each step changes one small field of ``ctx.state`` and plans the
next step, so the done list grows and the to-do list stays one entry long); it is grown in place
from one length to the next by ``overnight run`` / ``overnight resume --max-steps``. Then,
``reps`` times, alternating the two so a drift of the machine's speed hits both alike:

* **resume to first step**: ``python -m overnight resume TASK --store sqlite://...`` in a fresh
  process, whose next step ends the process (``os._exit(0)``) the moment it starts: interpreter
  start, CLI import, store open, lease, head load and verification, the world fingerprint
  (installed distributions, code, environment), drift check -- everything before the first step,
  nothing after it (no commit: the chain keeps its length);
* **bare import**: ``python -c 'import overnight'`` in a fresh process (the floor);

each child then writes its own peak memory (:mod:`overnight.bench.memory`: a few microseconds,
the same in both, so ``over import`` is unchanged);

and, in this process, **load + verify head** (:func:`~overnight.chain.read.load_head` on the open
store, ``lazy_done``: record, state document, todo and artifact pages, world fingerprint -- the done
pages are read and verified when used, so this is what ``ls``, the resume's look-up of the task's
code and the runner pay: its memo look-up of a step, its plan check and its drift check go by the
done pages' verified index, record format 4), **load + what a resume checks** (the same, then
what the runner checks before its first step, :func:`~overnight.chain.checked.check_done_pages`:
every done page hashed, and parsed and checked against its index unless this machine checked that
page reference before -- the cache the timed resumes filled) and **load + verify every done page**
(every done page read, parsed and verified: what ``verify`` and a format-3 head cost, and what
the runner did before its session until 2026-12-03) -- the parts that would grow with the chain. Each child's peak resident memory is recorded
too (``rss_mb``: ``VmHWM`` as the child reports it -- ``wait4``'s ``ru_maxrss`` would include this
process's size, :mod:`overnight.bench.memory`).

The children write their bytecode caches to a folder of the bench's own (``PYTHONPYCACHEPREFIX``,
filled by the warm-up runs), as an installed package has them: with ``PYTHONDONTWRITEBYTECODE``
set, every run would compile overnight's source again.

Times are wall-clock medians in milliseconds; ``over import`` is resume minus import (the cost the
issue's target bounds: <= 150 ms at 5,000 checkpoints). The tokenizer is never loaded on this path
(no step calls a model) and the distribution fingerprint comes from its on-disk cache after the
first resume (:mod:`overnight.verify.dists`); the state folder used is the bench's own, so the
first, warm-up resume fills that cache.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from overnight.bench import memory
from overnight.errors import BenchFailed, ConfigError

TASK_ID = "bench-resume-process"
TASK_FILE = "bench_resume_task.py"
EXIT_ENV = "OVERNIGHT_BENCH_EXIT_AT_STEP"
"""Set in the timed resumes: the task's next step ends the process when it starts."""

_TASK = '''"""A long chain of small checkpoints (overnight bench resume)."""
import os
import overnight

task = overnight.Task({task_id!r}, goal="a long chain of small checkpoints")


@task.step
def plan(ctx):
    ctx.add_step("work", position="end", i=0)


@task.step(planned=False)
def work(ctx, i):
    if os.environ.get({exit_env!r}):
        try:
            from overnight.bench.memory import report
        except ImportError:  # an older overnight (--baseline-src): the bench falls back to wait4's figure
            pass
        else:
            report()  # this process's own peak memory, on stdout
        os._exit(0)  # the bench times the resume up to here
    ctx.state["n"] = i
    if i + 1 < {capacity}:
        ctx.add_step("work", position="end", i=i + 1)  # one step ahead: the to-do list stays short
    return {{"i": i}}
'''

CHECKED = "load + what a resume checks"
"""The probe of the head's load with what the runner checks before its first step
(:func:`~overnight.chain.checked.check_done_pages`), pages this machine checked before hashed only."""
PROBES = ("resume to first step", "bare import", "load + verify head", CHECKED, "load + verify every done page")
CPU_PROBES = ("resume to first step (cpu)", "bare import (cpu)")
BASELINE = "baseline resume"
"""The probe of ``baseline=``: the same resume run by another overnight's source."""
"""The same child processes' CPU time (user + system, from the kernel): steadier than wall time on
a loaded machine."""


@dataclass
class ResumeProcessBench:
    """Result of :func:`run_resume_process_bench`: samples (ms) per probe and chain length."""

    lengths: tuple[int, ...]
    reps: int
    samples_ms: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    checkpoints: dict[int, int] = field(default_factory=dict)
    rss_mb: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """Peak resident memory (MB, ``ru_maxrss``) of each child: ``resume to first step``,
    ``bare import`` and (with a baseline) :data:`BASELINE`, per chain length."""

    def peak_rss(self, probe: str, length: int) -> float:
        """The largest peak RSS (MB) of ``probe``'s children at ``length``."""
        return max(self.rss_mb[probe][length])

    def median(self, probe: str, length: int) -> float:
        return statistics.median(self.samples_ms[probe][length])

    def over_import(self, length: int, cpu: bool = False, probe: str = "resume to first step") -> float:
        """Median of (resume - import), pair by pair (ms of wall time, or of CPU time); ``probe``:
        this version's resume, or :data:`BASELINE`'s."""
        tail = " (cpu)" if cpu else ""
        pairs = zip(self.samples_ms[probe + tail][length], self.samples_ms["bare import" + tail][length])
        return statistics.median(r - i for r, i in pairs)

    def baseline_ratio(self, length: int, cpu: bool = False) -> float | None:
        """Median of (this resume / the baseline's), pair by pair; None without a baseline."""
        tail = " (cpu)" if cpu else ""
        if BASELINE + tail not in self.samples_ms:
            return None
        pairs = zip(self.samples_ms["resume to first step" + tail][length], self.samples_ms[BASELINE + tail][length])
        return statistics.median(r / b for r, b in pairs)

    def markdown(self) -> str:
        lines = [f"`overnight resume` to its first step (whole process, SQLite), median of {self.reps} per "
                 "length; ms",
                 "",
                 "| chain (checkpoints) | resume to first step | bare `import overnight` | resume over import | "
                 "resume / import | CPU: resume over import | load + verify head | load + what a resume checks | "
                 "load + verify every done page | resume peak RSS, MB |",
                 "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in self.lengths:
            r, i = self.median("resume to first step", n), self.median("bare import", n)
            lines.append(f"| {self.checkpoints[n]:,} | {r:.0f} | {i:.0f} | {self.over_import(n):.0f} | {r / i:.1f}x | "
                         f"{self.over_import(n, cpu=True):.0f} | {self.median('load + verify head', n):.1f} | "
                         f"{self.median(CHECKED, n):.1f} | {self.median('load + verify every done page', n):.1f} | "
                         f"{self.peak_rss('resume to first step', n):.0f} |")
        if BASELINE in self.samples_ms:
            lines += ["", "against the baseline's resume, pair by pair (this / baseline)", "",
                      "| chain (checkpoints) | baseline resume, ms | baseline CPU over import, ms | this / baseline (wall) | "
                      "this / baseline (CPU) | baseline peak RSS, MB |",
                      "|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {self.checkpoints[n]:,} | {self.median(BASELINE, n):.0f} | {self.over_import(n, cpu=True, probe=BASELINE):.0f} | "
                      f"{self.baseline_ratio(n):.2f}x | {self.baseline_ratio(n, cpu=True):.2f}x | "
                      f"{self.peak_rss(BASELINE, n):.0f} |" for n in self.lengths]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"lengths": list(self.lengths), "reps": self.reps,
                "by_length": [{"length": n, "checkpoints": self.checkpoints[n],
                               **{p: {"median_ms": round(self.median(p, n), 3),
                                      "samples_ms": [round(x, 3) for x in self.samples_ms[p][n]]}
                                  for p in self.samples_ms},
                               "peak_rss_mb": {p: round(self.peak_rss(p, n), 1) for p in self.rss_mb},
                               "over_import_ms": round(self.over_import(n), 3),
                               "over_import_cpu_ms": round(self.over_import(n, cpu=True), 3)} for n in self.lengths]}

    def plot(self, path: Path) -> Path:
        """A log-log plot of the three probes against chain length (PNG, matplotlib).

        Raises:
            ImportError: matplotlib is not installed (the ``bench`` extra).
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [self.checkpoints[n] for n in self.lengths]
        for probe, style in zip(PROBES, ("o-", "s--", "^-", "<-", "v-")):
            ax.plot(xs, [self.median(probe, n) for n in self.lengths], style, label=probe)
        ax.plot(xs, [max(self.over_import(n), 0.1) for n in self.lengths], "d:", label="resume over import")
        for probe in CPU_PROBES:  # the same processes' CPU time: steadier than wall time under load
            ax.plot(xs, [self.median(probe, n) for n in self.lengths], "x-.", alpha=0.7, label=probe)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("checkpoints on the branch")
        ax.set_ylabel("ms (median)")
        ax.set_title("overnight resume to the first step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


@contextmanager
def _state_dir(path: Path) -> Iterator[None]:
    """``$OVERNIGHT_STATE_DIR`` set to ``path`` in this process meanwhile (then as it was)."""
    saved = os.environ.get("OVERNIGHT_STATE_DIR")
    os.environ["OVERNIGHT_STATE_DIR"] = str(path)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OVERNIGHT_STATE_DIR", None)
        else:
            os.environ["OVERNIGHT_STATE_DIR"] = saved


def _cli(directory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overnight", *args, "--store", f"sqlite://{directory / 'chain.db'}",
                           "--quiet"], cwd=directory, env=env, capture_output=True, text=True, timeout=3600)


def _timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """``(wall ms, cpu ms, peak RSS MB)`` of one child process (cpu: its user + system time, from
    the kernel, ``wait4``; RSS: the peak the child reported itself, :mod:`overnight.bench.memory` --
    ``wait4``'s ``ru_maxrss``, which includes this process's own size, only for a child that
    reported none: an older overnight run as the baseline)."""
    with tempfile.TemporaryFile() as errors, tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=errors)
        _, status, usage = os.wait4(proc.pid, 0)
        ms = (time.perf_counter() - t0) * 1000
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            text = errors.read().decode("utf-8", "replace").strip()
            raise BenchFailed(f"{' '.join(cmd[:4])} exited {proc.returncode}: {text[-500:]}")
        out.seek(0)
        peak = memory.parse(out.read().decode("utf-8", "replace"))
    return ms, (usage.ru_utime + usage.ru_stime) * 1000, usage.ru_maxrss / 1024 if peak is None else peak


def run_resume_process_bench(lengths: tuple[int, ...] = (10, 100, 1000, 5000), *, reps: int = 5,
                             directory: Path, source: Path | None = None,
                             baseline: Path | None = None) -> ResumeProcessBench:
    """Build the chain and time the resumes; see the module docstring.

    Args:
        lengths: chain lengths (checkpoints on the branch), ascending, each >= 3.
        reps: timed resumes (and imports) per length.
        directory: an empty, existing directory for the store, the task file and the state folder.
        source: the ``src`` folder of the overnight the child processes run (default: this one's),
            to compare two versions on one machine at one time.
        baseline: the ``src`` folder of another overnight (e.g. a checkout of the last release):
            its resume is timed too, in turn with the others, as ``baseline resume`` (its
            ratio to this one's in the table). It must read this version's store.

    Raises:
        ValueError: lengths not ascending or under 3, reps < 1.
        RuntimeError: a resume did not stop at its first step, or the chain did not grow.
    """
    if not lengths or list(lengths) != sorted(set(lengths)) or lengths[0] < 3:
        raise ConfigError(f"lengths must be ascending, distinct and at least 3, got {lengths}")
    if reps < 1:
        raise ConfigError(f"reps must be at least 1, got {reps}")
    from overnight.store import open_store
    from overnight.store.blobs import BlobReader
    from overnight.chain.checked import check_done_pages
    from overnight.chain.read import load_head

    directory = Path(directory).resolve()
    (directory / TASK_FILE).write_text(_TASK.format(task_id=TASK_ID, capacity=lengths[-1] + 10, exit_env=EXIT_ENV))
    env = {k: v for k, v in os.environ.items() if k not in (EXIT_ENV, "PYTHONDONTWRITEBYTECODE")}
    env.update(OVERNIGHT_STATE_DIR=str(directory / "state"), OVERNIGHT_ENV_KEY_FILE=str(directory / "env.key"),
               PYTHONPYCACHEPREFIX=str(directory / "pycache"))
    src = str(source or Path(__file__).resolve().parents[2])  # the overnight the child processes run
    env["PYTHONPATH"] = os.pathsep.join([src, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    timed_env = {**env, EXIT_ENV: "1"}
    base_env = {**timed_env, "PYTHONPATH": os.pathsep.join([str(baseline), *env["PYTHONPATH"].split(os.pathsep)[1:]])}
    result = ResumeProcessBench(tuple(lengths), reps, {p: {} for p in (*PROBES, *CPU_PROBES)})
    store = open_store(f"sqlite://{directory / 'chain.db'}")
    try:
        have = 0
        for n in lengths:
            # seq 0 is the creation (no step); the first run's first step is ``plan``
            missing = n - have
            proc = (_cli(directory, env, "run", TASK_FILE, "--max-steps", str(missing - 1)) if have == 0 else
                    _cli(directory, env, "resume", TASK_ID, "--max-steps", str(missing)))
            if proc.returncode not in (0, 75):
                raise BenchFailed(f"growing the chain to {n} failed (exit {proc.returncode}): {proc.stderr[-500:]}")
            head = store.get_checkpoint(store.get_ref(TASK_ID, "main"))
            have = result.checkpoints[n] = head.seq + 1
            resume = [sys.executable, "-m", "overnight", "resume", TASK_ID, "--store",
                      f"sqlite://{directory / 'chain.db'}", "--quiet"]
            bare = [sys.executable, "-c", "import overnight; from overnight.bench.memory import report; report()"]
            _timed(resume, directory, timed_env)  # warm-up (fills the distribution cache), not counted
            _timed(bare, directory, env)
            rs, bs, old = [], [], []
            if baseline is not None:
                _timed(resume, directory, base_env)
            for _ in range(reps):
                rs.append(_timed(resume, directory, timed_env))
                bs.append(_timed(bare, directory, env))
                if baseline is not None:
                    old.append(_timed(resume, directory, base_env))
            for probe, runs in (("resume to first step", rs), ("bare import", bs), (BASELINE, old)):
                if runs:
                    result.samples_ms.setdefault(probe, {})[n] = [w for w, _, _ in runs]
                    result.samples_ms.setdefault(probe + " (cpu)", {})[n] = [c for _, c, _ in runs]
                    result.rss_mb.setdefault(probe, {})[n] = [m for _, _, m in runs]
            for probe, lazy in (("load + verify head", True), (CHECKED, True), ("load + verify every done page", False)):
                loads = []
                for i in range(reps + 1):  # the first: a warm-up
                    t0 = time.perf_counter()
                    loaded, _ = load_head(store, TASK_ID, "main", lazy_done=lazy)
                    if probe == CHECKED:  # with the children's cache of checked pages, filled by their resumes
                        with _state_dir(directory / "state"):
                            check_done_pages(loaded, BlobReader(store), TASK_ID, "main")
                    if i:
                        loads.append((time.perf_counter() - t0) * 1000)
                result.samples_ms[probe][n] = loads
            if store.get_checkpoint(store.get_ref(TASK_ID, "main")).seq + 1 != have:
                raise BenchFailed("a timed resume committed a step: it did not stop at its first step")
    finally:
        store.close()
    return result


__all__ = ["ResumeProcessBench", "run_resume_process_bench"]
