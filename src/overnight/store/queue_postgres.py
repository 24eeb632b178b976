"""The queue on the PostgreSQL store (:mod:`overnight.store.queue`): the coordinator for workers on
many machines. A claim is one short READ COMMITTED transaction: ``SELECT ... ORDER BY priority
DESC, seq LIMIT 1 FOR UPDATE OF q SKIP LOCKED`` then ``UPDATE`` of that row -- concurrent claimers
skip each other's locked rows instead of waiting, and no transaction stays open while a task runs
(a held snapshot would hold back vacuum on the queue table)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from overnight.store.queue import LeaseView
from overnight.store.queue_sql import SqlQueue


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

    def lease(self, task_id: str) -> LeaseView | None:
        rows = self._read(self._sql("SELECT holder_id, holder, token, expires_at_ms FROM {s}.leases "
                                    "WHERE task_id=? AND branch=?"), (task_id.encode(), b"main"))
        if not rows:
            return None
        h, holder, token, expires = rows[0]
        return LeaseView(bytes(h).decode(), bytes(holder).decode(), token, expires)


__all__ = ["PostgresQueue"]
