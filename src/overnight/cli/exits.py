"""Exit codes, a typed error printed, a run's outcome reported -- without the CLI framework.

What :mod:`overnight.cli.common` (the typer commands) and the framework-free paths of
:func:`overnight.cli.main` (``hook``, ``resume``) share: the same words and the same exit code
either way. Nothing here imports typer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from overnight.cli import render
from overnight.errors import (
    ConcurrencyError,
    ConfigError,
    DriftError,
    IntegrityError,
    NotFound,
    OvernightError,
    StepError,
    StoreError,
)

if TYPE_CHECKING:
    from overnight.runtime.outcome import RunResult

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTEGRITY, EXIT_BUSY, EXIT_DRIFT, EXIT_RESUMABLE = 0, 1, 2, 3, 4, 5, 75
EXIT_STORE = 6


def exit_code(exc: OvernightError) -> int:
    """The exit code of a typed error (``overnight --help`` lists them)."""
    if isinstance(exc, StoreError):
        return EXIT_STORE
    if isinstance(exc, StepError) and isinstance(exc.__cause__, StoreError):
        return EXIT_STORE
    if isinstance(exc, DriftError):
        return EXIT_DRIFT
    if isinstance(exc, ConcurrencyError):
        return EXIT_BUSY
    if isinstance(exc, IntegrityError):
        return EXIT_INTEGRITY
    if isinstance(exc, (NotFound, ConfigError)):
        return EXIT_USAGE
    if isinstance(exc, StepError):
        return EXIT_FAILED
    return EXIT_FAILED


def print_error(exc: OvernightError) -> int:
    """Print ``error: ...`` (and, for a failed step, where in the step) on stderr; returns the
    exit code (:func:`exit_code`)."""
    render.err.print(f"[bold red]error:[/] {render.esc(exc)}")
    cause = exc.__cause__
    if isinstance(exc, StepError) and cause is not None:
        import traceback

        # a typed error already says what went wrong: show where in the step, not the library's chain
        typed = isinstance(cause, OvernightError)
        render.err.print("".join(traceback.format_exception(cause, chain=not typed)).rstrip(), markup=False)
    return exit_code(exc)


def report_run(result: "RunResult", *, quiet: bool, resume_with: str | None = None) -> int:
    """Print how a run ended (unless ``quiet``) and, when it can go on, the resume command (also
    with ``quiet``: ``resume_with`` when given, else ``overnight resume ...``); returns the exit
    code: 0 complete, 75 resumable, 1 otherwise."""
    if not quiet:
        kept = "resumable" if result.resumable or result.status == "complete" else \
            "NOT resumable: level ephemeral kept its checkpoints in this process only; running it again starts over"
        state = {"complete": "[green]complete[/]", "interrupted": f"[yellow]interrupted ({kept})[/]",
                 "stopped": f"[yellow]stopped after --max-steps ({kept})[/]"}[result.status]
        idle = result.status == "complete" and not (result.steps_run or result.steps_reused or result.created)
        render.err.print(
            f"task [bold]{render.esc(result.task_id)}[/] {state}: {result.done}/{result.total} steps, "
            f"{result.steps_run} run now, head {result.head[7:19]}"
            + ("" if idle else "; " + (  # a complete task run again records nothing: no session to name
                f"the task's context window #{result.session} (each run and each compaction starts a new one)"
                if result.used_model else f"session #{result.session} (each run starts a new one; no model used)"))
        )
        u = result.usage
        if u.get("calls") or u.get("replayed_calls") or result.compactions:
            render.err.print(f"model: {u.get('calls', 0)} call(s), {u.get('tokens_in', 0)} tokens in, "
                             f"{u.get('tokens_out', 0)} out; {u.get('replayed_calls', 0)} call(s) "
                             f"({u.get('replayed_tokens', 0)} tokens) replayed from the journal; "
                             f"{result.compactions} compaction(s)")
    if result.resumable:  # also with --quiet: where to go on is not progress chatter
        from overnight.runtime.outcome import resume_command

        render.err.print("resume with: " + render.esc(resume_with or resume_command(
            result.task_id, result.branch, result.store_url, result.resume_file)))
        return EXIT_RESUMABLE
    if result.status != "complete":  # ephemeral: nothing left to resume
        return EXIT_FAILED
    return EXIT_OK


__all__ = ["EXIT_BUSY", "EXIT_DRIFT", "EXIT_FAILED", "EXIT_INTEGRITY", "EXIT_OK", "EXIT_RESUMABLE", "EXIT_STORE",
           "EXIT_USAGE", "exit_code", "print_error", "report_run"]
