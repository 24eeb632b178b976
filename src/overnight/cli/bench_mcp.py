"""``overnight bench mcp``: task_checkpoint through a real MCP client session, and hook runs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from overnight.cli import render
from overnight.cli.common import DirOpt, JsonOpt, failing


def register(bench_app: typer.Typer) -> None:
    """Add the ``mcp`` command to ``overnight bench``."""

    @bench_app.command("mcp")
    def bench_mcp(
        calls: int = typer.Option(200, "--calls", min=5, help="task_checkpoint calls (and no-op calls) measured."),
        hooks: int = typer.Option(20, "--hooks", min=3, help="Runs of each hook measured."),
        directory: Optional[Path] = DirOpt,
        as_json: bool = JsonOpt,
    ) -> None:
        """task_checkpoint median/p99 through a real stdio MCP client session against a no-op tool call of the
        same SDK, and hook run wall time (interpreter start included) against `python -c pass`, same run."""
        with failing("mcp"):
            from overnight.bench.mcp import run_mcp_bench

            result = run_mcp_bench(calls=calls, hooks=hooks, directory=directory)
        render.report(result, as_json)
