# Over 600 lines: the whole public operation set, one function per CLI command with the same names and options, so the CLI, the dashboard and the MCP tools share one surface (split by command group once the parallel work on it lands).
"""The Python API the CLI mirrors: ``overnight X`` calls ``overnight.api.X`` with the same options.

Every function takes ``store`` as a :class:`~overnight.store.base.Store`, a URL, or None for the
default (``$OVERNIGHT_STORE`` or ``sqlite://.overnight/overnight.db``), and returns plain
dataclasses that the CLI renders as tables or ``--json``.
"""

from __future__ import annotations

from overnight.store.task_location import further_up_hint, locate, medium_for, opened, recorded_route

import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from overnight.codec import digest
from overnight.codec.canonical import from_tree
from overnight.config import Config
from overnight.config import load as load_config
from overnight.errors import (
    ArtifactNotFound,
    BranchNotFound,
    CheckpointNotFound,
    ConfigError,
    DigestMismatch,
    IntegrityError,
    NoValidCheckpoint,
    ObjectNotFound,
    OvernightError,
    StoreVersionError,
    TaskBusy,
    TaskNotFound,
    short_id,
    shown_task_id,
)
from overnight.runtime.task_code import load_stored_task, load_task
from overnight.store.task_location import Route
from overnight.runtime.outcome import RunEvent, RunResult, command
from overnight.runtime.runner import Runner
from overnight.runtime.task import TASK_ID_RULE, Task, task_id_problem
from overnight.store import Store, default_store_url, open_store
from overnight.store import exists as store_exists
from overnight.store import location as store_location
from overnight.store.blobs import BlobReader
from overnight.store.base import DEFAULT_GRACE_S
from overnight.store.queue import describe, state_of
from overnight.units import human_duration
from overnight.store.queue_open import queue_for, task_status
from overnight.store.compose.tiered import TieredStore
from overnight.chain.read import head_problems, load_head, served_by_copy
from overnight.verify.drift import DriftReport
from overnight.chain.integrity import load_checkpoint, parse_record, record_problems, signing_key_from_env
from overnight.chain.ditto import HealingReader
from overnight.chain.ditto import get_checkpoint as ditto_checkpoint
from overnight.chain.rollback import find_rollback
from overnight.chain.records import rollback_kind

# Branches, gc, archive and fsck are imported by the functions that use them: a resume, which
# imports this module, needs none of them before its first step (tests/test_resume_cost.py).
if TYPE_CHECKING:
    from overnight.chain.branches import LogEntry, MergeResult
    from overnight.ops.archive import ArchiveReport, RestoreReport
    from overnight.ops.gc import GcReport, RmReport
    from overnight.verify.fsck import VerifyReport


@contextmanager
def _opened(store: Store | str | None, *, task_id: str | None = None, write: bool = False,
            read_only: bool = False) -> Iterator[TieredStore]:
    """:func:`overnight.store.task_location.opened` (writing to a replicated task heals its media first);
    a ``TaskNotFound`` raised inside gains "did you mean" in its hint."""
    with opened(store, task_id=task_id, write=write, read_only=read_only, heal=_heal) as s:
        try:
            yield s
        except TaskNotFound as exc:
            _suggest(exc, s)
            raise


def _close(name: str, names: list[str]) -> list[str]:
    """Up to three of ``names`` closest to ``name``: first ``name`` in another case, then those
    that are ``name`` (in any case) plus a params digest (``NAME-<8 hex>``, the id ``submit`` /
    ``run --param`` give a task with params), then an adapter's task of that thread or session
    (``langgraph:NAME``, ``agents.NAME``), then the closest by ``difflib`` (as git suggests a
    mistyped command)."""
    import difflib

    folded = name.casefold()
    with_params = sorted(n for n in names if _params_id(n) and n[:-9].casefold() == folded and
                         len(n) == len(name) + 9)
    # an adapter's task: the thread or session id after its prefix (langgraph:T, agents.S)
    adapters = sorted(n for n in names if n.casefold() in (f"langgraph:{folded}", f"agents.{folded}"))
    same = [n for n in names if n.casefold() == folded and n != name]  # another case
    near = [n for n in difflib.get_close_matches(name, names, n=3, cutoff=0.6) if not _other_params(name, n)]
    return list(dict.fromkeys(same + with_params + adapters + near))[:3]


def _params_id(name: str) -> bool:
    """``name`` is ``NAME-<8 hex>``, the id ``submit`` / ``run --param`` give a task with params."""
    return len(name) > 9 and name[-9] == "-" and all(c in "0123456789abcdef" for c in name[-8:])


def _other_params(name: str, candidate: str) -> bool:
    """``name`` and ``candidate`` are the same task with other params: ``NAME-<8 hex>`` both, whose
    digests differ in more than two places (a typo changes one or two; other params change most,
    and ``difflib`` alone finds ``report-1a2b3c4d`` close to any other ``report-`` digest)."""
    if not (_params_id(name) and _params_id(candidate)) or name[:-9].casefold() != candidate[:-9].casefold():
        return False
    return sum(a != b for a, b in zip(name[-8:], candidate[-8:])) > 2


def suggest(exc: TaskNotFound, s: Store) -> None:
    """Add the stored task ids closest to the one not found in front of ``exc.hint`` ("did you
    mean ...?"); the dashboard and the MCP server call it on their own not-found errors."""
    _suggest(exc, s)


def _heal(replicated: Any, task_id: str) -> None:
    """Bring every medium of a replicated task to its newest verified head (``overnight repair``)."""
    from overnight.ops.repair import repair_task

    repair_task(replicated.media, list(replicated.names), task_id, key=signing_key_from_env())


def _named(exc: TaskNotFound, close: list[str]) -> bool:
    """When the id of ``exc`` (a task not found) is not a valid task id -- and not a LangGraph
    thread's (``langgraph:`` and any text) -- say so and why instead of "no task", with ``close``
    (did you mean) and the rule in the hint. Returns True when it did (no other hint applies)."""
    task_id = exc.task_id or ""
    if "is not a valid task id" in exc.message:
        return True  # said already (the dashboard asks again)
    why = None if task_id.startswith("langgraph:") else task_id_problem(task_id)
    if why is None:
        return False
    exc.message = f"{shown_task_id(task_id)} is not a valid task id: {why}"
    exc.hint = (f"did you mean {' or '.join(close)}? " if close else "") + f"a task id: {TASK_ID_RULE}" + \
        (f"; {exc.hint}" if exc.hint else "")
    return True


def _suggest(exc: TaskNotFound, s: Store | None, among: tuple[str, ...] | None = None) -> None:
    """Add the stored task ids closest to the one not found (``difflib``, as git suggests a
    mistyped command) in front of ``exc.hint``; an id no task can have is said to be one
    (:func:`_named`). ``s``: None when there is no store to look in. ``among``: for a queue
    command (``cancel``, ``retry``), the queue row statuses it acts on -- only the ids of such rows
    are suggested (none close: no suggestion), not tasks it would refuse."""
    if exc.task_id is None:
        return
    exc.message = exc.message.replace(repr(exc.task_id), shown_task_id(exc.task_id))
    if not exc.task_id or s is None:  # '' (no task can have it), or no store to look in
        _named(exc, [])
        return
    if exc.hint and "`overnight ls`" in exc.hint:  # the listing of this store, not of the default one
        exc.hint = exc.hint.replace("`overnight ls`", f"`{_command('ls', None, s)}`")
    row = _queue_row(s, exc.task_id)
    if row is not None:  # submitted, not started: no task row, no checkpoint yet
        now = s.clock_ms()
        state = describe(row, None, complete=False, now=now)
        why = ("a worker has not started it" if row.status == "queued" else
               "its first step has not committed" if row.status == "running" else "no step of it has run")
        exc.message = (f"task {shown_task_id(exc.task_id)} is {state} (submitted "
                       f"{human_duration(now - row.submitted_ms)} ago), no checkpoint yet: {why}")
        exc.hint = (f"it is submitted but has no checkpoint yet; `{_command('status', exc.task_id, s)}` "
                    "shows its queue state, " + (f"`{_command('retry', exc.task_id, s)}` queues it again"
                                                 if row.status in ("failed", "cancelled") else
                                                 f"`{_command('worker', None, s)}` runs it"))
        return
    try:
        stored = [t.task_id for t in s.list_tasks()]
        if among is None:  # every task: stored, or submitted and not started
            ids = stored + [r.task_id for r in unstarted(queue_for(s, create=False), set(stored))]
        else:  # only the queue rows the command acts on
            ids = [r.task_id for r in unstarted(queue_for(s, create=False), set()) if r.status in among]
    except OvernightError:
        _named(exc, [])
        return
    if exc.task_id in (ids if among is None else stored):  # stored, never submitted: a plain `overnight run` made it
        if among == CANCELLABLE:  # running in a terminal, or not running at all: resume/submit is no way to stop it
            exc.hint = (f"{shown_task_id(exc.task_id)} was run with `overnight run`, not submitted to the workers: "
                        "a run in a terminal stops with Ctrl-C there (it resumes later from its last checkpoint); "
                        "cancel acts on submitted tasks")
            return
        exc.hint = (f"{shown_task_id(exc.task_id)} was run with `overnight run`, not submitted: `overnight resume "
                    f"{exc.task_id}` runs it here, `overnight resume {exc.task_id} --submit` queues it for the workers")
        return
    close = _close(exc.task_id, ids)
    if _named(exc, close):
        return
    if close and "did you mean" not in (exc.hint or ""):
        exc.hint = f"did you mean {' or '.join(close)}?" + (f" {exc.hint}" if exc.hint else "")
    elif not close and among is None and "ephemeral" not in (exc.hint or ""):  # the run said so; a user asks later
        exc.hint = ((f"{exc.hint}; " if exc.hint else "") + "a task routed `ephemeral` (normal, expected to end "
                    "within 2 h the same day) is kept only in its run's process: `overnight route FILE.py` "
                    "shows a task's level")


def _queue_row(s: Store, task_id: str) -> Any | None:
    """The queue row of ``task_id`` (:class:`~overnight.store.queue.QueuedTask`), or None: never
    submitted, a store kind without a queue, or the queue unreadable.

    Raises:
        StoreVersionError: the queue's tables are a newer overnight's (never read as "no row")."""
    try:
        q = queue_for(s)
        return q.get(task_id) if q is not None else None
    except StoreVersionError:
        raise
    except OvernightError:
        return None


def _command(verb: str, task_id: str | None, s: Store) -> str:
    """``overnight VERB [ID]`` with ``--store`` when ``s`` is not the default store
    (:func:`~overnight.runtime.outcome.command`)."""
    return command(verb, task_id, getattr(s, "url", None))


def _held_by_worker(s: Store, task_id: str, branch: str, exc: TaskBusy, then: str) -> TaskBusy:
    """``exc`` -- a :class:`TaskBusy` taking the lease of ``task_id``/``branch`` -- naming the worker
    when the holder is one running the task from the queue (its row ``running``, claimed by a
    worker), with what a user can do: wait for it, or ``overnight cancel`` it (it stops at its next
    step boundary) and then ``then``. Otherwise ``exc`` as it is."""
    row = _queue_row(s, task_id) if branch == "main" else None  # workers run the main branch
    if row is None or row.status != "running" or not row.worker_id:
        return exc
    return TaskBusy(
        f"task {task_id!r} is busy: worker {row.worker_id} on {row.host} is running it (queue {row.queue!r})",
        task_id=task_id, holder=exc.holder,
        hint=f"wait for the worker to finish it (`{_command('status', task_id, s)}` shows its progress), or "
        f"`{_command('cancel', task_id, s)}` to stop it at its next step boundary, then {then}")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|hr|d|day|days|w|week|weeks)?\s*$")
_DURATION_S = {None: 1, "ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400,
               "day": 86400, "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}


def parse_duration(value: str | float | int | None, what: str = "duration") -> float | None:
    """Seconds from ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"0"`` (a bare number is seconds).

    Raises:
        ConfigError: anything else, or a negative number.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value.lower())):
        seconds = float(m.group(1)) * _DURATION_S[m.group(2)]
    else:
        raise ConfigError(f"cannot read {what} {value!r}", hint="use e.g. 30d, 12h, 90m, 45s or 0")
    if seconds < 0:
        raise ConfigError(f"{what} {value!r} is negative")
    return seconds


# --- loading task code: overnight.runtime.task_code (re-exported: api.load_task) -------------------


# --- run / resume ------------------------------------------------------------------------------


def run(
    entry: str | Task,
    *,
    store: Store | str | None = None,
    branch: str = "main",
    max_steps: int | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    on_drift: str | dict[str, str] | None = None,
    model: Any = None,
    max_context_tokens: int | None = None,
    params: dict[str, Any] | None = None,
    task_id: str | None = None,
) -> RunResult:
    """Create or resume the task defined at ``entry`` (``FILE.py[:NAME]``) and run it.

    ``on_drift``: drift policies for this run (``"deps=recompute,env=accept"``); ``model``: a
    model or spec for ``ctx.model`` (default the task's); ``max_context_tokens``: the session's
    context window (default the task's, 8,000). ``params`` (a JSON object: ``ctx.params``) and
    ``task_id`` run the definition as ``overnight submit`` queues it: under ``task_id``, else the
    definition's id plus 8 hex digits of the params' digest when there are params
    (:func:`~overnight.fleet.submit.default_id`); ``resume`` then runs the same definition and params.

    Raises:
        ConfigError: ``params`` is not a JSON object with string keys; from :func:`load_task`.
        SpecError: ``task_id`` is not a valid task id.
    """
    task = load_task(entry) if isinstance(entry, str) else entry
    if params or task_id is not None:
        from overnight.fleet.submit import check_params, default_id

        params = check_params(params)
        task = task.submitted_as(task_id if task_id is not None else default_id(task, params), params)
    return Runner(task, store, branch=branch, max_steps=max_steps, on_event=on_event, on_drift=on_drift,
                  model=model, max_context_tokens=max_context_tokens).run()


def resume(
    task_id: str,
    *,
    store: Store | str | None = None,
    branch: str = "main",
    entry: str | None = None,
    max_steps: int | None = None,
    on_event: Callable[[RunEvent], None] | None = None,
    on_drift: str | dict[str, str] | None = None,
    model: Any = None,
    max_context_tokens: int | None = None,
    allow_rollback: bool = False,
) -> RunResult:
    """Resume a stored task from the latest head of ``branch``, loading its code from the entry
    recorded when it was created (or ``entry`` to override) -- only from inside the project
    (:mod:`overnight.runtime.task_code`).

    Raises:
        TaskNotFound: no such task. ConfigError: no code location recorded and none given.
        CodeLocationRefused: the recorded location lies outside the project (pass ``entry``).
        EntryMismatch: the store's task row and the verified head disagree on the location.
        RollbackDetected: the branch ref was moved back (``allow_rollback=True`` accepts it).
    """
    if store is None:  # the default store, else the configured media; then every medium it was routed to
        found = locate(task_id, load_config())
        if found is None:
            exc = TaskNotFound(f"no task {task_id!r} in the default store or the configured media", task_id=task_id,
                               hint="`overnight ls` lists the tasks; pass --store URL for another store")
            if store_exists(default_store_url()):
                with opened(None) as s:
                    _suggest(exc, s)
            else:
                _suggest(exc, None)
                exc.hint = further_up_hint(default_store_url()) or exc.hint  # run in a project's subfolder?
            raise exc
        store = found[0]
        try:
            return resume(task_id, store=store, branch=branch, entry=entry, max_steps=max_steps, on_event=on_event,
                          on_drift=on_drift, model=model, max_context_tokens=max_context_tokens,
                          allow_rollback=allow_rollback)
        finally:
            store.close()
    with _opened(store) as s:
        # a replicated task is read from a medium that holds it (the runner repairs the others,
        # and sets aside a damaged one, before its session starts)
        medium = medium_for(s.hot, task_id, write=False)
        reader = s if medium is s.hot else medium
        row = reader.get_task(task_id)
        verified = spec = None
        head = None
        if entry is None and row.entry:
            # loaded and verified once: the runner starts from it when the branch ref still names it
            # once its lease is taken, and hashes its artifacts there (the deep check, the slow part,
            # runs under the lease and the stop signals); a replicated task's runner repairs first
            known: set[str] = set()
            loaded, fallback = load_head(reader, task_id, branch, key=signing_key_from_env(), deep=False,
                                         verified=known, lazy_done=True)
            verified = _spec_entry(loaded)
            spec = _spec_of(loaded)
            head = (loaded, fallback, known) if reader is s else None
        task = load_stored_task(task_id, recorded=row.entry, verified=verified, override=entry,
                                spec=spec)
        if task is None:
            raise _no_code(row, "resume")
        try:
            return Runner(task, s, branch=branch, max_steps=max_steps, on_event=on_event, on_drift=on_drift,
                          model=model, max_context_tokens=max_context_tokens, code_moved=entry is not None,
                          allow_rollback=allow_rollback, head=head).run()
        except TaskBusy as exc:  # a worker running it from the queue: say which, and `overnight cancel`
            told = _held_by_worker(s, task_id, branch, exc, f"`{_command('resume', task_id, s)}` runs it here")
            if told is exc:
                raise
            raise told from exc


def _spec_of(loaded: Any) -> dict[str, Any] | None:
    """A verified checkpoint's task spec (covered by its digest and signature), if it is a dict."""
    spec = loaded.state_tree["task"]["spec"]
    return spec if isinstance(spec, dict) else None


def _spec_params(loaded: Any) -> dict[str, Any]:
    """The params (``ctx.params``) in a verified checkpoint's spec, as recorded (a JSON tree;
    :func:`~overnight.codec.canonical.from_tree` decodes it); ``{}`` when it records none."""
    found = (_spec_of(loaded) or {}).get("params")
    return found if isinstance(found, dict) else {}


CODING_PAUSED_WHY = "coding agent: task_resume in the agent continues it"
"""Why a coding-agent task no session holds is in progress (:data:`CODING_PAUSED` in brackets):
the dashboard's reason for its ``in_progress`` status."""

CODING_PAUSED = f"in progress ({CODING_PAUSED_WHY})"
"""What ``ls`` / ``status`` (and the dashboard) say of a coding-agent task no agent session
holds: in progress, not ``interrupted`` -- ``overnight resume`` has no steps of it to run (its
agent does)."""


def coding_paused(kind: Any, status: str) -> bool:
    """Whether a task reads :data:`CODING_PAUSED` instead of ``status``: ``kind`` -- the ``kind``
    its verified head's task spec records (None or anything else: not a coding-agent task) -- is
    :data:`overnight.verify.coding_world.KIND`, and ``status`` (a status text, as
    :func:`~overnight.store.queue.describe` writes it) says ``interrupted`` or ``stalled``: no
    agent session holds it, and ``overnight resume`` has no step of it to run. The one rule
    ``ls``, ``status`` and the dashboard apply. Raises nothing."""
    return is_coding_task(kind) and state_of(status) in ("interrupted", "stalled")


def is_coding_task(kind: Any) -> bool:
    """Whether ``kind`` -- the ``kind`` a verified head's task spec records -- is a coding-agent
    task's (MCP tools / hooks: :data:`overnight.verify.coding_world.KIND`), which has no overnight
    steps to resume or queue. Raises nothing."""
    from overnight.verify.coding_world import KIND as CODING_KIND

    return kind == CODING_KIND


def _open_ended(loaded: Any, status: str) -> str:
    """``status`` -- a plan-based status of ``loaded``'s task -- or, for a task an adapter writes
    (a LangGraph thread, an Agents SDK session: no plan, so nothing to complete), ``open
    (LangGraph thread)`` / ``open (Agents SDK session)`` where it would say ``complete`` or ``in
    progress`` (FORMAT.md, "Tasks written by the adapters"); for a coding-agent task no session
    holds, :data:`CODING_PAUSED` where it would say ``interrupted`` or ``stalled``."""
    spec = _spec_of(loaded) or {}
    if coding_paused(spec.get("kind"), status):
        return CODING_PAUSED  # no overnight process runs it: its agent does, between sessions
    if status not in ("complete", "in progress"):
        return status  # running, failed, rolled back ...: as for any task
    if isinstance(spec.get("langgraph"), dict):
        return "open (LangGraph thread)"
    if spec.get("kind") == "openai-agents-session":
        return "open (Agents SDK session)"
    return status


def _spec_entry(loaded: Any) -> str | None:
    """The code location in a verified checkpoint's spec."""
    found = (_spec_of(loaded) or {}).get("entry")
    return found if isinstance(found, str) else None


# --- ls / show / cat ---------------------------------------------------------------------------


@dataclass
class TaskSummary:
    """One line of ``overnight ls``."""

    task_id: str
    goal: str
    status: str  # complete | in progress | invalid | rolled back (the branch ref was moved back)
    done: int | None
    """Steps done on the listed branch; None for a row with no plan: a submitted task with no
    checkpoint yet (its plan is not known until a worker loads its code) and a LangGraph thread
    or Agents SDK session (status ``open``: no plan at all)."""
    total: int | None
    """Steps done plus steps to do; None when ``done`` is."""
    branches: list[str]
    checkpoints: int
    updated_at: str | None
    """When its newest checkpoint was written (ISO 8601, UTC); None with no checkpoint."""
    created_at: str | None
    """When the task was created (ISO 8601, UTC); None for a submitted task with no checkpoint yet
    (``submitted_ms`` says when it was submitted)."""
    store: str = ""
    """Where the task was listed from: a store's path, or its URL with any password masked."""
    damaged: int = 0
    """Checkpoint records of the task that fail their own checks (digest, schema, signature) and
    that no verified ditto copy heals; the objects behind each record are not checked here (``show``
    checks those a load reads, ``verify`` everything, artifacts' bytes included)."""
    fell_back: str | None = None
    """Set when the head of the listed branch fails verification: ``"fell back from X to Y: reason"``."""
    entry: str | None = None
    """For a task submitted to the workers that has no checkpoint yet: its code location as
    submitted (``FILE.py:TASK`` or ``MODULE:ATTR``), not imported; its ``goal`` is then ``""``
    (unknown until a worker loads the code), ``done``/``total`` and ``created_at`` None and
    ``branches`` empty. None for a task with checkpoints."""
    submitted_ms: int | None = None
    """With ``entry``: when the task was submitted (Unix ms, the store's clock, as its queue row
    records it). None for a task with checkpoints."""
    served_by_copy: int = 0
    """Damaged checkpoint records whose verified ditto copy serves every read (they load and
    resume; ``overnight verify --repair`` rewrites them): not in ``damaged``, not invalid for
    ``verify``."""


def _fell_back(fallback: Any) -> str | None:
    """``"fell back from X to Y: Kind: reason"`` for a head that failed verification, else None."""
    if fallback is None:
        return None
    first = fallback.skipped[0] if fallback.skipped else None
    why = f": {first.error}: {first.reason}" if first is not None else ""
    return (f"fell back from {short_id(fallback.head_id)} to "
            f"{short_id(fallback.used_id) if fallback.used_id else 'nothing'}{why}")


def ls(*, store: Store | str | None = None) -> list[TaskSummary]:
    """Every task in the store with its status on ``main`` (or its first branch).

    With ``store=None``: the default store, then the configured database and cloud media (where
    the router puts ``important`` and ``critical`` tasks); a task on several media is listed once,
    from the first. ``TaskSummary.store`` says where each one is.

    Raises:
        ConfigError: ``store`` names a store that does not exist (nor, with ``store=None``, does
            the default store or any configured medium).
    """
    if store is not None:
        with _opened(store, read_only=True) as s:
            return _summaries(s, set())
    cfg = load_config()
    urls = list(dict.fromkeys(u for u in (cfg.medium(n) for n in ("local", "database", "cloud"))
                              if u is not None and store_exists(u)))
    if not urls:
        with _opened(None, read_only=True) as s:  # raises: no store yet
            return _summaries(s, set())
    out: list[TaskSummary] = []
    seen: set[str] = set()
    for i, url in enumerate(urls):
        try:
            with _opened(url, read_only=True) as s:
                out += _summaries(s, seen)
        except OvernightError as exc:
            if i == 0 and url == cfg.medium("local"):
                raise  # the default store itself: nothing to list
            warnings.warn(f"tasks on {store_location(url)} are not listed: {exc.message}", stacklevel=2)
    return out


def _damaged_records(s: Store, rows: list[Any], key: bytes | None) -> tuple[int, int]:
    """``(damaged, served by copy)``: records that fail their own checks (digest, schema,
    signature) and have no verified ditto copy, and those whose copy verifies and serves reads
    (one more read each, for damaged records only). ``ls`` counts these for every task; the
    objects behind each record are checked by ``show``/``log`` (and ``verify``), which cost a read
    per checkpoint."""
    bad = served = 0
    for row in rows:
        try:
            parse_record(row, key=key)
        except OvernightError:
            try:
                parse_record(ditto_checkpoint(s, row.checkpoint_id, [], write=False, row=row), key=key)
                served += 1
            except OvernightError:
                bad += 1
    return bad, served


def _summaries(s: Store, seen: set[str]) -> list[TaskSummary]:
    """:class:`TaskSummary` of every task in ``s`` not in ``seen`` (which gains them)."""
    key = signing_key_from_env()
    out = []
    now = s.clock_ms()  # one reading of the clock leases are judged by, for every task listed
    for t in s.list_tasks():
        if t.task_id in seen:
            continue
        seen.add(t.task_id)
        refs = s.list_refs(t.task_id)
        rows = s.list_checkpoints(t.task_id)
        branch = "main" if "main" in refs else next(iter(refs), None)
        status, fell_back = "invalid", None
        done: int | None = 0
        total: int | None = 0
        if branch is not None:
            try:
                loaded, fallback = load_head(s, t.task_id, branch, key=key)  # as a resume checks it
                done, total = loaded.doc.done.count, loaded.doc.done.count + loaded.doc.todo.count
                status = "complete" if not loaded.doc.todo.count else "in progress"
                fell_back = _fell_back(fallback)
                if find_rollback(s, loaded, key=key, skipped={k.checkpoint_id for k in fallback.skipped}
                                 if fallback else set(), named=fallback.head_id if fallback else loaded.id,
                                 branch=branch) is not None:
                    status = "rolled back"  # the ref was moved back: `overnight status` / `verify` say from where
            except OvernightError:
                status = "invalid"
        if status in ("in progress", "complete"):  # who holds it: running / stalled / queued / failed ...
            status = _open_ended(loaded, task_status(s, t.task_id, complete=status == "complete", now=now) or status)
        if state_of(status) == "open":  # an adapter's thread or session: no plan, so no steps of a total
            done = total = None
        bad, served = _damaged_records(s, rows, key)
        out.append(TaskSummary(t.task_id, t.goal, status, done, total, sorted(refs), len(rows),
                               max((r.created_at for r in rows), default=None), t.created_at,
                               store_location(s.url), bad, fell_back, served_by_copy=served))
    for row in unstarted(queue_for(s), seen):
        seen.add(row.task_id)
        out.append(TaskSummary(row.task_id, "", describe(row, None, complete=False, now=now), None, None, [],
                               0, None, None, store_location(s.url), entry=row.entry, submitted_ms=row.submitted_ms))
    return out


def unstarted(q: Any, known: set[str]) -> list[Any]:
    """The rows of queue ``q`` (None: a store kind without a queue) of tasks submitted to the
    workers that have no checkpoint yet: no task row, so not in ``known`` (task ids)."""
    return [row for row in (q.list() if q is not None else []) if row.task_id not in known]


@dataclass
class ChainEntry:
    """One checkpoint in ``overnight show``."""

    seq: int
    checkpoint_id: str
    branch: str
    session: int | None
    event: str
    step: str | None
    created_at: str
    stored_bytes: int
    heads: list[str] = field(default_factory=list)
    valid: bool = True
    problem: str | None = None
    archived: bool = False
    """In a cold store (``overnight archive``); read through, like the others."""
    record: Any = None
    """``show --raw``: the checkpoint record as stored (its body parsed as JSON; a body that does
    not parse: its text), whether or not it verifies."""
    why: str | None = None
    """A ``rollback`` record's kind (:func:`~overnight.chain.records.rollback_kind`); None for other
    events and for a record that does not verify."""
    served_by_copy: str | None = None
    """Set (what is damaged) when the record or an object its load reads is damaged and a verified
    ditto copy serves it: the checkpoint loads (``valid`` stays True, as ``verify`` counts it);
    ``overnight verify --repair`` rewrites the original."""


@dataclass
class TaskReport:
    """``overnight show``: the task, its branches and its chain of checkpoints."""

    task_id: str
    goal: str
    entry: str | None
    created_at: str
    branches: dict[str, str]
    status: str
    done: int
    total: int
    todo: list[str]
    artifacts: dict[str, int]
    chain: list[ChainEntry]
    stored_bytes: int
    usage: dict[str, Any] = field(default_factory=dict)
    fell_back: str | None = None
    """Set when the branch head fails verification: ``"fell back from X to Y: reason"``."""
    damaged: int = 0
    """Checkpoints that fail verification (each marked ``valid: false`` with its ``problem``); not
    those a ditto copy heals (``served_by_copy``)."""
    state: Any = None
    """``show --raw``: the state document of the branch's newest verified checkpoint, as stored
    (``todo``, ``done`` and ``artifacts`` are page references: ``overnight cat-object`` prints a page)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The task's params (``ctx.params``) as the branch's newest verified checkpoint records them
    in its spec (the stored JSON tree, which ``ctx.params`` decodes); ``{}`` when it records none."""
    served_by_copy: int = 0
    """Checkpoints whose damaged record or load-read object a verified ditto copy serves (each
    marked with ``served_by_copy``): they load; ``verify`` does not count them invalid."""


def _raw_json(data: bytes) -> Any:
    """Stored canonical JSON bytes as a JSON value (strictly parsed; bytes that do not parse: text)."""
    import json

    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


def show(task_id: str, *, store: Store | str | None = None, branch: str = "main", raw: bool = False) -> TaskReport:
    """The chain of a task (all branches), with validity of each record and the head's state.
    ``raw``: each entry also carries its record as stored, and the report the head's state document.

    Raises:
        TaskNotFound: no such task.
    """
    key = signing_key_from_env()
    with _opened(store, task_id=task_id, read_only=True) as s:
        t = s.get_task(task_id)
        refs = s.list_refs(task_id)
        if refs and branch not in refs:
            raise BranchNotFound(f"task {task_id!r} has no branch {branch!r}", task_id=task_id,
                                 hint="branches: " + ", ".join(refs))
        heads: dict[str, list[str]] = {}
        for b, cid in refs.items():
            heads.setdefault(cid, []).append(b)
        chain = []
        hot = {r.checkpoint_id for r in s.hot.list_checkpoints(task_id)}
        rows = s.list_checkpoints(task_id)
        damaged = record_problems(s, rows, key=key)
        # what a resume of each other branch would skip (e.g. an artifact whose bytes changed)
        for cid, problem in head_problems(s, task_id, [b for b in refs if b != branch], key=key).items():
            damaged.setdefault(cid, problem)
        status, done, total, todo, artifacts, fell_back, state, params = "invalid", 0, 0, [], {}, None, None, {}
        main_head: Any = None
        if branch in refs:
            try:
                loaded, fallback = load_head(s, task_id, branch, key=key)  # as a resume checks it
                fell_back = _fell_back(fallback)
                for skip in fallback.skipped if fallback else ():
                    damaged.setdefault(skip.checkpoint_id, f"{skip.error}: {skip.reason}")
                st = loaded.doc
                done, total = st.done.count, st.done.count + st.todo.count
                todo = [e.name for e in loaded.state.todo]
                artifacts = {n: a.size for n, a in loaded.artifacts.items()}
                status = "complete" if not st.todo.count else "in progress"
                params = _spec_params(loaded)
                if branch == "main":  # who holds it, as `ls` and `status` say: running / failed / ...
                    status = task_status(s, task_id, complete=not st.todo.count) or status
                status = _open_ended(loaded, status)
                if raw:
                    state = _raw_json(HealingReader(s, write_back=False).get(loaded.record.state.digest,
                                                                             "the head's state"))
                main_head = loaded if branch == "main" else None
            except OvernightError as exc:
                for skip in exc.fallback.skipped if isinstance(exc, NoValidCheckpoint) and exc.fallback else ():
                    damaged.setdefault(skip.checkpoint_id, f"{skip.error}: {skip.reason}")
        served = served_by_copy(s, [r for r in rows if r.checkpoint_id in damaged], key)
        for cid in served:
            del damaged[cid]
        for row in rows:
            session = why = None
            try:
                record = served[row.checkpoint_id][1] if row.checkpoint_id in served else parse_record(row, key=key)
                session = record.session.n
                why = rollback_kind(record.event)
            except OvernightError:
                pass  # in damaged already
            problem = damaged.get(row.checkpoint_id)
            chain.append(ChainEntry(row.seq, row.checkpoint_id, row.branch, session, row.event, row.step,
                                    row.created_at, row.stored_bytes, heads.get(row.checkpoint_id, []), problem is None,
                                    problem, row.checkpoint_id not in hot, _raw_json(row.body) if raw else None, why,
                                    served[row.checkpoint_id][0] if row.checkpoint_id in served else None))
        return TaskReport(task_id, t.goal, t.entry, t.created_at, refs, status, done, total, todo, artifacts, chain,
                          sum(c.stored_bytes for c in chain), _usage(s, task_id, main_head), fell_back, len(damaged),
                          state, params, len(served))


_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})")


def cat_object(object_digest: str, *, store: Store | str | None = None) -> bytes:
    """The verified bytes behind a digest, like ``git cat-file -p``: what an object stands for (a
    blob's content decompressed; a chunk tree's chunks concatenated), or a checkpoint's record body.
    Every byte returned hashes to ``object_digest``.

    Args:
        object_digest: ``sha256:<64 hex>`` (or the 64 hex digits alone), e.g. a record's
            ``state.digest``, a page of its state document, an artifact's digest, a checkpoint id.

    Raises:
        ConfigError: not a SHA-256 digest.
        ObjectNotFound: the store has no object and no checkpoint with this digest.
        IntegrityError: the stored bytes fail verification (``DigestMismatch``, ``MissingObject``
            for a chunk of a tree, naming the object).
    """
    m = _DIGEST.fullmatch(object_digest.strip().lower())
    if m is None:
        raise ConfigError(f"{object_digest!r} is not a digest", hint="give sha256: and 64 hex digits, e.g. from "
                          "`overnight show TASK --json --raw`")
    d = f"sha256:{m.group(1)}"
    with _opened(store, read_only=True) as s:
        if not s.missing_objects([d]):
            return BlobReader(s).get(d, f"object {short_id(d)}")
        try:
            row = s.get_checkpoint(d)
        except CheckpointNotFound:
            raise ObjectNotFound(f"no object or checkpoint {d} in the store",
                                 hint="digests are in `overnight show TASK --json --raw`") from None
        if digest.sha256(row.body) != d:
            raise DigestMismatch(f"checkpoint {short_id(d)} body does not match its digest", task_id=row.task_id,
                                 checkpoint_id=d, object_digest=d)
        return row.body


def _usage(s: Store, task_id: str, main_head: Any = None) -> dict[str, Any]:
    """Model usage of a task from its call journal (every call actually made) and its done steps
    (calls replayed from the journal after an interruption instead of being made again) on
    ``main`` -- ``main_head``, the verified head of ``main`` when the caller loaded it already
    (``show`` does: the head is loaded and verified once), else loaded here."""
    cfg = load_config()
    by_model: dict[str, dict[str, Any]] = {}
    for c in s.calls(task_id):
        m = by_model.setdefault(c.model, {"calls": 0, "tokens_in": 0, "tokens_out": 0})
        m["calls"] += 1
        m["tokens_in"] += c.tokens_in
        m["tokens_out"] += c.tokens_out
    cost = 0.0
    priced = bool(by_model)
    for model, m in by_model.items():
        price = cfg.price(model)
        if price is None:
            priced = False
            continue
        m["cost_usd"] = round(m["tokens_in"] / 1e6 * price[0] + m["tokens_out"] / 1e6 * price[1], 6)
        cost += m["cost_usd"]
    replayed = 0
    try:
        loaded = main_head or load_head(s, task_id, "main", key=signing_key_from_env(), deep=False)[0]
        replayed = sum(d.replayed_tokens for d in loaded.state.done)
    except OvernightError:
        pass
    return {"calls": sum(m["calls"] for m in by_model.values()),
            "tokens_in": sum(m["tokens_in"] for m in by_model.values()),
            "tokens_out": sum(m["tokens_out"] for m in by_model.values()),
            "tokens_saved_by_resume": replayed, "by_model": by_model,
            "cost_usd": round(cost, 6) if priced else None}


def resolve_checkpoint(store: Store, task_id: str, ref: str) -> str:
    """A full checkpoint id from a branch name, a full id, or a unique hex prefix (>= 4 digits).

    Raises:
        CheckpointNotFound: nothing matches, or the prefix is ambiguous.
    """
    refs = store.list_refs(task_id)
    if ref in refs:
        return refs[ref]
    hexpart = ref.split(":", 1)[-1].lower()
    matches = [r.checkpoint_id for r in store.list_checkpoints(task_id)
               if r.checkpoint_id.split(":", 1)[1].startswith(hexpart)]
    if len(hexpart) < 4 and matches:
        raise CheckpointNotFound(f"checkpoint prefix {ref!r} is too short: give at least 4 hex digits "
                                 f"(task {task_id!r})", task_id=task_id,
                                 hint="`overnight show TASK_ID` lists checkpoint ids (12 digits shown)")
    if not matches:
        raise CheckpointNotFound(f"task {task_id!r} has no checkpoint or branch {ref!r}", task_id=task_id,
                                 hint="`overnight show TASK_ID` lists checkpoint ids")
    if len(matches) > 1:
        raise CheckpointNotFound(f"checkpoint prefix {ref!r} is ambiguous in task {task_id!r}: "
                                 f"{', '.join(short_id(m) for m in matches[:5])}", task_id=task_id)
    return matches[0]


def _some(names: list[str], limit: int = 8) -> str:
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def cat(task_id: str, artifact: str, *, store: Store | str | None = None, at: str | None = None,
        branch: str = "main", notes: list[str] | None = None) -> bytes:
    """The bytes of ``artifact`` at the branch head (or at checkpoint/branch ``at``), verified.
    When the head fails verification, the newest valid checkpoint is used and ``notes`` (if given)
    gets a line saying so.

    Raises:
        TaskNotFound / CheckpointNotFound / ArtifactNotFound; IntegrityError if it fails verification.
    """
    key = signing_key_from_env()
    with _opened(store, task_id=task_id, read_only=True) as s:
        s.get_task(task_id)
        if at is None:
            loaded, fallback = load_head(s, task_id, branch, key=key, deep=False)
            if fallback is not None and notes is not None:
                notes.append(fallback.describe().splitlines()[0])
        else:
            loaded = load_checkpoint(s, resolve_checkpoint(s, task_id, at), key=key, deep=False)
        ref = loaded.artifacts.get(artifact)
        if ref is None:
            close = _close(artifact, list(loaded.artifacts))
            raise ArtifactNotFound(
                f"no artifact {artifact!r} at checkpoint {short_id(loaded.id)}", task_id=task_id,
                checkpoint_id=loaded.id,
                hint=(f"did you mean {' or '.join(close)}? " if close else "")
                + "artifacts there: " + _some(sorted(loaded.artifacts)),
            )
        try:
            # a damaged or missing object on the way (the tree object, its chunk index) read from
            # its verified ditto copy, as the load did; a read-only command writes nothing back
            return HealingReader(s, write_back=False).get(ref.digest, f"artifact {artifact!r}")
        except IntegrityError as exc:  # named: which task and checkpoint, and what to do
            exc.task_id, exc.checkpoint_id = task_id, loaded.id
            exc.hint = exc.hint or (f"`overnight verify {task_id}` reports the damage; an earlier version: "
                                    f"`overnight cat {task_id} {artifact} --at CHECKPOINT` (`overnight log "
                                    f"{task_id}` lists them); a resume falls back past it")
            raise


# --- verify / log / fork / rollback / merge -----------------------------------------------------


def verify(task_id: str | None = None, *, store: Store | str | None = None, all_objects: bool = False,
           on_progress: Callable[[int, int], None] | None = None, repair: bool = False,
           queued: list[str] | None = None) -> VerifyReport:
    """Full check of one task (or, with ``task_id=None``, every task); ``all_objects`` also checks
    every stored object, referenced or not; ``repair`` rewrites damaged or missing originals from
    their verified ditto copies (``healed``). See :mod:`overnight.verify.fsck`.

    ``queued``: with ``task_id=None``, gains the ids of the tasks submitted to the workers that
    have no checkpoint yet (nothing of them to verify; in queue order). A queue that cannot be
    read adds none: the check of the checkpoints is the report.

    Raises:
        TaskNotFound: ``task_id`` does not exist.
    """
    from overnight.verify.fsck import verify_store

    with _opened(store, task_id=task_id, read_only=not repair, write=repair) as s:
        rep = verify_store(s, [task_id] if task_id else None, key=signing_key_from_env(),
                           all_objects=all_objects, on_progress=on_progress, repair=repair)
        if queued is not None and task_id is None:
            try:
                queued += [row.task_id for row in unstarted(queue_for(s, create=False),
                                                             {t.task_id for t in s.list_tasks()})]
            except OvernightError:
                pass  # a damaged task table or queue: the problems above (or `overnight ls`) name it
        return rep


def log(task_id: str, *, store: Store | str | None = None) -> list[LogEntry]:
    """The task's history, all branches, newest first, with a graph column (``git log --graph``)."""
    from overnight.chain import branches as branching

    with _opened(store, task_id=task_id, read_only=True) as s:
        s.get_task(task_id)
        return branching.history(s, task_id, key=signing_key_from_env())


def fork(task_id: str, at: str, branch: str, *, store: Store | str | None = None) -> str:
    """Create ``branch`` at checkpoint ``at`` (id, unique prefix, or branch name); returns the new
    branch's first checkpoint id. Raises ``BranchExists``, ``CheckpointNotFound``, ``IntegrityError``."""
    from overnight.chain import branches as branching
    from overnight.ops.archive import ensure_hot

    with _opened(store, task_id=task_id, write=True) as s:
        s.get_task(task_id)
        cid = resolve_checkpoint(s, task_id, at)
        ensure_hot(s, task_id, cid)  # an archived checkpoint comes back to hot before a branch builds on it
        return branching.fork(s, task_id, cid, branch, key=signing_key_from_env())


def rollback(task_id: str, to: str, *, branch: str = "main", store: Store | str | None = None) -> str:
    """Give ``branch`` a new head with the state of its ancestor ``to``; the newer checkpoints stay
    in the history. Raises ``TaskBusy`` while a run holds the branch."""
    from overnight.chain import branches as branching
    from overnight.ops.archive import ensure_hot

    with _opened(store, task_id=task_id, write=True) as s:
        s.get_task(task_id)
        cid = resolve_checkpoint(s, task_id, to)
        ensure_hot(s, task_id, cid)  # an archived checkpoint comes back to hot before the branch uses its state
        return branching.rollback(s, task_id, cid, branch=branch, key=signing_key_from_env())


def merge(task_id: str, source: str, *, into: str = "main", prefer: str | None = None,
          store: Store | str | None = None) -> MergeResult:
    """Merge branch ``source`` into ``into`` (union of done steps; three-way for artifacts and
    state). Raises ``MergeConflict`` listing both sides unless ``prefer`` is ``ours``/``theirs``."""
    from overnight.chain import branches as branching

    with _opened(store, task_id=task_id, write=True) as s:
        s.get_task(task_id)
        return branching.merge(s, task_id, source, into=into, prefer=prefer, key=signing_key_from_env())


# --- status / drift / env export ----------------------------------------------------------------


@dataclass
class StatusReport:
    """``overnight status``: where the task stands, and (with ``drift=True``) what drifted. A task
    submitted but not started yet has no head: ``head`` is ``""`` and ``seq`` -1."""

    task_id: str
    branch: str
    head: str
    seq: int
    status: str
    done: int
    total: int
    next_steps: list[str]
    accepted_drift: list[dict[str, Any]]
    drift: DriftReport | None = None
    drift_plan: str | None = None
    plan_change: str | None = None
    """``+ x before c; - y``: how the task code's plan differs from the stored one (``--drift``)."""
    will_run: list[str] = field(default_factory=list)
    """With ``--drift``: the steps a resume runs, in order (the todo list after the drift policies
    and the plan change; steps a running step adds are not known yet)."""
    may_run: list[str] = field(default_factory=list)
    """Steps a recompute re-checks that read the output of a recomputed step: run again only if
    what they read now differs, else replayed."""
    replayed: list[str] = field(default_factory=list)
    """Steps a recompute pass replays from their checkpoints (nothing they read changed)."""
    fell_back: str | None = None
    """Set when the branch head fails verification: ``"fell back from X to Y: reason"`` (``head``
    is then the checkpoint a resume would continue from)."""
    drift_words: list[str] = field(default_factory=list)
    """With ``--drift`` on a coding-agent task: the drift in words (``"main moved 3 commits ..."``)."""
    rollback: str | None = None
    """Set when the branch ref was moved back behind a newer record or this machine's high-water
    mark (:mod:`overnight.chain.rollback`): what it names and what it is older than."""
    queue: dict[str, Any] | None = None
    """For a task submitted but not started (``seq`` -1), where it stands in the workers' queue:
    ``queue`` (name), ``priority``, ``entry``, ``params``, ``submitted_ms`` / ``not_before_ms``
    (Unix ms, the store's clock), ``age_ms`` (since it was submitted, by that clock), and ``ahead``:
    the tasks of its queue a worker claims before it (queued and due, higher priority or submitted
    earlier: the claim's order) -- 0 for one not queued."""
    healed: list[str] = field(default_factory=list)
    """What the head's load read from ditto copies because the original was damaged or missing,
    one line each (:meth:`~overnight.chain.ditto.Heal.describe`): the head loads and resumes as
    before; ``overnight verify --repair TASK`` rewrites the originals."""


def _queue_place(s: Store, row: Any, now: int) -> dict[str, Any]:
    """:attr:`StatusReport.queue` of queue row ``row`` at ``now`` (Unix ms, the store's clock; one
    read of the queue's rows)."""
    ahead = 0
    if row.status == "queued":
        q = queue_for(s)
        ahead = sum(1 for r in (q.list() if q is not None else [])
                    if r.queue == row.queue and r.status == "queued" and r.task_id != row.task_id
                    and r.not_before_ms <= max(now, row.not_before_ms)
                    and (r.priority, -r.seq) > (row.priority, -row.seq))
    return {"queue": row.queue, "priority": row.priority, "entry": row.entry, "params": dict(row.params),
            "submitted_ms": row.submitted_ms, "not_before_ms": row.not_before_ms,
            "age_ms": max(0, now - row.submitted_ms), "ahead": ahead}


def _no_code(row: Any, action: str) -> ConfigError:
    """Why a task without a recorded code location cannot be resumed (or drift-checked) here:
    a LangGraph thread or an Agents SDK session lives in its framework, not in overnight steps."""
    from overnight.codec.canonical import loads

    try:
        spec = loads(row.spec)
    except OvernightError:
        spec = {}
    if isinstance(spec, dict) and "langgraph" in spec:
        return ConfigError(f"task {row.task_id!r} is a LangGraph thread stored by OvernightSaver: it has no overnight "
                           f"steps to {action}", task_id=row.task_id,
                           hint="continue it by invoking your graph with the same thread_id; "
                           "saver.drift(config) reports what changed since its checkpoints")
    if isinstance(spec, dict) and spec.get("kind") == "openai-agents-session":
        return ConfigError(f"task {row.task_id!r} is an OpenAI Agents SDK session stored by OvernightSession: it has "
                           f"no overnight steps to {action}", task_id=row.task_id,
                           hint="open it again with OvernightSession(session_id, store=...)")
    from overnight.verify.coding_world import KIND

    if isinstance(spec, dict) and spec.get("kind") == KIND:
        return ConfigError(f"task {row.task_id!r} is a coding-agent task (MCP tools / hooks): it has no overnight "
                           f"steps to {action}", task_id=row.task_id,
                           hint="the agent continues it: task_resume (or the session-start hook) loads its control "
                           "point; `overnight status TASK --drift` shows what changed")
    return ConfigError(f"task {row.task_id!r} has no recorded code location; cannot {action} it without its code",
                       task_id=row.task_id, hint="pass --file FILE.py[:NAME] (the file defining the task; it is "
                       "imported, so its top-level code runs)")


def status(task_id: str, *, store: Store | str | None = None, branch: str = "main", drift: bool = False,
           entry: str | None = None, on_drift: str | dict[str, str] | None = None, model: Any = None) -> StatusReport:
    """The branch head of a task; with ``drift``, the drift report against the world now and what
    the policies would do -- without resuming or writing anything. ``model``: the model a resume
    would call (a model or a spec; default the task's), for the ``model`` component.

    Raises:
        TaskNotFound / BranchNotFound; IntegrityError when nothing verifies; ConfigError when the
        task's code cannot be loaded for a drift check.
    """

    with _opened(store, task_id=task_id, read_only=True) as s:
        try:
            s.get_task(task_id)
        except TaskNotFound:
            row = _queue_row(s, task_id)
            if row is None:
                raise
            now = s.clock_ms()
            return StatusReport(task_id, branch, "", -1, describe(row, None, complete=False, now=now), 0, 0, [], [],
                                drift_plan="not started: no checkpoint to compare with yet" if drift else None,
                                queue=_queue_place(s, row, now))
        key = signing_key_from_env()
        loaded, fallback = load_head(s, task_id, branch, key=key)  # as a resume checks it, artifacts hashed
        st = loaded.state
        accepted = list(loaded.record.fingerprint.accepted) if loaded.record.fingerprint else []
        rep = StatusReport(task_id, branch, loaded.id, loaded.record.seq,
                           "complete" if not st.todo else "in progress", len(st.done), len(st.done) + len(st.todo),
                           [e.name for e in st.todo[:10]], accepted, fell_back=_fell_back(fallback),
                           healed=[h.describe(task_id) for h in loaded.healed])
        moved_back = find_rollback(s, loaded, key=key, skipped={k.checkpoint_id for k in fallback.skipped}
                                   if fallback else set(), named=fallback.head_id if fallback else loaded.id,
                                   branch=branch)
        if moved_back is not None:
            rep.status, rep.rollback = "rolled back", moved_back.describe()
        else:
            rep.status = _open_ended(loaded, task_status(s, task_id, complete=not st.todo) or rep.status)
        if drift:
            task = load_stored_task(task_id, recorded=s.get_task(task_id).entry, verified=_spec_entry(loaded),
                                    override=entry, checkpoint_id=loaded.id, spec=_spec_of(loaded))
            if task is None:
                if _coding_drift(rep, loaded):
                    return rep
                raise _no_code(s.get_task(task_id), "check drift of")
            _predict(rep, s, loaded, task, on_drift, model)
        return rep


def _coding_drift(rep: StatusReport, loaded: Any) -> bool:
    """For a coding-agent task (``overnight mcp`` / hooks; no Python code to load): fill ``rep``
    with the drift of its world fingerprint (git, files, lock files, env, inputs --
    :mod:`overnight.verify.coding_world`) and return True; False for any other task."""
    from overnight.verify import coding_world
    from overnight.verify.drift import DriftItem

    spec = loaded.state_tree["task"]["spec"]
    if not isinstance(spec, dict) or spec.get("kind") != coding_world.KIND:
        return False
    # the project is the one this command runs in, as for the MCP server and the hooks -- never the
    # folder the store records (stored data must not choose what is read; a moved project follows)
    root = coding_world.project_root(Path.cwd())
    inputs, env, salt = coding_world.world_args(spec, root, rep.task_id)
    now = coding_world.world(root, inputs=inputs, env=env, salt=salt)
    found = coding_world.drift(root, loaded.world, now, checkpoint_id=loaded.id,
                               todo=[t.name for t in loaded.state.todo], salt=salt)
    rep.drift = DriftReport(found.checkpoint_id, [DriftItem(i["component"], i["key"], i["old"], i["new"])
                                                  for i in found.items])
    recorded = spec.get("project")
    moved = ([f"measured in {coding_world.printable(root, 1000)} (this directory's project); the task records "
              f"{coding_world.printable(recorded, 1000)}"] if isinstance(recorded, str) and recorded != str(root) else [])
    rep.drift_words = moved + found.lines
    rep.drift_plan = ("a coding-agent task: nothing runs again on resume; task_resume (or the session-start hook) "
                      "tells the agent what changed" if found.items else "no step to recompute")
    return True


def _predict(rep: StatusReport, s: Store, loaded: Any, task: Task, on_drift: str | dict[str, str] | None,
             model: Any) -> None:
    """Fill ``rep`` with the drift against the world now and what a resume would do about it --
    the same functions the runner calls (:func:`~overnight.runtime.drift_decision.decide`, read
    only, and :func:`~overnight.runtime.task.reconcile_plan`), so the prediction is the run."""
    from overnight.errors import DriftAbort
    from overnight.runtime.drift_decision import (
        decide,
        input_paths_for,
        policies_for,
        report_for,
        salt_of,
        world,
        world_spec,
    )
    from overnight.models import model_from_spec
    from overnight.runtime.session import identity_of, tokenizer_of
    from overnight.runtime.task import reconcile_plan
    from overnight.verify.drift import affected_steps, parse_policies

    state = loaded.state_tree
    client = model if hasattr(model, "complete") else model_from_spec(model or task.model)
    now = world(world_spec(task, salt_of(state), identity_of(client, tokenizer_of(client))))
    policies = policies_for(task, parse_policies(on_drift))
    moved = input_paths_for(state, loaded.world).moved_line()  # input paths are read in this project
    rep.drift_words = [moved] if moved else []
    route = recorded_route(state["task"]["spec"])
    level = task.level or (route.level if route else "durable")
    plan = []
    after = state
    if level != "durable":
        rep.drift = report_for(loaded, state, task, now, salt_of(state))
        plan.append(f"level {level}: drift is not checked on resume")
    else:
        try:
            decision = decide(s, loaded, task, now, policies, key=signing_key_from_env())
        except DriftAbort as exc:
            rep.drift = exc.report or report_for(loaded, state, task, now, salt_of(state))
            rep.drift_plan = f"abort (exit 5): {exc.message.splitlines()[0]}"
            return
        rep.drift = decision.found or decision.report
        after = decision.state
        if decision.rollback_to is not None:
            plan.append(f"roll back to checkpoint {decision.rollback_to.id[7:19]}")
        for component in rep.drift.components():
            policy = policies[component]
            if policy == "recompute":
                steps = affected_steps(rep.drift, state["done"], {component}, closure=False)
                plan.append(f"{component}: recompute {len(steps)} step(s)" + (f" ({_some(steps, 6)})" if steps else ""))
            else:
                plan.append(f"{component}: {policy}")
        if decision.recomputed:
            closure = affected_steps(rep.drift, state["done"], {c for c in rep.drift.components()
                                                                  if policies[c] == "recompute"})
            rep.may_run = [n for n in closure if n not in decision.recomputed]
    todo, change = reconcile_plan(after["todo"], after["done"], task)
    if change:
        plan.append(f"plan changed: {change.describe()}")
        rep.plan_change = change.describe()
    rep.will_run = [e["name"] for e in todo if e.get("previous") is None or e["previous"].get("direct")]
    rep.replayed = [e["name"] for e in todo if e.get("previous") is not None and not e["previous"].get("direct")
                    and e["name"] not in rep.may_run]
    rep.drift_plan = "; ".join(plan) or "no step to recompute"


def env_export(task_id: str, *, store: Store | str | None = None, at: str | None = None, branch: str = "main") -> str:
    """The recorded environment of a checkpoint (default: the branch head) as a pip requirements
    file: package pins, lock-file digests, Python version and declared env-var *names* (never values).

    Raises:
        ConfigError: the checkpoint has no fingerprint.
    """
    from overnight.verify.fingerprint import pip_requirements

    with _opened(store, task_id=task_id, read_only=True) as s:
        s.get_task(task_id)
        key = signing_key_from_env()
        if at is None:
            loaded, _ = load_head(s, task_id, branch, key=key, deep=False)
        else:
            loaded = load_checkpoint(s, resolve_checkpoint(s, task_id, at), key=key, deep=False)
        if loaded.world is None:
            raise ConfigError(f"checkpoint {short_id(loaded.id)} has no fingerprint to export", task_id=task_id,
                              checkpoint_id=loaded.id)
        step_env = {name for d in loaded.state_tree["done"] for name in (d.get("reads") or {}).get("env", {})}
        return pip_requirements(loaded.world, step_env)


# --- route / config / repair ---------------------------------------------------------------------


def route(entry: str | Task, *, now: Any = None) -> Route:
    """The router's decision for a task (level, media, reasons), without running it.

    Raises:
        SpecError: no expected span, or the spec is under the completeness threshold.
    """
    from overnight.runtime.router import route as route_task

    task = load_task(entry) if isinstance(entry, str) else entry
    return route_task(task, load_config(), now=now)


def config() -> Config:
    """The effective configuration and where each value came from."""
    return load_config()


def repair(task_id: str | None = None, *, store: Store | str | None = None) -> list[Any]:
    """Bring every medium of a replicated task (or of every task, ``task_id=None``) up to the newest
    verifiable head; returns one :class:`~overnight.ops.repair.RepairReport` per task.

    With ``store=None`` a task is looked up on every configured medium (local, database, cloud), so
    a task whose local copy was lost with its disk is found on a replica and the local copy made
    again; ``task_id=None`` then repairs every task any configured medium knows. A task kept on one
    medium is only checked (nothing to copy from).

    Raises:
        TaskNotFound: no configured medium (or ``store``) knows the task.
    """
    from overnight.codec.canonical import loads
    from overnight.store.compose.replicated import ReplicatedStore
    from overnight.ops.repair import repair_task

    key = signing_key_from_env()

    def over(media: list[Store], names: list[str], tid: str) -> Any:
        return repair_task(media, names, tid, key=key)

    if store is None:
        cfg = load_config()
        ids = [task_id] if task_id else _configured_task_ids(cfg)
        reports = []
        for tid in ids:
            found = locate(tid, cfg)
            if found is None:
                raise TaskNotFound(f"no task {shown_task_id(tid)} on any configured medium", task_id=tid,
                                   hint="`overnight ls` lists the tasks; pass --store URL for another store")
            located = found[0]
            try:
                if isinstance(located, ReplicatedStore):
                    reports.append(over(located.media, list(located.names), tid))
                else:
                    reports.append(over([located], [located.url], tid))
            finally:
                located.close()
        return reports
    reports = []
    with _opened(store) as s:
        ids = [task_id] if task_id else [t.task_id for t in s.list_tasks()]
        for tid in ids:
            rec = recorded_route(loads(s.get_task(tid).spec))
            urls = rec.urls if rec and rec.level != "ephemeral" and rec.urls else [s.url]
            names = rec.media if rec and len(rec.media) == len(urls) else urls
            media = [s if u == s.url else open_store(u) for u in urls]
            try:
                reports.append(over(media, list(names), tid))
            finally:
                for m in media:
                    if m is not s:
                        m.close()
    return reports


@dataclass
class SalvageReport:
    """``overnight repair --salvage``: what was read from a damaged SQLite file into a new one, and
    how the new one verifies. ``rows``/``errors`` per table (see :mod:`overnight.ops.salvage`);
    ``refs_restored`` lists ``task/branch -> checkpoint`` refs rebuilt because the ref rows were
    lost (the newest checkpoint of the branch whose record verifies); ``verify`` is the full check
    of the result."""

    source: str
    target: str
    rows: dict[str, int]
    errors: dict[str, int]
    refs_restored: dict[str, str]
    verify: VerifyReport


def salvage(path: str | Path, *, into: str | Path | None = None) -> SalvageReport:
    """Recover what SQLite can still read from a damaged store file into a new file (default
    ``NAME.salvaged.db`` beside it), rebuild lost branch refs from verified records, and verify the
    result. The damaged file is never written. Nothing salvaged is trusted more than any stored
    row: every load of the new store verifies it, and :attr:`SalvageReport.verify` says what holds.

    Raises:
        ConfigError: the file is missing, or the target exists.
        StoreCorrupt: not even the table list of the file is readable.
    """
    from overnight.ops.salvage import copy_rows
    from overnight.store.sqlite import SQLiteStore

    source = Path(str(path).removeprefix("sqlite://"))
    target = Path(into) if into is not None else source.with_name(source.stem + ".salvaged.db")
    copied = copy_rows(source, target)
    key = signing_key_from_env()
    restored: dict[str, str] = {}
    with SQLiteStore(target) as s:
        for t in s.list_tasks():
            refs = s.list_refs(t.task_id)
            newest: dict[str, tuple[int, str]] = {}
            for row in s.list_checkpoints(t.task_id):
                try:
                    record = parse_record(row, key=key)  # the branch and seq of a record that verifies
                except OvernightError:
                    continue
                if record.branch not in newest or record.seq > newest[record.branch][0]:
                    newest[record.branch] = (record.seq, row.checkpoint_id)
            ids = {r.checkpoint_id for r in s.list_checkpoints(t.task_id)}
            for branch, (_, cid) in newest.items():
                if refs.get(branch) not in ids:  # the ref row, or the checkpoint it named, was lost
                    s.set_ref(t.task_id, branch, cid, refs.get(branch))
                    restored[f"{t.task_id}/{branch}"] = cid
        from overnight.verify.fsck import verify_store

        report = verify_store(s, None, key=key, all_objects=True)
    return SalvageReport(copied.source, copied.target, copied.rows, copied.errors, restored, report)


def _configured_task_ids(cfg: Config) -> list[str]:
    """Ids of the tasks on every configured medium that exists (local, database, cloud). A damaged
    medium is passed over while another one lists tasks (their repair sets it aside).

    Raises:
        StoreCorrupt: a medium is damaged and no other one lists a task.
    """
    from overnight.errors import StoreCorrupt

    ids: dict[str, None] = {}
    damaged: StoreCorrupt | None = None
    for name in ("local", "database", "cloud"):
        url = cfg.medium(name)
        if url is None or not store_exists(url):
            continue
        try:
            with open_store(url) as s:
                ids.update((t.task_id, None) for t in s.list_tasks())
        except StoreCorrupt as exc:
            damaged = damaged or exc
    if damaged is not None and not ids:
        raise damaged
    return list(ids)


# --- gc / rm / archive / restore ----------------------------------------------------------------


def gc(*, store: Store | str | None = None, apply: bool = False, keep_last: int | None = None,
       older_than: str | float | None = None, task_id: str | None = None,
       grace: str | float = DEFAULT_GRACE_S,
       on_progress: Callable[[int, int], None] | None = None) -> GcReport:
    """Find -- and with ``apply=True`` delete -- dangling checkpoints (on no live branch's
    lineage) and objects no remaining checkpoint needs. A dry run by default.

    Args:
        keep_last: keep each task's N newest dangling checkpoints.
        older_than: only dangling checkpoints older than this go (``"30d"``; seconds as a number).
        task_id: only this task's dangling checkpoints, and the objects only they needed.
        grace: objects stored or refreshed more recently than this stay (default 1 h): the
            safety margin for commits running at the same time (``overnight/ops/gc.py``).

    Raises:
        TaskNotFound, ConfigError; FormatTooNew when a checkpoint is from a newer overnight.
    """
    from overnight.ops import gc as collecting

    with _opened(store, read_only=not apply) as s:
        return collecting.collect(s, apply=apply, keep_last=keep_last,
                                  older_than_s=parse_duration(older_than, "--older-than"), task_id=task_id,
                                  grace_s=parse_duration(grace, "--grace") or 0.0, on_progress=on_progress)


@contextmanager
def _all_leases(s: Store, task_id: str, force: bool) -> Iterator[None]:
    """Hold every branch's lease (and main's) for the block; ``TaskBusy`` names a live holder
    unless ``force``."""
    from overnight.store.leases import DEFAULT_TTL_MS, Holder

    holder = Holder.current()
    held = []
    try:
        for b in sorted({"main", *s.list_refs(task_id)}):
            try:
                held.append(s.acquire_lease(task_id, b, holder.id, holder.to_json(), DEFAULT_TTL_MS * 20))
            except TaskBusy as exc:
                if not force:
                    by_worker = _held_by_worker(s, task_id, b, exc, f"`{_command('rm', task_id, s)}`; or pass "
                                                "--force to delete the task under the worker")
                    if by_worker is not exc:
                        raise by_worker from exc
                    raise TaskBusy(exc.message, task_id=task_id, holder=exc.holder,
                                   hint="stop that run first, or pass --force to delete the task under it") from exc
        yield
    finally:
        for lease in held:
            try:
                s.release_lease(lease)
            except OvernightError:
                pass


def rm(task_id: str, *, store: Store | str | None = None, dry_run: bool = False, force: bool = False,
       grace: str | float = DEFAULT_GRACE_S,
       on_progress: Callable[[int, int], None] | None = None) -> RmReport:
    """Delete a task -- its record, branches, leases, checkpoints, journal, archive catalog rows and
    queue row (a submitted task) -- and then the objects no other task needs (those stored less than ``grace`` ago stay for
    ``gc``). A cold store it was archived to is not touched.

    A task that was submitted but has no checkpoint yet (queued, or parked ``failed`` before its
    first commit) is removed too: its queue row goes, so no worker runs it; the report has no
    checkpoint and its ``queue_status`` says what the row was.

    Raises:
        TaskNotFound: no such task (neither stored nor submitted).
        TaskBusy: a live process holds one of its branches (``force=True`` deletes anyway).
    """
    from overnight.ops import gc as collecting

    with _opened(store, task_id=task_id, write=True) as s:
        grace_s = parse_duration(grace, "--grace") or 0.0
        queued = _queue_row(s, task_id)
        status = queued.status if queued is not None else None
        try:
            s.get_task(task_id)
            stored = True
        except TaskNotFound as exc:
            if not getattr(exc, "leftover", False) and queued is None:
                raise
            # only the records of a first commit (or of an rm) cut short, or a submitted task no
            # worker has committed yet: no checkpoint, nothing to keep
            stored = False
        if dry_run:
            if not stored:
                return collecting.RmReport(task_id, applied=False, grace_s=grace_s, queue_status=status)
            report = collecting.remove_task(s, task_id, apply=False, grace_s=grace_s, on_progress=on_progress)
            report.queue_status = status
            return report
        # under the leases: no worker starts (or commits) it while it goes
        with _all_leases(s, task_id, force):
            # the queue row first, unless a worker claimed it meanwhile (its session is starting: it
            # would create the task again once these leases go): no worker may claim it again
            q = queue_for(s)
            if q is not None and not q.delete(task_id, unless_claimed=not force) and not force:
                claimed = _queue_row(s, task_id)
                if claimed is not None:
                    busy = TaskBusy(f"task {task_id!r} was claimed by a worker: its session is starting",
                                    task_id=task_id, hint="`overnight cancel` it, or pass --force")
                    raise _held_by_worker(s, task_id, "main", busy, f"`{_command('rm', task_id, s)}`; or pass "
                                          "--force to delete the task under the worker") from None
            try:
                s.get_task(task_id)  # again: a worker may have made its first commit since
                stored = True
            except TaskNotFound:
                stored = False
            if stored:
                report = collecting.remove_task(s, task_id, apply=True, grace_s=grace_s, on_progress=on_progress)
            else:
                s.delete_task(task_id)
                report = collecting.RmReport(task_id, applied=True, grace_s=grace_s)
            report.queue_status = status
            return report


def archive(task_id: str, *, cold: str, store: Store | str | None = None, keep_last: int | None = None,
            older_than: str | float | None = None, grace: str | float = DEFAULT_GRACE_S,
            on_progress: Callable[[int, int], None] | None = None) -> ArchiveReport:
    """Move the task's history beyond ``keep_last`` checkpoints per branch (or older than
    ``older_than``) into the cold store ``cold``, packed; heads and everything a kept checkpoint
    needs stay in hot. Archived checkpoints stay readable through every command.

    Raises:
        ConfigError, TaskNotFound, TaskBusy (a run holds a branch), TaskChanged.
    """
    from overnight.ops import archive as archiving

    with _opened(store, task_id=task_id, write=True) as s:
        return archiving.archive(s, task_id, cold=cold, keep_last=keep_last,
                                 older_than_s=parse_duration(older_than, "--older-than"),
                                 grace_s=parse_duration(grace, "--grace") or 0.0, on_progress=on_progress)


def restore(task_id: str, *, store: Store | str | None = None, cold: str | None = None,
            on_progress: Callable[[int, int], None] | None = None) -> RestoreReport:
    """Bring every archived checkpoint of the task back into the hot store (``cold``: read packs
    from this store, and restore runs it holds that the hot catalog lost).

    Raises:
        TaskNotFound; MissingObject / DigestMismatch for a missing or damaged pack.
    """
    from overnight.ops import archive as archiving

    with _opened(store, task_id=task_id, write=True) as s:
        return archiving.restore(s, task_id, cold=cold, on_progress=on_progress)


# --- dashboard reads (``overnight ui``) ----------------------------------------------------------


@contextmanager
def reading(store: Store | str | None = None) -> Iterator[TieredStore]:
    """The store as every read command here sees it (archived history read through from its
    cold store), held open for the block -- for a long-lived reader such as ``overnight ui``,
    which serves many requests from one open store.

    Raises:
        ConfigError: ``store`` names a store that does not exist (it is never created here).
    """
    with _opened(store) as s:
        yield s


def leases(task_id: str, *, store: Store) -> list[Any] | None:
    """The lease rows of a task's branches (:class:`~overnight.store.base.Lease`, one per branch
    ever held, released ones with ``holder_id == ""``), or None when none was ever held (a task
    written by an adapter or a coding agent, which hold no lease: its status comes from its
    checkpoints' age)."""
    found = [lease for branch in store.list_refs(task_id) if (lease := store.read_lease(task_id, branch)) is not None]
    return found or None


def usage(task_id: str, *, store: Store) -> dict[str, Any]:
    """Model usage of a task, as ``overnight show`` reports it (``TaskReport.usage``): calls,
    tokens in/out, tokens saved by resume (replayed from the call journal), per model, and the
    cost in USD when ``[prices]`` covers every model (else None)."""
    return _usage(store, task_id)


# --- the queue: submit / workers / retry / cancel (overnight.fleet runs the workers) --------------


def submit(entry: str, *, store: Store | str | None = None, task_id: str | None = None,
           params: dict[str, Any] | None = None, queue: str = "default", priority: int = 0,
           not_before: Any = None, idempotency_key: str | None = None) -> tuple[Any, bool]:
    """Queue the task defined at ``entry`` for ``overnight worker``; returns ``(QueuedTask,
    created)``. See :func:`overnight.fleet.submit.submit`."""
    from overnight.fleet.submit import submit as submit_task

    return submit_task(entry, store=store, task_id=task_id, params=params, queue=queue, priority=priority,
                       not_before=not_before, idempotency_key=idempotency_key)


def _queue_call(store: Store | str | None, fn: Callable[[Any, Store], Any], task_id: str | None = None,
                among: tuple[str, ...] | None = None) -> Any:
    """``fn(queue, store)`` on the store's queue; for the task ``task_id`` (when given), an id no task can have
    (text that is not UTF-8 included, which no store could even look up) is not found, said so
    (:func:`_suggest`), before the queue is asked. A ``TaskNotFound`` raised suggests the ids of the
    rows whose status is in ``among`` (the rows the command acts on; None: every task)."""
    with opened(store, heal=_heal) as s:
        try:
            q = queue_for(s)
            if q is None:
                raise ConfigError(f"store {s.url} has no queue; workers need an sqlite:// or postgresql:// store")
            if task_id is not None and task_id_problem(task_id) is not None:
                raise TaskNotFound(f"no task {shown_task_id(task_id)} in the queue", task_id=task_id)
            return fn(q, s)
        except TaskNotFound as exc:
            _suggest(exc, s, among)
            raise


def enqueue(task_id: str, *, store: Store | str | None = None, branch: str = "main") -> tuple[Any, bool]:
    """Queue a stored task for the workers instead of resuming it here (``overnight resume
    --submit``, the dashboard's resume). The code location and params are those its verified head
    records -- nothing is imported here; the worker that claims it checks them again. Returns
    ``(QueuedTask, queued_now)`` (False: it was queued or running already, or it is complete).

    A task whose verified head is complete is not queued (a worker would run nothing): the row
    returned says ``complete`` (its queue row, settled ``complete`` when it was parked ``failed`` or
    ``cancelled``; a row made up for it when it was never submitted). A queued or running row stays.

    Raises:
        TaskNotFound / BranchNotFound; IntegrityError when nothing verifies; ConfigError when the
        head records no code location (a coding-agent or adapter task) or the store has no queue.
    """
    from overnight.store.queue import QueuedTask

    if branch != "main":
        raise ConfigError("workers run a task's main branch", task_id=task_id,
                          hint=f"overnight resume {task_id} --branch {branch} runs another branch here")
    with _opened(store, task_id=task_id, write=True) as s:
        s.get_task(task_id)
        # as the worker's resume loads it (artifacts hashed): a head that falls back is not complete
        loaded, _ = load_head(s, task_id, branch, key=signing_key_from_env(), deep=True)
        spec = _spec_of(loaded) or {}
        entry = _spec_entry(loaded)
        if entry is None:
            raise _no_code(s.get_task(task_id), "queue")
        q = queue_for(s)
        if q is None:
            raise ConfigError(f"store {s.url} has no queue; workers need an sqlite:// or postgresql:// store")
        params = from_tree(spec["params"], "task params") if "params" in spec else {}
        if not loaded.doc.todo.count:  # complete: nothing for a worker to run
            return _settle_complete(q, QueuedTask(task_id=task_id, entry=entry, params=dict(params),
                                                  status="complete")), False
        return q.requeue(QueuedTask(task_id=task_id, entry=entry, params=dict(params)))


def _settle_complete(q: Any, made_up: Any) -> Any:
    """The queue row of a task whose verified head is complete (nothing for a worker to run), on
    queue ``q``: a row parked ``failed`` or ``cancelled`` (or ``queued``, not claimed) is settled
    ``complete`` (:meth:`~overnight.store.queue_sql.SqlQueue.settle`) and returned; a ``running`` one
    (a worker's, which finishes it itself) is returned as it is; ``made_up`` -- a
    :class:`~overnight.store.queue.QueuedTask` saying ``complete`` -- when there is no row. Raises
    what the store raises (StoreBusy, StoreUnavailable)."""
    q.settle(made_up.task_id, "complete")
    row = q.get(made_up.task_id)
    return row if row is not None and row.status in ("queued", "running", "complete") else made_up


def _steps_left(s: Store, task_id: str) -> int | None:
    """The steps left on ``task_id``'s main head, verified as a resume loads it (artifacts hashed:
    a head whose artifact is damaged falls back to a checkpoint with steps left, which a worker can
    run); None when the store has no such task or branch, or nothing of it verifies -- then a
    worker that claims it reports what it finds. Raises what the store raises (StoreBusy,
    StoreUnavailable)."""
    try:
        s.get_task(task_id)
        loaded, _ = load_head(s, task_id, "main", key=signing_key_from_env(), deep=True)
    except (TaskNotFound, BranchNotFound, IntegrityError):
        return None
    return loaded.doc.todo.count


def queue_row(task_id: str, *, store: Store | str | None = None) -> Any | None:
    """The queue row of ``task_id`` (:class:`~overnight.store.queue.QueuedTask`: status, attempts,
    ``not_before_ms`` ...), or None when it was never submitted (or the id is no valid task id).

    Raises:
        ConfigError: the store has no queue (workers need an sqlite:// or postgresql:// store).
    """
    def get(q: Any, _: Store) -> Any | None:
        return q.get(task_id)

    if task_id_problem(task_id) is not None:
        return None
    return _queue_call(store, get)


def workers(*, store: Store | str | None = None) -> list[Any]:
    """Workers that registered in the store's queue (:class:`~overnight.store.queue.WorkerRow`)."""
    return _queue_call(store, lambda q, _: q.workers())


def clock_ms(*, store: Store | str | None = None) -> int:
    """Now, in Unix ms, by the clock the store's leases, claims and worker heartbeats are set by
    (:meth:`~overnight.store.base.LeaseStore.clock_ms`: PostgreSQL's server clock, else this
    machine's), for judging their ages as the workers do."""
    with _opened(store, read_only=True) as s:
        return s.clock_ms()


RETRYABLE = ("failed", "cancelled")
"""Queue row statuses ``retry`` queues again (any other row it returns as it is)."""

CANCELLABLE = ("queued", "running")
"""Queue row statuses ``cancel`` acts on (any other row it returns as it is)."""


def retry(task_id: str, *, store: Store | str | None = None) -> Any:
    """Queue a ``failed`` or ``cancelled`` task again (its deaths reset); returns its queue row
    (:class:`~overnight.store.queue.QueuedTask`). A failed row is queued to start now
    (``not_before_ms`` 0); a cancelled row that never started (``attempts`` 0) keeps its
    ``not_before_ms`` (``submit --not-before``; one in the past starts now anyway). A parked row
    whose task's verified main head is complete -- finished since by ``overnight run`` / ``resume``
    here -- is settled ``complete`` instead, as :func:`enqueue` does (a worker would run nothing).
    Any other row is returned as it is (``complete``, ``queued`` or ``running``: nothing queued).

    Raises:
        TaskNotFound: it was never submitted (the hint suggests only failed or cancelled rows),
            or the id is no valid task id; ConfigError when the store has no queue.
    """
    from overnight.store.queue import QueuedTask

    def go(q: Any, s: Store) -> Any:
        row = q.get(task_id)
        if row is not None and row.status in RETRYABLE and _steps_left(s, task_id) == 0:
            return _settle_complete(q, QueuedTask(task_id=task_id, entry=row.entry, params=dict(row.params),
                                                  status="complete"))
        if row is not None and row.status == "complete" and _steps_left(s, task_id):
            # finished once, but its verified head has steps left again (rolled back, or falling
            # back past damage): queue it, as `resume --submit` does
            return q.requeue(QueuedTask(task_id=task_id, entry=row.entry, params=dict(row.params)))[0]
        return q.retry(task_id)

    return _queue_call(store, go, task_id, among=RETRYABLE)


def cancel(task_id: str, *, store: Store | str | None = None) -> Any:
    """Cancel a submitted task (a queued one at once; a running one stops at its next step
    boundary); returns its queue row (:class:`~overnight.store.queue.QueuedTask`), any row not
    ``queued`` or ``running`` as it is.

    Raises:
        TaskNotFound: it was never submitted (the hint suggests only queued or running rows), or
            the id is no valid task id; ConfigError when the store has no queue.
    """
    return _queue_call(store, lambda q, _: q.cancel(task_id), task_id, among=CANCELLABLE)


def task_state(task_id: str, *, store: Store, complete: bool, now: int | None = None) -> str | None:
    """What ``overnight ls`` says of a task from its queue row and task lease (``queued``,
    ``running (worker W on HOST, heartbeat N s ago)``, ``stalled (...)``, ``interrupted``, ``failed
    (REASON)``, ``cancelled``, ``complete``), or None for a store kind without a queue.
    ``complete``: its verified head has nothing left to do; ``now``: Unix ms by the store's clock
    (default: read from it, :func:`clock_ms`)."""
    return task_status(store, task_id, complete=complete, now=now)
