"""The task queue: submitted tasks, claims by workers, and what ``overnight ls`` says about each.

The queue is two tables next to a store's own (``queue``, ``workers``) and a handful of
statements, one file per store (:mod:`overnight.store.queue_sqlite`,
:mod:`overnight.store.queue_postgres`); this module holds what they share: the row types, the
claim rules and the status a person reads.

Vocabulary (the lease words of ``docs/FORMAT.md``):

* **submit** -- insert a row ``queued`` (an idempotency key already used returns that row).
* **claim** -- one short transaction: pick the first runnable row -- ``queued`` with
  ``not_before_ms <= now``, or ``running`` whose claim expired and whose task lease (the
  ``leases`` row of ``(task, main)``) is not live -- in order ``priority DESC, seq`` (submission
  order; no starvation within a priority), lock it (``FOR UPDATE SKIP LOCKED`` on PostgreSQL,
  ``BEGIN IMMEDIATE`` on SQLite), set it ``running`` with ``claim_token + 1``. A claim of a
  ``running`` row is a *takeover*: its previous holder died or stalled.
* **heartbeat** -- the process running the task extends ``claim_expires_ms`` every third of the
  TTL, fenced by the claim token (:class:`ClaimLost` when another worker took it over).
* **finish / release / death** -- every status change after a claim is ``WHERE claim_token =``
  the claimer's token: a holder that was taken over changes nothing.

The claim is about *who runs the task*; the task lease (:mod:`overnight.store.leases`, taken by
the runner) is what every checkpoint commit checks, so a paused holder can never commit over its
taker (``LeaseLost``).

Statuses (``QueuedTask.status``): ``queued`` / ``running`` / ``failed`` (``reason`` says why) /
``cancelled`` / ``complete``. Times are Unix milliseconds by the store's clock
(:meth:`~overnight.store.base.LeaseStore.clock_ms`: PostgreSQL's server clock, else this machine's).

A row edited outside overnight (``params`` that is not a JSON object, text in an integer column,
bytes that are not UTF-8, a NULL ``task_id``) never stops a worker or a listing: :func:`row_to_task`
refuses it with :class:`QueueRowInvalid` naming the row and the column; a claim parks such a row
``failed`` with that reason and goes on with the next one; listings show it as such a ``failed`` row
(:func:`listed_task`). After the cell is fixed, ``overnight retry TASK_ID`` queues it again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from overnight.codec.canonical import MAX_DEPTH
from overnight.errors import ConcurrencyError, SchemaError
from overnight.store.base import Lease
from overnight.store.leases import DEFAULT_TTL_MS, Holder, ended, now_ms, process_gone
from overnight.units import human_duration

STATUSES = ("queued", "running", "failed", "cancelled", "complete")

COMPLETED_OUTSIDE = "completed by a run outside the queue"
"""The ``reason`` of a ``queued`` row finished ``complete`` because a run outside the workers
(``overnight run`` / ``resume`` here) completed its task before any worker claimed it
(:meth:`~overnight.store.queue_sql.SqlQueue.settle`)."""

ALREADY_COMPLETE = "already complete when claimed: nothing to run"
"""The ``reason`` of a row a worker claimed and finished ``complete`` without running a step: its
task's verified head had nothing left to do (completed by a run outside the queue since it was
submitted, or by an earlier claim whose own finish was not recorded)."""


class ClaimLost(ConcurrencyError):
    """This worker's claim on a task was taken over by another worker (its claim expired)."""


class QueueRowInvalid(SchemaError):
    """A queue row that cannot be decoded (edited outside overnight): a cell of the wrong type, text
    that is not UTF-8, ``params`` that is not a JSON object of at most ``MAX_DEPTH`` levels, an
    unknown ``status``, a NULL or empty ``task_id``.

    Attributes:
        row: how the row is named: its task id when readable (``task_id`` is then set too), else
            ``seq N`` or ``rowid N``.
        column: the first column that does not decode.
        detail: what is wrong with it (no more than the start of the bad value).
    """

    def __init__(self, message: str, *, row: str, column: str, detail: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.row = row
        self.column = column
        self.detail = detail


@dataclass
class QueuedTask:
    """One row of the queue.

    Attributes:
        task_id: the task's id in the store.
        entry: where its code is: ``module:attr`` or a file relative to the project root.
        params: JSON object passed to the task (``ctx.params``).
        queue: queue name (default ``default``).
        priority: higher runs first; then ``seq`` (submission order).
        seq: submission order, unique, increasing.
        submitted_ms, not_before_ms: submission time; the task is not claimed before ``not_before_ms``.
        idempotency_key: a second submit with the same key returns this row.
        status: one of :data:`STATUSES`; ``reason`` for ``failed`` (and the last death).
        deaths: sessions that died in a row without a new checkpoint (parks the task at the limit).
        attempts: claims so far.
        claim_token: fencing token of the claim; grows by one on every claim.
        worker_id, host, pid: who claimed it last (pid: the child process running it, once started).
        claimed_ms, claim_expires_ms, heartbeat_ms: claim times.
        progress_head: the branch head when ``deaths`` was last reset (a death after a new
            checkpoint starts counting again).
        cancel_requested: ``overnight cancel`` on a running task: its holder stops at the next step.
        taken_over: set on the row a claim returns when it took over a ``running`` row.
        previous_worker: on such a row, the worker that held it (``worker_id`` is the claimer's).
    """

    task_id: str
    entry: str
    params: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    seq: int = 0
    submitted_ms: int = 0
    not_before_ms: int = 0
    idempotency_key: str | None = None
    status: str = "queued"
    reason: str | None = None
    deaths: int = 0
    attempts: int = 0
    claim_token: int = 0
    worker_id: str | None = None
    host: str | None = None
    pid: int | None = None
    claimed_ms: int | None = None
    claim_expires_ms: int | None = None
    heartbeat_ms: int | None = None
    progress_head: str | None = None
    cancel_requested: bool = False
    taken_over: bool = False
    previous_worker: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS = ("task_id", "entry", "params", "queue", "priority", "seq", "submitted_ms", "not_before_ms",
           "idempotency_key", "status", "reason", "deaths", "attempts", "claim_token", "worker_id", "host", "pid",
           "claimed_ms", "claim_expires_ms", "heartbeat_ms", "progress_head", "cancel_requested")


_TEXT = frozenset({"task_id", "entry", "params", "queue", "idempotency_key", "status", "reason", "worker_id",
                   "host", "progress_head"})
_NULLABLE = frozenset({"idempotency_key", "reason", "worker_id", "host", "pid", "claimed_ms", "claim_expires_ms",
                       "heartbeat_ms", "progress_head"})


def _short(value: Any) -> str:
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _cell(column: str, value: Any, text: bool, nullable: bool) -> str | None:
    """What is wrong with one cell (None: nothing). Text columns hold ``str`` (``bytes``: a value
    that is not UTF-8), integer columns ``int``."""
    if value is None:
        return None if nullable else "is NULL"
    if text:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return f"is bytes {_short(bytes(value))}, not UTF-8 text"
        return None if isinstance(value, str) else f"is not text ({type(value).__name__} {_short(value)})"
    if type(value) is int:
        return None
    return f"is not an integer ({type(value).__name__} {_short(value)})"


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests more than ``MAX_DEPTH`` containers (counted as the codec counts them,
    ``params`` itself being the first): deeper params could never be stored by the runner. Iterative,
    so no input exhausts the stack."""
    todo = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            todo.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def _params(text: str) -> tuple[Any, str | None]:
    """``params`` decoded, and what is wrong with it (None: nothing)."""
    if not text:
        return {}, None
    try:
        value = json.loads(text)
    except RecursionError:
        return None, f"nests more than {MAX_DEPTH} levels"
    except ValueError as exc:
        return None, f"is not JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"is not a JSON object ({type(value).__name__})"
    if _too_deep(value):
        return None, f"nests more than {MAX_DEPTH} levels"
    return value, None


def _decode(row: tuple, rowid: Any) -> tuple[dict[str, Any], QueueRowInvalid | None]:
    """The row's cells that decode, and the error for the first one that does not."""
    values: dict[str, Any] = {}
    bad: tuple[str, str] | None = None
    for column, value in zip(COLUMNS, row):
        wrong = _cell(column, value, column in _TEXT, column in _NULLABLE)
        if wrong is None and column == "params":
            value, wrong = _params(value)
        elif wrong is None and column == "task_id" and not value:
            wrong = "is empty"
        elif wrong is None and column == "status" and value not in STATUSES:
            wrong = f"is {_short(value)}, not one of {', '.join(STATUSES)}"
        if wrong is None:
            values[column] = value
        elif bad is None:
            bad = (column, wrong)
    if bad is None:
        return values, None
    task_id = values.get("task_id")
    if task_id is not None:
        name, what = repr(task_id), f"the queue row of task {task_id!r}"
    else:
        name = f"seq {values['seq']}" if "seq" in values else f"rowid {rowid}"
        what = f"queue row {name}"
    column, wrong = bad
    retry = f"`overnight retry {task_id}`" if task_id is not None else "`overnight retry TASK_ID`"
    return values, QueueRowInvalid(
        f"{what} does not decode: column {column} {wrong}", row=name, column=column, detail=wrong, task_id=task_id,
        hint=f"it was edited outside overnight; fix the cell in the queue table (or delete the row), then {retry} "
        "queues it again")


def row_to_task(row: tuple, *, rowid: Any = None) -> QueuedTask:
    """Decode a queue row: the cells of :data:`COLUMNS` in order (text as ``str``, or ``bytes`` for a
    value that is not UTF-8; integers as ``int``).

    ``rowid``: the row's place in its table (SQLite's ``rowid``), naming it when neither its task id
    nor its ``seq`` is readable.

    Raises:
        QueueRowInvalid: a cell does not decode (the error names the row and the column).
    """
    values, error = _decode(row, rowid)
    if error is not None:
        raise error
    values["cancel_requested"] = bool(values["cancel_requested"])
    return QueuedTask(**values)


def parked_reason(error: QueueRowInvalid) -> str:
    """The ``reason`` a row that does not decode is parked ``failed`` with (and listed with)."""
    retry = f"`overnight retry {error.task_id}`" if error.task_id is not None else "`overnight retry`"
    return f"malformed queue row: column {error.column} {error.detail}; fix it, then {retry}"


def listed_task(row: tuple, *, rowid: Any = None) -> QueuedTask:
    """:func:`row_to_task` for listings (``overnight ls`` / ``status``, the dashboard, a worker's
    look at what is coming): never raises. A row that does not decode is shown ``failed`` with
    :func:`parked_reason` (what a claim parks it as), its cells that decode kept, the rest at their
    defaults; its ``task_id`` is ``(seq N)`` / ``(rowid N)`` when unreadable."""
    values, error = _decode(row, rowid)
    if error is None:
        values["cancel_requested"] = bool(values["cancel_requested"])
        return QueuedTask(**values)
    task_id = error.task_id if error.task_id is not None else f"({error.row})"
    keep = {k: v for k, v in values.items() if k in ("entry", "queue", "priority", "seq", "submitted_ms",
                                                      "idempotency_key", "deaths", "attempts", "claim_token",
                                                      "worker_id", "host", "progress_head")}
    return QueuedTask(task_id=task_id, entry=keep.pop("entry", "?"), **keep, status="failed",
                      reason=parked_reason(error))


SILENT_AFTER_MS = 90_000
"""A worker whose last heartbeat is older than this is ``silent`` (killed, or its machine gone):
three times the default lease (30 s), whose heartbeat comes every 10 s."""


@dataclass
class WorkerRow:
    """A worker process as ``overnight workers`` lists it.

    Attributes:
        worker_id: ``--worker-id`` or ``HOST-PID``.
        host, pid: where it runs. started_ms, heartbeat_ms: when it registered / last beat, by the
            store's clock (:meth:`~overnight.store.base.LeaseStore.clock_ms`), as listings judge them.
        queues: the queues it claims from. concurrency: children at most.
        held: tasks it runs now. state: ``running`` / ``stopping`` / ``stopped``.
    """

    worker_id: str
    host: str
    pid: int
    started_ms: int
    heartbeat_ms: int
    queues: list[str]
    concurrency: int
    held: int = 0
    state: str = "running"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worker_process_gone(w: WorkerRow, offset_ms: int) -> bool:
    """Whether the process of worker ``w`` provably no longer runs
    (:func:`~overnight.store.leases.process_gone`: a worker on this machine only; elsewhere False).

    ``w.started_ms`` is by the store's clock, the pid's start by this machine's: ``offset_ms`` is
    this machine's clock minus the store's (``now_ms() - clock_ms()``, the store's read first, so
    a slow read errs towards "still runs"), to compare the two on one clock."""
    return process_gone(w.host, w.pid, w.started_ms + offset_ms)


WORKER_COLUMNS = ("worker_id", "host", "pid", "started_ms", "heartbeat_ms", "queues", "concurrency", "held", "state")


_WORKER_TEXT = frozenset({"worker_id", "host", "queues", "state"})


def row_to_worker(row: tuple, *, rowid: Any = None) -> WorkerRow:
    """Decode a ``workers`` row (the cells of ``WORKER_COLUMNS``, typed as :func:`row_to_task`'s).
    Never raises: a row edited by hand shows what it holds rather than breaking ``overnight
    workers``. A cell that does not decode reads ``?`` (text) or 0 (an integer), an unreadable
    ``worker_id`` ``(rowid N)``, and ``state`` then says ``malformed (column C ...)``."""
    values: dict[str, Any] = {}
    bad: str | None = None
    for column, value in zip(WORKER_COLUMNS, row):
        text = column in _WORKER_TEXT
        wrong = _cell(column, value, text, False)
        if wrong is not None:
            bad = bad or f"column {column} {wrong}"
            value = f"(rowid {rowid})" if column == "worker_id" else "?" if text else 0
        if column == "queues":
            try:
                queues = json.loads(value)
            except (ValueError, RecursionError):
                queues = None
            value = [str(q) for q in queues] if isinstance(queues, list) else [value]
        values[column] = value
    if bad is not None:
        values["state"] = f"malformed ({bad})"
    return WorkerRow(**values)


def backoff_ms(deaths: int, base_s: float) -> int:
    """Delay before the next attempt after ``deaths`` deaths in a row: ``base * 2**(deaths-1)``,
    at most 10 minutes."""
    return int(min(base_s * 2 ** max(deaths - 1, 0), 600.0) * 1000)


STATES = ("complete", "in_progress", "open", "queued", "running", "stalled", "interrupted", "failed", "cancelled",
          "invalid", "rolled_back")
"""The machine-readable states of a status text (:func:`state_of`): ``--json``'s ``status_kind``."""


def state_of(status: str) -> str:
    """The state (one of :data:`STATES`) a status text starts with -- :func:`describe`'s, or
    ``in progress`` / ``invalid`` / ``rolled back`` / ``open`` (an adapter's thread or session) of a
    listing -- for scripts: ``queued (starts in 30 min)`` is ``queued``, ``failed (REASON)`` is
    ``failed``. A text that starts with none of
    them (not one overnight writes) is ``"unknown"``."""
    head = status.replace("in progress", "in_progress", 1).replace("rolled back", "rolled_back", 1).split(" ", 1)[0]
    return head if head in STATES else "unknown"


def describe(row: QueuedTask | None, lease: Lease | None, *, complete: bool, now: int | None = None,
             ttl_ms: int = DEFAULT_TTL_MS) -> str:
    """The status a person reads for a task (``overnight ls`` / ``status``, the dashboard).

    ``row``: its queue row (None when it was never submitted); ``lease``: its task lease on
    ``main`` (None when never held); ``complete``: its verified head has nothing left to do.

    Returns one of ``complete``, ``failed (REASON)`` (parked by a worker, or a plain run's step
    that failed for good: :func:`~overnight.store.leases.ended`), ``cancelled``, ``queued`` (``queued (retry in
    N s)``), ``running (worker W on HOST, heartbeat N s ago)`` (``running (pid P on HOST, ...)``
    for a plain ``overnight run``), ``stalled (lease expired N s ago; ...)``, ``interrupted``; a
    ``queued`` row whose task lease a dead run outside the queue still holds (``overnight run``
    killed) says how long until its lease expires (no worker claims it before).
    A ``complete`` row says ``complete`` only with ``complete`` (its head finished): a head rolled
    back or falling back past damage since has steps left again. ``complete`` wins over a parked row: a run outside the workers (``overnight resume`` after
    ``overnight cancel``, or after a worker parked it ``failed``) that finished the task is its latest
    outcome (such a run also settles the row: :meth:`~overnight.store.queue_sql.SqlQueue.settle`; a
    ``queued`` row it finishes ``complete``, so no worker claims it).
    """
    now = now_ms() if now is None else now
    if complete:  # the latest run finished it: a row parked before (failed, cancelled) is history
        return "complete"
    if row is not None and row.status in ("failed", "cancelled"):
        return f"failed ({row.reason})" if row.status == "failed" else "cancelled"
    # a row settled ``complete`` whose task's verified head has steps left is history: the head it
    # finished was rolled back, or failed verification and a load falls back before it -- the task
    # reads as a lease and the checkpoints say (``interrupted``: resume, or ``resume --submit``)
    held = lease is not None and lease.holder_id != ""
    gone = held and (lambda h: h is not None and h.is_gone())(Holder.from_json(lease.holder))  # type: ignore[union-attr]
    live = held and not gone and lease.expires_at_ms > now  # type: ignore[union-attr]
    if live:
        assert lease is not None
        who = Holder.from_json(lease.holder)
        if row is not None and row.status == "running" and row.worker_id:
            name = f"worker {row.worker_id} on {row.host}"
        else:
            name = f"pid {who.pid} on {who.host}" if who else "another process"
        beat = row.heartbeat_ms if row is not None and row.status == "running" and row.heartbeat_ms else \
            lease.expires_at_ms - ttl_ms
        return f"running ({name}, heartbeat {human_duration(now - beat)} ago)"
    if row is not None and row.status == "queued":
        if held and lease.expires_at_ms > now:  # type: ignore[union-attr]  # a run here died (gone): claims wait
            return (f"queued (a run of it outside the queue died; a worker can claim it once that run's lease "
                    f"expires in {human_duration(lease.expires_at_ms - now)})")  # type: ignore[union-attr]
        if row.not_before_ms <= now + 1000:
            return "queued"
        return f"queued ({'retry' if row.attempts else 'starts'} in {human_duration(row.not_before_ms - now)})"
    if row is not None and row.status == "running":
        expires = row.claim_expires_ms or 0
        if gone and expires > now:  # its session's process is gone (seen on this host): no wait for the heartbeat
            return (f"stalled (its session on {row.host} died; another worker takes it over when the claim "
                    f"expires in {human_duration(expires - now)})")
        if expires > now:
            return f"running (worker {row.worker_id} on {row.host}, heartbeat {human_duration(now - (row.heartbeat_ms or now))} ago)"
        return f"stalled (lease expired {human_duration(now - expires)} ago; another worker will take it over)"
    if held and not gone:
        assert lease is not None
        return f"stalled (lease expired {human_duration(now - lease.expires_at_ms)} ago; resume takes it over)"
    outcome = ended(lease.holder) if lease is not None and not held else None
    if outcome is not None and outcome.startswith("failed: "):  # a plain run's step failed for good
        return f"failed ({outcome[len('failed: '):]})"
    return "interrupted"


__all__ = ["ALREADY_COMPLETE", "COLUMNS", "COMPLETED_OUTSIDE", "ClaimLost", "QueueRowInvalid", "QueuedTask",
           "SILENT_AFTER_MS", "STATUSES", "WorkerRow", "backoff_ms", "describe", "listed_task", "parked_reason",
           "row_to_task", "row_to_worker", "worker_process_gone"]
