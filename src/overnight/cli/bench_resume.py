"""``overnight bench resume``: the whole ``overnight resume`` process to its first step, against
chain length, over a bare ``import overnight`` (table and log-log plot)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer

from overnight.cli import render
from overnight.cli.common import failing


def _lengths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"--chain takes comma-separated integers, got {text!r}") from None


def register(bench_app: typer.Typer) -> None:
    """Add the ``resume`` command to ``overnight bench``."""

    @bench_app.command("resume")
    def bench_resume(
        chain: str = typer.Option("10,100,1000,5000", "--chain", help="Chain lengths (checkpoints), ascending, "
                                  "comma-separated; the chain is grown from one to the next."),
        reps: int = typer.Option(5, "--reps", min=1, help="Timed resumes (and bare imports) per length."),
        out: Path = typer.Option(Path("bench-results"), "--out", help="Directory for resume_process.md, "
                                 "resume_process.json and resume_process.png (created if missing)."),
        baseline: Optional[Path] = typer.Option(None, "--baseline-src", help="The src folder of another overnight "
                                                "(e.g. a checkout of main): its resume is timed in turn too, as "
                                                "the baseline of a ratio."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON instead of the table."),
    ) -> None:
        """Time `overnight resume` in a fresh process up to the start of its first step (SQLite store,
        a chain of small checkpoints) against a bare `python -c 'import overnight'`, alternating the
        two, at each --chain length; and, in this process, the head's load and verification. Writes
        a Markdown table, the raw samples and a log-log plot into --out. Building 5,000 checkpoints
        takes minutes."""
        from overnight.bench.resume_process import run_resume_process_bench

        with failing("bench"):
            try:
                with tempfile.TemporaryDirectory(prefix="overnight-bench-resume-") as tmp:
                    bench = run_resume_process_bench(_lengths(chain), reps=reps, directory=Path(tmp),
                                                     baseline=baseline.resolve() if baseline else None)
                out.mkdir(parents=True, exist_ok=True)
                (out / "resume_process.md").write_text(bench.markdown() + "\n", encoding="utf-8")
                (out / "resume_process.json").write_text(json.dumps(bench.to_json(), indent=2) + "\n",
                                                         encoding="utf-8")
                plot = bench.plot(out / "resume_process.png")
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from None
        render.report(bench, as_json)
        render.err.print(f"wrote {out / 'resume_process.md'}, {out / 'resume_process.json'}, {plot}")
