"""The queue on the SQLite store (:mod:`overnight.store.queue`): many worker processes on one
machine, each claim one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock serialises claims;
no row locks to skip)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from overnight.store.queue_sql import SqlQueue


class SQLiteQueue(SqlQueue):
    """The queue in an open :class:`~overnight.store.sqlite.SQLiteStore` (same file, same connection).

    SQLite keeps whatever a cell is given (text in an INTEGER column, bytes that are not UTF-8 in a
    TEXT one, a NULL ``task_id``), and reading text that is not UTF-8 fails the whole statement. So
    rows are selected with :meth:`_expr`: a text or blob cell as ASCII hex behind a ``t`` / ``b``
    tag, which :meth:`_cells` decodes one cell at a time -- a bad cell fails only its row's decoding
    (:class:`~overnight.store.queue.QueueRowInvalid`, naming it), never the statement."""

    LOCK = ""
    ROWID = "rowid"
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

    def _has_table(self, name: str = "workers") -> bool:
        # a view by that name counts (it is read, and refused if it says a newer version): never created over
        return bool(self._read("SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name=?", (name,)))

    def _lease_live(self) -> str:
        return ("EXISTS (SELECT 1 FROM leases l WHERE l.task_id=q.task_id AND l.branch='main' AND l.holder_id<>'' "
                "AND l.expires_at_ms > ?)")

    def _next_seq(self, cur: Any) -> int:
        cur.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM queue")
        return int(cur.fetchone()[0])

    def _expr(self, column: str) -> str:
        return (f"CASE typeof({column}) WHEN 'text' THEN 't' || hex({column}) "
                f"WHEN 'blob' THEN 'b' || hex({column}) ELSE {column} END")

    def _cells(self, row: tuple) -> tuple:
        """Decode cells selected with :meth:`_expr`: text as strict UTF-8; a blob as the store writes
        a string UTF-8 cannot encode (a lone surrogate, ``surrogatepass``) -- anything else stays
        ``bytes``, which :func:`~overnight.store.queue.row_to_task` refuses as not UTF-8 text."""
        return tuple(_untag(v) if type(v) is str else v for v in row)


def _untag(tagged: str) -> str | bytes:
    """One cell of :meth:`SQLiteQueue._expr` (``t``/``b`` + hex): ``str``, or ``bytes`` when it is not
    text as the store writes it."""
    raw = bytes.fromhex(tagged[1:])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if tagged[0] == "t":
            return raw
        try:
            return raw.decode("utf-8", "surrogatepass")  # a string with a lone surrogate, as _param stores it
        except UnicodeDecodeError:
            return raw
    return text if tagged[0] == "t" else raw  # valid UTF-8 as a blob: the store writes that as text


__all__ = ["SQLiteQueue"]
