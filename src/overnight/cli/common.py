"""What every ``overnight`` command shares: exit codes, printing a typed error, a missing extra.

Internal to :mod:`overnight.cli`; :mod:`overnight.cli.app` and the ``bench`` command modules
import it (neither imports the other's private helpers).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NoReturn

import typer

from overnight.cli import render
from overnight.cli.exits import (  # noqa: F401 (re-exported)
    EXIT_BUSY, EXIT_DRIFT, EXIT_FAILED, EXIT_INTEGRITY, EXIT_OK, EXIT_RESUMABLE, EXIT_STORE, EXIT_USAGE, exit_code,
    print_error,
)
from overnight.errors import OvernightError

EXIT_CODES_HELP = (
    "Exit codes: 0 complete | 1 step failed | 2 usage / not found | 3 integrity (nothing verifies, a ref "
    "moved back, code outside the project) | 4 busy (task held by another process) | 5 drift abort | "
    "6 store refused (disk full, read-only, unreachable) | 75 resumable (interrupted or --max-steps; "
    "run `overnight resume TASK_ID`)."
)

StoreOpt = typer.Option(None, "--store", "-s", envvar="OVERNIGHT_STORE",
                        help="Store URL: sqlite://PATH, file://DIR, postgresql://HOST/DB?schema=NAME or "
                        "s3://BUCKET/PREFIX. Default: sqlite://.overnight/overnight.db (or overnight.toml's store.url).")
BranchOpt = typer.Option("main", "--branch", "-b", help="Branch to use.")
JsonOpt = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")
PlainQuietOpt = typer.Option(False, "--quiet", "-q", help="No progress bar (results, errors and warnings still "
                             "print).")
DirOpt = typer.Option(None, "--dir", help="Directory on the disk to measure (default: a temporary directory "
                      "under the current one).")
"""A benchmark's scratch directory (``--dir``)."""

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
"""The database the ``bench`` commands use unless ``--postgres`` names another (the test server, as
in the test suite; ``overnight.bench`` has its own copy: the CLI loads the benchmarks only when one runs)."""


def fail(exc: OvernightError) -> None:
    raise typer.Exit(print_error(exc))


def check_python_entry(entry: str, command: str) -> None:
    """Refuse a task definition that names a file which is not Python (``overnight submit README.md``)
    before it is imported as a module named ``README``: a file that exists, or a path with a suffix,
    other than ``.py``. ``MODULE:ATTR`` and a missing ``FILE.py`` go on to the library's own errors.

    Raises ConfigError (exit 2)."""
    from pathlib import Path

    from overnight.errors import ConfigError

    head, sep, tail = entry.rpartition(":")
    target = head if sep and head and tail.isidentifier() else entry
    if not target or target.endswith(".py"):
        return
    path = Path(target).expanduser()
    pathlike = "/" in target or "\\" in target
    if path.is_file() or (pathlike and path.suffix and not path.is_dir()):
        raise ConfigError(f"{target} is not a Python file; {command} takes FILE.py[:TASK] or module:attr",
                          hint="name the .py file that defines the task (overnight.Task), e.g. "
                          f"`overnight {command} examples/api_report.py`")


def need_extra(exc: ImportError, extras: str) -> NoReturn:
    """Exit 2 saying which extra a command needs (``extras``: ``bench``, ``langgraph,bench``, ...)."""
    render.err.print(f"[bold red]error:[/] {render.esc(exc)}; install the extra: "
                     + render.esc(f"pip install 'overnight[{extras}]' (from a clone: pip install '.[{extras}]')"))
    raise typer.Exit(EXIT_USAGE)


@contextmanager
def failing(extras: str | None = None) -> Iterator[None]:
    """Around a command's library call: a typed error is printed and exits with its code
    (:func:`fail`); with ``extras`` (``bench``, ``mcp`` ...), an ImportError exits 2 naming the extra
    to install (:func:`need_extra`). Anything else propagates."""
    try:
        yield
    except OvernightError as exc:
        fail(exc)
    except ImportError as exc:
        if extras is None:
            raise
        need_extra(exc, extras)


def store_further_up_note(store: str | None) -> str | None:
    """For a command about to write the default store (no ``--store``, ``$OVERNIGHT_STORE`` or
    ``overnight.toml`` store) where none exists yet, while one exists in a parent folder (run in a
    project's subfolder): the note naming it
    (:func:`~overnight.store.task_location.further_up_hint`); None otherwise -- then the command
    creates the store here as usual. Nothing is opened."""
    if store is not None:
        return None
    from overnight.store import default_store_url, exists, location
    from overnight.store.task_location import further_up_hint

    url = default_store_url()
    if exists(url):
        return None
    hint = further_up_hint(url)
    return None if hint is None else f"no store here, so this one creates a new store at {location(url)}; {hint}"


@contextmanager
def noting_store_further_up(store: str | None) -> Iterator[None]:
    """Around a command that may create the default store: when it did create it, and a store
    exists in a parent folder (:func:`store_further_up_note`), say so on stderr afterwards -- a
    task run in a project's subfolder lands in a new, separate store that ``overnight ls`` in the
    project folder does not list."""
    note = store_further_up_note(store)
    try:
        yield
    finally:
        from overnight.store import default_store_url, exists

        if note is not None and exists(default_store_url()):
            render.err.print(f"[yellow]note:[/] {render.esc(note)}")
