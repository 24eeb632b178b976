"""The CLI's one output layer: rich tables for people, ``--json`` for scripts, progress bars.

rich is imported when something is first printed through it (``out``, ``err``, a table, a
progress bar), not with this module: ``overnight resume --quiet`` that prints nothing never loads it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from overnight.units import human_bytes, human_duration  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from rich.console import Console

    from overnight.runtime.outcome import RunEvent

    out: Console
    err: Console


def _width(stream: Any) -> int | None:
    # a pipe or file gets wide tables (no wrapping mid-id); a terminal gets its own width
    return None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))


def _console(name: str) -> Console:
    """``out`` (stdout) or ``err`` (stderr): a rich console, made on first use. No emoji codes:
    ``:a:`` in a task id (``langgraph:a:b``) is text, never an emoji."""
    console = globals().get(name)
    if console is None:
        from rich.console import Console

        console = globals()[name] = Console(stderr=name == "err", highlight=False, soft_wrap=True, emoji=False,
                                            width=_width(sys.stderr if name == "err" else sys.stdout))
    return console


def __getattr__(name: str) -> Any:  # render.out / render.err (PEP 562)
    if name in ("out", "err"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_jsonable(value: Any) -> Any:
    """Dataclasses and containers -> plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """JSON on stdout (lone surrogates escaped, so any stored string prints)."""
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, ensure_ascii=True) + "\n")


def report(result: Any, as_json: bool) -> None:
    """A benchmark's result on stdout: ``result.to_json()`` with --json, else its ``markdown()``
    table as written (no rich markup)."""
    if as_json:
        print_json(result.to_json())
    else:
        _console("out").print(result.markdown(), markup=False)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, justify: dict[str, str] | None = None,
          no_wrap: Iterable[str] = ()) -> None:
    """A table on stdout; columns named in ``no_wrap`` keep their width (ids, times, sizes) up to
    half the terminal's, 48 at least (longer cells end in ``…``), the others fold when the terminal is
    narrow. On a pipe or file (without ``$COLUMNS``) a row is never folded or cut: each stays on
    one line, however wide, so ``grep`` finds it whole."""
    from rich.table import Table
    from rich.text import Text

    keep = set(no_wrap)
    console = _console("out")
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    # on a terminal, a kept column is at most half the width, 48 at least (a 400-character LangGraph
    # thread id would squeeze every other column to nothing): longer cells end in "…" (--json has them)
    cap = None if piped else max(48, console.width // 2)
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, justify=(justify or {}).get(c, "left"),  # type: ignore[arg-type]
                     overflow="ellipsis" if c in keep else "fold", no_wrap=c in keep,
                     max_width=cap if c in keep else None)
    for r in rows:
        t.add_row(*[Text(safe(v, one_line=True)) for v in r])  # a line break in stored text would split a row
    if piped:  # a pipe or file: one line per row, for grep
        from rich.measure import Measurement

        wide = console.options.update_width(1 << 16)
        saved, console.width = console.width, max(Measurement.get(console, wide, t).maximum, 1)
        try:
            console.print(t, crop=False)
        finally:
            console.width = saved
        return
    console.print(t)


def safe(value: Any, *, one_line: bool = False) -> str:
    """Printable text for any stored value (lone surrogates and control characters escaped, bidi
    controls such as U+202E and U+2066-U+2069 included: ``str.isprintable`` is false for them);
    ``one_line``: line breaks too (a table cell, a goal on its line)."""
    text = "" if value is None else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    kept = " " if one_line else " \n"
    return "".join(c if c.isprintable() or c in kept else repr(c)[1:-1] for c in text)


def esc(value: Any, *, one_line: bool = False) -> str:
    """:func:`safe` text escaped for rich markup (``[i=4]`` in a step name is text, not a style)."""
    from rich.markup import escape

    return escape(safe(value, one_line=one_line))


_NOTES = {
    "step_retry": (False, "[yellow]retrying[/] {step}: {detail}"),
    "stop_requested": (True, "[yellow]{detail}[/]"),
    "drift": (True, "[yellow]drift:[/] {detail}"),
    "plan": (True, "[yellow]plan changed:[/] {detail}"),
    "compaction_start": (False, "[cyan]compacting:[/] {detail}"),
    "compaction": (False, "[cyan]compacted[/] into checkpoint {checkpoint}; {detail} starts"),
}
"""Run events shown as one line on stderr: ``kind -> (shown even with --quiet, the line)``; the
line's ``{step}``, ``{detail}`` and ``{checkpoint}`` are the event's, escaped."""


def _eta(task: Any) -> Any:
    """The ETA column's cell: from the mean duration of the steps run in this session."""
    from rich.text import Text

    eta = task.fields.get("eta")
    return Text("ETA -:--:--" if eta is None else "ETA " + time.strftime("%H:%M:%S", time.gmtime(eta)), style="cyan")


class _Silent:
    """A progress display that shows nothing (``--quiet``), without importing rich."""

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def add_task(self, *args: Any, **kw: Any) -> int:
        return 0

    def update(self, *args: Any, **kw: Any) -> None:
        pass


def _progress(*columns: Any, transient: bool) -> Any:
    """A rich progress display on stderr with ``columns`` (names of :mod:`rich.progress` columns,
    ``"eta"`` for :func:`_eta`, or ``(name, args...)``)."""
    from rich import progress

    class EtaColumn(progress.ProgressColumn):
        def render(self, task: progress.Task) -> Any:
            return _eta(task)

    made = [EtaColumn() if c == "eta" else getattr(progress, c[0])(*c[1:]) if isinstance(c, tuple)
            else getattr(progress, c)() for c in columns]
    return progress.Progress(*made, console=_console("err"), transient=transient)


class _StepLogHandler(logging.Handler):
    """Shows ``ctx.log`` lines above the progress bar: INFO and up (WARNING and up with --quiet)."""

    def __init__(self, quiet: bool) -> None:
        super().__init__(logging.WARNING if quiet else logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, "step", "")
        style = "yellow" if record.levelno >= logging.WARNING else "dim"
        _console("err").print(f"[{style}]{esc(step)}:[/] {esc(record.getMessage())}")


class RunProgress:
    """Turns :class:`RunEvent` into a rich progress bar (step name, done/total, elapsed, ETA).

    Also appends every event as a JSON line to ``events_path`` when given (flushed per line).
    """

    def __init__(self, *, quiet: bool = False, events_path: str | None = None) -> None:
        self.quiet = quiet
        self.events = open(events_path, "a", encoding="utf-8") if events_path else None
        self.progress = _Silent() if quiet else _progress(
            "SpinnerColumn", ("TextColumn", "[bold]{task.fields[step]}"), "BarColumn", "MofNCompleteColumn",
            "TimeElapsedColumn", "eta", transient=False)
        self.bar: Any = None
        self.durations: list[float] = []

    def __enter__(self) -> "RunProgress":
        # the bar starts with the run (create/resume): an error before that prints no empty bar
        self._log = _StepLogHandler(self.quiet)
        logging.getLogger("overnight.task").addHandler(self._log)
        logging.getLogger("overnight.task").setLevel(logging.INFO)
        # what the runner logs for Python API users, this progress display shows from run events
        self._quiet_runner = logging.NullHandler()
        logging.getLogger("overnight.runner").addHandler(self._quiet_runner)
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger("overnight.task").removeHandler(self._log)
        logging.getLogger("overnight.runner").removeHandler(self._quiet_runner)
        if self.bar is not None:
            self.progress.__exit__(*exc)
        if self.events:
            self.events.close()

    def __call__(self, e: "RunEvent") -> None:
        if self.events:
            self.events.write(json.dumps({"t": time.time(), **dataclasses.asdict(e)}, ensure_ascii=True) + "\n")
            self.events.flush()
        if e.kind in ("create", "resume"):
            on = f" on branch [bold]{esc(e.branch)}[/]" if e.branch != "main" else ""
            if e.kind == "create":
                self._say(f"[green]created[/] task [bold]{esc(e.task_id)}[/]{on} (checkpoint {(e.checkpoint_id or '')[7:19]})")
                if e.detail:  # the router's decision
                    level_note = esc(e.detail)
                    if "ephemeral" in e.detail:
                        _console("err").print(f"[yellow]level ephemeral:[/] {level_note}")
                    else:
                        self._say(f"[dim]{level_note}[/]")
            elif not self.quiet:
                self._say(f"[green]resuming[/] task [bold]{esc(e.task_id)}[/]{on} from checkpoint "
                          f"{(e.checkpoint_id or '')[7:19]} ({e.done}/{e.total} steps done)")
            if e.detail and e.kind == "resume":  # a fallback or self-heal is always reported, even with --quiet
                lines = e.detail.split("\n")
                fell_back = "\n".join(x for x in lines if not x.startswith(("healed ", "project moved: ")))
                if fell_back:
                    _console("err").print(f"[yellow]fallback:[/] {esc(fell_back)}")
                for line in lines:
                    if line.startswith("healed "):  # read from a verified ditto copy
                        _console("err").print(f"[yellow]self-heal:[/] {esc(line)}")
                    elif line.startswith("project moved: "):  # input paths in it are read here now
                        _console("err").print(f"[yellow]project moved:[/] {esc(line[len('project moved: '):])}")
            if self.bar is None:
                self.progress.__enter__()
            self.bar = self.progress.add_task("run", total=e.total, completed=e.done, step="", eta=None)
        elif e.kind == "repair":  # before the session starts; always reported, even with --quiet
            _console("err").print(f"[yellow]repair:[/] {esc(e.detail)}")
        elif self.bar is None:
            return
        elif e.kind == "step_start" and not self.quiet:
            self.progress.update(self.bar, step=esc(safe(e.step)[:48]), total=e.total, completed=e.done)
        elif e.kind in ("step_end", "skip", "replay"):
            if e.duration_ms is not None:
                self.durations.append(e.duration_ms / 1000)
            eta = (sum(self.durations) / len(self.durations)) * (e.total - e.done) if self.durations else None
            self.progress.update(self.bar, total=e.total, completed=e.done, eta=eta)
        elif e.kind in _NOTES:
            shown_always, text = _NOTES[e.kind]
            line = text.format(step=esc(e.step or ""), detail=esc(e.detail), checkpoint=(e.checkpoint_id or "")[7:19])
            if shown_always:
                _console("err").print(line)
            else:
                self._say(line)
        elif e.kind == "end":
            self.progress.update(self.bar, step="done" if e.detail == "complete" else str(e.detail),
                                 total=e.total, completed=e.done, eta=0 if e.detail == "complete" else None)

    def _say(self, text: str) -> None:
        if not self.quiet:
            _console("err").print(text)



class progress_bar:  # noqa: N801 - used as a context manager like rich's
    """A determinate progress bar on stderr for long plumbing work (``verify``); yields
    ``update(done, total)``. ``label`` names what is counted; several labels name phases, the
    next one shown when the count starts again (``verify --all``: checkpoints, then objects).

    Shown only on an interactive terminal: the bar is transient (erased when done), so a file or
    pipe would get nothing of it but the line break rich ends a non-interactive display with -- a
    blank first line before the command's own messages."""

    def __init__(self, label: str | tuple[str, ...], *, quiet: bool = False) -> None:
        self.labels = (label,) if isinstance(label, str) else label
        shown = not quiet and _console("err").is_interactive
        self.progress = _progress(("TextColumn", "{task.description}"), "BarColumn", "MofNCompleteColumn",
                                  "TimeElapsedColumn", transient=True) if shown else _Silent()

    def __enter__(self):
        self.progress.__enter__()
        bar = self.progress.add_task(self.labels[0], total=None)
        phase, last = 0, 0

        def update(done: int, total: int) -> None:
            nonlocal phase, last
            if done < last and phase + 1 < len(self.labels):
                phase += 1
                self.progress.update(bar, description=self.labels[phase])
            last = done
            self.progress.update(bar, completed=done, total=total)

        return update

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)
