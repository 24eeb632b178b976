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
``cancelled`` / ``complete``. Times are Unix milliseconds of the writing process's clock.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from overnight.errors import ConcurrencyError
from overnight.store.base import Lease
from overnight.store.leases import DEFAULT_TTL_MS, Holder, ended, now_ms
from overnight.units import human_duration

STATUSES = ("queued", "running", "failed", "cancelled", "complete")


class ClaimLost(ConcurrencyError):
    """This worker's claim on a task was taken over by another worker (its claim expired)."""


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


def row_to_task(row: tuple) -> QueuedTask:
    values = dict(zip(COLUMNS, row))
    values["params"] = json.loads(values["params"]) if values["params"] else {}
    values["cancel_requested"] = bool(values["cancel_requested"])
    return QueuedTask(**values)


SILENT_AFTER_MS = 90_000
"""A worker whose last heartbeat is older than this is ``silent`` (killed, or its machine gone):
three times the default lease (30 s), whose heartbeat comes every 10 s."""


@dataclass
class WorkerRow:
    """A worker process as ``overnight workers`` lists it.

    Attributes:
        worker_id: ``--worker-id`` or ``HOST-PID``.
        host, pid: where it runs. started_ms, heartbeat_ms: when it started / last beat.
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


WORKER_COLUMNS = ("worker_id", "host", "pid", "started_ms", "heartbeat_ms", "queues", "concurrency", "held", "state")


def row_to_worker(row: tuple) -> WorkerRow:
    values = dict(zip(WORKER_COLUMNS, row))
    try:
        queues = json.loads(values["queues"])
    except (ValueError, TypeError):
        queues = None
    # a row edited by hand shows what it holds rather than breaking `overnight workers`
    values["queues"] = queues if isinstance(queues, list) else [str(values["queues"])]
    return WorkerRow(**values)


def backoff_ms(deaths: int, base_s: float) -> int:
    """Delay before the next attempt after ``deaths`` deaths in a row: ``base * 2**(deaths-1)``,
    at most 10 minutes."""
    return int(min(base_s * 2 ** max(deaths - 1, 0), 600.0) * 1000)


def describe(row: QueuedTask | None, lease: Lease | None, *, complete: bool, now: int | None = None,
             ttl_ms: int = DEFAULT_TTL_MS) -> str:
    """The status a person reads for a task (``overnight ls`` / ``status``, the dashboard).

    ``row``: its queue row (None when it was never submitted); ``lease``: its task lease on
    ``main`` (None when never held); ``complete``: its verified head has nothing left to do.

    Returns one of ``complete``, ``failed (REASON)`` (parked by a worker, or a plain run's step
    that failed for good: :func:`~overnight.store.leases.ended`), ``cancelled``, ``queued`` (``queued (retry in
    N s)``), ``running (worker W on HOST, heartbeat N s ago)`` (``running (pid P on HOST, ...)``
    for a plain ``overnight run``), ``stalled (lease expired N s ago; ...)``, ``interrupted``.
    """
    now = now_ms() if now is None else now
    if row is not None and row.status in ("failed", "cancelled"):
        return f"failed ({row.reason})" if row.status == "failed" else "cancelled"
    if complete or (row is not None and row.status == "complete"):
        return "complete"
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


__all__ = ["COLUMNS", "ClaimLost", "QueuedTask", "SILENT_AFTER_MS", "STATUSES", "WorkerRow", "backoff_ms",
           "describe", "row_to_task", "row_to_worker"]
