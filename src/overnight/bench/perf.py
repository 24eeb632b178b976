"""``overnight bench perf``: issue 14's cost targets, judged from one run of every benchmark they need.

Runs these benchmarks in one process, each against baselines measured in the same run, then
judges every figure against its target (:mod:`overnight.bench.targets`):

1. storage growth against LangGraph's ``SqliteSaver`` (:mod:`overnight.bench.storage`; run first,
   so the process's peak RSS after it is that benchmark's) and bytes per checkpoint
   (:mod:`overnight.bench.step_bytes`);
2. commit latency (:mod:`overnight.bench.commit`) of overnight on SQLite, a ``file://`` directory
   and PostgreSQL, against LangGraph's ``SqliteSaver`` and ``PostgresSaver`` and a bare
   write+fsync of the same bytes (the floor);
3. resume latency against chain length (:mod:`overnight.bench.resume`) -- overnight's verified
   head load and its whole resume session on each store, against LangGraph's ``get_tuple``;
4. ``verify --all`` and ``verify TASK`` throughput in MB/s and peak RSS at two store sizes
   (:mod:`overnight.bench.verify`) against ``hashlib.sha256`` in memory;
5. the whole ``overnight resume`` process to its first step against chain length
   (:mod:`overnight.bench.resume_process`), over a bare ``python -c 'import overnight'``;
6. the adapters against the savers they replace: a LangGraph chat (:mod:`overnight.bench.langgraph`)
   and an Agents SDK session (:mod:`overnight.bench.agents_session`).

:func:`write_report` puts into one directory ``perf.md`` (the Markdown tables), ``perf.json``
(settings, machine, every raw sample, the judged targets) and PNG plots drawn with matplotlib:
``commit_latency.png`` (median and p99 per system and medium) and ``resume_latency.png``
(milliseconds against chain length, log-log), and ``resume_process.png`` (the whole process, log-log).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from overnight.bench import targets as judged
from overnight.bench.agents_session import SessionBench, run_session_bench
from overnight.bench.commit import DEFAULT_POSTGRES, CommitBench, open_overnight, run_commit_bench
from overnight.bench.commit import SYSTEMS as COMMIT_SYSTEMS
from overnight.bench.resume import SYSTEMS as RESUME_SYSTEMS
from overnight.bench.resume import ResumeBench, run_resume_bench
from overnight.bench.langgraph import LangGraphBench, run_langgraph_bench
from overnight.bench.resume_process import ResumeProcessBench, run_resume_process_bench
from overnight.bench.step_bytes import StepBytesBench, run_step_bytes_bench
from overnight.bench.storage import StorageBench, run_storage_bench
from overnight.bench.verify import VerifyBench, run_verify_bench

#: files :func:`write_report` writes into its directory
FILES = ("perf.md", "perf.json", "commit_latency.png", "resume_latency.png", "resume_process.png")


@dataclass(frozen=True)
class PerfSettings:
    """Sizes of one run.

    Attributes:
        commits: commits per system in the commit benchmark.
        state_kb: state size per commit (KB).
        lengths: chain lengths (checkpoints) at which resume is timed, ascending.
        reps: timed resumes per system and length.
        verify_checkpoints, verify_mb: size of the store ``verify --all`` and ``verify TASK``
            check (checkpoints, MB of distinct artifact content).
        verify_scales: the store sizes checked, as multiples of that (peak RSS across them).
        process_lengths: chain lengths at which the whole ``overnight resume`` process is timed
            (each >= 3, ascending; building the chain runs that many steps).
        step_bytes_steps: steps of ``bench step-bytes`` (>= 10; 0 leaves it out).
        storage_steps: steps of ``bench storage`` (>= 2; 0 leaves it out).
        langgraph_turns: turns of ``bench langgraph`` (0 leaves it out).
        session_turns: turns of ``bench agents-session`` (0 leaves it out).
    """

    commits: int = 200
    state_kb: float = 10.0
    lengths: tuple[int, ...] = (10, 100, 1000, 5000)
    reps: int = 5
    verify_checkpoints: int = 1000
    verify_mb: float = 100.0
    verify_scales: tuple[int, ...] = (1, 2)
    process_lengths: tuple[int, ...] = (10, 1000, 5000)
    step_bytes_steps: int = 1000
    storage_steps: int = 500
    langgraph_turns: int = 500
    session_turns: int = 200


#: the default run (the sizes issue 14 names: ~5 minutes on 2 idle cores) and ``--quick`` (~20 s;
#: the same targets judged at smaller sizes)
DEFAULT = PerfSettings()
QUICK = PerfSettings(commits=30, lengths=(10, 100), reps=3, verify_checkpoints=50, verify_mb=5.0,
                     process_lengths=(10, 30), step_bytes_steps=100, storage_steps=50, langgraph_turns=50,
                     session_turns=50)


@dataclass
class PerfReport:
    """Result of :func:`run_perf`: the benchmarks (None: left out), the settings, the machine, the
    run time (s). :meth:`targets` judges them."""

    settings: PerfSettings
    machine: dict[str, Any]
    commit: CommitBench
    resume: ResumeBench
    verify: VerifyBench
    elapsed_s: float
    resume_process: ResumeProcessBench | None = None
    step_bytes: StepBytesBench | None = None
    storage: StorageBench | None = None
    langgraph: LangGraphBench | None = None
    session: SessionBench | None = None

    def targets(self) -> list[judged.Target]:
        """Issue 14's targets, each figure of this run judged (:func:`overnight.bench.targets.judge`)."""
        return judged.judge(self)

    def markdown(self) -> str:
        m = self.machine
        optional = [("Bytes per checkpoint", self.step_bytes), ("Storage growth against SqliteSaver", self.storage),
                    ("LangGraph: OvernightSaver against SqliteSaver", self.langgraph),
                    ("OpenAI Agents SDK: OvernightSession against SQLiteSession", self.session)]
        return "\n\n".join([
            "# overnight bench perf",
            f"{m['date']} · {m['platform']} · {m['cpus']} CPUs · Python {m['python']} · load average "
            f"{m['loadavg']} at start · {self.elapsed_s:.0f} s",
            "## Targets (issue 14)\n\n" + judged.INTRO
            + ("" if self.settings == DEFAULT else
               "\n\n**Sizes smaller than the issue's (`--quick`, or settings of your own): each verdict is a hint "
               "for these sizes, not the issue's figure.**")
            + "\n\n" + judged.markdown(self.targets()),
            *(f"## {title}\n\n" + bench.markdown() for title, bench in optional if bench is not None),
            "## Commit latency\n\n" + self.commit.markdown(),
            "## Resume latency against chain length\n\n" + self.resume.markdown(),
            "## Verify throughput\n\n" + self.verify.markdown(),
            *(["## Resume, the whole process\n\n" + self.resume_process.markdown()] if self.resume_process else []),
            "![commit latency](commit_latency.png)\n\n![resume latency](resume_latency.png)"
            + ("\n\n![resume process](resume_process.png)" if self.resume_process else ""),
        ]) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"settings": asdict(self.settings), "issue_sizes": self.settings == DEFAULT, "machine": self.machine,
                "elapsed_s": round(self.elapsed_s, 3),
                "commit": self.commit.to_json(), "resume": self.resume.to_json(), "verify": self.verify.to_json(),
                "resume_process": self.resume_process.to_json() if self.resume_process else None,
                **{name: bench.to_json() if bench is not None else None
                   for name, bench in (("step_bytes", self.step_bytes), ("storage", self.storage),
                                       ("langgraph", self.langgraph), ("session", self.session))},
                "targets": judged.to_json(self.targets())}


def machine() -> dict[str, Any]:
    """Where and when the run happened: UTC date, platform, CPU count, Python, 1-minute load."""
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "platform": platform.platform(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "loadavg": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def run_perf(settings: PerfSettings = DEFAULT, *, postgres_url: str | None = DEFAULT_POSTGRES,
             directory: Path | None = None) -> PerfReport:
    """Run the benchmarks (see the module docstring) on every system.

    Args:
        settings: sizes (:data:`DEFAULT`, :data:`QUICK`, or your own).
        postgres_url: the PostgreSQL server (fresh schemas, dropped afterwards); None leaves out
            the PostgreSQL systems (overnight's and LangGraph's).
        directory: disk to measure; temporary files go under it (default the current directory).

    Raises:
        ImportError: matplotlib or a langgraph checkpointer is missing (``pip install 'overnight[bench]'``).
        ConfigError: the PostgreSQL server is unreachable.
    """
    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    info = machine()
    t0 = time.perf_counter()
    def served(systems: tuple[str, ...]) -> tuple[str, ...]:
        return systems if postgres_url is not None else tuple(s for s in systems if "ostgres" not in s)

    if postgres_url is not None:  # an unreachable server fails the run now, not after minutes of the others
        with ExitStack() as stack:
            open_overnight("overnight postgres", base, postgres_url, stack)
    # first: its peak RSS is read from the process's high-water mark, which later runs would raise
    storage = run_storage_bench(settings.storage_steps, directory=base) if settings.storage_steps else None
    step_bytes = run_step_bytes_bench(settings.step_bytes_steps, directory=base) if settings.step_bytes_steps else None
    commit = run_commit_bench(settings.commits, settings.state_kb, base, systems=served(COMMIT_SYSTEMS),
                              postgres_url=postgres_url or DEFAULT_POSTGRES)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-resume-", dir=base) as tmp:
        resume = run_resume_bench(settings.lengths, reps=settings.reps, systems=served(RESUME_SYSTEMS),
                                  directory=Path(tmp), postgres_url=postgres_url or DEFAULT_POSTGRES)
    verify = run_verify_bench(settings.verify_checkpoints, settings.verify_mb, base, scales=settings.verify_scales)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-resume-process-", dir=base) as tmp:
        process = run_resume_process_bench(settings.process_lengths, reps=settings.reps, directory=Path(tmp))
    langgraph = run_langgraph_bench(settings.langgraph_turns, directory=base) if settings.langgraph_turns else None
    session = run_session_bench(settings.session_turns, directory=base) if settings.session_turns else None
    return PerfReport(settings, info, commit, resume, verify, time.perf_counter() - t0, process, step_bytes, storage,
                      langgraph, session)


_COLOURS = {"overnight": "#1f77b4", "LangGraph": "#ff7f0e", "floor": "#7f7f7f"}


def _colour(name: str) -> str:
    return next((c for prefix, c in _COLOURS.items() if name.startswith(prefix)), "#2ca02c")


def write_report(report: PerfReport, out: Path) -> list[Path]:
    """Write :data:`FILES` into ``out`` (created if missing). Returns their paths.

    Raises:
        ImportError: matplotlib is not installed (the ``bench`` extra).
        OSError: ``out`` cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FILES]
    paths[0].write_text(report.markdown(), encoding="utf-8")
    paths[1].write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")

    series = report.commit.series
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(series) + 1.5))
    names = [s.name for s in series]
    medians = [s.median for s in series]
    p99 = [s.pct(99) - s.median for s in series]
    ax.barh(names, medians, xerr=[[0] * len(series), p99], color=[_colour(n) for n in names], capsize=3)
    ax.invert_yaxis()
    ax.set_xlabel("commit latency, ms (bar: median, whisker: p99)")
    ax.set_title(f"Commit latency, {report.commit.n} commits of ~{report.commit.state_bytes / 1024:.0f} KB each")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    lengths = report.resume.lengths
    systems = list(dict.fromkeys(s.system for s in report.resume.series))
    for s in report.resume.series:  # a colour per system; dashed: overnight's whole resume session
        ax.plot(lengths, [s.median(n) for n in lengths], marker="o", label=s.name,
                color=plt.get_cmap("tab10")(systems.index(s.system)),
                linestyle="--" if s.name.endswith("resume session") else "-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("checkpoints on the branch")
    ax.set_ylabel("resume latency, ms (median)")
    ax.set_title("Resume latency against chain length")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[3], dpi=110)
    plt.close(fig)
    if report.resume_process is not None:
        report.resume_process.plot(paths[4])
    else:
        paths = paths[:4]
    return paths

