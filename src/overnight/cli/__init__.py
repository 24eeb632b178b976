"""The ``overnight`` command (:func:`main`); the commands themselves are in :mod:`overnight.cli.app`."""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterator

HOOK_EVENTS = ("pre-compact", "session-start", "stop")


def main() -> None:
    """Console-script entry point.

    ``overnight hook claude-code EVENT`` and ``overnight hook run --event NAME``, which a coding
    agent runs at every turn and compaction, are dispatched here without importing the CLI
    framework, the API layer and the runner (most of a cold start: see ``overnight bench mcp``);
    so is ``overnight resume TASK_ID`` with no option but ``--store``, ``--branch``,
    ``--max-steps`` and ``--quiet`` (without the CLI framework: see ``overnight bench resume``).
    The same functions run either way, and anything else -- ``--help`` included -- goes through
    the typer app in :mod:`overnight.cli.app`.
    """
    code = _fast_hook(sys.argv[1:])
    if code is None:
        code = _fast_resume(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    with _imports():
        from overnight.cli.app import main as app_main

    app_main()


@contextmanager
def _imports() -> Iterator[None]:
    """Import the command's modules with the cyclic garbage collector paused, then freeze what they
    made: modules, classes and functions live as long as the process, and a collection would walk
    them again and again (~70 of the collections while ``overnight resume`` imports
    its ~250 modules; see ``overnight bench resume``). The collector runs as before afterwards,
    over what the command allocates from then on (``gc.freeze``: CPython's documented use)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _options(args: list[str], names: dict[str, str],
             switches: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]] | None:
    """``--name VALUE`` / ``--name=VALUE`` options of ``names`` (flag -> key), ``switches`` (flag ->
    key, set to ``""`` when given) and positionals; None for anything it does not know (typer then
    reports it)."""
    opts: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, value = a.partition("=")
        if switches and a in switches:
            opts[switches[a]] = ""
        elif flag in names:
            if not eq:
                if i + 1 >= len(args):
                    return None
                value = args[i + 1]
                i += 1
            opts[names[flag]] = value
        elif a.startswith("-"):
            return None
        else:
            rest.append(a)
        i += 1
    return opts, rest


def _fast_resume(argv: list[str]) -> int | None:
    """``overnight resume TASK_ID [--store URL] [--branch NAME] [--max-steps N] [--quiet]`` run as
    the typer command runs it (the same :func:`overnight.api.resume`, progress display, messages
    and exit codes: :mod:`overnight.cli.exits`), without importing typer and every command module;
    None for any other form (other options, ``--help``, a bad value: typer handles and reports it)."""
    if not argv or argv[0] != "resume":
        return None
    parsed = _options(argv[1:], {"--store": "store", "-s": "store", "--branch": "branch", "-b": "branch",
                                 "--max-steps": "max_steps"}, {"--quiet": "quiet", "-q": "quiet"})
    if parsed is None:
        return None
    opts, rest = parsed
    quiet = "quiet" in opts
    steps = opts.get("max_steps")
    if len(rest) != 1 or (steps is not None and not (steps.isascii() and steps.isdigit() and int(steps) >= 1)):
        return None
    import warnings

    with _imports():
        from overnight import api
        from overnight.cli import render
        from overnight.cli.exits import EXIT_RESUMABLE, print_error, report_run
        from overnight.errors import OvernightError

    warnings.formatwarning = lambda message, category, *args, **kw: f"warning: {message}\n"  # type: ignore
    store = opts["store"] if "store" in opts else (os.environ.get("OVERNIGHT_STORE") or None)
    try:
        try:
            with render.RunProgress(quiet=quiet, events_path=None) as progress:
                result = api.resume(rest[0], store=store, branch=opts.get("branch", "main"), entry=None,
                                    max_steps=int(steps) if steps is not None else None, on_event=progress,
                                    on_drift=None, model=None, max_context_tokens=None, allow_rollback=False)
        except OvernightError as exc:
            return print_error(exc)
        return report_run(result, quiet=quiet)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_RESUMABLE


def _fast_hook(argv: list[str]) -> int | None:
    if len(argv) < 2 or argv[0] != "hook" or any(a in ("--help", "-h") for a in argv):
        return None
    # a hook builds only overnight's own pydantic models: skip pydantic's scan of every installed
    # distribution's entry points for plugins (set the variable to override)
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if argv[1] == "claude-code" and len(argv) >= 3 and argv[2] in HOOK_EVENTS:
        parsed = _options(argv[3:], {"--store": "store", "-s": "store"})
        if parsed is None or parsed[1]:
            return None
        from overnight.hooks import claude_code

        return claude_code.run(argv[2], store=parsed[0].get("store"))
    if argv[1] == "run":
        parsed = _options(argv[2:], {"--store": "store", "-s": "store", "--event": "event", "-e": "event"})
        if parsed is None or "event" not in parsed[0] or len(parsed[1]) > 1:
            return None
        from overnight.errors import ConfigError
        from overnight.hooks import run_generic

        try:
            return run_generic(parsed[0]["event"], parsed[1][0] if parsed[1] else None, store=parsed[0].get("store"))
        except ConfigError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    return None
