"""``overnight bench storage``: stored bytes of a 500-step growing task vs LangGraph's SqliteSaver."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from overnight.cli.common import DEFAULT_POSTGRES, DirOpt, EXIT_USAGE, JsonOpt, failing
from overnight.cli import render


def register(bench_app: typer.Typer) -> None:
    """Add the ``storage`` and ``step-bytes`` commands to ``overnight bench``."""

    @bench_app.command("storage")
    def bench_storage(
        steps: int = typer.Option(500, "--steps", min=2, help="Steps of the task (one checkpoint each)."),
        start_kb: float = typer.Option(500.0, "--start-kb", min=0.0, help="Artifact size before the first append (KB)."),
        append_kb: float = typer.Option(1.0, "--append-kb", min=0.01, help="Appended to the artifact per step (KB)."),
        message_kb: float = typer.Option(2.0, "--message-kb", min=0.01, help="Message text added per step (KB)."),
        media: str = typer.Option("sqlite", "--media", help="Overnight stores to measure, comma-separated: sqlite, "
                                  "file, postgres (LangGraph's SqliteSaver runs beside sqlite)."),
        postgres: str = typer.Option(DEFAULT_POSTGRES, "--postgres",
                                     help="Server for the postgres medium (a fresh schema, dropped afterwards)."),
        directory: Optional[Path] = DirOpt,
        keep: bool = typer.Option(False, "--keep", help="Keep the stores (SQLite files, file store) to inspect "
                                  "them; their paths are in --json's \"where\"."),
        as_json: bool = JsonOpt,
    ) -> None:
        """Storage growth: a task whose artifact grows by appends (500 KB + 1 KB per step) and whose
        message list grows 2 KB per step, run by overnight's runner; bytes stored (database file after
        a WAL checkpoint) against LangGraph's SqliteSaver storing the same state each step, in the same
        run; commit time per step."""
        from overnight.bench.storage import run_storage_bench

        with failing("bench"):
            try:
                result = run_storage_bench(steps, start_kb=start_kb, append_kb=append_kb, message_kb=message_kb,
                                           media=tuple(m.strip() for m in media.split(",") if m.strip()),
                                           postgres_url=postgres, directory=directory, keep=keep)
            except ValueError as exc:
                render.err.print(f"[bold red]error:[/] {render.esc(exc)}")
                raise typer.Exit(EXIT_USAGE)
        render.report(result, as_json)

    @bench_app.command("step-bytes")
    def bench_step_bytes(
        steps: int = typer.Option(1000, "--steps", min=10, help="Steps measured per workload (one checkpoint each)."),
        large_kb: float = typer.Option(256.0, "--large-kb", min=1.0,
                                       help="Size of the value that stays unchanged in the second workload (KB)."),
        directory: Optional[Path] = DirOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """Bytes per checkpoint: a task whose every step sets one small field of ctx.state, and the
        same with a large value that never changes; SQLite store growth per step, broken down by
        what the bytes are (record, state document, pages, ditto copies, journal, SQLite overhead)."""
        from overnight.bench.step_bytes import run_step_bytes_bench

        with failing():
            result = run_step_bytes_bench(steps, large_kb=large_kb, directory=directory)
        render.report(result, as_json)
