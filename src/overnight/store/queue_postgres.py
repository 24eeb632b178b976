"""The queue on the PostgreSQL store (:mod:`overnight.store.queue`): the coordinator for workers on
many machines. A claim is one short READ COMMITTED transaction: ``SELECT ... ORDER BY priority
DESC, seq LIMIT 1 FOR UPDATE OF q SKIP LOCKED`` then ``UPDATE`` of that row -- concurrent claimers
skip each other's locked rows instead of waiting, and no transaction stays open while a task runs
(a held snapshot would hold back vacuum on the queue table).

``overnight cancel`` also sends a ``NOTIFY`` on :data:`CANCEL_CHANNEL` in its transaction, so a
running session learns of it without asking the server after every step: :class:`CancelListener`
holds one ``LISTEN`` connection per session (the step loop then costs no query for it; when that
connection is down, the session asks after each step as on SQLite)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psycopg

from overnight.store.postgres import parse_url
from overnight.store.queue_sql import SqlQueue

CANCEL_CHANNEL = "overnight_cancel"
"""The ``NOTIFY`` channel of cancellations; the payload is ``["<schema>", "<task id>"]`` (JSON)."""


class CancelListener:
    """A thread with its own connection that ``LISTEN``s on :data:`CANCEL_CHANNEL` and calls
    ``on_cancel()`` when the payload names ``schema`` and ``task_id``.

    A notification only makes it read the queue row (any client that may connect to the database
    may ``NOTIFY``; only one that may write the queue can cancel). Nothing waits for it: the
    connection is made on the thread. Once its ``LISTEN`` holds, the
    thread asks ``cancelled()`` (the queue row) once, so a cancel sent before then is not lost,
    and sets :attr:`alive`; until then, and again if the connection fails, the caller asks the
    queue after every step as on SQLite. The thread is a daemon: it never keeps the session alive.
    """

    def __init__(self, conninfo: str, schema: str, task_id: str, on_cancel: Callable[[], None],
                 cancelled: Callable[[Any], bool]) -> None:
        self.alive = False
        self._payload = json.dumps([schema, task_id])
        self._on_cancel = on_cancel
        self._cancelled = cancelled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(conninfo,), name="overnight-cancel-listen",
                                        daemon=True)
        self._thread.start()

    def _run(self, conninfo: str) -> None:
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                if self._cancelled(conn):
                    self._on_cancel()  # cancelled before the LISTEN held
                self.alive = True
                while not self._stop.is_set():
                    notes = list(conn.notifies(timeout=1.0, stop_after=1))  # the lock is free after it
                    # any client of the database may NOTIFY: the queue row decides
                    if any(n.payload == self._payload for n in notes) and self._cancelled(conn):
                        self._on_cancel()
        except psycopg.Error:
            pass  # the server went away: the session asks after each step until it ends
        finally:
            self.alive = False

    def close(self) -> None:
        """Stop listening (the thread ends within a second)."""
        self._stop.set()


class PostgresQueue(SqlQueue):
    """The queue in an open :class:`~overnight.store.postgres.PostgresStore` (same schema, same pool)."""

    LOCK = " FOR UPDATE OF q SKIP LOCKED"
    DDL = (
        "SELECT pg_advisory_xact_lock(hashtext('overnight.queue.ddl'))",
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

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self.store.fetch(sql, args)

    def _sql(self, text: str) -> str:
        return self.store.sql(text).replace("?", "%s")

    def _notify_cancel(self, cur: Any, task_id: str) -> None:
        cur.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, json.dumps([self.store.schema, task_id])))

    def watch_cancel(self, task_id: str, on_cancel: Callable[[], None]) -> CancelListener:
        """A :class:`CancelListener` for ``task_id`` on this store's server (one more connection)."""
        sql = self._sql("SELECT 1 FROM {s}.queue WHERE task_id=? AND cancel_requested<>0")
        return CancelListener(parse_url(self.store.url)[0], self.store.schema, task_id, on_cancel,
                              lambda conn: conn.execute(sql, (task_id,)).fetchone() is not None)

    def _has_table(self) -> bool:
        return self._read(self.store.sql("SELECT to_regclass('{s}.workers') IS NOT NULL"))[0][0]

    def _lease_live(self) -> str:
        return self.store.sql(
            "EXISTS (SELECT 1 FROM {s}.leases l WHERE l.task_id=convert_to(q.task_id, 'UTF8') "
            "AND l.branch=convert_to('main', 'UTF8') AND l.holder_id<>''::bytea AND l.expires_at_ms > ?)")

    def _enc(self, text: str) -> object:
        return text.encode()

    def _next_seq(self, cur: Any) -> int:
        cur.execute(self.store.sql("SELECT nextval('{s}.queue_seq')"))
        return int(cur.fetchone()[0])



__all__ = ["CANCEL_CHANNEL", "CancelListener", "PostgresQueue"]
