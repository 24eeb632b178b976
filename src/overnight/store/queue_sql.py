"""The queue's statements, shared by SQLite and PostgreSQL (:mod:`overnight.store.queue`).

A subclass supplies the dialect: ``_tx()`` (one short write transaction yielding a cursor-like
object with ``execute``), ``_read(sql, args)``, ``_sql(text)`` (placeholders ``?`` and the schema
prefix ``{s}.``), ``LOCK`` (the claim's row-lock clause) and ``DDL``; and, for rows edited
outside overnight, ``_expr`` / ``_cells`` (how a cell is selected so that reading it cannot fail,
and decoded back) and ``ROWID`` (a row's name when its task id is unreadable). Every statement
after a claim is fenced by the claim token. No transaction is held while a task runs: a claim, a
heartbeat, a status change are each one transaction of a few statements.
"""

from __future__ import annotations

import json
import logging
import socket
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

from overnight.errors import StoreCorrupt, StoreVersionError, TaskNotFound
from overnight.store.leases import now_ms
from overnight.store.queue import (
    COLUMNS,
    COMPLETED_OUTSIDE,
    WORKER_COLUMNS,
    ClaimLost,
    QueuedTask,
    QueueRowInvalid,
    WorkerRow,
    backoff_ms,
    listed_task,
    parked_reason,
    row_to_task,
    row_to_worker,
)

LOG = logging.getLogger("overnight.queue")

QUEUE_SCHEMA_VERSION = 1
"""Version of the queue's tables (``queue``, ``workers``), kept as row ``schema_version`` of table
``queue_meta`` next to them (spec: ``docs/FORMAT.md``, "Queue"). Tables made before the version was
recorded are version 1 (the same columns); a writer that opens them records it. A store whose queue
tables carry a higher version was written by a newer overnight and is refused."""

PARK_AT_MOST = 100
"""Rows that do not decode one claim parks at most before it returns None (the next claim goes on)."""


class CancelWatch(Protocol):
    """What :meth:`SqlQueue.watch_cancel` returns."""

    alive: bool
    """True while cancellations reach ``on_cancel`` (the channel is set up and connected)."""

    def close(self) -> None:
        """Stop watching (returns at once)."""


_COLS = ", ".join(COLUMNS)
_VERSION_DDL = (
    "CREATE TABLE IF NOT EXISTS {s}.queue_meta (key text PRIMARY KEY, value text NOT NULL)",
    f"INSERT INTO {{s}}.queue_meta (key, value) VALUES ('schema_version', '{QUEUE_SCHEMA_VERSION}') "
    "ON CONFLICT (key) DO NOTHING",
)
"""Statements recording :data:`QUEUE_SCHEMA_VERSION` (both dialects; idempotent)."""


def log_parked(error: QueueRowInvalid) -> None:
    """What a claim does with a row it parked when its caller passes no ``on_parked``: a warning on
    the ``overnight.queue`` logger naming the row and the column."""
    LOG.warning("parked %s failed: %s", error.row, error)


class SqlQueue:
    """Queue operations over a store's connection (see :mod:`overnight.store.queue`)."""

    LOCK = ""
    DDL: tuple[str, ...] = ()
    DDL_LOCK: tuple[str, ...] = ()
    """Statements serialising concurrent writers' DDL (PostgreSQL: an advisory lock); DDL starts with them."""
    ROWID: str | None = None
    """The column naming a row whatever its cells hold (SQLite's ``rowid``), or None: the task id
    and ``seq`` name it (PostgreSQL's are typed and never NULL). :meth:`claim` needs one."""
    _ready: set[str] = set()

    def __init__(self, store: Any, *, create: bool = True) -> None:
        self.store = store
        self.absent = False
        self._meta_seen = False  # table queue_meta seen holding the version (a dropped one: StoreCorrupt, reopened)
        key = f"{type(self).__name__}:{store.url}"
        if key in SqlQueue._ready:
            return
        writer = not getattr(store, "read_only", False)
        if self._has_table():
            self._check_version(writer)
        elif not writer or not create:
            self.absent = True  # nothing was ever submitted here; a reader (or ``create=False``) creates nothing
            return
        else:
            with self._tx() as cur:
                for stmt in (*self.DDL, *_VERSION_DDL):
                    cur.execute(self._sql(stmt))
        SqlQueue._ready.add(key)

    def _check_version(self, record: bool) -> None:
        """Refuse queue tables of a newer overnight (:data:`QUEUE_SCHEMA_VERSION`); with ``record``,
        write the version into tables made before it was recorded.

        Raises:
            StoreVersionError: the tables' version is higher than this code knows.
            StoreCorrupt: the recorded version is not a positive whole number of at most 18 digits, or
                there are several (edited by hand).
        """
        seen = self._meta_seen or self._has_table("queue_meta")  # once seen, a claim's check is one read
        found = self._read(self._sql("SELECT value FROM {s}.queue_meta WHERE key='schema_version'")) if seen else []
        self._meta_seen = bool(found)
        if len(found) > 1:
            raise StoreCorrupt(f"store {self.store.url}: table queue_meta holds {len(found)} schema versions",
                               hint="someone made or edited the table by hand (its key is unique): keep one row "
                               "(docs/FORMAT.md, Queue)")
        if not found:
            if record:
                with self._tx() as cur:
                    for stmt in (*self.DDL_LOCK, *_VERSION_DDL):
                        cur.execute(self._sql(stmt))
            return
        value = found[0][0]
        if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18 and int(value) > 0):
            raise StoreCorrupt(f"store {self.store.url}: the queue's schema version {value!r} (table queue_meta) "
                               "is not a version number", hint="someone edited the table by hand; set it back to "
                               f"'{QUEUE_SCHEMA_VERSION}' if the queue tables are this version's (docs/FORMAT.md, Queue)")
        if int(value) > QUEUE_SCHEMA_VERSION:
            raise StoreVersionError(
                f"store {self.store.url}: its queue tables have schema version {value}, written by a newer "
                f"overnight (this one knows up to {QUEUE_SCHEMA_VERSION})",
                hint="upgrade overnight on every machine that submits to or runs workers on this store")

    # dialect hooks -----------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[Any]:  # pragma: no cover - overridden
        raise NotImplementedError
        yield

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _sql(self, text: str) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def _has_table(self, name: str = "workers") -> bool:
        """Does the store have the queue's table ``name``?"""
        raise NotImplementedError

    def _lease_live(self, now: str = "?") -> str:
        """SQL: the task lease of ``q.task_id`` on ``main`` is held and not expired at ``now`` (SQL;
        default one ``?``)."""
        raise NotImplementedError

    def _now(self, cur: Any) -> int:
        """Now, in Unix ms, by the store's clock (:meth:`clock_ms`), inside the transaction ``cur``."""
        return now_ms()

    def clock_ms(self) -> int:
        """Now, in Unix ms, by the clock this queue's claims, retries and worker heartbeats are set
        and judged by: the store's (:meth:`~overnight.store.base.LeaseStore.clock_ms`; PostgreSQL:
        the server's, so workers on machines whose clocks disagree judge the same claims alike)."""
        return self.store.clock_ms()

    def _next_seq(self, cur: Any) -> Any:
        raise NotImplementedError

    def _expr(self, column: str) -> str:
        """SQL selecting ``column`` (a column reference) so that reading it cannot fail whatever the
        cell holds; :meth:`_cells` decodes it. Here: the column itself (a typed schema)."""
        return column

    def _cells(self, row: tuple) -> tuple:
        """The values of cells selected with :meth:`_expr`: ``str`` for text (``bytes`` for a value
        that is not UTF-8 text), ``int`` for integers, None for NULL."""
        return row

    def _task_cols(self) -> str:
        """The select list of a queue row (table alias ``q``): :data:`COLUMNS` through :meth:`_expr`,
        then :attr:`ROWID` (NULL without one)."""
        return ", ".join([*(self._expr(f"q.{c}") for c in COLUMNS), f"q.{self.ROWID}" if self.ROWID else "NULL"])

    def _task(self, row: tuple) -> QueuedTask:
        """A row selected with :meth:`_task_cols`, decoded. Raises QueueRowInvalid."""
        return row_to_task(self._cells(row[:-1]), rowid=row[-1])

    def _listed(self, row: tuple) -> QueuedTask:
        """A row selected with :meth:`_task_cols` as listings show it (:func:`listed_task`; never raises)."""
        return listed_task(self._cells(row[:-1]), rowid=row[-1])

    # submit ------------------------------------------------------------------------------------
    def submit(self, task: QueuedTask) -> tuple[QueuedTask, bool]:
        """Insert ``task`` as ``queued``; returns ``(row, created)``. An existing row with the same
        idempotency key, or the same task id, is returned unchanged (``created`` False) -- also when
        another process inserts it between this one's look and its insert (PostgreSQL: the unique
        index refuses the second insert; the submit then reads the winner's row)."""
        try:
            return self._submit_once(task)
        except Exception as exc:  # noqa: BLE001 - the dialect's unique-violation error, by name
            if type(exc).__name__ not in ("UniqueViolation", "IntegrityError"):
                raise
            return self._submit_once(task)  # the concurrent submit committed: its row is found now

    def _submit_once(self, task: QueuedTask) -> tuple[QueuedTask, bool]:
        with self._tx() as cur:
            if task.idempotency_key is not None:
                cur.execute(self._sql(f"SELECT {self._task_cols()} FROM {{s}}.queue q WHERE idempotency_key=?"),
                            (task.idempotency_key,))
                found = cur.fetchone()
                if found is not None:
                    return self._listed(found), False
            cur.execute(self._sql(f"SELECT {self._task_cols()} FROM {{s}}.queue q WHERE task_id=?"), (task.task_id,))
            found = cur.fetchone()
            if found is not None:
                return self._listed(found), False
            now = self._now(cur)
            task.seq = self._next_seq(cur)
            task.submitted_ms = now
            task.status = "queued"
            values = [getattr(task, c) for c in COLUMNS]
            values[COLUMNS.index("params")] = json.dumps(task.params, sort_keys=True)
            values[COLUMNS.index("cancel_requested")] = 0
            cur.execute(self._sql(f"INSERT INTO {{s}}.queue ({_COLS}) VALUES ({', '.join('?' * len(COLUMNS))})"),
                        tuple(values))
        return task, True

    # claim ---------------------------------------------------------------------------------------
    def claim(self, worker_id: str, queues: list[str], ttl_ms: int,
              on_parked: Callable[[QueueRowInvalid], None] | None = None) -> QueuedTask | None:
        """Claim the first runnable task of ``queues`` (see the module docstring), or None.

        A runnable row that does not decode (:class:`~overnight.store.queue.QueueRowInvalid`: edited
        outside overnight) is parked ``failed`` in the same transaction, its reason naming the column
        (:func:`~overnight.store.queue.parked_reason`), and the next row is tried (at most
        :data:`PARK_AT_MOST` per call). ``on_parked(error)`` is called for each parked row once that
        is committed (default: a warning on the ``overnight.queue`` logger). Never raises
        QueueRowInvalid; raises what the store raises (StoreBusy, StoreUnavailable, ...)."""
        assert self.ROWID is not None, "a claim names its row by ROWID"
        self._check_version(False)  # a newer overnight may have upgraded the tables since this queue opened
        marks = ", ".join("?" * len(queues))
        parked: list[QueueRowInvalid] = []
        task = None
        with self._tx() as cur:
            now = self._now(cur)
            for _ in range(PARK_AT_MOST):
                cur.execute(self._sql(
                    f"SELECT {self._task_cols()} FROM {{s}}.queue q WHERE q.queue IN ({marks}) AND "
                    "((q.status='queued' AND q.not_before_ms <= ?) OR (q.status='running' AND q.claim_expires_ms < ?)) "
                    f"AND NOT {self._lease_live()} ORDER BY q.priority DESC, q.seq LIMIT 1{self.LOCK}"),
                    (*queues, now, now, now))
                found = cur.fetchone()
                if found is None:
                    break
                try:
                    task = self._task(found)
                except QueueRowInvalid as exc:
                    # in the claim's transaction, on the row it locked: a holder of an expired claim on it
                    # is fenced out by the status (every statement after a claim wants 'running')
                    cur.execute(self._sql(f"UPDATE {{s}}.queue SET status='failed', reason=?, claim_expires_ms=0 "
                                          f"WHERE {self.ROWID}=?"), (parked_reason(exc), found[-1]))
                    parked.append(exc)
                    continue
                task.taken_over = task.status == "running"
                task.previous_worker = task.worker_id if task.taken_over else None
                task.status, task.claim_token, task.worker_id = "running", task.claim_token + 1, worker_id
                task.host, task.pid, task.attempts = socket.gethostname(), None, task.attempts + 1
                task.claimed_ms, task.heartbeat_ms, task.claim_expires_ms = now, now, now + ttl_ms
                cur.execute(self._sql(
                    "UPDATE {s}.queue SET status='running', claim_token=?, worker_id=?, host=?, pid=NULL, attempts=?, "
                    f"claimed_ms=?, heartbeat_ms=?, claim_expires_ms=? WHERE {self.ROWID}=?"),
                    (task.claim_token, worker_id, task.host, task.attempts, now, now, now + ttl_ms, found[-1]))
                break
        for error in parked:
            (on_parked or log_parked)(error)
        return task

    def heartbeat(self, task_id: str, token: int, ttl_ms: int, pid: int | None = None) -> bool:
        """Extend a claim; returns whether a cancel was requested.

        Raises:
            ClaimLost: the claim token changed (another worker took the task over) or the task
                is no longer running."""
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute(self._sql("UPDATE {s}.queue SET heartbeat_ms=?, claim_expires_ms=?, pid=COALESCE(?, pid) "
                                  "WHERE task_id=? AND claim_token=? AND status='running'"),
                        (now, now + ttl_ms, pid, task_id, token))
            if cur.rowcount != 1:
                raise ClaimLost(f"task {task_id!r}: this worker's claim (token {token}) was taken over", task_id=task_id,
                                hint="its claim expired (a pause past the lease?); the other worker continues it")
            cur.execute(self._sql("SELECT cancel_requested<>0 FROM {s}.queue WHERE task_id=?"), (task_id,))
            return bool(cur.fetchone()[0])

    def watch_cancel(self, task_id: str, on_cancel: Callable[[], None]) -> CancelWatch | None:
        """A push channel for ``overnight cancel`` of ``task_id``: ``on_cancel()`` is called (on
        another thread) when it is cancelled, so a session need not ask after every step. None when
        this queue has no such channel (SQLite: :meth:`cancel_requested` is a local read); a
        session asks :meth:`cancel_requested` after each step whenever the watch is not
        :attr:`CancelWatch.alive`."""
        return None

    def _notify_cancel(self, cur: Any, task_id: str) -> None:
        """Tell :meth:`watch_cancel` listeners, inside ``cancel``'s transaction (none here)."""

    def cancel_requested(self, task_id: str, token: int) -> bool:
        """Whether ``overnight cancel`` asked this claim's session to stop (one read; the session
        asks after each step, so it stops at the next step boundary)."""
        rows = self._read(self._sql("SELECT cancel_requested<>0 FROM {s}.queue WHERE task_id=? AND claim_token=?"),
                          (task_id, token))
        return bool(rows and rows[0][0])

    def _fenced(self, task_id: str, token: int, sets: str, args: tuple) -> bool:
        with self._tx() as cur:
            cur.execute(self._sql(f"UPDATE {{s}}.queue SET {sets} WHERE task_id=? AND claim_token=? "
                                  "AND status='running'"), (*args, task_id, token))
            return cur.rowcount == 1

    def finish(self, task_id: str, token: int, status: str, reason: str | None = None) -> bool:
        """Set a claimed task ``complete`` / ``failed`` / ``cancelled``; False when the claim was lost."""
        return self._fenced(task_id, token, "status=?, reason=?, claim_expires_ms=0, cancel_requested=0",
                            (status, reason))

    def release(self, task_id: str, token: int, not_before_ms: int = 0) -> bool:
        """Put a claimed task back ``queued`` (a graceful stop; a task busy elsewhere), to start
        not before ``not_before_ms`` (Unix ms by :meth:`clock_ms`; 0: at once)."""
        return self._fenced(task_id, token, "status='queued', claim_expires_ms=0, not_before_ms=?", (not_before_ms,))

    def record_death(self, task: QueuedTask, head: str | None, reason: str, *, base_s: float,
                     max_deaths: int) -> str:
        """Count a session that died (its child killed, its worker gone): ``deaths + 1``, or 1 when
        the task made a new checkpoint since (``head`` differs from ``progress_head``); park it
        ``failed`` at ``max_deaths``, else queue it again after :func:`backoff_ms`. Fenced by
        ``task.claim_token``. Returns the new status (``""`` when the claim was lost)."""
        deaths = 1 if head != task.progress_head else task.deaths + 1
        if deaths >= max_deaths:
            why = (f"died {deaths} times in a row without a new checkpoint (last: {reason}); a poison task "
                   f"is parked -- `overnight retry {task.task_id}` queues it again")
            ok = self._fenced(task.task_id, task.claim_token,
                              "status='failed', reason=?, deaths=?, progress_head=?, claim_expires_ms=0",
                              (why, deaths, head))
            return "failed" if ok else ""
        ok = self._fenced(task.task_id, task.claim_token,
                          "status='queued', reason=?, deaths=?, progress_head=?, claim_expires_ms=0, not_before_ms=?",
                          (reason, deaths, head, self.clock_ms() + backoff_ms(deaths, base_s)))
        return "queued" if ok else ""

    def expire_dead_lease(self, task_id: str) -> bool:
        """Expire the task lease of ``(task, main)`` when its holder is provably gone (a process on
        this host that no longer runs: :meth:`~overnight.store.leases.Holder.is_gone`), so the
        task can be claimed again at once instead of after the TTL. The token stays: the next
        holder's is one higher. Returns whether it expired one."""
        from overnight.store.leases import Holder

        lease = self.store.read_lease(task_id, "main")
        if lease is None or lease.holder_id == "" or lease.expires_at_ms <= self.clock_ms():
            return False
        holder = Holder.from_json(lease.holder)
        if holder is None or not holder.is_gone():
            return False
        with self._tx() as cur:
            cur.execute(self._sql(self._EXPIRE), self._lease_key(task_id) + (self._enc(lease.holder_id), lease.token))
            return cur.rowcount == 1

    _EXPIRE = "UPDATE {s}.leases SET expires_at_ms=0 WHERE task_id=? AND branch=? AND holder_id=? AND token=?"

    def _enc(self, text: str) -> object:
        return text

    def _lease_key(self, task_id: str) -> tuple:
        return (self._enc(task_id), self._enc("main"))

    # people ------------------------------------------------------------------------------------
    def get(self, task_id: str) -> QueuedTask | None:
        """The queue row of ``task_id``, or None. A row that does not decode is returned as
        :func:`~overnight.store.queue.listed_task` shows it (``failed``, the reason naming the column)."""
        if self.absent:
            return None
        rows = self._read(self._sql(f"SELECT {self._task_cols()} FROM {{s}}.queue q WHERE task_id=?"), (task_id,))
        return self._listed(rows[0]) if rows else None

    def list(self) -> list[QueuedTask]:
        """Every queue row in submission order; one that does not decode as
        :func:`~overnight.store.queue.listed_task` shows it (never raises for a row's content)."""
        if self.absent:
            return []
        return [self._listed(r) for r in self._read(self._sql(f"SELECT {self._task_cols()} FROM {{s}}.queue q "
                                                              "ORDER BY q.seq"))]

    def retry(self, task_id: str) -> QueuedTask:
        """Queue a ``failed`` or ``cancelled`` task again (deaths reset); returns its row, any row
        in another status as it is. A failed row may start now (``not_before_ms`` 0: retry means
        now); a cancelled row that never started (``attempts`` 0) keeps its ``not_before_ms`` (a
        ``submit --not-before`` still ahead holds; one past starts now anyway), one that ran starts
        now. One conditional ``UPDATE``. Raises TaskNotFound (no row), and what the store raises."""
        with self._tx() as cur:
            cur.execute(self._sql("UPDATE {s}.queue SET status='queued', deaths=0, reason=NULL, not_before_ms=CASE "
                                  "WHEN status='cancelled' AND attempts=0 THEN not_before_ms ELSE 0 END, "
                                  "cancel_requested=0 WHERE task_id=? AND status IN ('failed', 'cancelled')"),
                        (task_id,))
        return self._must(task_id)

    def settle(self, task_id: str, status: str, reason: str | None = None) -> bool:
        """Record the outcome of a run outside the workers (``overnight run`` / ``resume`` here) on
        the task's queue row, so the row says what the latest run did:

        * a row parked ``failed`` or ``cancelled`` (no worker claims it) takes ``status`` --
          ``complete``, or ``failed`` with ``reason``;
        * with ``status`` ``complete``, a ``queued`` row -- submitted, not claimed (a claim sets it
          ``running`` in the same transaction) -- is finished too: ``complete``, reason
          :data:`~overnight.store.queue.COMPLETED_OUTSIDE`, so no worker claims a task with nothing
          left to do. A failure here leaves a ``queued`` row to the workers (they retry it).

        A ``running`` row is never changed: a worker holds it (a worker that claims a complete task
        finishes its row ``complete`` itself). Each change is one conditional ``UPDATE`` on the
        row's status, so a claim committed since the caller looked is not overwritten; the claim
        token, attempts and worker of the row stay. True when a row changed. Raises what the store
        raises (StoreBusy, StoreUnavailable)."""
        if self.absent:
            return False
        moves = ("failed", "cancelled", "queued") if status == "complete" else ("failed", "cancelled")
        marks = ", ".join("?" * len(moves))
        if not self._read(self._sql(f"SELECT 1 FROM {{s}}.queue WHERE task_id=? AND status IN ({marks})"),
                          (task_id, *moves)):
            return False  # a read first: a worker's own run (its row `running`) takes no write lock here
        with self._tx() as cur:
            cur.execute(self._sql("UPDATE {s}.queue SET status=?, reason=?, deaths=0, cancel_requested=0, "
                                  "claim_expires_ms=0 WHERE task_id=? AND status IN ('failed', 'cancelled')"),
                        (status, reason, task_id))
            changed = cur.rowcount
            if status == "complete":
                cur.execute(self._sql("UPDATE {s}.queue SET status='complete', reason=?, deaths=0, "
                                      "cancel_requested=0, claim_expires_ms=0 WHERE task_id=? AND status='queued'"),
                            (COMPLETED_OUTSIDE, task_id))
                changed += cur.rowcount
            return changed == 1

    def requeue(self, task: QueuedTask) -> tuple[QueuedTask, bool]:
        """Queue a stored task for the workers (``overnight resume --submit``, the dashboard's
        resume): a new row from ``task``, or -- when a row exists -- ``failed``, ``cancelled`` and
        ``complete`` ones queued again with ``task``'s entry and params (deaths reset); a ``queued``
        or ``running`` row stays as it is. Returns ``(row, queued_now)``."""
        row, created = self.submit(task)
        if created or row.status in ("queued", "running"):
            return row, created
        with self._tx() as cur:
            cur.execute(self._sql("UPDATE {s}.queue SET status='queued', deaths=0, reason=NULL, not_before_ms=0, "
                                  "cancel_requested=0, entry=?, params=? WHERE task_id=? AND status IN "
                                  "('failed', 'cancelled', 'complete')"),
                        (task.entry, json.dumps(task.params, sort_keys=True), task.task_id))
        return self._must(task.task_id), True

    def cancel(self, task_id: str) -> QueuedTask:
        """Cancel a task: ``queued`` -> ``cancelled`` now; ``running`` -> its holder stops at the next
        step boundary and marks it ``cancelled``. Raises TaskNotFound."""
        with self._tx() as cur:
            cur.execute(self._sql("UPDATE {s}.queue SET status='cancelled', reason=NULL WHERE task_id=? "
                                  "AND status='queued'"), (task_id,))
            cur.execute(self._sql("UPDATE {s}.queue SET cancel_requested=1 WHERE task_id=? AND status='running'"),
                        (task_id,))
            if cur.rowcount:
                self._notify_cancel(cur, task_id)
        return self._must(task_id)

    def delete(self, task_id: str, *, unless_claimed: bool = False) -> bool:
        """Remove the task's queue row (``overnight rm``, which holds the task's leases): no worker
        claims it again. True when there was one (and it went). ``unless_claimed``: not while a
        worker's claim on it is live -- ``running``, its claim not expired by the store's clock
        (:meth:`_now`) -- in one statement, so a claim made since the caller looked is seen:
        False then, and the row stays."""
        if self.absent:
            return False
        with self._tx() as cur:
            if unless_claimed:
                cur.execute(self._sql("DELETE FROM {s}.queue WHERE task_id=? AND NOT (status='running' "
                                      "AND claim_expires_ms>?)"), (task_id, self._now(cur)))
            else:
                cur.execute(self._sql("DELETE FROM {s}.queue WHERE task_id=?"), (task_id,))
            return cur.rowcount > 0

    def _must(self, task_id: str) -> QueuedTask:
        row = self.get(task_id)
        if row is None:
            raise TaskNotFound(f"no submitted task {task_id!r} in {self.store.url}", task_id=task_id,
                               hint="`overnight ls` lists the tasks; `overnight submit` queues one")
        return row

    # workers -----------------------------------------------------------------------------------
    def worker_beat(self, w: WorkerRow) -> None:
        """Insert or update a worker's row (its heartbeat). ``w.heartbeat_ms`` is set to now by the
        store's clock (:meth:`clock_ms`), as the listings judge it; so is ``w.started_ms`` when it
        is 0 (a worker's first write)."""
        with self._tx() as cur:
            self._put_worker(cur, w, self._now(cur))

    def _put_worker(self, cur: Any, w: WorkerRow, now: int) -> None:
        """Replace the row of ``w``, its heartbeat ``now`` (by :meth:`clock_ms`), inside ``cur``; a
        ``started_ms`` of 0 (not yet registered) is set to ``now`` too, so ``overnight workers``
        ages it by the clock it reads (a worker whose own clock is off shows its true age)."""
        w.heartbeat_ms = now
        w.started_ms = w.started_ms or now
        cur.execute(self._sql("DELETE FROM {s}.workers WHERE worker_id=?"), (w.worker_id,))
        cur.execute(self._sql(f"INSERT INTO {{s}}.workers ({', '.join(WORKER_COLUMNS)}) VALUES "
                              f"({', '.join('?' * len(WORKER_COLUMNS))})"),
                    (w.worker_id, w.host, w.pid, w.started_ms, w.heartbeat_ms, json.dumps(w.queues),
                     w.concurrency, w.held, w.state))

    def register_worker(self, w: WorkerRow, live: Callable[[WorkerRow, int], bool]) -> WorkerRow | None:
        """Write the row of a worker that starts, unless a worker ``live(row, now)`` holds its id:
        that row is returned and nothing is written; None once ``w`` is registered (its heartbeat,
        and its ``started_ms`` when 0, set by :meth:`clock_ms`). One write transaction, so of two
        workers started at once with one id exactly one gets it (PostgreSQL: the second insert
        meets the first's primary key and the check runs again). Raises what the store raises (StoreBusy, StoreUnavailable)."""
        cols = ", ".join([*(self._expr(f"w.{c}") for c in WORKER_COLUMNS), f"w.{self.ROWID}" if self.ROWID else "NULL"])
        for attempt in (1, 2):
            try:
                with self._tx() as cur:
                    now = self._now(cur)
                    cur.execute(self._sql(f"SELECT {cols} FROM {{s}}.workers w WHERE w.worker_id=?{self.LOCK_ROW}"),
                                (w.worker_id,))
                    found = cur.fetchone()
                    if found is not None:
                        held = row_to_worker(self._cells(found[:-1]), rowid=found[-1])
                        if live(held, now):
                            return held
                    self._put_worker(cur, w, now)
                return None
            except Exception as exc:  # noqa: BLE001 - the dialect's unique-violation error, by name
                if attempt == 2 or type(exc).__name__ not in ("UniqueViolation", "IntegrityError"):
                    raise
        return None  # pragma: no cover - the loop returns or raises

    LOCK_ROW = ""
    """The clause locking a selected row for the transaction (PostgreSQL ``FOR UPDATE``; SQLite's
    write transaction holds the database)."""

    def workers(self) -> list[WorkerRow]:
        """Every worker row, by id; a row edited by hand as :func:`~overnight.store.queue.row_to_worker`
        shows it (never raises for a row's content)."""
        if self.absent:
            return []
        cols = ", ".join([*(self._expr(f"w.{c}") for c in WORKER_COLUMNS), f"w.{self.ROWID}" if self.ROWID else "NULL"])
        return [row_to_worker(self._cells(r[:-1]), rowid=r[-1]) for r in self._read(self._sql(
            f"SELECT {cols} FROM {{s}}.workers w ORDER BY w.worker_id"))]


__all__ = ["SqlQueue"]
