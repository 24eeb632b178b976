"""``overnight bench kpi``: the reference KPI table measured with real faults (see
:mod:`overnight.bench.kpi`), written with plots into an output directory and printed."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import typer

from overnight.cli import render
from overnight.cli.common import DEFAULT_POSTGRES


def register(bench_app: typer.Typer) -> None:
    """Add the ``kpi`` command to ``overnight bench``."""

    @bench_app.command("kpi")
    def bench_kpi(
        tasks: int = typer.Option(90, "--tasks", min=1, help="Tasks in the workload (each runs through every "
                                  "configuration)."),
        seed: int = typer.Option(7, "--seed", help="Seed of the workload and its fault schedule."),
        out: Path = typer.Option(Path("bench-results"), "--out", help="Directory for kpi.md, kpi.json, the PNG "
                                 "plots and report.md."),
        postgres: str = typer.Option(os.environ.get("OVERNIGHT_BENCH_POSTGRES", DEFAULT_POSTGRES), "--postgres",
                                     help="PostgreSQL server for the medium-loss trials ('' to skip them; "
                                     "default $OVERNIGHT_BENCH_POSTGRES or the local server)."),
        media_tasks: int = typer.Option(3, "--media-tasks", min=1, help="Tasks per medium-loss trial."),
        keep_work: bool = typer.Option(False, "--keep-work", help="Keep the scratch stores and event logs "
                                       "(OUT/kpi-work)."),
    ) -> None:
        """Completion, continuation, wasted steps, corruption and drift detection, checkpoint overhead,
        resume latency, storage and medium loss: naive baseline vs session vs durable vs router, under
        SIGKILLs, context exhaustion, corruption, drift and medium loss, next to the claimed figures."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from overnight.bench.kpi import CONFIGS, run_kpi
        from overnight.bench.kpi_report import write_report

        out.mkdir(parents=True, exist_ok=True)
        work = out / "kpi-work" if keep_work else Path(tempfile.mkdtemp(prefix="kpi-work-", dir=out))
        total = tasks * len(CONFIGS) + 4
        try:
            with Progress(TextColumn("[bold]bench kpi[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          TextColumn("{task.description}"), console=render.err, transient=True) as progress:
                bar = progress.add_task("", total=total)
                run = run_kpi(tasks, seed, work, postgres_url=postgres or None, media_tasks=media_tasks,
                              on_trial=lambda what: progress.update(bar, advance=1, description=what))
            text = write_report(run, out)
        finally:
            if not keep_work:
                shutil.rmtree(work, ignore_errors=True)
        render.out.print(text, markup=False)
        render.err.print(f"wrote {render.esc(str(out))}/kpi.md, kpi.json, kpi-*.png and report.md "
                         f"in {run.elapsed_s:.0f} s")
