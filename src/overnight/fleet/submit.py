"""Submitting a task to the queue: ``overnight submit`` / :func:`overnight.api.submit`.

The definition is imported once here, to check that it is a task (``ConfigError``, exit 2,
otherwise). Its location is recorded so that every worker can import it: ``module:attr``, or a
file relative to the project root -- never an absolute path (a checkout at another path, or on
another machine, must work). A worker imports it only from the project root or a module
(:func:`overnight.runtime.task_code.check_location`).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from datetime import datetime, timezone
from typing import Any, Callable

from overnight.codec.canonical import dumps_sorted, from_tree
from overnight.errors import ConfigError
from overnight.runtime.task_code import _is_path, _split, load_task
from overnight.runtime.task import Task, params_text
from overnight.store import open_store
from overnight.store.leases import now_ms
from overnight.store.queue import QueuedTask
from overnight.store.queue_open import queue_for


def parse_time(value: str | float | int | datetime | None, *, clock: Callable[[], int] = now_ms) -> int:
    """``--not-before``: ISO 8601 (``2026-12-02T06:00``, UTC unless it has an offset), ``+30m``
    / ``+2h`` / ``+45s`` from now, or Unix seconds. Returns Unix milliseconds (0 for None).

    ``clock``: now, in Unix ms, that a relative time counts from -- :func:`submit` passes the
    store's (:meth:`~overnight.store.base.LeaseStore.clock_ms`), by which claims are judged, so a
    machine whose clock is off queues a task to start when it says; it is read only for a
    relative time. An absolute time is kept as given.

    Raises: ConfigError for anything else."""
    at, relative = _read_time(value)
    return clock() + at if relative else at


def _read_time(value: str | float | int | datetime | None) -> tuple[int, bool]:
    """``(ms, relative)``: what :func:`parse_time` reads, without reading a clock -- Unix ms, or
    with ``relative`` the span in ms from now (``+30m``). Raises ConfigError."""
    from overnight.runtime.task import parse_span

    if value is None:
        return 0, False
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(dt.timestamp() * 1000), False
    if isinstance(value, (int, float)):
        try:
            return int(value * 1000), False
        except (OverflowError, ValueError) as exc:
            raise ConfigError(f"--not-before {value!r} is not a time between 1970 and 9999") from exc
    text = value.strip()
    if text.startswith("+"):
        if text[1:].strip().replace(".", "", 1).isdigit():  # "+30": seconds, minutes or hours? (a span's bare number is hours)
            raise ConfigError(f"--not-before {value!r} has no unit", hint="use +30s, +30m, +2h, ISO 8601 or Unix seconds")
        try:
            return int((parse_span(text[1:]) or 0) * 1000), True
        except Exception as exc:  # noqa: BLE001 - SpecError: re-raised as a usage error
            raise ConfigError(f"cannot read --not-before {value!r}", hint="use +30m, +2h, ISO 8601 or Unix seconds") from exc
    try:
        return int(float(text) * 1000), False
    except ValueError:
        pass
    except OverflowError as exc:
        raise ConfigError(f"--not-before {value!r} is not a time between 1970 and 9999") from exc
    try:
        return _read_time(datetime.fromisoformat(text))
    except ValueError as exc:
        raise ConfigError(f"cannot read --not-before {value!r}", hint="use +30m, +2h, ISO 8601 or Unix seconds") from exc


def default_id(task: Task, params: dict[str, Any]) -> str:
    """The definition's id, plus ``-`` and 8 hex digits of the SHA-256 of the params' canonical JSON
    with keys sorted when there are params (``report-3f2a9c1b``): the same params in any order, the
    same id."""
    if not params:
        return task.id
    return f"{task.id}-{hashlib.sha256(dumps_sorted(params)).hexdigest()[:8]}"


def code_location(entry: str, task: Task) -> str:
    """Where workers import the definition from: ``module:attr`` as given, or the file relative to
    the project root with the attribute that holds the task.

    Raises: ConfigError for a file outside the project root (an absolute path would not exist on
    another machine or in another checkout)."""
    recorded = task.entry or entry
    target, attr = _split(recorded)
    if _is_path(target) and (target.startswith("/") or target.startswith("..")):
        raise ConfigError(f"task file {entry} lies outside the project root; workers import code only from the "
                          "project (the folder holding overnight.toml, else the current directory) or a module",
                          hint="run submit from the project folder, move the file into it, or name a module: "
                          "package.module:task")
    return recorded if attr else f"{target}"


_QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_YEAR_10000_MS = 253_402_300_800_000
_PRIORITY = (-2**31, 2**31 - 1)
"""Priorities fit a 32-bit integer column on every store."""


def _check_fields(queue: str, priority: int, idempotency_key: str | None) -> None:
    """Refuse, as usage errors, values no store column holds: a queue name that is not 1-100 of
    ``[A-Za-z0-9._-]``, a priority outside 32 bits, an idempotency key that is empty, over 200
    characters or holds a control character (NUL included).

    Raises: ConfigError naming the field."""
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        raise ConfigError(f"queue name {queue!r} is not 1-100 letters, digits, '.', '_' or '-'",
                          hint="e.g. --queue default or --queue gpu")
    if not isinstance(priority, int) or not _PRIORITY[0] <= priority <= _PRIORITY[1]:
        raise ConfigError(f"--priority {priority!r} is not an integer in [{_PRIORITY[0]}, {_PRIORITY[1]}]")
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 200
                                        or any(not c.isprintable() for c in idempotency_key)):
        raise ConfigError("an idempotency key is 1-200 printable characters",
                          hint="e.g. a request id or a digest of what the submission is for")


def _check_not_before(value: Any, ms: int) -> None:
    """Raises ConfigError when ``ms`` (read from ``--not-before`` ``value``) is before 1970 or after 9999."""
    if not 0 <= ms < _YEAR_10000_MS:
        raise ConfigError(f"--not-before {value!r} is not a time between 1970 and 9999")


def check_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``params`` (None: ``{}``), checked to be a JSON object with string keys and
    finite numbers (JSON has no NaN or Infinity).

    Raises:
        ConfigError: it is not, or it nests deeper than Python's recursion limit.
    """
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"params must be a JSON object, got {type(params).__name__}")
    out = dict(params or {})
    try:
        json.dumps(out, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params must be a JSON object with string keys and finite numbers: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError("params nest too deeply") from exc
    return out


def submit(entry: str, *, store: Any = None, task_id: str | None = None, params: dict[str, Any] | None = None,
           queue: str = "default", priority: int = 0, not_before: str | float | datetime | None = None,
           idempotency_key: str | None = None) -> tuple[QueuedTask, bool]:
    """Queue the task defined at ``entry`` (``FILE.py[:TASK]`` or ``module:attr``).

    ``not_before``: see :func:`parse_time`; a relative time (``+30m``) counts from now by the
    store's clock, which claims are judged by (PostgreSQL: the server's), not this machine's.

    Returns ``(row, created)``: ``created`` is False when the idempotency key (or the task id)
    was already submitted -- the earlier row is returned and nothing is queued twice -- or when the
    store holds the task complete already (its row then says ``complete``: nothing to run). A key
    already used must come with the same request: task id, code, params, queue and priority.

    Raises:
        ConfigError: ``entry`` is not a task, lies outside the project, params is not a JSON
            object, the store has no queue (SQLite and PostgreSQL have one), the idempotency key
            was used by another request (:func:`_same_request`), the task id (given,
            or a default id two param sets share) is already submitted with other params, or the
            store holds a task of that id made by other code (or with none: a coding-agent task).
        IntegrityError: the store holds the task, but no checkpoint of it verifies.
    """
    params = check_params(params)
    _check_fields(queue, priority, idempotency_key)
    task = load_task(entry)
    location = code_location(entry, task)
    at, relative = _read_time(not_before)  # read (and refused) before the store is opened
    _check_not_before(not_before, at)
    row = QueuedTask(task_id=task_id or default_id(task, params), entry=location, params=params, queue=queue,
                     priority=int(priority), not_before_ms=at, idempotency_key=idempotency_key)
    Task(id=row.task_id, goal=task.goal)  # the id must be a valid task id (SpecError otherwise)
    s = store if hasattr(store, "commit") else open_store(store)
    try:
        q = queue_for(s)
        if q is None:
            raise ConfigError(f"store {s.url} has no queue; workers need an sqlite:// or postgresql:// store",
                              hint="pass --store sqlite://PATH or --store postgresql://HOST/DB")
        if relative:  # from now by the clock claims are judged by (PostgreSQL: the server's), not this machine's
            row.not_before_ms = q.clock_ms() + at
            _check_not_before(not_before, row.not_before_ms)
        done = _stored(s, q, row, location)
        if done is not None:
            return done, False
        found, created = q.submit(row)
        if not created and idempotency_key is not None and found.idempotency_key == idempotency_key:
            _same_request(found, row)
        if not created and idempotency_key is None and found.task_id == row.task_id and found.params != params:
            raise ConfigError(
                f"task {row.task_id!r} is already submitted ({found.status}) with params {params_text(found.params)}; "
                f"these are {params_text(params)}", task_id=row.task_id,
                hint=(f"`overnight retry {row.task_id}` queues it again with its own params"
                      if found.status in ("failed", "cancelled") else "a worker runs it with its own params") +
                "; for other params, submit with another --id")
        return found, created
    finally:
        if s is not store:
            s.close()


def _same_request(found: QueuedTask, row: QueuedTask) -> None:
    """A submit whose idempotency key an earlier submit used must be the same request -- task id,
    code, params, queue and priority (``--not-before`` is not compared: ``+30m`` names another
    moment each time) -- as a payment API refuses a key reused with other parameters: returning
    the earlier task for another request would silently drop this one.

    Raises:
        ConfigError: what differs, naming the key, the earlier task and both values.
    """
    from overnight.runtime.task_code import same_location

    differs = [(what, was, now) for what, was, now, same in (
        ("task id", found.task_id, row.task_id, found.task_id == row.task_id),
        ("code", found.entry, row.entry, same_location(found.entry, row.entry)),
        ("params", params_text(found.params), params_text(row.params), found.params == row.params),
        ("queue", found.queue, row.queue, found.queue == row.queue),
        ("priority", found.priority, row.priority, found.priority == row.priority)) if not same]
    if differs:
        said = "; ".join(f"{what} {was!s} there, {now!s} here" for what, was, now in differs)
        raise ConfigError(
            f"idempotency key {row.idempotency_key!r} was used by task {found.task_id!r} ({found.status}) with "
            f"another request: {said}", task_id=found.task_id,
            hint="an idempotency key names one request: submit this one with another key (or none); "
                 f"`overnight status {shlex.quote(found.task_id)}` shows the earlier one")


def _stored(s: Any, q: Any, row: QueuedTask, location: str) -> QueuedTask | None:
    """Check the task the store already holds under ``row.task_id``, if any (a plain ``overnight
    run`` made it, or an earlier submit): refuse one made by other code -- as ``overnight run``
    does: a worker would refuse it too, and park it failed -- or with no code to run (a coding-agent
    or adapter task); for one whose verified head is complete return its row, settled ``complete``
    (nothing for a worker to run, as ``overnight resume --submit`` says). None: queue it.

    Raises:
        ConfigError: the stored task was made by other code, or has none.
        IntegrityError: no checkpoint of it verifies.
    """
    from overnight.chain.read import load_head
    from overnight.errors import TaskNotFound
    from overnight.keys import signing_key_from_env
    from overnight.runtime.task_code import same_location

    try:
        existing = s.get_task(row.task_id)
    except TaskNotFound:
        return None
    if not existing.entry:
        raise ConfigError(f"task {row.task_id!r} already exists and has no code workers could run (a coding-agent "
                          "or adapter task)", task_id=row.task_id, hint="submit under another id: --id NAME")
    if not same_location(existing.entry, location):
        raise ConfigError(f"task {row.task_id!r} already exists, created by {existing.entry}; this code is "
                          f"{location}", task_id=row.task_id,
                          hint="give this task another id (--id NAME), or submit the code that created it")
    if not s.list_refs(row.task_id).get("main"):
        return None
    loaded, _ = load_head(s, row.task_id, "main", key=signing_key_from_env(), deep=False)
    if loaded.doc.todo.count:
        return None  # not complete: the worker resumes it (and checks its params, as a resume does)
    spec = loaded.state_tree["task"]["spec"]
    stored = from_tree(spec["params"], "task params") if isinstance(spec, dict) and "params" in spec else {}
    if stored != row.params:
        raise ConfigError(f"task {row.task_id!r} is complete with params {params_text(stored)}; these are "
                          f"{params_text(row.params)}", task_id=row.task_id, hint="for other params, submit with "
                          "another --id (the default id holds a digest of the params)")
    q.settle(row.task_id, "complete")
    return q.get(row.task_id) or QueuedTask(task_id=row.task_id, entry=existing.entry, params=row.params,
                                            status="complete")


__all__ = ["check_params", "default_id", "parse_time", "submit"]
