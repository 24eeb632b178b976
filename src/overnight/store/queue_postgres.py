"""The queue on the PostgreSQL store (:mod:`overnight.store.queue`): the coordinator for workers on
many machines. A claim is one statement, its own READ COMMITTED transaction: ``WITH c AS (SELECT
... ORDER BY priority DESC, seq LIMIT 1 FOR UPDATE OF q SKIP LOCKED) UPDATE ... FROM c RETURNING
...`` -- concurrent claimers skip each other's locked rows instead of waiting, a claim is one round
trip (not ``BEGIN``, ``SELECT``, ``UPDATE``, ``COMMIT``: each of those waits for a CPU when the
machine is busy, ``overnight bench fleet``'s claim p99), and no transaction stays open while a
task runs (a held snapshot would hold back vacuum on the queue table).

``overnight cancel`` also sends a ``NOTIFY`` on :data:`CANCEL_CHANNEL` in its transaction, so a
running session learns of it without asking the server after every step: :class:`CancelListener`
holds one ``LISTEN`` connection per process (a session keeps it for the tasks it runs in turn; the
step loop then costs no query for it; when that connection is down, the session asks after each
step as on SQLite)."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psycopg

from overnight.store.postgres import NOW_MS_SQL, parse_url
from overnight.store.queue import COLUMNS, QueuedTask, QueueRowInvalid, parked_reason, row_to_task
from overnight.store.queue_sql import PARK_AT_MOST, SqlQueue, log_parked

CANCEL_CHANNEL = "overnight_cancel"
"""The ``NOTIFY`` channel of cancellations; the payload is ``["<schema>", "<task id>"]`` (JSON)."""


class CancelListener:
    """A thread with its own connection that ``LISTEN``s on :data:`CANCEL_CHANNEL` for one schema
    and calls a watched task's ``on_cancel()`` when its queue row says it was cancelled. One
    listener serves every task a process watches (a worker's session watches one task after
    another over the same connection, instead of a connection per task).

    A notification only makes it read the queue row (any client that may connect to the database
    may ``NOTIFY``; only one that may write the queue can cancel). Nothing waits for it: the
    connection is made on the thread. For every task :meth:`watch` adds, the thread asks
    ``cancelled(conn, task_id)`` (the queue row) once it listens -- a cancel sent before is not
    lost -- and only then does the task's :class:`CancelHandle` turn :attr:`~CancelHandle.alive`;
    until then, and again if the connection fails, the caller asks the queue after every step as on
    SQLite. ``wake(task_id)`` sends a notification from another connection so a listening thread
    asks at once. The thread is a daemon: it never keeps the process alive; a thread whose
    connection failed is started again by the next :meth:`watch`.
    """

    def __init__(self, conninfo: str, schema: str, cancelled: Callable[[Any, str], bool],
                 wake: Callable[[str], None]) -> None:
        self._conninfo = conninfo
        self._schema = schema
        self._cancelled = cancelled
        self._wake = wake
        self._lock = threading.Lock()
        self._watched: dict[str, Callable[[], None]] = {}
        self._checked: set[str] = set()
        self._stop = threading.Event()
        self.listening = False
        self._thread: threading.Thread | None = None

    def watch(self, task_id: str, on_cancel: Callable[[], None]) -> CancelHandle:
        """Call ``on_cancel()`` (on the listener's thread) once ``task_id`` is cancelled; returns
        its handle (:meth:`CancelHandle.close` stops watching it)."""
        with self._lock:
            self._watched[task_id] = on_cancel
            self._checked.discard(task_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="overnight-cancel-listen", daemon=True)
                self._thread.start()
            elif self.listening:
                try:
                    self._wake(task_id)  # the thread may sit in a wait of up to a second: it asks now
                except Exception:  # noqa: BLE001 - it asks within a second anyway
                    pass
        return CancelHandle(self, task_id)

    def unwatch(self, task_id: str) -> None:
        with self._lock:
            self._watched.pop(task_id, None)
            self._checked.discard(task_id)

    def checked(self, task_id: str) -> bool:
        """Whether the thread listens and has asked ``task_id``'s row since it was watched."""
        return self.listening and task_id in self._checked

    def _run(self) -> None:
        try:
            with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                self.listening = True
                while not self._stop.is_set():
                    with self._lock:
                        fresh = [(t, cb) for t, cb in self._watched.items() if t not in self._checked]
                    for task_id, on_cancel in fresh:  # cancelled before the LISTEN held, or before the watch
                        if self._cancelled(conn, task_id):
                            on_cancel()
                        with self._lock:
                            if self._watched.get(task_id) is on_cancel:
                                self._checked.add(task_id)
                    notes = list(conn.notifies(timeout=1.0, stop_after=1))  # the connection's lock is free after it
                    for note in notes:
                        try:
                            schema, task_id = json.loads(note.payload)
                        except (ValueError, TypeError):
                            continue
                        with self._lock:
                            on_cancel = self._watched.get(task_id) if task_id in self._checked else None
                        # any client of the database may NOTIFY: the queue row decides
                        if schema == self._schema and on_cancel is not None and self._cancelled(conn, task_id):
                            on_cancel()
        except psycopg.Error:
            pass  # the server went away: the sessions ask after each step; the next watch connects again
        finally:
            self.listening = False
            with self._lock:
                self._checked.clear()

    def close(self) -> None:
        """Stop listening (the thread ends within a second)."""
        self._stop.set()


class CancelHandle:
    """One task watched by a :class:`CancelListener`."""

    def __init__(self, listener: CancelListener, task_id: str) -> None:
        self._listener = listener
        self._task_id = task_id

    @property
    def alive(self) -> bool:
        """The listener is connected and has asked this task's row since the watch began: until
        it is, the caller asks the queue itself after every step."""
        return self._listener.checked(self._task_id)

    def close(self) -> None:
        """Stop watching this task (the listener and its connection stay for the next one)."""
        self._listener.unwatch(self._task_id)


_LISTENERS: dict[tuple[str, str], CancelListener] = {}
_LISTENERS_LOCK = threading.Lock()


class PostgresQueue(SqlQueue):
    """The queue in an open :class:`~overnight.store.postgres.PostgresStore` (same schema, same pool)."""

    LOCK = " FOR UPDATE OF q SKIP LOCKED"
    LOCK_ROW = " FOR UPDATE"
    DDL_LOCK = ("SELECT pg_advisory_xact_lock(hashtext('overnight.queue.ddl'))",)
    DDL = (
        *DDL_LOCK,
        """CREATE TABLE IF NOT EXISTS {s}.queue (
            task_id text PRIMARY KEY, entry text NOT NULL, params text NOT NULL, queue text NOT NULL,
            priority integer NOT NULL, seq bigint NOT NULL UNIQUE, submitted_ms bigint NOT NULL,
            not_before_ms bigint NOT NULL, idempotency_key text UNIQUE, status text NOT NULL, reason text,
            deaths integer NOT NULL, attempts integer NOT NULL, claim_token bigint NOT NULL, worker_id text,
            host text, pid integer, claimed_ms bigint, claim_expires_ms bigint, heartbeat_ms bigint,
            progress_head text, cancel_requested integer NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS queue_claim ON {s}.queue (queue, status, priority DESC, seq)",
        "CREATE SEQUENCE IF NOT EXISTS {s}.queue_seq",
        """CREATE TABLE IF NOT EXISTS {s}.workers (
            worker_id text PRIMARY KEY, host text NOT NULL, pid integer NOT NULL, started_ms bigint NOT NULL,
            heartbeat_ms bigint NOT NULL, queues text NOT NULL, concurrency integer NOT NULL,
            held integer NOT NULL, state text NOT NULL)""",
    )

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self.store.transaction() as cur:
            yield cur

    def claim(self, worker_id: str, queues: list[str], ttl_ms: int,
              on_parked: Callable[[QueueRowInvalid], None] | None = None) -> QueuedTask | None:
        """Claim the first runnable task of ``queues`` in one statement (the module docstring), or
        None. Not retried on a dead connection: the claim may have committed (the worker's loop
        retries; a claim nobody runs expires after ``ttl_ms`` and is taken over).

        A claimed row that does not decode (:class:`~overnight.store.queue.QueueRowInvalid`) is
        parked ``failed`` at once, fenced by the token of this claim (reason:
        :func:`~overnight.store.queue.parked_reason`), ``on_parked(error)`` is called (default: a
        warning on the ``overnight.queue`` logger) and the next row is claimed (at most
        :data:`~overnight.store.queue_sql.PARK_AT_MOST` per call). Never raises QueueRowInvalid."""
        self._check_version(False)  # a newer overnight may have upgraded the tables since this queue opened
        for _ in range(PARK_AT_MOST):
            found = self._claim_one(worker_id, queues, ttl_ms)
            if found is None:
                return None
            try:
                task = row_to_task(found[:-2])
            except QueueRowInvalid as exc:
                # task_id (the primary key) and claim_token are typed columns: always readable here
                task_id, token = found[COLUMNS.index("task_id")], found[COLUMNS.index("claim_token")]
                if self.finish(task_id, token, "failed", parked_reason(exc)):
                    (on_parked or log_parked)(exc)
                continue
            task.taken_over = found[-2] == "running"
            task.previous_worker = found[-1] if task.taken_over else None
            return task
        return None

    def _claim_one(self, worker_id: str, queues: list[str], ttl_ms: int) -> tuple | None:
        """The claim's one statement: the claimed row (:data:`COLUMNS`, then its status and worker
        before the claim), or None. Claims, retries and leases are judged by the server's clock
        (``n.t``), as they were set: a worker whose clock runs ahead takes no live claim early."""
        marks = ", ".join("?" * len(queues))
        sql = self._sql(
            f"WITH n AS (SELECT {NOW_MS_SQL} AS t), "
            f"c AS (SELECT q.task_id, q.status AS was, q.worker_id AS held_by FROM {{s}}.queue q, n "
            f"WHERE q.queue IN ({marks}) AND ((q.status='queued' AND q.not_before_ms <= n.t) OR "
            f"(q.status='running' AND q.claim_expires_ms < n.t)) AND NOT {self._lease_live('n.t')} "
            f"ORDER BY q.priority DESC, q.seq LIMIT 1{self.LOCK}) "
            "UPDATE {s}.queue q SET status='running', claim_token=q.claim_token+1, worker_id=?, host=?, pid=NULL, "
            "attempts=q.attempts+1, claimed_ms=n.t, heartbeat_ms=n.t, claim_expires_ms=n.t + ? FROM c, n "
            f"WHERE q.task_id=c.task_id RETURNING {', '.join(f'q.{c}' for c in COLUMNS)}, c.was, c.held_by")
        with self.store.connection() as conn:
            return conn.execute(sql, (*queues, worker_id, socket.gethostname(), ttl_ms)).fetchone()

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self.store.fetch(sql, args)

    def _sql(self, text: str) -> str:
        return self.store.sql(text).replace("?", "%s")

    def _notify_cancel(self, cur: Any, task_id: str) -> None:
        cur.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, json.dumps([self.store.schema, task_id])))

    def watch_cancel(self, task_id: str, on_cancel: Callable[[], None]) -> CancelHandle:
        """Watch ``task_id`` on this process's :class:`CancelListener` for this store's server and
        schema (one connection per process and schema, made on first use)."""
        conninfo, schema = parse_url(self.store.url)[0], self.store.schema
        with _LISTENERS_LOCK:
            listener = _LISTENERS.get((conninfo, schema))
            if listener is None:
                sql = self._sql("SELECT 1 FROM {s}.queue WHERE task_id=? AND cancel_requested<>0")
                listener = _LISTENERS[(conninfo, schema)] = CancelListener(
                    conninfo, schema, lambda conn, t: conn.execute(sql, (t,)).fetchone() is not None,
                    lambda t: self.store.fetch("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, json.dumps([schema, t]))))
        return listener.watch(task_id, on_cancel)

    def _has_table(self, name: str = "workers") -> bool:
        return self._read(self.store.sql(f"SELECT to_regclass('{{s}}.{name}') IS NOT NULL"))[0][0]

    def _lease_live(self, now: str = "?") -> str:
        return self.store.sql(
            "EXISTS (SELECT 1 FROM {s}.leases l WHERE l.task_id=convert_to(q.task_id, 'UTF8') "
            f"AND l.branch=convert_to('main', 'UTF8') AND l.holder_id<>''::bytea AND l.expires_at_ms > {now})")

    def _now(self, cur: Any) -> int:
        cur.execute(f"SELECT {NOW_MS_SQL}")
        return int(cur.fetchone()[0])

    def _enc(self, text: str) -> object:
        return text.encode()

    def _next_seq(self, cur: Any) -> int:
        cur.execute(self.store.sql("SELECT nextval('{s}.queue_seq')"))
        return int(cur.fetchone()[0])



__all__ = ["CANCEL_CHANNEL", "CancelHandle", "CancelListener", "PostgresQueue"]
