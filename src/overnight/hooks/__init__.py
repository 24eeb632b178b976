"""Hooks: what an agent's lifecycle events do to its overnight task, without the agent asking.

A coding agent runs a command at some events -- Claude Code before a compaction (``PreCompact``),
when a session starts (``SessionStart``) and when a turn ends (``Stop``); other agents at similar
points. The command reads the event's JSON on stdin (``session_id``, ``transcript_path``, ``cwd``,
``trigger``, ``source``, ``hook_event_name``) and:

* ``pre-compact`` commits a ``compaction`` checkpoint of the current task: the transcript (when
  the payload names one: it must then exist and be JSON Lines) as an artifact (``transcripts/<session_id>.jsonl``; content-defined chunks, so a longer transcript
  stores only what was appended) and the control point updated from the agent's own todo list
  (the last ``TodoWrite`` in the transcript: pending and in-progress items become the todo list,
  completed ones are added to done). If that commit fails, the compaction must not happen:
  the caller blocks it.
* ``stop`` commits the same, as a ``step`` checkpoint (nothing is written when nothing changed).
* ``session-start`` returns the control point and the drift since it, as text for the agent's
  context (in full after a compaction or a resume; one line on a fresh start or a clear).

**Which task.** The project's *current task*: ``$OVERNIGHT_TASK`` if set, else the pointer file
``.overnight/current-task`` in the project (found from the event's ``cwd`` upwards, like
``.git``), written by ``task_start`` and ``task_resume``. The pointer, not the agent's session id,
because the MCP server never sees that id (MCP has no notion of the agent's conversation), a
session id changes on every ``/clear`` and on resume while the task goes on, and the project
directory is the one thing the server, the hooks and the agent share; the pointer also names the
store the task lives in, so a hook finds a task started with ``overnight mcp --store URL`` (a store
inside the project is named relative to it, so a moved or copied project finds its own). Two
agents working on one checkout at the same time share it: give each its own worktree (or
``OVERNIGHT_TASK``). No current task: every hook does nothing.

**Speed.** A hook imports only the store, the verify layer and this package (no CLI framework, no
runner, no tokenizer vocabulary: text budgets are estimated as UTF-8 bytes / 4), runs ``git``
locally and never touches the network unless the task's store is a network store. A watchdog ends
a hook that runs past its deadline (``$OVERNIGHT_HOOK_DEADLINE_S``, default 45 s, below the 60 s
hook timeout ``install`` writes): a ``pre-compact`` that cannot finish in time blocks the compaction.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

EVENTS = ("pre-compact", "session-start", "stop")
ALIASES = {"precompact": "pre-compact", "pre_compact": "pre-compact", "sessionstart": "session-start",
           "session_start": "session-start", "stop": "stop", "subagentstop": "stop", "sessionend": "stop",
           "session-end": "stop", "agent-turn-complete": "stop"}
DEFAULT_DEADLINE_S = 45.0
CONTEXT_BUDGET_TOKENS = 2000
"""Budget of the text ``session-start`` puts into the agent's context (estimated tokens)."""


def event_name(name: str) -> str:
    """``pre-compact`` / ``session-start`` / ``stop`` from those or an agent's own spelling
    (``PreCompact``, ``SessionStart``, ``Stop``, ``SessionEnd``, ``agent-turn-complete``).

    Raises ConfigError for anything else."""
    key = name.strip().lower()
    if key in EVENTS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    from overnight.errors import ConfigError

    raise ConfigError(f"unknown hook event {name!r}", hint="one of " + ", ".join(EVENTS))


@dataclass
class Outcome:
    """What a hook did: ``ok``, a one-line ``message``, the ``context`` text (session-start), the
    checkpoint id it committed, and the error when it failed."""

    event: str
    ok: bool
    message: str = ""
    context: str | None = None
    checkpoint_id: str | None = None
    task_id: str | None = None
    error: BaseException | None = None
    skipped: bool = False
    """Nothing was done and the caller says why on stderr (an empty ``pre-compact`` input)."""


def _locate(payload: dict[str, Any], store: str | None) -> tuple[Path, str, str, str | None] | None:
    """``(project root, task id, branch, store URL)`` of the current task, or None. The store: ``store``
    (``--store``), else the store the pointer names for that task, resolved against the root the
    pointer was found in (:func:`~overnight.mcp.tasks.pointer_store`: a moved or copied project
    uses its own store; a missing one is a StoreUnavailable, never created), else
    ``$OVERNIGHT_STORE``. The pointer wins over the variable: ``task_start``/``task_resume`` wrote
    where this task lives, while the variable is a machine-wide default (often a fleet's PostgreSQL
    store) that need not hold it; the variable is used when the pointer's store is missing.

    The pointer is data a repository can carry: its store is used only when it lies inside the
    project or this user's own ``task_start``/``task_resume`` confirmed it on this machine (the rule:
    :func:`~overnight.mcp.tasks.pointer_store`); else a ConfigError -- nothing is committed to that
    store and no text from it reaches the agent -- unless ``--store`` or ``$OVERNIGHT_STORE`` (the
    user's own choices, always trusted) names the store to use instead."""
    from overnight.errors import ConfigError, StoreUnavailable
    from overnight.mcp.tasks import pointer_store, read_pointer

    cwd = payload.get("cwd") or os.getcwd()
    found = read_pointer(cwd)
    task = os.environ.get("OVERNIGHT_TASK")
    if found is None and not task:
        return None
    root = found[0] if found else Path(cwd).resolve()
    pointer = found[1] if found else {}
    task_id = task or pointer["task_id"]
    branch = os.environ.get("OVERNIGHT_BRANCH") or (pointer.get("branch") if pointer.get("task_id") == task_id
                                                    else None) or "main"
    env_store = os.environ.get("OVERNIGHT_STORE") or None
    if store is None and found and pointer.get("task_id") == task_id:
        try:
            store = pointer_store(root, pointer)
        except (StoreUnavailable, ConfigError):  # missing, or outside the project and not confirmed here
            if env_store is None:
                raise
    return root, task_id, branch, store or env_store


def read_transcript(path: str | None) -> tuple[bytes, list[Any]]:
    """The transcript's bytes and its parsed lines (JSON Lines, one event per line).

    Raises ConfigError when the payload names none, the file is missing, or a line is not JSON."""
    import orjson

    from overnight.errors import ConfigError

    if not path:
        raise ConfigError("the hook payload has no transcript_path", hint="pass the agent's hook JSON on stdin")
    try:
        raw = Path(path).expanduser().read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"transcript {path} does not exist", hint="the agent names it in transcript_path; "
                          "was it moved or deleted?") from None
    except OSError as exc:
        raise ConfigError(f"transcript {path} cannot be read: {exc}") from None
    entries = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"transcript {path} is not JSON Lines: line {n} is not JSON ({exc})",
                              hint="transcript_path must name the agent's .jsonl transcript") from None
    return raw, entries


def agent_todos(entries: list[Any]) -> tuple[list[str], list[str]] | None:
    """``(todo, done)`` from the last ``TodoWrite`` tool call in a Claude Code transcript (todo:
    pending and in-progress items in order; done: completed ones), or None when there is none."""
    for entry in reversed(entries):
        msg = entry.get("message") if isinstance(entry, dict) else None
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for block in reversed(content):
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "TodoWrite":
                todos = (block.get("input") or {}).get("todos")
                if not isinstance(todos, list):
                    continue
                items = [(str(t.get("content", "")).strip(), t.get("status")) for t in todos if isinstance(t, dict)]
                return ([c for c, s in items if c and s != "completed"], [c for c, s in items if c and s == "completed"])
    return None


@contextmanager
def _suggesting(tasks: Any, task_id: str) -> Iterator[None]:
    """A ``TaskNotFound`` for the current task gains where its id came from and "did you mean" the
    stored task ids closest to it (``difflib``, as the CLI and the MCP server suggest): a mistyped
    ``$OVERNIGHT_TASK`` is the usual cause."""
    from overnight.errors import TaskNotFound

    try:
        yield
    except TaskNotFound as exc:
        if exc.task_id not in (None, task_id) or "did you mean" in (exc.hint or ""):
            raise
        import difflib

        try:
            ids = [t.task_id for t in tasks.store().list_tasks()]
        except Exception:  # noqa: BLE001 - a suggestion is a courtesy, never a second error
            ids = []
        close = difflib.get_close_matches(task_id, ids, n=3, cutoff=0.6)
        origin = ("$OVERNIGHT_TASK" if os.environ.get("OVERNIGHT_TASK") == task_id
                  else "the current-task pointer (.overnight/current-task)")
        exc.hint = (f"did you mean {' or '.join(close)}? " if close else "") + \
            f"{origin} names task {task_id!r}, which is not in this store; `overnight ls` lists the tasks"
        raise


def _checkpoint(event: str, payload: dict[str, Any], loc: tuple[Path, str, str, str | None]) -> Outcome:
    from overnight.mcp.tasks import CodingTasks

    root, task_id, branch, store = loc
    session = str(payload.get("session_id") or payload.get("thread-id") or "unknown")
    blobs: dict[str, bytes] = {}
    todo = done = None
    what = "no transcript"
    if payload.get("transcript_path"):  # named: it must be there and be JSON Lines
        raw, entries = read_transcript(payload["transcript_path"])
        blobs[f"transcripts/{session}.jsonl"] = raw
        todos = agent_todos(entries)
        todo, done = todos if todos is not None else (None, None)
        what = f"transcript {len(entries)} lines, {len(raw)} bytes"
    trigger = payload.get("trigger")
    detail = f"{'compaction' if event == 'pre-compact' else 'turn ended'}{f' ({trigger})' if trigger else ''}: {what}"
    with CodingTasks(store, project=root, session_id=session, exact_root=True) as tasks, _suggesting(tasks, task_id):
        r = tasks.checkpoint(task_id, branch=branch, todo=todo, done=done, skip_known_done=True, blobs=blobs,
                             step=event, compaction=event == "pre-compact", session_id=session, detail=detail)
    return Outcome(event, True, r.describe(), checkpoint_id=r.checkpoint_id, task_id=task_id)


def _session_start(payload: dict[str, Any], loc: tuple[Path, str, str, str | None]) -> Outcome:
    from overnight.mcp.tasks import CodingTasks, render_control_point

    root, task_id, branch, store = loc
    source = payload.get("source") or "startup"
    with CodingTasks(store, project=root, exact_root=True) as tasks, _suggesting(tasks, task_id):
        if source in ("compact", "resume"):
            r = tasks.resume(task_id, branch=branch, make_current=False)
            text = ("overnight: this session continues a durable task. Its control point (the last verified "
                    "checkpoint) and what changed since:\n"
                    + render_control_point(r.control, drift_report=r.drift, fallback=r.fallback,
                                           budget_tokens=CONTEXT_BUDGET_TOKENS)
                    + f"\nRecord progress with task_checkpoint(task_id={task_id!r}, ...).")
        else:
            r = tasks.status(task_id, branch=branch)
            cp = r.control
            moved = f"; {cp.moved_line()}" if cp.project_moved else ""
            text = (f"overnight: the project's current task is {task_id} ({cp.goal!r}; {len(cp.done)} done, "
                    f"{len(cp.todo)} todo{'; the project changed since its last checkpoint' if r.drift.lines else ''}"
                    f"{moved}). Call task_resume to load it before working on it.")
    return Outcome("session-start", True, f"control point of {task_id} loaded", context=text,
                   checkpoint_id=r.control.checkpoint_id, task_id=task_id)


def handle(event: str, payload: dict[str, Any], *, store: str | None = None) -> Outcome:
    """Run one hook event on the current task; never raises (a failure is ``Outcome.ok=False``).
    The outcome's ``message``, ``context`` and ``task_id`` have their lone surrogates escaped
    (:func:`~overnight.verify.coding_world.utf8_safe`): stored text may hold them, and what the
    hook prints must be UTF-8 (a strict stdout would fail on them)."""
    from overnight.verify.coding_world import utf8_safe

    out = _handle(event_name(event), payload, store)
    out.message, out.context, out.task_id = utf8_safe(out.message), utf8_safe(out.context), utf8_safe(out.task_id)
    return out


def _handle(event: str, payload: dict[str, Any], store: str | None) -> Outcome:
    loc = None
    try:
        loc = _locate(payload, store)
        if loc is None:
            return Outcome(event, True, "no current overnight task in this project: nothing to do")
        if event == "session-start":
            return _session_start(payload, loc)
        if event == "pre-compact" and not payload:
            return Outcome(event, True, "pre-compact: the hook input was empty (no transcript, no session): nothing "
                           "to save, no checkpoint committed", task_id=loc[1], skipped=True)
        return _checkpoint(event, payload, loc)
    except Exception as exc:  # noqa: BLE001 - reported to the agent in its own terms by the caller
        return Outcome(event, False, _describe(exc), task_id=loc[1] if loc else getattr(exc, "task_id", None),
                       error=exc)


def _describe(exc: BaseException) -> str:
    from overnight.errors import OvernightError

    if isinstance(exc, OvernightError):
        return f"{type(exc).__name__}: {exc.message}" + (f" (hint: {exc.hint})" if exc.hint else "")
    return f"{type(exc).__name__}: {exc}"


def read_payload(text: str | None = None) -> dict[str, Any]:
    """The hook JSON: ``text`` if given, else stdin (empty: ``{}``). Raises ConfigError when it is
    not a JSON object."""
    import json

    from overnight.errors import ConfigError

    raw = text if text is not None else (sys.stdin.read() if not sys.stdin.isatty() else "")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"the hook input is not JSON: {exc}", hint="agents pass the event as a JSON object on stdin") from None
    if not isinstance(data, dict):
        raise ConfigError("the hook input is not a JSON object")
    return data


def with_deadline(seconds: float | None, on_timeout: Callable[[], int]) -> threading.Timer | None:
    """Start a watchdog: after ``seconds`` (default ``$OVERNIGHT_HOOK_DEADLINE_S`` or 45), call
    ``on_timeout`` (which prints what the agent must see and returns the exit code) and end the
    process at once with that code. A commit cut short this way leaves the old head or the new one,
    never a torn record (the store is crash-safe)."""
    if seconds is None:
        seconds = float(os.environ.get("OVERNIGHT_HOOK_DEADLINE_S", DEFAULT_DEADLINE_S))
    if seconds <= 0:
        return None

    def fire() -> None:
        code = 1
        try:
            code = on_timeout()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def run_event(event: str, payload_text: str | None, *, store: str | None,
              on_timeout: Callable[[Outcome], int]) -> Outcome:
    """Read the payload (``payload_text``, else stdin) and :func:`handle` the event under the
    watchdog; when the deadline passes, ``on_timeout`` gets a failed outcome saying so, prints it
    the agent's way and returns the exit code the process ends with."""
    name = event_name(event)
    late = Outcome(name, False, "the checkpoint did not finish before the hook's deadline "
                   "($OVERNIGHT_HOOK_DEADLINE_S): the store may be busy or slow")
    timer = with_deadline(None, lambda: on_timeout(late))
    try:
        try:
            payload = read_payload(payload_text)
        except Exception as exc:  # noqa: BLE001
            return Outcome(name, False, _describe(exc), error=exc)
        return handle(name, payload, store=store)
    finally:
        if timer is not None:
            timer.cancel()


def generic_output(out: Outcome) -> int:
    """Print an outcome for ``overnight hook run``: the context as plain text on stdout, a failure on
    stderr; exit 2 for a failed ``pre-compact`` (the blocking convention), 1 for another failure."""
    if not out.ok:
        sys.stderr.write(f"overnight: {out.event} failed: {out.message}\n")
        return 2 if out.event == "pre-compact" else 1
    if out.skipped:
        sys.stderr.write(f"overnight: {out.message}\n")
    if out.context:
        sys.stdout.write(out.context + "\n")
    return 0


def run_generic(event: str, payload_text: str | None = None, *, store: str | None = None) -> int:
    """``overnight hook run --event NAME [PAYLOAD]``: for agents other than Claude Code
    (:func:`generic_output`). Returns the exit code."""
    return generic_output(run_event(event, payload_text, store=store, on_timeout=generic_output))
