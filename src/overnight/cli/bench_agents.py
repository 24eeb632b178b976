"""``overnight bench agents-session``: the Agents SDK session adapter against the SDK's SQLiteSession."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from overnight.cli import render
from overnight.cli.common import DirOpt, failing


def register(bench_app: typer.Typer) -> None:
    """Add the ``agents-session`` command to ``overnight bench``."""

    @bench_app.command("agents-session")
    def bench_agents_session(
        turns: int = typer.Option(200, "--turns", min=30, help="Conversation turns (two items each)."),
        message_bytes: int = typer.Option(400, "--message-bytes", min=10, help="Bytes of text per message."),
        directory: Optional[Path] = DirOpt,
    ) -> None:
        """OvernightSession vs the Agents SDK's SQLiteSession: latency per operation, bytes on disk."""
        with failing("agents"):
            from overnight.bench.agents_session import run_session_bench

            result = run_session_bench(turns=turns, message_bytes=message_bytes, directory=directory)
        render.out.print(result.markdown())
