"""``overnight bench``: the benchmark commands' group. Each prints a table with ratios against a
named baseline measured in the same run; a benchmark's code is in :mod:`overnight.bench` and is
imported only inside its command. The larger commands have a module each (``bench_*.py``); the
queue's (``bench fleet``) are registered by :mod:`overnight.cli.fleet`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from overnight.cli import bench_agents, bench_kpi, bench_langgraph, bench_mcp, bench_perf, bench_resume, bench_storage
from overnight.cli import render
from overnight.cli.common import DirOpt, JsonOpt, failing

bench_app = typer.Typer(help="Benchmarks that print a table (ratios against a named baseline, same run).",
                        no_args_is_help=True)
bench_storage.register(bench_app)
bench_perf.register(bench_app)
bench_langgraph.register(bench_app)
bench_agents.register(bench_app)
bench_kpi.register(bench_app)
bench_mcp.register(bench_app)
bench_resume.register(bench_app)


@bench_app.command("commit")
def bench_commit(
    n: int = typer.Option(300, "--n", min=10, help="Commits per system."),
    state_kb: float = typer.Option(10.0, "--state-kb", min=0.1, help="Size of the state per commit (KB)."),
    directory: Optional[Path] = DirOpt,
    cpu: bool = typer.Option(False, "--cpu", help="Also run both SQLite writers on their own files with "
                             "synchronous=OFF: their time besides the flush (diagnostic rows, '(no fsync)')."),
    as_json: bool = JsonOpt,
) -> None:
    """Checkpoint commit latency: overnight vs LangGraph SqliteSaver.put vs a raw write+fsync floor."""
    from overnight.bench.commit import CPU_SYSTEMS, LOCAL_SYSTEMS, run_commit_bench

    with failing("bench"):
        result = run_commit_bench(n=n, state_kb=state_kb, directory=directory,
                                  systems=CPU_SYSTEMS if cpu else LOCAL_SYSTEMS)
    render.report(result, as_json)


@bench_app.command("verify")
def bench_verify(
    checkpoints: int = typer.Option(1000, "--checkpoints", min=2, help="Checkpoints (steps) in the store."),
    mb: float = typer.Option(100.0, "--mb", min=0.1, help="MB of distinct artifact content in the store."),
    directory: Optional[Path] = typer.Option(None, "--dir", help="Directory on the disk to measure."),
    scales: str = typer.Option("1,3", "--scales", help="Store sizes, as multiples of --checkpoints and --mb "
                               "(peak RSS flat across them: memory does not grow with the store)."),
    processes: str = typer.Option("auto", "--processes", help="Helper processes hashing content, one run "
                                  "each: 'auto' (verify's default), 0 (threads only), N; e.g. auto,0."),
) -> None:
    """Time `overnight verify --all` and `verify TASK` (wall, CPU, MB/s against sha256 in memory, peak
    RSS) on stores of N checkpoints and M MB of artifacts, times each scale."""
    from overnight.bench.verify import run_verify_bench

    sizes = tuple(int(s) for s in scales.split(",") if s.strip())
    procs = tuple(None if p.strip() == "auto" else int(p) for p in processes.split(",") if p.strip())
    render.out.print(run_verify_bench(checkpoints=checkpoints, mb=mb, directory=directory, scales=sizes,
                                      processes=procs).markdown())


@bench_app.command("ui")
def bench_ui(
    tasks: int = typer.Option(1000, "--tasks", min=1, help="Small tasks in the store."),
    checkpoints: int = typer.Option(5000, "--checkpoints", min=3, help="Checkpoints of the one long task."),
    repeat: int = typer.Option(7, "--repeat", min=1, help="Timed requests per page (median reported)."),
    directory: Optional[Path] = typer.Option(None, "--dir", help="Directory for the temporary store."),
    as_json: bool = JsonOpt,
) -> None:
    """Render time of the dashboard's tasks page (N tasks) and task page (a chain of M
    checkpoints) on local SQLite, against `overnight ls` and `overnight show` on the same store.
    Target: under 300 ms each. Needs the ui extra."""
    with failing("ui"):
        from overnight.bench.ui import run_ui_bench

        result = run_ui_bench(tasks=tasks, checkpoints=checkpoints, repeat=repeat, directory=directory)
    render.report(result, as_json)
