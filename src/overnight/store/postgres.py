# Over 600 lines: one backend: every method of the store protocol over one PostgreSQL schema (migrations are in postgres_schema.py).
"""PostgreSQL backend: ``postgresql://[USER@]HOST[:PORT]/DB[?schema=NAME]`` (psycopg 3 + a pool).

The coordinator for many workers on many machines (DESIGN.md, "Scale-out"). Tables live in one
schema (default ``overnight``; ``?schema=NAME`` picks another, e.g. one per test or per tenant),
created and upgraded by the versioned migrations of :mod:`overnight.store.postgres_schema`.

A commit is one statement, ``SELECT commit_checkpoint(...)`` (a function of the schema, migration
4: one round trip, its own transaction): the lease row is read ``FOR SHARE`` (so a takeover, which
updates that row, waits for the commit or comes before it) and its fencing token compared, the ref
moves by ``UPDATE ... WHERE checkpoint_id = <expected>`` (or ``INSERT ... ON CONFLICT DO NOTHING``
for a new branch), then the task, the objects, the checkpoint and its journal rows are inserted. A
stale head or a lost lease rolls everything back. Durable when :meth:`PostgresStore.commit`
returns (every connection runs with ``synchronous_commit = on``).

Pooled connections are not checked before use (that costs a round trip per checkout). One found
dead (the server restarted, ``pg_terminate_backend``) is discarded, the pool's idle connections
are checked, and what was being done runs once more if that is safe: a read, a ``BEGIN`` (nothing
done yet), a commit (idempotent: a head that already is the new checkpoint means the attempt whose
answer was lost committed it).

Strings the caller controls are stored as ``bytea`` (UTF-8, surrogates passed through): PostgreSQL
``text`` cannot hold U+0000 or a lone surrogate, and every string must round-trip exactly.

Waiting: a statement blocked on a row lock longer than ``busy_timeout_ms`` (``lock_timeout``), or
a pool that has no free connection for that long, raises :class:`~overnight.errors.StoreBusy`.

Deletion against concurrent commits, by row locks (every time is the server's clock):

* a commit refreshes an object it finds stored with ``UPDATE ... SET stored_at_ms = now``, which
  locks the row until the commit ends; ``delete_objects`` deletes with ``... AND stored_at_ms <=
  now - min_age`` in the ``WHERE`` clause, which PostgreSQL re-checks on the row's new version after
  waiting for that lock, so a refreshed object stays. An object deleted first is inserted anew;
* a commit reads its parent checkpoint ``FOR KEY SHARE``; ``delete_checkpoints`` first locks the
  checkpoints it will delete ``FOR UPDATE`` and only then (a new statement, a new snapshot) drops
  those that are heads or parents of a survivor. Whichever comes second sees the other.
"""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterable, Iterator, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg_pool

from overnight.errors import (
    CheckpointNotFound,
    ConfigError,
    LeaseLost,
    SchemaError,
    StaleHead,
    StoreBusy,
    StoreUnavailable,
    TaskBusy,
    TaskNotFound,
)
from overnight.config import mask_password
from overnight.store import postgres_schema
from overnight.store.blobs import is_damaged
from overnight.store.base import ArchiveRow, CallRecord, CheckpointRow, Commit, JournalRow, TaskRow
from overnight.store.base import Closing, Lease, MinAge, ObjectRecord, ObjectStat, age_limit, check_parent, stale_head
from overnight.store.leases import can_take_over, describe_holder, next_token, now_ms, released_holder
from overnight.store.refusal import unreachable

_MISSING = re.compile(r'FATAL:\s+(database|role) "([^"]*)" does not exist')
"""libpq's startup refusal for a database or user the server does not have (PostgreSQL's
``3D000``/``28000`` messages, which psycopg raises without a sqlstate)."""

DEFAULT_SCHEMA = "overnight"
NOW_MS_SQL = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
"""SQL: now by the server's clock, in Unix ms -- what leases, queue claims and object stored times
are set and judged by (:meth:`PostgresStore.clock_ms`)."""
_OUR_PARAMS = ("schema", "pool_max", "busy_timeout_ms")
_PAGE = 10_000  # digests per page of a listing of every object
T = TypeVar("T")


def _b(text: str | None) -> bytes | None:
    """A caller's string as stored: UTF-8 with surrogates passed through."""
    return None if text is None else text.encode("utf-8", "surrogatepass")


def _s(data: Any) -> Any:
    return None if data is None else bytes(data).decode("utf-8", "surrogatepass")


def _text_safe(value: str | None) -> bool:
    """Can PostgreSQL ``text`` hold it (no U+0000, no lone surrogate)?"""
    if value is None:
        return True
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lease_lost(lease: Lease, holder_json: str | None) -> LeaseLost:
    """A commit or renewal fenced out: ``holder_json`` is the lease's holder now (None: nobody)."""
    who = describe_holder(holder_json) if holder_json is not None else "nobody"
    return LeaseLost(f"lease on branch {lease.branch!r} was taken over (now held by {who})", task_id=lease.task_id,
                     hint="this process stalled past its lease TTL; the other holder continues the task")


def parse_url(url: str) -> tuple[str, str, dict[str, int]]:
    """``(libpq conninfo URL, schema, options)`` from a store URL; raises :class:`ConfigError`."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname and not parts.path.strip("/"):
        raise ConfigError(f"malformed PostgreSQL store URL {url!r}",
                          hint="use postgresql://[USER@]HOST[:PORT]/DB[?schema=NAME]")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ConfigError(f"malformed PostgreSQL store URL {url!r}: {exc}",
                          hint="use postgresql://[USER@]HOST[:PORT]/DB[?schema=NAME]") from exc
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OUR_PARAMS}
    rest = [(k, v) for k, v in query if k not in _OUR_PARAMS]
    schema = ours.get("schema", DEFAULT_SCHEMA)
    try:
        postgres_schema.quote_schema(schema)
    except ValueError as exc:
        raise ConfigError(f"store URL {url!r}: {exc}", hint="e.g. ?schema=overnight") from exc
    options: dict[str, int] = {}
    for key in ("pool_max", "busy_timeout_ms"):
        if key in ours:
            try:
                options[key] = int(ours[key])
            except ValueError:
                options[key] = 0
            if options[key] < 1:
                raise ConfigError(f"store URL {url!r}: {key} must be a positive integer")
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
    return conninfo, schema, options


def schema_exists(url: str, *, connect_timeout_s: float = 3.0) -> bool | None:
    """Whether the store's schema is already in the database (None: the server cannot be asked --
    opening the store then says why). Creates nothing.

    Raises:
        ConfigError: a malformed URL."""
    conninfo, schema, _ = parse_url(url)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=max(1, int(connect_timeout_s))) as conn:
            return conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                                (schema,)).fetchone() is not None
    except psycopg.Error:
        return None


def _handing_over(first: list[psycopg.Connection]) -> type[psycopg.Connection]:
    """A connection class for the pool whose first ``connect`` returns the connection in ``first``
    (the one the schema check ran on) instead of opening another: opening a store costs one
    connection -- one server backend, which a worker's session otherwise started twice."""

    class HandedOver(psycopg.Connection):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:  # type: ignore[override]
            if first:
                return first.pop()
            return super().connect(conninfo, **kwargs)

    return HandedOver


class PostgresStore(Closing):
    """:class:`~overnight.store.base.Store` in a PostgreSQL schema (see the module docstring).

    Args:
        url: ``postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DB`` plus optional query parameters:
            ``schema`` (default ``overnight``), ``pool_max`` (connections, default 10),
            ``busy_timeout_ms`` (default 10000); any other parameter (``sslmode``, ...) goes to libpq.
        connect_timeout_s: how long opening waits for the server.
        check_shape: compare an up-to-date schema's tables with its recorded version
            (:func:`~overnight.store.postgres_schema.check_shape`, one catalog query: ~10 ms on a
            new connection). A worker's session passes False: its worker checked the same schema
            when it opened it; the version is still checked.

    Raises:
        ConfigError: malformed URL, login refused, or no right to create the schema.
        StoreUnavailable: the server does not answer (connection refused, timed out, unknown host).
        StoreVersionError: the schema was created by a newer overnight.
        StoreSchemaMismatch: the schema's recorded version disagrees with its tables (half-migrated).
    """

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0, check_shape: bool = True,
                 _migrations: tuple[postgres_schema.Migration, ...] = postgres_schema.MIGRATIONS) -> None:
        self.url = url
        conninfo, self.schema, options = parse_url(url)
        self.busy_timeout_ms = options.get("busy_timeout_ms", 10_000)
        self._q = postgres_schema.quote_schema(self.schema)
        self._closed = False
        self._close_lock = threading.Lock()
        where = self._where(conninfo)
        first: list[psycopg.Connection] = []
        try:
            conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=max(1, int(connect_timeout_s)))
            try:
                postgres_schema.migrate(conn, self.schema, where=url, migrations=_migrations, check=check_shape)
            except BaseException:
                conn.close()
                raise
            first.append(conn)  # the pool's first connection: one connection (one server backend) per open
        except psycopg.OperationalError as exc:
            detail = f"cannot connect to PostgreSQL at {where}: {' '.join(str(exc).split())}"
            missing = _MISSING.search(str(exc))
            if missing is not None:  # the server answered (libpq gives no sqlstate for a refused startup)
                raise ConfigError(detail, hint=f"the server answered: the {missing[1]} {missing[2]!r} in the URL does "
                                  "not exist; " + ("create it (`createdb -h HOST NAME`)" if missing[1] == "database"
                                                   else "use an existing user") + " or fix the URL") from exc
            if exc.sqlstate is None:  # no answer from a server (refused, timed out, unknown host)
                raise unreachable(mask_password(url), detail,
                                  hint="is the server running, and the host and port right? `pg_isready -h HOST "
                                  "-p PORT` checks; run the command again once it answers") from exc
            if exc.sqlstate[:2] in ("08", "57"):  # the connection broke, or the server shut it (restart, terminate)
                raise unreachable(mask_password(url), detail, hint="the server closed the connection while the store "
                                  "was opened (a restart, or pg_terminate_backend): run the command again") from exc
            raise ConfigError(detail, hint="the server answered but refused: check the user, password and "
                              "database in the URL") from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(f"no right to create schema {self.schema!r} in {where}: {str(exc).strip()}",
                              hint="grant CREATE on the database, or create the schema for this user") from exc
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"cannot open PostgreSQL store {url!r}: {str(exc).strip()}") from exc
        self._pool = psycopg_pool.ConnectionPool(
            conninfo,
            min_size=1,
            max_size=options.get("pool_max", 10),
            kwargs={"autocommit": True},
            connection_class=_handing_over(first),
            configure=self._configure,
            check=None,  # no round trip per checkout: a dead connection is replaced on use (_call, _tx)
            timeout=self.busy_timeout_ms / 1000,
            name=f"overnight:{self.schema}",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            for conn in first:
                conn.close()
            raise unreachable(mask_password(url), f"no connection to {where} within {connect_timeout_s} s",
                              hint="is the server overloaded or gone? run the command again once it answers") from exc

    @staticmethod
    def _where(conninfo: str) -> str:
        p = urlsplit(conninfo)
        return f"{p.hostname or 'localhost'}:{p.port or 5432}{p.path or ''}"

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute(f"SET lock_timeout = {int(self.busy_timeout_ms)}; SET synchronous_commit = on")  # one round trip

    # -- plumbing ---------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text.replace("{s}", self._q)

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            if not self._answers():
                raise self._gone(f"no connection within {self.busy_timeout_ms} ms") from exc
            raise StoreBusy(f"no free connection to {self.url} within {self.busy_timeout_ms} ms",
                            hint="raise ?pool_max=N, or reduce concurrent writers") from exc
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            raise StoreBusy(f"{self.url}: a row stayed locked by another writer for {self.busy_timeout_ms} ms",
                            hint="another overnight process is committing to this branch; retry") from exc
        except psycopg.errors.UndefinedTable as exc:  # a table dropped under a running store
            raise StoreUnavailable(f"store {mask_password(self.url)}: {' '.join(str(exc).split())} -- the "
                                   f"schema {self.schema!r} lost a table while in use", location=mask_password(self.url),
                                   hint="restore the schema from a backup, or recreate it (opening an empty schema "
                                   "migrates it) and repair a replicated task from its other media") from exc
        except psycopg.OperationalError as exc:  # the server went away (shutdown, network, restart)
            if exc.sqlstate is None or exc.sqlstate.startswith(("08", "57")):
                raise self._gone(' '.join(str(exc).split())) from exc
            raise

    def _answers(self) -> bool:
        """Whether the server accepts a new connection now (telling a full pool from a dead server)."""
        try:
            with psycopg.connect(parse_url(self.url)[0], autocommit=True, connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def _gone(self, detail: str) -> StoreUnavailable:
        return unreachable(mask_password(self.url), detail,
                           hint="the PostgreSQL server stopped answering; nothing committed is lost -- run the "
                           "command again once it is back (`overnight resume TASK_ID` continues a run)")

    @staticmethod
    def _dead(exc: StoreUnavailable) -> bool:
        """Did the connection die under a statement (the server restarted, ``pg_terminate_backend``,
        the network) -- rather than no connection being had at all?"""
        return isinstance(exc.__cause__, psycopg.OperationalError)

    def _call(self, fn: Callable[[psycopg.Connection, bool], T]) -> T:
        """``fn(conn, retry=False)`` on a pooled connection; if the connection turns out dead, the
        pool's idle connections are checked and ``fn(conn, retry=True)`` runs once more on a live
        one. Pooled connections are not checked before use (a round trip per checkout), so ``fn``
        must be safe to run twice: a read, or one statement (its own transaction under autocommit)
        made idempotent with ``retry``."""
        try:
            with self._conn() as conn:
                return fn(conn, False)
        except StoreUnavailable as exc:
            if not self._dead(exc):
                raise
        self._pool.check()
        with self._conn() as conn:
            return fn(conn, True)

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor]:
        """A transaction's cursor. A connection found dead by ``BEGIN`` (nothing done yet) is
        replaced once, as in :meth:`_call`."""
        begun = False
        try:
            with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
                begun = True
                yield cur
            return
        except StoreUnavailable as exc:
            if begun or not self._dead(exc):
                raise
        self._pool.check()
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    def fetch(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        """Rows of one read statement (``sql`` with the schema already in it: :meth:`sql`); a
        connection the server closed is replaced and the read runs again once."""
        return self._call(lambda conn, retry: conn.execute(sql, args).fetchall())

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self.fetch(self._sql(sql), args)

    # -- for tables kept beside the store's own (the queue: store/queue_postgres.py) ----------

    def sql(self, text: str) -> str:
        """``text`` with ``{s}`` replaced by this store's schema (quoted)."""
        return self._sql(text)

    def connection(self) -> ContextManager[psycopg.Connection]:
        """A pooled connection; a full pool, a held lock or a lost server raise StoreBusy or
        StoreUnavailable as the store's own statements do."""
        return self._conn()

    def transaction(self) -> ContextManager[psycopg.Cursor]:
        """A cursor in one transaction on a pooled connection (committed on exit)."""
        return self._tx()

    @staticmethod
    def _require_text(what: str, value: str | None, checkpoint_id: str | None = None) -> None:
        if not _text_safe(value):
            raise SchemaError(f"{what} {value!r} is not a digest (it holds U+0000 or a lone surrogate)",
                              checkpoint_id=checkpoint_id if _text_safe(checkpoint_id) else None,
                              hint="digests and checkpoint ids are 'sha256:' + 64 hex digits")

    # -- objects ----------------------------------------------------------------------------

    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        wanted = list(dict.fromkeys(digests))
        safe = [d for d in wanted if _text_safe(d)]
        present = {r[0] for r in self._read("SELECT digest FROM {s}.objects WHERE digest = ANY(%s)", (safe,))}
        return set(wanted) - present

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        safe = [d for d in dict.fromkeys(digests) if _text_safe(d)]
        rows = self._read("SELECT digest, kind, size, codec, data FROM {s}.objects WHERE digest = ANY(%s)", (safe,))
        return {r[0]: ObjectRecord(r[0], r[1], r[2], r[3], bytes(r[4])) for r in rows}

    def _insert_objects(self, cur: psycopg.Cursor, objects: Iterable[ObjectRecord]) -> int:
        """Insert the objects not stored yet and refresh the stored time of those that are; returns
        the ``data`` bytes written. A stored object with other bytes under the same digest is
        replaced only if it is damaged (:func:`is_damaged`)."""
        first: dict[str, ObjectRecord] = {}
        for o in objects:
            self._require_text("object digest", o.digest)
            first.setdefault(o.digest, o)
        if not first:
            return 0
        added = 0
        todo = sorted(first)  # digest order, as delete_objects locks them: fewer lock-order deadlocks
        rest: list[str] = []
        for _ in range(5):  # an object deleted between the insert and the refresh is inserted again
            objs = [first[d] for d in todo]
            cur.execute(
                self._sql("INSERT INTO {s}.objects (digest, kind, size, codec, data) "
                          "SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], %s::bytea[]) "
                          "ON CONFLICT (digest) DO NOTHING RETURNING digest"),
                ([o.digest for o in objs], [o.kind for o in objs], [o.size for o in objs], [o.codec for o in objs],
                 [o.data for o in objs]),
            )
            inserted = {r[0] for r in cur.fetchall()}
            added += sum(len(first[d].data) for d in inserted)
            present = [d for d in todo if d not in inserted]
            if not present:
                break
            # refresh: the row lock held until this commit ends keeps a concurrent gc off it
            cur.execute(self._sql(f"UPDATE {{s}}.objects SET stored_at_ms = {NOW_MS_SQL} WHERE digest = ANY(%s) "
                                  "RETURNING digest"), (present,))
            refreshed = {r[0] for r in cur.fetchall()}
            rest.extend(refreshed)
            todo = [d for d in present if d not in refreshed]
            if not todo:
                break
        if rest:
            cur.execute(self._sql("SELECT digest, kind, size, codec, data FROM {s}.objects WHERE digest = ANY(%s)"),
                        (rest,))
            for d, kind, size, codec, data in cur.fetchall():
                o = first[d]
                if (kind, size, codec, bytes(data)) != (o.kind, o.size, o.codec, o.data) and is_damaged(self, d):
                    cur.execute(self._sql("UPDATE {s}.objects SET kind = %s, size = %s, codec = %s, data = %s "
                                          "WHERE digest = %s"), (o.kind, o.size, o.codec, o.data, d))
                    added += len(o.data)
        return added

    def put_objects(self, objects: Iterable[ObjectRecord]) -> None:
        objects = list(objects)
        if objects:
            with self._tx() as cur:
                self._insert_objects(cur, objects)

    def iter_object_digests(self) -> Iterator[str]:
        # in digest order, a page at a time (keyset paging on the primary key, COLLATE "C"): a
        # listing of millions of objects holds one page in memory; the first page has no lower
        # bound, so even a digest of '' is listed
        page = self._read("SELECT digest FROM {s}.objects ORDER BY digest LIMIT %s", (_PAGE,))
        while True:
            yield from (r[0] for r in page)
            if len(page) < _PAGE:
                return
            page = self._read("SELECT digest FROM {s}.objects WHERE digest > %s ORDER BY digest LIMIT %s",
                              (page[-1][0], _PAGE))

    def iter_object_stats(self) -> Iterator[ObjectStat]:
        rows = self._read(f"SELECT digest, octet_length(data), greatest(0, {NOW_MS_SQL} - stored_at_ms) FROM {{s}}.objects")
        for digest, size, age in rows:
            yield ObjectStat(digest, int(size), int(age))

    def delete_objects(self, digests: Iterable[str], *, min_age_ms: MinAge | None = None) -> int:
        wanted = [d for d in dict.fromkeys(digests) if _text_safe(d)]
        freed = 0
        wanted.sort()
        for i in range(0, len(wanted), 1000):
            part = wanted[i : i + 1000]
            with self._tx() as cur:
                if min_age_ms is None:
                    cur.execute(self._sql("DELETE FROM {s}.objects WHERE digest = ANY(%s) RETURNING octet_length(data)"),
                                (part,))
                else:
                    # the age test is in the WHERE clause: re-checked on a row a commit refreshed meanwhile
                    cur.execute(self._sql(f"DELETE FROM {{s}}.objects WHERE digest = ANY(%s) AND "
                                          f"stored_at_ms <= {NOW_MS_SQL} - %s RETURNING octet_length(data)"),
                                (part, int(age_limit(min_age_ms))))
                freed += sum(int(r[0]) for r in cur.fetchall())
        return freed

    # -- checkpoints and refs ---------------------------------------------------------------

    def commit(self, commit: Commit) -> int:
        cp = commit.checkpoint
        self._require_text("checkpoint id", cp.checkpoint_id)
        self._require_text("parent id", cp.parent_id, cp.checkpoint_id)
        self._require_text("signature", cp.signature, cp.checkpoint_id)
        for j in commit.journal:
            self._require_text("journal checkpoint id", j.checkpoint_id, cp.checkpoint_id)
            self._require_text("step key", j.step_key, cp.checkpoint_id)
        if not _text_safe(commit.expected_head):  # no stored ref can name it: the head is not that
            raise StaleHead(f"branch {cp.branch!r} moved: expected head {commit.expected_head!r}, "
                            f"found {self.get_ref(cp.task_id, cp.branch)}", task_id=cp.task_id,
                            hint="reload the head and retry")
        first: dict[str, ObjectRecord] = {}
        for o in commit.objects:
            self._require_text("object digest", o.digest)
            first.setdefault(o.digest, o)
        objs = [first[d] for d in sorted(first)]  # digest order, as delete_objects locks them
        lease, t, js = commit.lease, commit.task, commit.journal
        args: list[Any] = [
            _b(lease.task_id) if lease else None, _b(lease.branch) if lease else None,
            _b(lease.holder_id) if lease else None, lease.token if lease else None,
            commit.expected_head, now_ms(), False,
            cp.checkpoint_id, _b(cp.task_id), cp.parent_id, _b(cp.branch), cp.seq, _b(cp.created_at),
            _b(cp.session), _b(cp.event), _b(cp.step), cp.body, cp.signature,
            _b(t.task_id) if t else None, _b(t.created_at) if t else None, _b(t.goal) if t else None,
            _b(t.entry) if t else None, t.spec if t else None,
            [o.digest for o in objs], [o.kind for o in objs], [o.size for o in objs], [o.codec for o in objs],
            [o.data for o in objs], [], [],
            [_b(j.task_id) for j in js], [j.checkpoint_id for j in js], [j.seq for j in js],
            [j.step_key for j in js], [_b(j.step_name) for j in js], [_b(j.session) for j in js],
            [_b(j.started_at) for j in js], [float(j.duration_ms) for j in js], [j.tokens_in for j in js],
            [j.tokens_out for j in js],
        ]
        for _ in range(4):  # each round judges the stored objects that differ (OV004) once
            try:
                return self._call(lambda conn, retry: conn.execute(
                    self._commit_sql, args[:6] + [retry] + args[7:]).fetchone()[0])
            except psycopg.Error as exc:
                if exc.sqlstate in ("OV001", "OV002", "OV003"):
                    raise self._refusal(exc, commit) from None
                if exc.sqlstate != "OV004":
                    raise
                replace, keep = args[28], args[29]
                for d in (exc.diag.message_detail or "").split():
                    (replace if is_damaged(self, d) else keep).append(d)
        raise StoreBusy(f"{self.url}: stored objects kept changing under commit {cp.checkpoint_id}",
                        hint="another writer is rewriting objects; retry")

    _COMMIT_TYPES = ("bytea", "bytea", "bytea", "bigint", "text", "bigint", "boolean", "text", "bytea", "text",
                     "bytea", "bigint", "bytea", "bytea", "bytea", "bytea", "bytea", "text", "bytea", "bytea",
                     "bytea", "bytea", "bytea", "text[]", "text[]", "bigint[]", "text[]", "bytea[]", "text[]",
                     "text[]", "bytea[]", "text[]", "bigint[]", "text[]", "bytea[]", "bytea[]", "bytea[]",
                     "double precision[]", "bigint[]", "bigint[]")

    @property
    def _commit_sql(self) -> str:
        casts = ", ".join(f"%b::{t}" for t in self._COMMIT_TYPES)
        return self._sql(f"SELECT {{s}}.commit_checkpoint({casts})")

    def _refusal(self, exc: psycopg.Error, commit: Commit) -> Exception:
        """The store error for a refusal of ``commit_checkpoint`` (its SQLSTATEs: postgres_schema)."""
        cp, detail = commit.checkpoint, exc.diag.message_detail or ""
        if exc.sqlstate == "OV001" and commit.lease is not None:
            return _lease_lost(commit.lease, _s(bytes.fromhex(detail[1:])) if detail else None)
        if exc.sqlstate == "OV002":
            return stale_head(cp.task_id, cp.branch, commit.expected_head, detail[1:] if detail else None)
        if exc.sqlstate == "OV003":
            try:
                check_parent(cp, _s(bytes.fromhex(detail[1:])) if detail else None)
            except Exception as refused:  # noqa: BLE001 - check_parent's own error, returned
                return refused
        return exc

    def _cas_ref(self, cur: psycopg.Cursor, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        """Move ``task_id/branch`` from ``expected`` to ``new`` (None deletes), or raise StaleHead."""
        key = (_b(task_id), _b(branch))
        if expected is not None:
            if new is None:
                cur.execute(self._sql("DELETE FROM {s}.refs WHERE task_id=%s AND branch=%s AND checkpoint_id=%s"),
                            (*key, expected))
            else:
                cur.execute(self._sql("UPDATE {s}.refs SET checkpoint_id=%s, updated_at_ms=%s "
                                      "WHERE task_id=%s AND branch=%s AND checkpoint_id=%s"),
                            (new, now_ms(), *key, expected))
            if cur.rowcount == 1:
                return
        elif new is not None:
            cur.execute(self._sql("INSERT INTO {s}.refs VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"),
                        (*key, new, now_ms()))
            if cur.rowcount == 1:
                return
        cur.execute(self._sql("SELECT checkpoint_id FROM {s}.refs WHERE task_id=%s AND branch=%s"), key)
        row = cur.fetchone()
        current = row[0] if row else None
        if current == expected:  # only for new=None, expected=None: nothing to do
            return
        raise stale_head(task_id, branch, expected, current)

    @staticmethod
    def _row(r: tuple) -> CheckpointRow:
        return CheckpointRow(r[0], _s(r[1]), r[2], _s(r[3]), r[4], _s(r[5]), _s(r[6]), _s(r[7]), _s(r[8]),
                             bytes(r[9]), r[10], r[11])

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        rows = self._read("SELECT * FROM {s}.checkpoints WHERE checkpoint_id=%s", (checkpoint_id,)) \
            if _text_safe(checkpoint_id) else []
        if not rows:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id} in {self.url}", checkpoint_id=checkpoint_id)
        return self._row(rows[0])

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        rows = self._read("SELECT * FROM {s}.checkpoints WHERE task_id=%s ORDER BY seq, created_at, checkpoint_id",
                          (_b(task_id),))
        return [self._row(r) for r in rows]

    def checkpoints_after(self, task_id: str, branch: str, seq: int) -> list[CheckpointRow]:
        rows = self._read("SELECT * FROM {s}.checkpoints WHERE task_id=%s AND seq>%s AND branch=%s "
                          "ORDER BY seq, created_at, checkpoint_id", (_b(task_id), seq, _b(branch)))
        return [self._row(r) for r in rows]

    def get_ref(self, task_id: str, branch: str) -> str | None:
        rows = self._read("SELECT checkpoint_id FROM {s}.refs WHERE task_id=%s AND branch=%s", (_b(task_id), _b(branch)))
        return rows[0][0] if rows else None

    def list_refs(self, task_id: str) -> dict[str, str]:
        rows = self._read("SELECT branch, checkpoint_id FROM {s}.refs WHERE task_id=%s ORDER BY branch", (_b(task_id),))
        return {_s(r[0]): r[1] for r in rows}

    def set_ref(self, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        self._require_text("checkpoint id", new)
        if not _text_safe(expected):  # no stored ref can hold it
            raise StaleHead(f"branch {branch!r} moved: expected head {expected!r}, found {self.get_ref(task_id, branch)}",
                            task_id=task_id, hint="reload the head and retry")
        with self._tx() as cur:
            self._cas_ref(cur, task_id, branch, new, expected)

    def put_checkpoints(self, rows: Iterable[CheckpointRow], journal: Iterable[JournalRow] = ()) -> None:
        rows, journal = list(rows), list(journal)
        for cp in rows:
            self._require_text("checkpoint id", cp.checkpoint_id)
            self._require_text("parent id", cp.parent_id, cp.checkpoint_id)
            self._require_text("signature", cp.signature, cp.checkpoint_id)
        if not rows and not journal:
            return
        with self._tx() as cur:
            if rows:
                cur.executemany(
                    self._sql("INSERT INTO {s}.checkpoints VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                              "ON CONFLICT DO NOTHING"),
                    [(cp.checkpoint_id, _b(cp.task_id), cp.parent_id, _b(cp.branch), cp.seq, _b(cp.created_at),
                      _b(cp.session), _b(cp.event), _b(cp.step), cp.body, cp.signature, cp.stored_bytes) for cp in rows])
            if journal:
                cur.executemany(
                    self._sql("INSERT INTO {s}.journal VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING"),
                    [(_b(j.task_id), j.checkpoint_id, j.seq, j.step_key, _b(j.step_name), _b(j.session),
                      _b(j.started_at), j.duration_ms, j.tokens_in, j.tokens_out) for j in journal])

    def delete_checkpoints(self, checkpoint_ids: Iterable[str], *, orphans: bool = False) -> int:
        wanted = [c for c in dict.fromkeys(checkpoint_ids) if _text_safe(c)]
        if not wanted:
            return 0
        with self._tx() as cur:
            # lock first (a commit building on one of them holds FOR KEY SHARE: wait for it), then
            # decide with a fresh snapshot that sees any child it added
            cur.execute(self._sql("SELECT checkpoint_id FROM {s}.checkpoints WHERE checkpoint_id = ANY(%s) "
                                  "ORDER BY checkpoint_id FOR UPDATE"), (wanted,))
            doomed = {r[0] for r in cur.fetchall()}
            cur.execute(self._sql("SELECT checkpoint_id FROM {s}.refs WHERE checkpoint_id = ANY(%s)"), (list(doomed),))
            doomed -= {r[0] for r in cur.fetchall()}
            while doomed and not orphans:
                cur.execute(self._sql("SELECT DISTINCT parent_id FROM {s}.checkpoints WHERE parent_id = ANY(%s) "
                                      "AND NOT (checkpoint_id = ANY(%s))"), (list(doomed), list(doomed)))
                keep = {r[0] for r in cur.fetchall()}
                if not keep:
                    break
                doomed -= keep
            if not doomed:
                return 0
            ids = list(doomed)
            cur.execute(self._sql("DELETE FROM {s}.journal WHERE checkpoint_id = ANY(%s)"), (ids,))
            cur.execute(self._sql("DELETE FROM {s}.checkpoints WHERE checkpoint_id = ANY(%s) RETURNING octet_length(body)"),
                        (ids,))
            return sum(int(r[0]) for r in cur.fetchall())

    def delete_task(self, task_id: str) -> None:
        with self._tx() as cur:
            for table in ("refs", "leases", "journal", "calls", "checkpoints", "archives", "tasks"):
                cur.execute(self._sql(f"DELETE FROM {{s}}.{table} WHERE task_id=%s"), (_b(task_id),))

    # -- archives ---------------------------------------------------------------------------

    def put_archive(self, row: ArchiveRow) -> None:
        self._require_text("archive id", row.archive_id)
        with self._tx() as cur:
            cur.execute(self._sql("INSERT INTO {s}.archives VALUES (%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING"),
                        (_b(row.task_id), row.archive_id, _b(row.created_at), _b(row.location), row.manifest))

    def list_archives(self, task_id: str | None = None) -> list[ArchiveRow]:
        cols = "archive_id, task_id, created_at, location, manifest"
        if task_id is None:
            rows = self._read(f"SELECT {cols} FROM {{s}}.archives ORDER BY created_at, archive_id")
        else:
            rows = self._read(f"SELECT {cols} FROM {{s}}.archives WHERE task_id=%s ORDER BY created_at, archive_id",
                              (_b(task_id),))
        return [ArchiveRow(r[0], _s(r[1]), _s(r[2]), _s(r[3]), bytes(r[4])) for r in rows]

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        if not _text_safe(archive_id):
            return
        with self._tx() as cur:
            cur.execute(self._sql("DELETE FROM {s}.archives WHERE task_id=%s AND archive_id=%s"),
                        (_b(task_id), archive_id))

    # -- tasks and journal ------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRow:
        rows = self._read("SELECT task_id, created_at, goal, entry, spec FROM {s}.tasks WHERE task_id=%s", (_b(task_id),))
        if not rows:
            raise TaskNotFound(f"no task {task_id!r} in {self.url}", task_id=task_id, hint="`overnight ls` lists the tasks")
        r = rows[0]
        return TaskRow(_s(r[0]), _s(r[1]), _s(r[2]), _s(r[3]), bytes(r[4]))

    def list_tasks(self) -> list[TaskRow]:
        rows = self._read("SELECT task_id, created_at, goal, entry, spec FROM {s}.tasks ORDER BY created_at, task_id")
        return [TaskRow(_s(r[0]), _s(r[1]), _s(r[2]), _s(r[3]), bytes(r[4])) for r in rows]

    def journal(self, task_id: str) -> list[JournalRow]:
        rows = self._read("SELECT * FROM {s}.journal WHERE task_id=%s ORDER BY seq", (_b(task_id),))
        return [JournalRow(_s(r[0]), r[1], r[2], r[3], _s(r[4]), _s(r[5]), _s(r[6]), r[7], r[8], r[9]) for r in rows]

    # -- call journal -----------------------------------------------------------------------

    def record_call(self, call: CallRecord) -> None:
        self._require_text("step key", call.step_key)
        self._require_text("request digest", call.request_digest)
        with self._tx() as cur:
            cur.execute(self._sql("INSERT INTO {s}.calls VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING"),
                        (_b(call.task_id), call.step_key, call.seq, call.request_digest, _b(call.model), call.response,
                         call.tokens_in, call.tokens_out, call.latency_ms, _b(call.created_at)))

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        if step_key is None:
            rows = self._read("SELECT * FROM {s}.calls WHERE task_id=%s ORDER BY created_at, seq", (_b(task_id),))
        elif not _text_safe(step_key):
            return []
        else:
            rows = self._read("SELECT * FROM {s}.calls WHERE task_id=%s AND step_key=%s ORDER BY created_at, seq",
                              (_b(task_id), step_key))
        return [CallRecord(_s(r[0]), r[1], r[2], r[3], _s(r[4]), bytes(r[5]), r[6], r[7], r[8], _s(r[9])) for r in rows]

    # -- leases -----------------------------------------------------------------------------

    def _check_lease(self, cur: psycopg.Cursor, lease: Lease) -> None:
        """Inside a commit: the lease row, read FOR SHARE, must still name this holder and token."""
        cur.execute(self._sql("SELECT holder_id, token, holder FROM {s}.leases WHERE task_id=%s AND branch=%s FOR SHARE"),
                    (_b(lease.task_id), _b(lease.branch)))
        row = cur.fetchone()
        if row is None or _s(row[0]) != lease.holder_id or row[1] != lease.token:
            raise _lease_lost(lease, _s(row[2]) if row is not None and row[0] else None)

    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        key = (_b(task_id), _b(branch))
        with self._tx() as cur:
            # the row exists from the first acquisition on (a released lease keeps its token)
            cur.execute(self._sql("INSERT INTO {s}.leases VALUES (%s, %s, '', '', 0, 0) ON CONFLICT DO NOTHING"), key)
            # judged by the server's clock, as every holder's expiry was set: a client whose clock
            # runs ahead must not take a live lease early (nor one running behind lose its own)
            cur.execute(self._sql(f"SELECT holder_id, holder, token, expires_at_ms, {NOW_MS_SQL} FROM {{s}}.leases "
                                  "WHERE task_id=%s AND branch=%s FOR UPDATE"), key)
            cur_holder_id, cur_holder, token, expires, now = cur.fetchone()
            cur_holder_id, cur_holder = _s(cur_holder_id), _s(cur_holder)
            if cur_holder_id not in ("", holder_id) and not can_take_over(cur_holder, expires, now):
                raise TaskBusy(
                    f"task {task_id!r} is busy (held by {describe_holder(cur_holder)}, "
                    f"lease expires in {(expires - now) / 1000:.0f} s)",
                    task_id=task_id,
                    holder=describe_holder(cur_holder),
                    hint="wait for that run to finish, or stop it (Ctrl-C / kill) and resume",
                )
            token = next_token(task_id, branch, token)
            cur.execute(self._sql("UPDATE {s}.leases SET holder_id=%s, holder=%s, token=%s, expires_at_ms=%s "
                                  "WHERE task_id=%s AND branch=%s"),
                        (_b(holder_id), _b(holder), token, now + ttl_ms, *key))
        return Lease(task_id, branch, holder_id, holder, token, now + ttl_ms)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        with self._tx() as cur:
            self._check_lease(cur, lease)
            cur.execute(self._sql(f"UPDATE {{s}}.leases SET expires_at_ms={NOW_MS_SQL} + %s WHERE task_id=%s AND branch=%s "
                                  "RETURNING expires_at_ms"), (ttl_ms, _b(lease.task_id), _b(lease.branch)))
            expires = cur.fetchone()[0]
        return Lease(lease.task_id, lease.branch, lease.holder_id, lease.holder, lease.token, expires)

    def read_lease(self, task_id: str, branch: str) -> Lease | None:
        rows = self._read("SELECT holder_id, holder, token, expires_at_ms FROM {s}.leases WHERE task_id=%s AND branch=%s",
                          (_b(task_id), _b(branch)))
        if not rows:
            return None
        h, holder, token, expires = rows[0]
        return Lease(task_id, branch, bytes(h).decode(), bytes(holder).decode(), token, expires)

    def release_lease(self, lease: Lease, outcome: str | None = None) -> None:
        with self._tx() as cur:
            cur.execute(self._sql("UPDATE {s}.leases SET holder_id='', holder=%s, expires_at_ms=0 "
                                  "WHERE task_id=%s AND branch=%s AND holder_id=%s AND token=%s"),
                        (_b(released_holder(outcome)) if outcome else b"", _b(lease.task_id), _b(lease.branch),
                         _b(lease.holder_id), lease.token))

    def clock_ms(self) -> int:
        """Now, in Unix ms, by the PostgreSQL server's clock (one query): what leases and queue
        claims in this store are set and judged by, whatever each client's clock says."""
        return int(self._read(f"SELECT {NOW_MS_SQL}")[0][0])

    # -- housekeeping -----------------------------------------------------------------------

    def stored_bytes(self) -> int:
        """Bytes of the schema's tables with their TOAST data and indexes (``pg_total_relation_size``)."""
        rows = self._read(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
            (self.schema,),
        )
        return int(rows[0][0])

    def close(self) -> None:
        with self._close_lock:
            if not self._closed:
                self._closed = True
                self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self.url!r})"
