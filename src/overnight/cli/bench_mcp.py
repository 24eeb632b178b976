"""``overnight bench mcp``: task_checkpoint through a real MCP client session, and hook runs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from overnight.cli import render


def register(bench_app: typer.Typer) -> None:
    """Add the ``mcp`` command to ``overnight bench``."""

    @bench_app.command("mcp")
    def bench_mcp(
        calls: int = typer.Option(200, "--calls", min=5, help="task_checkpoint calls (and no-op calls) measured."),
        hooks: int = typer.Option(20, "--hooks", min=3, help="Runs of each hook measured."),
        directory: Optional[Path] = typer.Option(None, "--dir", help="Directory on the disk to measure (default: "
                                                 "a temporary directory under the current one)."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    ) -> None:
        """task_checkpoint median/p99 through a real stdio MCP client session against a no-op tool call of the
        same SDK, and hook run wall time (interpreter start included) against `python -c pass`, same run."""
        from overnight.cli.common import need_extra as _need_extra

        try:
            from overnight.bench.mcp import run_mcp_bench

            result = run_mcp_bench(calls=calls, hooks=hooks, directory=directory)
        except ImportError as exc:
            _need_extra(exc, "mcp")
        if as_json:
            render.print_json(result.to_json())
            return
        render.out.print(result.markdown())
