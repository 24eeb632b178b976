"""``overnight bench langgraph``: OvernightSaver vs LangGraph's SqliteSaver on a growing chat."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from overnight.cli import render
from overnight.cli.common import DirOpt, failing


def register(bench_app: typer.Typer) -> None:
    """Add the ``langgraph`` command to ``overnight bench``."""

    @bench_app.command("langgraph")
    def bench_langgraph(
        turns: int = typer.Option(500, "--turns", min=2, help="Turns; each appends one ~1-2 KB message."),
        directory: Optional[Path] = DirOpt,
    ) -> None:
        """Stored bytes and per-turn put latency of a message-accumulating LangGraph graph:
        OvernightSaver vs SqliteSaver, same turns, same run."""
        with failing("langgraph,bench"):
            from overnight.bench.langgraph import run_langgraph_bench

            result = run_langgraph_bench(turns=turns, directory=directory)
        render.out.print(result.markdown())
