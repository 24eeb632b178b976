"""The queue of a store: which implementation serves it (SQLite or PostgreSQL), and a task's
status read through it. Kept apart from :mod:`overnight.store.queue` (the queue's rows and
statuses) so the implementations import that module and this one imports them, without a cycle."""

from __future__ import annotations

from typing import Any

from overnight.store.queue import describe


def queue_for(store: Any, *, create: bool = True) -> Any | None:
    """The queue of a store (its hot store when tiered): a :class:`~overnight.store.queue_sqlite.SQLiteQueue`
    or :class:`~overnight.store.queue_postgres.PostgresQueue`, or None for a store kind without one.
    ``create=False``: its tables are not created when missing (the queue is then empty, ``absent``)."""
    base = getattr(store, "hot", store)
    base = getattr(base, "primary", base)
    from overnight.store.sqlite import SQLiteStore

    if isinstance(base, SQLiteStore):
        from overnight.store.queue_sqlite import SQLiteQueue

        return SQLiteQueue(base, create=create)
    try:
        from overnight.store.postgres import PostgresStore
    except ImportError:
        return None
    if isinstance(base, PostgresStore):
        from overnight.store.queue_postgres import PostgresQueue

        return PostgresQueue(base, create=create)
    return None


def task_status(store: Any, task_id: str, *, complete: bool, now: int | None = None) -> str:
    """:func:`describe` for a task of ``store``: its queue row (on a store with a queue) and its
    task lease on ``main`` (every store: a plain ``overnight run`` holds one), so running, stalled,
    interrupted and failed read the same with or without workers. ``now``: Unix ms by the store's
    clock (default: ``store.clock_ms()``, the clock its leases and claims are set by; a listing of
    many tasks reads it once)."""
    q = queue_for(store)
    return describe(q.get(task_id) if q is not None else None, store.read_lease(task_id, "main"), complete=complete,
                    now=store.clock_ms() if now is None else now)


def settle_run(store: Any, task_id: str, status: str, reason: str | None = None) -> bool:
    """After a run of ``task_id``'s main branch outside the workers (``overnight run`` / ``resume``)
    ended ``complete`` or ``failed`` (``reason``): its queue row, when one is parked ``failed`` or
    ``cancelled``, takes that outcome, and a ``queued`` row (submitted, not yet claimed) of a task
    that completed is finished ``complete`` (reason: completed by a run outside the queue); a
    ``running`` row, a worker's, is never changed (:meth:`~overnight.store.queue_sql.SqlQueue.settle`).
    So ``overnight status`` / ``ls``, the dashboard and the workers all see the latest run's outcome,
    and no worker claims a task with nothing left to do. Creates no queue where there is none. True
    when a row changed. Raises what the store raises (StoreBusy, StoreUnavailable)."""
    q = queue_for(store, create=False)
    return q is not None and q.settle(task_id, status, reason)


__all__ = ["queue_for", "settle_run", "task_status"]
