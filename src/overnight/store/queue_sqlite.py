"""The queue on the SQLite store (:mod:`overnight.store.queue`): many worker processes on one
machine, each claim one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock serialises claims;
no row locks to skip)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from overnight.store.queue_sql import SqlQueue


class SQLiteQueue(SqlQueue):
    """The queue in an open :class:`~overnight.store.sqlite.SQLiteStore` (same file, same connection)."""

    LOCK = ""
    DDL = (
        """CREATE TABLE IF NOT EXISTS queue (
            task_id TEXT PRIMARY KEY, entry TEXT NOT NULL, params TEXT NOT NULL, queue TEXT NOT NULL,
            priority INTEGER NOT NULL, seq INTEGER NOT NULL UNIQUE, submitted_ms INTEGER NOT NULL,
            not_before_ms INTEGER NOT NULL, idempotency_key TEXT UNIQUE, status TEXT NOT NULL, reason TEXT,
            deaths INTEGER NOT NULL, attempts INTEGER NOT NULL, claim_token INTEGER NOT NULL, worker_id TEXT,
            host TEXT, pid INTEGER, claimed_ms INTEGER, claim_expires_ms INTEGER, heartbeat_ms INTEGER,
            progress_head TEXT, cancel_requested INTEGER NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS queue_claim ON queue (queue, status, priority, seq)",
        """CREATE TABLE IF NOT EXISTS workers (
            worker_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started_ms INTEGER NOT NULL,
            heartbeat_ms INTEGER NOT NULL, queues TEXT NOT NULL, concurrency INTEGER NOT NULL,
            held INTEGER NOT NULL, state TEXT NOT NULL)""",
    )

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self.store.transaction() as db:
            yield db.cursor()

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self.store.query(sql, args)

    def _sql(self, text: str) -> str:
        return text.replace("{s}.", "")

    def _has_table(self) -> bool:
        return bool(self._read("SELECT 1 FROM sqlite_master WHERE type='table' AND name='workers'"))

    def _lease_live(self) -> str:
        return ("EXISTS (SELECT 1 FROM leases l WHERE l.task_id=q.task_id AND l.branch='main' AND l.holder_id<>'' "
                "AND l.expires_at_ms > ?)")

    def _next_seq(self, cur: Any) -> int:
        cur.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM queue")
        return int(cur.fetchone()[0])



__all__ = ["SQLiteQueue"]
