# Over 600 lines: one backend: every method of the store protocol over one SQLite schema (the shared parts are in store/base.py, blobs.py, leases.py).
"""SQLite backend: the embedded default (``sqlite://.overnight/overnight.db``).

Objects and checkpoints live in rowid tables: their rows (compressed chunks of a few KB) are
larger than what a ``WITHOUT ROWID`` b-tree keeps inline, and would spill to overflow pages
(measured: 2.6x the data on disk); small fixed-size rows (refs, leases, journal) are
``WITHOUT ROWID``.

One file, WAL journal, ``synchronous=FULL``: a commit is on disk when :meth:`SQLiteStore.commit`
returns, and a crash at any instant leaves either the old or the new head (SQLite's atomic
commit). Writers take the database lock with ``BEGIN IMMEDIATE`` and wait up to ``busy_timeout_ms``
for it; past that they get :class:`~overnight.errors.StoreBusy`, never a raw "database is locked".

Deletion (``gc``, ``rm``, ``archive``) runs in the same kind of write transaction, so it is
serialized with commits: an object's age is read and the object deleted in one transaction
(``DELETE ... WHERE stored_at_ms <= ?``), and a checkpoint is deleted only if no ref and no
surviving child names it at that moment.

Schema versions (``meta.schema_version``): 1 is the first release; 2 adds ``objects.stored_at_ms``
(added with the migration time as its default, so old rows are dated without being rewritten)
and the ``archives`` table. Opening a store migrates it; a newer version is refused.

A commit is one write transaction of four statements (ref CAS, new objects, the checkpoint row --
inserted only if its parent is stored -- and journal rows) and one ``fdatasync`` of the WAL;
``overnight bench commit`` measures it against LangGraph's ``SqliteSaver.put``.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ContextManager, Iterable, Iterator

from overnight.errors import (
    CheckpointNotFound,
    ConfigError,
    DigestMismatch,
    LeaseLost,
    StoreBusy,
    OutputNotWritable,
    StoreCorrupt,
    StoreFull,
    StoreReadOnly,
    StoreUnavailable,
    StoreVersionError,
    TaskBusy,
    TaskNotFound,
)
from overnight.store.base import ArchiveRow, CallRecord, CheckpointRow, Commit, JournalRow, TaskRow
from overnight.store.base import Closing, Lease, MinAge, ObjectRecord, ObjectStat, age_limit, check_parent, stale_head
from overnight.store.base import DamagedBytes, DamagedInt, DamagedText
from overnight.codec import digest
from overnight.store.blobs import is_damaged
from overnight.store.leases import can_take_over, describe_holder, next_token, now_ms, released_holder
from overnight.store.refusal import refusals

SCHEMA_VERSION = 2
PAGE_SIZE = 8192
"""Bytes per database page of a store this code creates (an existing file keeps its own). Larger
than SQLite's default 4096 so that most objects (a page blob, a state document, a chunk of up to
~8 KB compressed) fit in one b-tree cell instead of spilling into an overflow chain whose last page
is partly empty: ~10 % less file per checkpoint (``overnight bench step-bytes``)."""
_BATCH = 500  # digests per IN (...) query
_PAGE = 10_000  # digests per page of a listing of every object
_INSERT_ROWS = 100  # objects per INSERT statement (6 parameters each, far below SQLite's limit)


@functools.lru_cache(maxsize=_INSERT_ROWS)
def _insert_sql(rows: int) -> str:
    """``INSERT OR IGNORE`` of ``rows`` objects, returning the digest of each row inserted (a
    row ignored -- its digest is stored -- is not returned)."""
    return ("INSERT OR IGNORE INTO objects (digest, kind, size, codec, data, stored_at_ms) VALUES "
            + ",".join(["(?,?,?,?,?,?)"] * rows) + " RETURNING digest")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    digest TEXT PRIMARY KEY,
    kind   TEXT NOT NULL,
    size   INTEGER NOT NULL,
    codec  TEXT NOT NULL,
    data   BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id    TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    goal       TEXT NOT NULL,
    entry      TEXT,
    spec       BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    checkpoint_id TEXT PRIMARY KEY NOT NULL,
    task_id       TEXT NOT NULL,
    parent_id     TEXT,
    branch        TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    created_at    TEXT NOT NULL,
    session       TEXT NOT NULL,
    event         TEXT NOT NULL,
    step          TEXT,
    body          BLOB NOT NULL,
    signature     TEXT,
    stored_bytes  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_task ON checkpoints (task_id, seq);
CREATE TABLE IF NOT EXISTS refs (
    task_id       TEXT NOT NULL,
    branch        TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, branch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal (
    task_id       TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    step_key      TEXT NOT NULL,
    step_name     TEXT NOT NULL,
    session       TEXT NOT NULL,
    started_at    TEXT NOT NULL,
    duration_ms   REAL NOT NULL,
    tokens_in     INTEGER NOT NULL,
    tokens_out    INTEGER NOT NULL,
    PRIMARY KEY (checkpoint_id, step_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS journal_task ON journal (task_id, seq);
CREATE TABLE IF NOT EXISTS calls (
    task_id        TEXT NOT NULL,
    step_key       TEXT NOT NULL,
    seq            INTEGER NOT NULL,
    request_digest TEXT NOT NULL,
    model          TEXT NOT NULL,
    response       BLOB NOT NULL,
    tokens_in      INTEGER NOT NULL,
    tokens_out     INTEGER NOT NULL,
    latency_ms     REAL NOT NULL,
    created_at     TEXT NOT NULL,
    PRIMARY KEY (task_id, step_key, seq, request_digest)
);
CREATE TABLE IF NOT EXISTS leases (
    task_id       TEXT NOT NULL,
    branch        TEXT NOT NULL,
    holder_id     TEXT NOT NULL,
    holder        TEXT NOT NULL,
    token         INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, branch)
) WITHOUT ROWID;
"""


def _migration_2(now: int) -> list[str]:
    """Schema 1 -> 2: object stored times (old rows read the migration time, no rewrite) and the
    archive catalog."""
    return [
        f"ALTER TABLE objects ADD COLUMN stored_at_ms INTEGER NOT NULL DEFAULT {int(now)}",
        """CREATE TABLE archives (
            task_id    TEXT NOT NULL,
            archive_id TEXT NOT NULL,
            created_at TEXT NOT NULL,
            location   TEXT NOT NULL,
            manifest   BLOB NOT NULL,
            PRIMARY KEY (task_id, archive_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX checkpoints_parent ON checkpoints (parent_id)",
    ]


_BLOB_COLUMNS = frozenset({"data", "body", "spec", "response", "manifest"})


def _param(value: object) -> object:
    """A str that UTF-8 cannot encode (a lone surrogate) is stored as its surrogatepass bytes; every
    comparison uses the same rule, so lookups still match, and :func:`_row` turns it back."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "surrogatepass")
    return value


def _params(args: object) -> object:
    if isinstance(args, (tuple, list)):
        for a in args:  # the common case, all ASCII, passes through without a copy
            if isinstance(a, str) and not a.isascii():
                return tuple(_param(a) for a in args)
    return args


@functools.lru_cache(maxsize=64)
def _text_columns(description: tuple) -> tuple[bool, ...]:
    """For each column of a result: is it a text column (not one of :data:`_BLOB_COLUMNS`)?"""
    return tuple(d[0] not in _BLOB_COLUMNS for d in description)


_last_text: tuple = (None, ())
"""The description :func:`_row` saw last and its :func:`_text_columns` (held, so never reused)."""


def _row(cursor: sqlite3.Cursor, row: tuple) -> tuple:
    """Row factory: bytes read from a text column are a str stored by :func:`_param`."""
    for v in row:
        if type(v) is bytes:
            break
    else:
        return row
    global _last_text
    description = cursor.description
    last = _last_text  # one statement's rows share one description: skip hashing it per row
    text = last[1] if last[0] is description else _text_columns(description)
    _last_text = (description, text)
    for v, t in zip(row, text):
        if t and type(v) is bytes:
            break
    else:
        return row  # bytes only in blob columns (a checkpoint's body, an object's data): as they are
    try:
        return tuple(v.decode("utf-8", "surrogatepass") if type(v) is bytes and t else v for v, t in zip(row, text))
    except UnicodeDecodeError:  # not written by overnight: that cell is damage, not the whole query's
        return tuple(_decoded(v) if type(v) is bytes and t else v for v, t in zip(row, text))


class NotUTF8(bytes):
    """A text cell another client left holding bytes that are not UTF-8 (``x'ff'``, or text that
    SQLite cannot decode): kept as its bytes, so the type checks of every read (see the comment
    above :class:`DamagedText`) report the cell as damage -- naming table and column -- instead of
    one cell failing the whole query."""


def _decoded(value: bytes) -> str | bytes:
    try:
        return value.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return NotUTF8(value)


def read_cells_as_stored(conn: sqlite3.Connection) -> None:
    """Make ``conn`` read rows as the store does, for a reader of a damaged file (``repair
    --salvage``): a text cell that is not UTF-8 comes back as :class:`NotUTF8` instead of failing
    the statement, bytes stored in a text column as the text they hold."""
    conn.text_factory = _decoded
    conn.row_factory = _row


def _undecodable(exc: UnicodeDecodeError) -> sqlite3.DatabaseError:
    """The SQLite error whose *message* Python could not decode. SQLite quotes damaged file
    contents in some messages (``malformed database schema (<the damaged schema row's name>)``);
    when those bytes are not UTF-8, the sqlite3 module raises a bare UnicodeDecodeError in place of
    the error. Returned as the corruption error it is, so every caller's translation makes it
    StoreCorrupt (never a traceback)."""
    raw = exc.object if isinstance(exc.object, (bytes, bytearray)) else b""
    err = sqlite3.DatabaseError(f"database disk image is malformed: {bytes(raw).decode('utf-8', 'backslashreplace')}")
    err.sqlite_errorcode = _SQLITE_CORRUPT  # type: ignore[attr-defined]
    err.sqlite_errorname = "SQLITE_CORRUPT"  # type: ignore[attr-defined]
    return err


def _decoding(method: Any) -> Any:
    """``method`` of a cursor, raising a SQLite error whose message is not UTF-8 as the corruption
    error it is (:func:`_undecodable`) instead of a bare UnicodeDecodeError."""
    @functools.wraps(method)
    def call(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        except UnicodeDecodeError as exc:
            raise _undecodable(exc) from exc
    return call


class _Cursor(sqlite3.Cursor):
    """Raises a SQLite error whose message is not UTF-8 as the corruption error it is (:func:`_undecodable`)."""

    execute = _decoding(sqlite3.Cursor.execute)
    executemany = _decoding(sqlite3.Cursor.executemany)
    fetchone = _decoding(sqlite3.Cursor.fetchone)
    fetchmany = _decoding(sqlite3.Cursor.fetchmany)
    fetchall = _decoding(sqlite3.Cursor.fetchall)
    __next__ = _decoding(sqlite3.Cursor.__next__)


class _Connection(sqlite3.Connection):
    """Every caller string round-trips exactly, lone surrogates included (see :func:`_param`); a
    SQLite error whose message is not UTF-8 is the corruption error it is (:class:`_Cursor`)."""

    def cursor(self, factory: Any = _Cursor) -> sqlite3.Cursor:  # type: ignore[override]
        return super().cursor(factory)

    def execute(self, sql: str, parameters: object = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        return self.cursor().execute(sql, _params(parameters))

    def executemany(self, sql: str, seq: object, /) -> sqlite3.Cursor:  # type: ignore[override]
        return self.cursor().executemany(sql, [_params(p) for p in seq])  # type: ignore[union-attr]


# -- cells of the wrong type ---------------------------------------------------------------------
#
# SQLite keeps any value in any column: a TEXT column turns a number into text, an INTEGER column
# keeps text that is not a number (and a real), a BLOB column keeps anything. So another client can
# leave a cell of a type overnight never writes there (``UPDATE checkpoints SET seq='x'``), and
# nothing read from such a row may reach code that relies on the types of the store protocol
# (``bytes(row.data)`` of an integer allocates that many bytes; a text ``seq`` breaks every sort).
# A cell of the wrong type is damage, like a flipped bit: every read checks the types it returns.
# An object row that fails raises DigestMismatch naming the column (a read of it fails as a read of
# a damaged object does: healed from its ditto copy, or the load falls back); a task row read by id
# raises StoreCorrupt naming the column. A checkpoint row -- and a task row in a listing -- comes
# back with a *placeholder* in each bad cell: a value of the column's type (so listings, sorts and
# sums still work and one bad row does not hide the rest) carrying a ``damage`` attribute that
# names the cell. Verification refuses a checkpoint row holding one
# (:func:`overnight.chain.integrity.parse_record`), so the fallback machinery skips that record.

_NONE = type(None)
_TEXT: tuple[type, ...] = (str,)
_OPT_TEXT: tuple[type, ...] = (str, _NONE)
_INT: tuple[type, ...] = (int,)
_REAL: tuple[type, ...] = (float, int)
_BLOB: tuple[type, ...] = (bytes,)
_WANTED = {_TEXT: "text", _OPT_TEXT: "text or NULL", _INT: "an integer", _REAL: "a number", _BLOB: "a blob"}
_KIND = {int: "an integer", float: "a real", str: "text", bytes: "a blob", _NONE: "NULL",
         NotUTF8: "bytes that are not UTF-8"}


def _placeholder(value: object, damage: str) -> object:
    """``value`` (a str, int or bytes) as a :class:`DamagedText` / :class:`DamagedInt` /
    :class:`DamagedBytes` whose ``damage`` is ``damage``."""
    cls = DamagedText if isinstance(value, str) else DamagedInt if isinstance(value, int) else DamagedBytes
    out = cls(value)  # type: ignore[arg-type]
    out.damage = damage
    return out


def _cell(value: object) -> str:
    """A cell's SQLite type and value, shortened, for a message: ``text 'x'``, ``a real 1.5``."""
    kind = _KIND.get(type(value), type(value).__name__)
    if value is None:
        return kind
    if isinstance(value, (str, bytes)) and len(value) > 24:
        return f"{kind} of {len(value)} {'characters' if isinstance(value, str) else 'bytes'} ({value[:24]!r}...)"
    return f"{kind} {value!r}"


def _wrong_cells(table: str, columns: tuple[tuple[str, tuple[type, ...], object], ...], row: tuple) -> list[str]:
    """What is wrong with the types of ``row`` (one row of ``table``, its cells in the order of
    ``columns``: ``(name, accepted types, placeholder)``): ``["checkpoints.seq holds text 'x', not
    an integer"]``, or ``[]`` when every cell has its column's type."""
    return [f"{table}.{name} holds {_cell(v)}, not {_WANTED[types]}"
            for (name, types, _), v in zip(columns, row) if type(v) not in types]


def _typed(columns: tuple[tuple[str, tuple[type, ...], object], ...], row: tuple) -> bool:
    """Does every cell of ``row`` have its column's type (the fast path of every read)?"""
    for (_, types, _), v in zip(columns, row):
        if type(v) not in types:
            return False
    return True


def _quarantined(table: str, columns: tuple[tuple[str, tuple[type, ...], object], ...], row: tuple) -> tuple:
    """``row`` with every cell of the wrong type replaced by its column's placeholder, marked with
    what the cell held (see the comment above :class:`DamagedText`)."""
    return tuple(v if type(v) in types else _placeholder(empty, f"{table}.{name} holds {_cell(v)}, not {_WANTED[types]}")
                 for (name, types, empty), v in zip(columns, row))


_OBJECT_COLUMNS = (("digest", _TEXT, ""), ("kind", _TEXT, ""), ("size", _INT, 0), ("codec", _TEXT, ""),
                   ("data", _BLOB, b""))
_CHECKPOINT_COLUMNS = (
    ("checkpoint_id", _TEXT, ""), ("task_id", _TEXT, ""), ("parent_id", _OPT_TEXT, ""), ("branch", _TEXT, ""),
    ("seq", _INT, -1), ("created_at", _TEXT, ""), ("session", _TEXT, ""), ("event", _TEXT, ""),
    ("step", _OPT_TEXT, ""), ("body", _BLOB, b""), ("signature", _OPT_TEXT, ""), ("stored_bytes", _INT, 0),
)
"""Columns of ``checkpoints`` (``SELECT *`` order, which is :class:`CheckpointRow`'s). A bad
``seq`` reads as -1: no record has it, so it never passes for a newer checkpoint."""
_TASK_COLUMNS = (("task_id", _TEXT, ""), ("created_at", _TEXT, ""), ("goal", _TEXT, ""), ("entry", _OPT_TEXT, ""),
                 ("spec", _BLOB, b""))
_JOURNAL_COLUMNS = (("task_id", _TEXT, ""), ("checkpoint_id", _TEXT, ""), ("seq", _INT, 0), ("step_key", _TEXT, ""),
                    ("step_name", _TEXT, ""), ("session", _TEXT, ""), ("started_at", _TEXT, ""),
                    ("duration_ms", _REAL, 0), ("tokens_in", _INT, 0), ("tokens_out", _INT, 0))
_CALL_COLUMNS = (("task_id", _TEXT, ""), ("step_key", _TEXT, ""), ("seq", _INT, 0), ("request_digest", _TEXT, ""),
                 ("model", _TEXT, ""), ("response", _BLOB, b""), ("tokens_in", _INT, 0), ("tokens_out", _INT, 0),
                 ("latency_ms", _REAL, 0), ("created_at", _TEXT, ""))
_ARCHIVE_COLUMNS = (("archive_id", _TEXT, ""), ("task_id", _TEXT, ""), ("created_at", _TEXT, ""),
                    ("location", _TEXT, ""), ("manifest", _BLOB, b""))
_REF_COLUMNS = (("branch", _TEXT, ""), ("checkpoint_id", _TEXT, ""))
"""What :meth:`SQLiteStore.list_refs` selects."""
_FULL_REF_COLUMNS = (("task_id", _TEXT, ""), *_REF_COLUMNS)
"""A whole ``refs`` row (what :meth:`SQLiteStore.damaged_entries` checks)."""
_LINK_COLUMNS = (("checkpoint_id", _TEXT, ""), ("task_id", _TEXT, ""), ("parent_id", _OPT_TEXT, ""))
"""The cells of a ``checkpoints`` row that listings and lineage follow."""


def _digest_cell(value: object) -> Any:
    """An ``objects.digest`` cell as listings yield it: text, NULL and bytes (:class:`NotUTF8`, a
    blob) as they are; a number (a damaged page can leave one) as the :class:`DamagedBytes` of its
    decimal text, so whoever reports the row shows it as bytes (``bytes()`` of an integer would
    allocate that many) and no lookup by it matches a row."""
    if value is None or isinstance(value, (str, bytes)):
        return value
    return _placeholder(str(value).encode("ascii", "backslashreplace"), f"objects.digest holds {_cell(value)}, not text")


def _schema_lacks(exc: sqlite3.Error) -> bool:
    """Did a statement name a table or column the file's schema does not have?"""
    return isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(("no such table", "no such column"))


def _named(value: object) -> str:
    """A cell naming a row in a message: its text quoted, else what it holds."""
    return repr(value) if type(value) is str else f"({_cell(value)})"


def _damaged_ref(row: tuple) -> tuple:
    """A ref row with a cell of the wrong type: a sound branch name is kept, and the rest reads as
    :class:`DamagedText` whose text (and ``damage``) names the cell, so messages about the branch
    or its head say what is wrong."""
    damage = "; ".join(_wrong_cells("refs", _REF_COLUMNS, row))
    head = _placeholder(f"damaged:{damage}", damage)
    return (row[0] if type(row[0]) is str else head, head)
_LEASE_COLUMNS = (("holder_id", _TEXT, ""), ("holder", _TEXT, ""), ("token", _INT, 0), ("expires_at_ms", _INT, 0))
"""What :meth:`SQLiteStore.read_lease` selects. A lease row with a cell of the wrong type reads as
no lease (as a garbled lease record does in the key-value stores): a lease only coordinates, and
the commit's check of holder and token fences off whoever held it."""


def _schema_version(value: object) -> int | None:
    """``meta.schema_version`` as a number, or None when it is not decimal digits."""
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else None


# primary result codes (sqlite.org/rescode.html); extended codes carry them in the low byte
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = \
    3, 8, 10, 11, 13, 14, 26


def _read_only_fs(path: Path) -> bool:
    """Whether ``path`` is on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # pragma: no cover - no statvfs
        return False


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class SQLiteStore(Closing):
    """:class:`~overnight.store.base.Store` on one SQLite file.

    Args:
        path: database file; parent directories are created. ``":memory:"`` is refused (a
            checkpoint store that vanishes with the process is not a store).
        busy_timeout_ms: how long a writer waits for another process's transaction (ms).
        read_only: open without writing anything (no journal-mode switch, no migration): what
            reading commands do, so they work on a read-only file, directory or file system. In a
            read-only directory where SQLite cannot create the ``-shm`` file beside the database,
            the file is opened ``immutable`` (no writer can be changing it there). Every write
            then raises :class:`~overnight.errors.StoreReadOnly`.

    Raises:
        ConfigError: the file is not an SQLite database or cannot be opened.
        StoreReadOnly: a writable open of a file, folder or file system that refuses writes.
        StoreUnavailable: ``read_only`` and the file is missing, or reading it was denied.
        StoreVersionError: the file was created by a newer overnight.
    """

    def __init__(self, path: str | os.PathLike, *, busy_timeout_ms: int = 10_000, read_only: bool = False) -> None:
        if str(path) == ":memory:":
            raise ConfigError("sqlite store needs a file path, not ':memory:'")
        self.path = Path(path)
        self.url = f"sqlite://{self.path}"
        self.busy_timeout_ms = busy_timeout_ms
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            self._db = self._connect_read_only()
            return
        if self.path.exists():
            self._open_writable(busy_timeout_ms)
            return
        try:
            self._open_writable(busy_timeout_ms)
        except (StoreReadOnly, StoreUnavailable) as exc:
            # no store yet: what refused is the user's own folder, not a store (issue 19: exit 2)
            where = os.path.abspath(self.path)
            raise OutputNotWritable(f"cannot create or open the store at {where}: {exc.message}", path=where,
                                    reason=exc.message, hint="run in a folder you can write, or pass --store URL "
                                    "(or set OVERNIGHT_STORE) to put the store elsewhere") from exc

    def _open_writable(self, busy_timeout_ms: int) -> None:
        with refusals(str(self.path), writing=True):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # Two processes opening a new file at once can get SQLITE_BUSY at once (the switch to WAL
        # and the first schema write take locks the busy handler does not wait for): retry the
        # whole open until busy_timeout_ms has passed.
        deadline = time.monotonic() + busy_timeout_ms / 1000
        delay = 0.005
        while True:
            try:
                self._db = self._connect(busy_timeout_ms)
                return
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc):
                    raise self._unreadable(exc) from exc
                if time.monotonic() >= deadline:
                    raise StoreBusy(f"store {self.path} stayed locked for {busy_timeout_ms} ms while opening",
                                    hint="another process holds it; retry, or raise busy_timeout_ms") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except sqlite3.DatabaseError as exc:
                raise self._unreadable(exc) from exc

    def _connect(self, busy_timeout_ms: int) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                             timeout=busy_timeout_ms / 1000, factory=_Connection)
        try:
            db.row_factory = _row
            db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # takes effect only in a new, empty file
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise ConfigError(f"cannot switch {self.path} to WAL journal mode (got {mode!r})")
            db.execute("PRAGMA synchronous=FULL")
            self._db = db
            self._migrate()
            return db
        except BaseException:
            db.close()
            raise

    def _connect_read_only(self) -> sqlite3.Connection:
        """A ``mode=ro`` connection (``immutable=1`` where the ``-shm`` file cannot be created);
        checks the schema version, migrates nothing."""
        if not self.path.is_file():
            raise StoreUnavailable(f"store {self.path} does not exist", location=str(self.path),
                                   hint="run a task first, or point --store / OVERNIGHT_STORE at the store")
        uri = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
        # a file with no table at all is a store another process is creating right now (the file
        # exists before its schema commits): wait for it as for a lock, up to busy_timeout_ms
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while (opened := self._open_read_only(uri)) is None:
            if time.monotonic() >= deadline:
                raise StoreBusy(f"store {self.path} has no tables yet after {self.busy_timeout_ms} ms",
                                hint="another process is creating it, or the file is empty: check "
                                "--store / OVERNIGHT_STORE")
            time.sleep(0.05)
        db, row = opened
        if row is None or _schema_version(row[0]) is None:  # a store always has its version: damaged?
            try:
                damage = [str(r[0]) for r in db.execute("PRAGMA quick_check(20)").fetchall()]
            except sqlite3.Error as exc:
                db.close()
                raise self._unreadable(exc) from exc
            if damage != ["ok"]:
                db.close()
                raise StoreCorrupt(f"store {self.path} is damaged: {'; '.join(damage)}", hint=self._recover_hint())
            if row is not None:
                db.close()
                raise ConfigError(f"store {self.path} records schema version {row[0]!r}",
                                  hint="is it an overnight SQLite store? point --store / OVERNIGHT_STORE at the right file")
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            db.close()
            raise StoreVersionError(
                f"store {self.path} has schema version {row[0]}, written by a newer overnight "
                f"(this one knows up to {SCHEMA_VERSION})",
                hint="upgrade overnight (pip install -U overnight) to open this store")
        return db

    def _open_read_only(self, uri: str) -> tuple[sqlite3.Connection, Any] | None:
        """``(connection, schema version row)``, or None while the file has no table yet."""
        db = None
        for suffix in ("", "&immutable=1"):
            try:
                db = sqlite3.connect(uri + suffix, uri=True, isolation_level=None, check_same_thread=False,
                                     timeout=self.busy_timeout_ms / 1000, factory=_Connection)
                db.row_factory = _row
                db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
                return db, db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            except sqlite3.Error as exc:
                empty = False
                if db is not None:
                    try:
                        empty = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
                    except sqlite3.Error:
                        pass
                    db.close()
                    db = None
                if empty and self._being_created():
                    return None
                if suffix or getattr(exc, "sqlite_errorcode", 0) & 0xFF != _SQLITE_CANTOPEN:
                    raise self._unreadable(exc) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _being_created(self) -> bool:
        """An empty database that another process is creating: its WAL exists, or it was touched
        in the last few seconds (a file left empty long ago is not a store: refused at once)."""
        try:
            return (Path(f"{self.path}-wal").exists() or Path(f"{self.path}-journal").exists()
                    or time.time() - self.path.stat().st_mtime < 5)
        except OSError:
            return False

    def _recover_hint(self) -> str:
        return (f"salvage what verifies into a new file: overnight repair --salvage {self.path} "
                f"(writes {self.path.with_name(self.path.stem + '.salvaged.db')}; the damaged file is kept)")

    def _cannot_write(self) -> Exception | None:
        """StoreReadOnly when the file, its folder or its file system refuses writes, else None."""
        for target in (self.path, self.path.parent):
            if target.exists() and not os.access(target, os.W_OK):
                return StoreReadOnly(
                    f"store {self.path} is read-only ({target} is not writable"
                    f"{': a read-only file system' if _read_only_fs(target) else ' by this user'})",
                    location=str(self.path),
                    hint="reading commands (ls, show, log, status, verify, cat) still work; to write, make it "
                    "writable or copy the store somewhere writable and pass --store")
        return None

    def _unreadable(self, exc: sqlite3.Error) -> Exception:
        """A file SQLite cannot open: damaged (StoreCorrupt), full, or not a SQLite file (ConfigError)."""
        # a file without overnight's tables, met on open, is not an overnight store (ConfigError below)
        typed = exc if _schema_lacks(exc) else self._translate(exc)
        if typed is not exc and "not a database" not in str(exc):
            return typed
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_CANTOPEN:
            if not self.read_only:
                readonly = self._cannot_write()
                if readonly is not None:
                    return readonly
            return StoreUnavailable(f"cannot open store {self.path}: {exc}", location=str(self.path),
                                    hint="check that the file and its folder exist and this user may read them "
                                    f"(`ls -l {self.path}`)")
        return ConfigError(f"cannot open store {self.path}: {exc}",
                           hint="is it an overnight SQLite store? point --store / OVERNIGHT_STORE at the right file")

    # -- plumbing ---------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._write():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
                version = 1
            else:
                version = _schema_version(row[0])
                if version is None:  # as a read-only open reports it
                    damage = [str(r[0]) for r in self._db.execute("PRAGMA quick_check(20)").fetchall()]
                    if damage != ["ok"]:
                        raise StoreCorrupt(f"store {self.path} is damaged: {'; '.join(damage)}",
                                           hint=self._recover_hint())
                    raise ConfigError(f"store {self.path} records schema version {row[0]!r}",
                                      hint="is it an overnight SQLite store? point --store / OVERNIGHT_STORE at the "
                                      "right file")
            if version > SCHEMA_VERSION:
                raise StoreVersionError(
                    f"store {self.path} has schema version {row[0]}, written by a newer overnight "
                    f"(this one knows up to {SCHEMA_VERSION})",
                    hint="upgrade overnight (pip install -U overnight) to open this store",
                )
            if version < 2:
                try:
                    for statement in _migration_2(now_ms()):
                        self._db.execute(statement)
                except sqlite3.Error as exc:  # a damaged meta table makes a current store look old
                    damage = [str(r[0]) for r in self._db.execute("PRAGMA quick_check(20)").fetchall()]
                    if damage != ["ok"]:
                        raise StoreCorrupt(f"store {self.path} is damaged: {'; '.join(damage)}",
                                           hint=self._recover_hint()) from exc
                    raise
            if version < SCHEMA_VERSION:
                self._db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    def _translate(self, exc: sqlite3.Error) -> Exception:
        """The typed error for a SQLite failure (the original is chained by the caller)."""
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(exc, sqlite3.OperationalError) and _is_locked(exc):
            return StoreBusy(f"store {self.path} stayed locked by another process for {self.busy_timeout_ms} ms",
                             hint="another overnight process is writing a large commit; retry, or raise busy_timeout_ms")
        primary = (code or 0) & 0xFF
        if primary == _SQLITE_FULL or "disk is full" in str(exc):
            return StoreFull(f"store {self.path}: the disk is full ({exc}); the write in flight was rolled back, "
                             "everything committed before it is intact", location=str(self.path),
                             hint=f"free space on that file system (`df -h {self.path.parent}`), then run the "
                             "command again (`overnight resume TASK_ID` continues a run)")
        if primary in (_SQLITE_READONLY, _SQLITE_PERM) or "readonly database" in str(exc):
            return self._cannot_write() or StoreReadOnly(
                f"store {self.path} is read-only ({exc})", location=str(self.path),
                hint="reading commands (ls, show, log, status, verify, cat) still work; to write, make the file, "
                "its folder and file system writable")
        if primary == _SQLITE_IOERR:
            return StoreUnavailable(f"store {self.path}: the disk failed reading or writing it ({exc})",
                                    location=str(self.path),
                                    hint="check the disk or share (dmesg, mount), then run the command again")
        if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or "malformed" in str(exc) or "decode to UTF-8" in str(exc):
            return StoreCorrupt(f"store {self.path} is damaged: {exc}",
                                hint="resume a replicated task from another medium (`overnight repair`), or "
                                + self._recover_hint())
        if _schema_lacks(exc):
            # the store's own statements name only what its schema (checked on open) has: a damaged
            # schema page (a bit flip in a column's name) or another program changed the schema
            return StoreCorrupt(f"store {self.path} is damaged: its schema lacks what overnight wrote ({exc})",
                                hint="resume a replicated task from another medium (`overnight repair`), or "
                                + self._recover_hint())
        return exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), rolled back on error.

        Raises StoreBusy, StoreFull or StoreCorrupt for the SQLite failures they name."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc) from exc
                raise

    def _rollback(self) -> None:
        """Roll back the open transaction, if SQLite has not already (it does on a full disk, say)."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error is the one to report

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                try:
                    return self._db.execute(sql, args).fetchall()
                except sqlite3.OperationalError as exc:
                    if not str(exc).startswith("Could not decode to UTF-8"):
                        raise
                # a text cell another client left that is not UTF-8 (``CAST(x'ff' AS TEXT)``):
                # read again decoding each text cell on its own, so that cell reads as NotUTF8
                # (damage the type checks name) instead of failing the whole query; only then,
                # so valid rows keep the C decoder
                self._db.text_factory = _decoded
                try:
                    return self._db.execute(sql, args).fetchall()
                finally:
                    self._db.text_factory = str
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    # -- for tables kept beside the store's own (the queue: store/queue_sqlite.py) and salvage ----

    def transaction(self) -> ContextManager[sqlite3.Connection]:
        """One write transaction on this store's database, serialized with its commits; raises
        StoreBusy, StoreFull or StoreCorrupt as a commit does."""
        return self._write()

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        """The rows of one statement, its SQLite errors translated as every store read's are."""
        return self._read(sql, args)

    # -- objects ----------------------------------------------------------------------------

    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        wanted = list(dict.fromkeys(digests))
        present: set[str] = set()
        for i in range(0, len(wanted), _BATCH):
            part = wanted[i : i + _BATCH]
            marks = ",".join("?" * len(part))
            present.update(r[0] for r in self._read(f"SELECT digest FROM objects WHERE digest IN ({marks})", tuple(part)))
        return set(wanted) - present

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        """The stored objects among ``digests``: ``{digest: ObjectRecord}`` (a digest not stored
        is absent).

        Raises:
            DigestMismatch: a row holds a cell of the wrong type (``objects.size`` as text,
                ``objects.data`` as an integer, ...): the message names the column, and
                ``object_digest`` the object.
        """
        wanted = list(dict.fromkeys(digests))
        out: dict[str, ObjectRecord] = {}
        for i in range(0, len(wanted), _BATCH):
            part = wanted[i : i + _BATCH]
            marks = ",".join("?" * len(part))
            asked = set(part)
            for row in self._read(
                f"SELECT digest, kind, size, codec, data FROM objects WHERE digest IN ({marks})", tuple(part)
            ):
                if not _typed(_OBJECT_COLUMNS, row):
                    raise self._damaged_object(row, self._asked_for(row, part))
                if row[0] in asked:  # else a damaged index led to another row: the one asked for is missing
                    out[row[0]] = ObjectRecord(*row)
        return out

    def _asked_for(self, row: tuple, part: list[str]) -> str:
        """Which of ``part`` the damaged object ``row`` was found under. Usually its own digest; but a
        damaged page can leave the index entry of digest D pointing at a row whose digest cell now
        reads otherwise (bytes that are not UTF-8, other text): that row *is* D's, damaged, and the
        error must name D -- the digest callers heal from its ditto copy or report -- never the
        garbled cell (not text, so not a digest; :class:`NotUTF8`). Asked one digest at a time,
        only on this error path."""
        if type(row[0]) is str and row[0] in part:
            return row[0]
        for d in part:
            found = self._read("SELECT digest, kind, size, codec, data FROM objects WHERE digest=?", (d,))
            if found and (found[0][0] != d or not _typed(_OBJECT_COLUMNS, found[0])):
                return d
        return next(iter(part))  # pragma: no cover - the row came from a lookup of one of them

    def _damaged_object(self, row: tuple, d: str | None = None) -> DigestMismatch:
        """The error for an object row with a cell of the wrong type (named with its column);
        ``d``: the digest it was read under (default: its digest cell, when that is text)."""
        if d is None:
            d = row[0] if type(row[0]) is str else "(a row whose digest is not text)"
        stored = "" if type(row[0]) is str and row[0] == d else f" (the row found under it has digest cell {_cell(row[0])})"
        return DigestMismatch(
            f"object {d} in store {self.path} is damaged{stored}: "
            f"{'; '.join(_wrong_cells('objects', _OBJECT_COLUMNS, row))}",
            object_digest=d, hint="another program wrote this row; `overnight verify --all` lists what else is "
            "damaged, and a commit that stores the object again replaces the row")

    def put_objects(self, objects: Iterable[ObjectRecord]) -> None:
        objects = list(objects)
        if objects:
            with self._write() as db:
                self._insert_objects(db, objects)

    def _insert_objects(self, db: sqlite3.Connection, objects: Iterable[ObjectRecord]) -> int:
        """Insert what is not stored yet and refresh the stored time of what is; returns the
        ``data`` bytes written. A stored object with other bytes under the same digest is replaced
        only if it is damaged (:func:`is_damaged`). New objects go in one statement per
        :data:`_INSERT_ROWS` (a commit's handful: one), which names those it inserted."""
        objects = list(objects)
        added = 0
        now = now_ms()
        inserted: set[str] = set()
        for i in range(0, len(objects), _INSERT_ROWS):
            part = objects[i : i + _INSERT_ROWS]
            rows = db.execute(_insert_sql(len(part)), [v for o in part for v in (o.digest, o.kind, o.size, o.codec,
                                                                                 o.data, now)]).fetchall()
            inserted.update(r[0] for r in rows)
        for o in objects:
            if o.digest in inserted:  # this row was inserted (a digest listed twice: the first time)
                inserted.discard(o.digest)
                added += len(o.data)
                continue
            row = (o.digest, o.kind, o.size, o.codec, o.data)
            stored = db.execute("SELECT digest, kind, size, codec, data FROM objects WHERE digest=?",
                                (o.digest,)).fetchone()
            # a row with a cell of the wrong type is damaged as it stands (never read to find out)
            if not _typed(_OBJECT_COLUMNS, stored) or (tuple(stored) != row and is_damaged(self, o.digest)):
                db.execute("UPDATE objects SET kind=?, size=?, codec=?, data=?, stored_at_ms=? WHERE digest=?",
                           (o.kind, o.size, o.codec, o.data, now, o.digest))
                added += len(o.data)
            else:
                db.execute("UPDATE objects SET stored_at_ms=? WHERE digest=? AND stored_at_ms<?", (now, o.digest, now))
        return added

    def iter_object_digests(self) -> Iterator[str]:
        # a page at a time, in row order (keyset paging on the rowid, which any row has whatever its
        # digest holds -- another client's BLOB, '' or NULL): a listing of millions of objects
        # holds one page in memory, not every row
        after = 0
        while True:
            page = self._read("SELECT rowid, digest FROM objects WHERE rowid > ? ORDER BY rowid LIMIT ?",
                              (after, _PAGE))
            yield from (_digest_cell(r[1]) for r in page)
            if len(page) < _PAGE:
                return
            after = page[-1][0]

    def iter_object_stats(self) -> Iterator[ObjectStat]:
        """Every object's digest, ``data`` length and age; a stored time that is not an integer
        (another program's cell) counts as just stored, so ``gc`` keeps the object."""
        now = now_ms()
        for d, size, stored_at in self._read("SELECT digest, length(data), stored_at_ms FROM objects"):
            yield ObjectStat(_digest_cell(d), size, max(0, now - stored_at) if type(stored_at) is int else 0)

    def delete_objects(self, digests: Iterable[str], *, min_age_ms: MinAge | None = None) -> int:
        wanted = list(dict.fromkeys(digests))
        freed = 0
        for i in range(0, len(wanted), _BATCH):
            part = wanted[i : i + _BATCH]
            marks = ",".join("?" * len(part))
            with self._write() as db:  # age read and row deleted in one transaction: no commit in between
                if min_age_ms is None:
                    rows = db.execute(f"DELETE FROM objects WHERE digest IN ({marks}) RETURNING length(data)",
                                      tuple(part)).fetchall()
                else:
                    cutoff = now_ms() - age_limit(min_age_ms)  # asked now that the lock is held
                    rows = db.execute(f"DELETE FROM objects WHERE digest IN ({marks}) AND stored_at_ms <= ? "
                                      "RETURNING length(data)", (*part, cutoff)).fetchall()
            freed += sum(r[0] for r in rows)
        return freed

    # -- checkpoints and refs ---------------------------------------------------------------

    def commit(self, commit: Commit) -> int:
        cp = commit.checkpoint
        with self._write() as db:
            if commit.lease is not None:
                self._check_lease(db, commit.lease)
            self._cas_ref(db, cp.task_id, cp.branch, cp.checkpoint_id, commit.expected_head)
            if commit.task is not None:
                t = commit.task
                db.execute(
                    "INSERT OR IGNORE INTO tasks VALUES (?,?,?,?,?)", (t.task_id, t.created_at, t.goal, t.entry, t.spec)
                )
            added = len(cp.body) + self._insert_objects(db, commit.objects)
            values = (cp.checkpoint_id, cp.task_id, cp.parent_id, cp.branch, cp.seq, cp.created_at, cp.session,
                      cp.event, cp.step, cp.body, cp.signature, added)
            # one statement for the common case: insert if the parent is there, a checkpoint of the
            # same task (checked in detail below otherwise)
            if db.execute("INSERT OR IGNORE INTO checkpoints SELECT ?,?,?,?,?,?,?,?,?,?,?,? WHERE ?3 IS NULL OR "
                          "EXISTS (SELECT 1 FROM checkpoints WHERE checkpoint_id=?3 AND task_id=?2)",
                          values).rowcount == 0:
                self._insert_checkpoint_slow(db, cp, values)
            if commit.journal:
                db.executemany(
                    "INSERT OR IGNORE INTO journal VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [(j.task_id, j.checkpoint_id, j.seq, j.step_key, j.step_name, j.session, j.started_at,
                      j.duration_ms, j.tokens_in, j.tokens_out) for j in commit.journal],
                )
        return added

    @staticmethod
    def _insert_checkpoint_slow(db: sqlite3.Connection, cp: CheckpointRow, values: tuple) -> None:
        """The checkpoint row was not inserted: its parent is gone (ParentGone) or of another task
        (SchemaError), or a row with its id is stored -- kept if intact (the commit is a repeat),
        replaced if damaged (its body does not hash to its id, or a cell has the wrong type)."""
        if cp.parent_id is not None:
            parent = db.execute("SELECT task_id FROM checkpoints WHERE checkpoint_id=?", (cp.parent_id,)).fetchone()
            check_parent(cp, parent[0] if parent is not None else None)
        stored = db.execute("SELECT * FROM checkpoints WHERE checkpoint_id=?", (cp.checkpoint_id,)).fetchone()
        if stored is None:  # OR IGNORE skipped another constraint (a NULL where none may be): raise it
            db.execute("INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values)
        elif not _typed(_CHECKPOINT_COLUMNS, stored) or (
                stored[9] != cp.body and digest.sha256(stored[9]) != cp.checkpoint_id):
            # a damaged copy of this record (a cell of the wrong type, or a body that does not hash
            # to its id): replace it
            db.execute("DELETE FROM checkpoints WHERE checkpoint_id=?", (cp.checkpoint_id,))
            db.execute("INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", values)

    @staticmethod
    def _cas_ref(db: sqlite3.Connection, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        """Move ``task_id/branch`` from ``expected`` to ``new`` (None deletes), or raise StaleHead."""
        if expected is not None:
            if new is None:
                cur = db.execute("DELETE FROM refs WHERE task_id=? AND branch=? AND checkpoint_id=?",
                                 (task_id, branch, expected))
            else:
                cur = db.execute("UPDATE refs SET checkpoint_id=?, updated_at_ms=? WHERE task_id=? AND branch=? "
                                 "AND checkpoint_id=?", (new, now_ms(), task_id, branch, expected))
            if cur.rowcount == 1:
                return
        elif new is not None:
            cur = db.execute("INSERT OR IGNORE INTO refs VALUES (?,?,?,?)", (task_id, branch, new, now_ms()))
            if cur.rowcount == 1:
                return
        row = db.execute("SELECT checkpoint_id FROM refs WHERE task_id=? AND branch=?", (task_id, branch)).fetchone()
        current = row[0] if row else None
        if current == expected:  # only for new=None, expected=None: nothing to do
            return
        raise stale_head(task_id, branch, expected, current)

    @staticmethod
    def _row(row: tuple) -> CheckpointRow:
        """A ``SELECT *`` row of ``checkpoints``; a cell of the wrong type comes back as a placeholder
        that verification refuses (see :class:`DamagedText`), so the record is skipped, not loaded."""
        if not _typed(_CHECKPOINT_COLUMNS, row):
            row = _quarantined("checkpoints", _CHECKPOINT_COLUMNS, row)
        return CheckpointRow(*row)

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        """The stored row of ``checkpoint_id``. A cell of the wrong type comes back as a placeholder
        carrying what the cell held (:class:`DamagedText`, :class:`DamagedInt`,
        :class:`DamagedBytes`), which :func:`~overnight.chain.integrity.parse_record` refuses with
        a SchemaError naming the column: the record fails verification (a load falls back past
        it) instead of this read failing for every caller.

        Raises:
            CheckpointNotFound: no row with that id.
        """
        rows = self._read("SELECT * FROM checkpoints WHERE checkpoint_id=?", (checkpoint_id,))
        if not rows:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id} in {self.url}", checkpoint_id=checkpoint_id)
        return self._row(rows[0])

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        """Every checkpoint row of ``task_id`` by ``seq``; a row with a cell of the wrong type is
        listed with placeholders, as :meth:`get_checkpoint` returns it."""
        rows = self._read("SELECT * FROM checkpoints WHERE task_id=? ORDER BY seq, created_at, checkpoint_id", (task_id,))
        return [self._row(r) for r in rows]

    def checkpoints_after(self, task_id: str, branch: str, seq: int) -> list[CheckpointRow]:
        rows = self._read("SELECT * FROM checkpoints WHERE task_id=? AND seq>? AND branch=? "
                          "ORDER BY seq, created_at, checkpoint_id", (task_id, seq, branch))
        return [self._row(r) for r in rows]

    def get_ref(self, task_id: str, branch: str) -> str | None:
        """The head, or None; a cell of the wrong type reads as the :class:`DamagedText` of
        :meth:`list_refs` (no checkpoint has that id: the load falls back, ``verify`` reports it)."""
        rows = self._read("SELECT checkpoint_id FROM refs WHERE task_id=? AND branch=?", (task_id, branch))
        if rows and type(rows[0][0]) is not str:
            return _damaged_ref((branch, rows[0][0]))[1]
        return rows[0][0] if rows else None

    def list_refs(self, task_id: str) -> dict[str, str]:
        """A ref row with a cell of the wrong type (not UTF-8, say) names, as branch and as head,
        a :class:`DamagedText` saying which cell held what: no checkpoint has that id, so the
        branch reads as one whose head is missing (``verify`` reports it, loads fall back)."""
        rows = self._read("SELECT branch, checkpoint_id FROM refs WHERE task_id=? ORDER BY branch", (task_id,))
        return dict(r if _typed(_REF_COLUMNS, r) else _damaged_ref(r) for r in rows)

    def set_ref(self, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        with self._write() as db:
            self._cas_ref(db, task_id, branch, new, expected)

    def put_checkpoints(self, rows: Iterable[CheckpointRow], journal: Iterable[JournalRow] = ()) -> None:
        rows, journal = list(rows), list(journal)
        if not rows and not journal:
            return
        with self._write() as db:
            db.executemany(
                "INSERT OR IGNORE INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [(cp.checkpoint_id, cp.task_id, cp.parent_id, cp.branch, cp.seq, cp.created_at, cp.session, cp.event,
                  cp.step, cp.body, cp.signature, cp.stored_bytes) for cp in rows])
            db.executemany(
                "INSERT OR IGNORE INTO journal VALUES (?,?,?,?,?,?,?,?,?,?)",
                [(j.task_id, j.checkpoint_id, j.seq, j.step_key, j.step_name, j.session, j.started_at,
                  j.duration_ms, j.tokens_in, j.tokens_out) for j in journal])

    def delete_checkpoints(self, checkpoint_ids: Iterable[str], *, orphans: bool = False) -> int:
        wanted = list(dict.fromkeys(checkpoint_ids))
        if not wanted:
            return 0
        with self._write() as db:  # the guards and the deletes see one state: no commit in between
            db.execute("CREATE TEMP TABLE IF NOT EXISTS doomed (checkpoint_id TEXT PRIMARY KEY)")
            db.execute("DELETE FROM doomed")
            db.executemany("INSERT OR IGNORE INTO doomed VALUES (?)", [(c,) for c in wanted])
            db.execute("DELETE FROM doomed WHERE checkpoint_id IN (SELECT checkpoint_id FROM refs)")
            if not orphans:
                # a parent of a survivor stays; repeat, since keeping it may keep its own parent
                while db.execute(
                        "DELETE FROM doomed WHERE EXISTS (SELECT 1 FROM checkpoints c WHERE c.parent_id = "
                        "doomed.checkpoint_id AND c.checkpoint_id NOT IN (SELECT checkpoint_id FROM doomed))"
                ).rowcount:
                    pass
            freed = db.execute("SELECT coalesce(sum(length(body)), 0) FROM checkpoints WHERE checkpoint_id IN "
                               "(SELECT checkpoint_id FROM doomed)").fetchone()[0]
            db.execute("DELETE FROM journal WHERE checkpoint_id IN (SELECT checkpoint_id FROM doomed)")
            db.execute("DELETE FROM checkpoints WHERE checkpoint_id IN (SELECT checkpoint_id FROM doomed)")
            db.execute("DELETE FROM doomed")
        return int(freed)

    def delete_task(self, task_id: str) -> None:
        with self._write() as db:
            for table in ("refs", "leases", "journal", "calls", "checkpoints", "archives", "tasks"):
                db.execute(f"DELETE FROM {table} WHERE task_id=?", (task_id,))

    # -- tasks and journal ------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRow:
        """The row of ``task_id``.

        Raises:
            TaskNotFound: no such task.
            StoreCorrupt: its row holds a cell of the wrong type (the message names the column), or
                it has branches but no row while a row of ``tasks`` holds a NULL ``task_id``.
        """
        rows = self._read("SELECT task_id, created_at, goal, entry, spec FROM tasks WHERE task_id=?", (task_id,))
        if not rows:
            if self._read("SELECT 1 FROM refs WHERE task_id=? LIMIT 1", (task_id,)) \
                    and self._read("SELECT 1 FROM tasks WHERE task_id IS NULL LIMIT 1"):
                # its branches are here and a row lost its id: that row is most likely this task's
                raise StoreCorrupt(f"store {self.path}: task {task_id!r} has branches but no task row, and a row of "
                                   "the tasks table is damaged: tasks.task_id holds NULL, not text", task_id=task_id,
                                   hint="another program wrote that row; resume a replicated task from another medium "
                                   "(`overnight repair`), or " + self._recover_hint())
            raise TaskNotFound(f"no task {task_id!r} in {self.url}", task_id=task_id, hint="`overnight ls` lists the tasks")
        r = rows[0]
        if not _typed(_TASK_COLUMNS, r):
            raise StoreCorrupt(f"store {self.path}: the row of task {task_id!r} is damaged: "
                               f"{'; '.join(_wrong_cells('tasks', _TASK_COLUMNS, r))}", task_id=task_id,
                               hint="another program wrote this row; resume a replicated task from another medium "
                               "(`overnight repair`), or " + self._recover_hint())
        return TaskRow(*r)

    def list_tasks(self) -> list[TaskRow]:
        """Every task row, oldest first. A row with a cell of the wrong type (``tasks.spec`` as
        text, a NULL ``task_id``) is listed with placeholders (empty, of the column's type, marked
        as :meth:`get_checkpoint` marks them) rather than ending the listing of every task; reading
        that task by id (:meth:`get_task`) raises StoreCorrupt naming the column."""
        rows = self._read("SELECT task_id, created_at, goal, entry, spec FROM tasks ORDER BY created_at, task_id")
        return [TaskRow(*(r if _typed(_TASK_COLUMNS, r) else _quarantined("tasks", _TASK_COLUMNS, r))) for r in rows]

    def journal(self, task_id: str) -> list[JournalRow]:
        """The task's journal rows by ``seq``. A row with a cell of the wrong type is left out: the
        journal only indexes the checkpoints (which are the truth, and verified)."""
        rows = self._read("SELECT * FROM journal WHERE task_id=? ORDER BY seq", (task_id,))
        return [JournalRow(*r) for r in rows if _typed(_JOURNAL_COLUMNS, r)]

    # -- call journal -----------------------------------------------------------------------

    def record_call(self, call: CallRecord) -> None:
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO calls VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (call.task_id, call.step_key, call.seq, call.request_digest, call.model, call.response,
                        call.tokens_in, call.tokens_out, call.latency_ms, call.created_at))

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        """The task's recorded model calls (of ``step_key`` only, if given), oldest first; a row
        with a cell of the wrong type is left out (that call is made again, not replayed)."""
        if step_key is None:
            rows = self._read("SELECT * FROM calls WHERE task_id=? ORDER BY created_at, seq", (task_id,))
        else:
            rows = self._read("SELECT * FROM calls WHERE task_id=? AND step_key=? ORDER BY created_at, seq",
                              (task_id, step_key))
        # a row with a cell of the wrong type is left out: its step calls the model again rather
        # than replay a response nothing can vouch for
        return [CallRecord(*r) for r in rows if _typed(_CALL_COLUMNS, r)]

    # -- archives ---------------------------------------------------------------------------

    def put_archive(self, row: ArchiveRow) -> None:
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO archives VALUES (?,?,?,?,?)",
                       (row.task_id, row.archive_id, row.created_at, row.location, row.manifest))

    def list_archives(self, task_id: str | None = None) -> list[ArchiveRow]:
        """The archive catalog (of ``task_id`` only, if given), oldest first. A row with a cell of
        the wrong type is listed with placeholders (its manifest empty, so reading it fails its
        archive id as a damaged manifest does)."""
        cols = "archive_id, task_id, created_at, location, manifest"
        if task_id is None:
            rows = self._read(f"SELECT {cols} FROM archives ORDER BY created_at, archive_id")
        else:
            rows = self._read(f"SELECT {cols} FROM archives WHERE task_id=? ORDER BY created_at, archive_id", (task_id,))
        return [ArchiveRow(*(r if _typed(_ARCHIVE_COLUMNS, r) else _quarantined("archives", _ARCHIVE_COLUMNS, r)))
                for r in rows]

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM archives WHERE task_id=? AND archive_id=?", (task_id, archive_id))

    # -- leases -----------------------------------------------------------------------------

    def _check_lease(self, db: sqlite3.Connection, lease: Lease) -> None:
        row = db.execute(
            "SELECT holder_id, token, holder FROM leases WHERE task_id=? AND branch=?", (lease.task_id, lease.branch)
        ).fetchone()
        if row is None or row[0] != lease.holder_id or row[1] != lease.token:
            who = describe_holder(row[2]) if row else "nobody"
            raise LeaseLost(
                f"lease on branch {lease.branch!r} was taken over (now held by {who})",
                task_id=lease.task_id,
                hint="this process stalled past its lease TTL; the other holder continues the task",
            )

    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        """Take the lease of ``task_id``/``branch`` for ``ttl_ms`` with the next fencing token; a
        lease row with a cell of the wrong type counts as no lease (see :data:`_LEASE_COLUMNS`).

        Raises:
            TaskBusy: another live holder has it.
        """
        with self._write() as db:
            now = now_ms()
            row = db.execute(
                "SELECT holder_id, holder, token, expires_at_ms FROM leases WHERE task_id=? AND branch=?",
                (task_id, branch),
            ).fetchone()
            if row is not None and not _typed(_LEASE_COLUMNS, row):  # garbled: no lease (see _LEASE_COLUMNS)
                row = (None, None, row[2] if type(row[2]) is int else 0, None)
            if row is not None and row[0] is not None and row[0] != holder_id \
                    and not can_take_over(row[1], row[3], now):
                raise TaskBusy(
                    f"task {task_id!r} is busy (held by {describe_holder(row[1])}, "
                    f"lease expires in {(row[3] - now) / 1000:.0f} s)",
                    task_id=task_id,
                    holder=describe_holder(row[1]),
                    hint="wait for that run to finish, or stop it (Ctrl-C / kill) and resume",
                )
            token = next_token(task_id, branch, row[2]) if row is not None else 1
            db.execute(
                "INSERT INTO leases VALUES (?,?,?,?,?,?) ON CONFLICT (task_id, branch) DO UPDATE SET "
                "holder_id=excluded.holder_id, holder=excluded.holder, token=excluded.token, "
                "expires_at_ms=excluded.expires_at_ms",
                (task_id, branch, holder_id, holder, token, now + ttl_ms),
            )
        return Lease(task_id, branch, holder_id, holder, token, now + ttl_ms)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        with self._write() as db:
            self._check_lease(db, lease)
            expires = now_ms() + ttl_ms
            db.execute(
                "UPDATE leases SET expires_at_ms=? WHERE task_id=? AND branch=?", (expires, lease.task_id, lease.branch)
            )
        return Lease(lease.task_id, lease.branch, lease.holder_id, lease.holder, lease.token, expires)

    def read_lease(self, task_id: str, branch: str) -> Lease | None:
        """The lease row of ``task_id``/``branch``, or None -- also when a cell of it has the wrong
        type (see :data:`_LEASE_COLUMNS`)."""
        rows = self.query("SELECT holder_id, holder, token, expires_at_ms FROM leases WHERE task_id=? AND branch=?",
                          (task_id, branch))
        return Lease(task_id, branch, *rows[0]) if rows and _typed(_LEASE_COLUMNS, rows[0]) else None

    def release_lease(self, lease: Lease, outcome: str | None = None) -> None:
        # the row stays, expired and without a holder, so the next token is still one higher
        with self._write() as db:
            db.execute(
                "UPDATE leases SET holder_id='', holder=?, expires_at_ms=0 "
                "WHERE task_id=? AND branch=? AND holder_id=? AND token=?",
                (released_holder(outcome), lease.task_id, lease.branch, lease.holder_id, lease.token),
            )

    def clock_ms(self) -> int:
        """Now, in Unix ms, by this machine's clock: an SQLite store is written from one host."""
        return now_ms()

    # -- housekeeping -----------------------------------------------------------------------

    def damaged_entries(self) -> list[str]:
        """Rows whose references cannot be read, one line each naming the row (``[]`` when there
        is none): a ``refs`` row with a cell of the wrong type (bytes that are not UTF-8, say --
        :meth:`list_refs` lists its head as a placeholder no checkpoint has, or, when the damaged
        cell is ``task_id``, its task shows no such branch at all), a ``tasks`` row whose
        ``task_id`` is not text (its task's refs and checkpoints are listed under no task), a
        ``checkpoints`` row whose ``checkpoint_id``, ``task_id`` or ``parent_id`` is of the wrong
        type (the lineage through it is cut, or the row is listed under no task).

        Each may keep checkpoints alive that no listing shows -- a branch head, the ancestors of a
        record, every checkpoint of a task --, and so the objects those need: ``gc`` deletes
        nothing while there is one (:func:`overnight.ops.gc._refuse_hidden_damage`, the rule the
        key-value stores' :meth:`~overnight.store.keyed.KeyedStore.damaged_entries` feed too);
        ``verify --all`` reports each as the damaged ref, task or checkpoint row it is. Reads every
        ref and task row and three cells of every checkpoint row."""
        found = [line for _, line in self._damaged_refs()]
        for (task_id,) in self._read("SELECT task_id FROM tasks"):
            if type(task_id) is not str:
                found.append(f"a tasks row in store {self.path} cannot be read: tasks.task_id holds {_cell(task_id)}, "
                             "not text; its task is not listed, nor its branches and checkpoints")
        # every row: a cell that is not UTF-8 is still of SQLite type text, so no WHERE finds it
        for row in self._read("SELECT checkpoint_id, task_id, parent_id FROM checkpoints"):
            if not _typed(_LINK_COLUMNS, row):
                found.append(f"the checkpoints row {_named(row[0])} of task {_named(row[1])} in store {self.path} "
                             f"cannot be read: {'; '.join(_wrong_cells('checkpoints', _LINK_COLUMNS, row))}; the "
                             "lineage through it is cut")
        return found

    def _damaged_refs(self) -> list[tuple[tuple, str]]:
        """``(row, line)`` of each ``refs`` row with a cell of the wrong type (see :meth:`damaged_entries`)."""
        out = []
        for row in self._read("SELECT task_id, branch, checkpoint_id FROM refs"):
            if not _typed(_FULL_REF_COLUMNS, row):
                out.append((row, f"the ref row of task {_named(row[0])}, branch {_named(row[1])} in store {self.path} "
                                 f"cannot be read: {'; '.join(_wrong_cells('refs', _FULL_REF_COLUMNS, row))}; the "
                                 "checkpoints it keeps alive are unknown"))
        return out

    def check_medium(self) -> list[str]:
        """SQLite's own check of the file (``PRAGMA quick_check``: pages, b-trees, free lists --
        the level below overnight's records), run by ``overnight verify --all``, and the ``refs``
        rows whose ``task_id`` cannot be read (they belong to no task, so no check of a task finds
        them; :meth:`damaged_entries`). Returns what is wrong, ``[]`` when the file is sound."""
        try:
            rows = self._read("PRAGMA quick_check(100)")
        except StoreCorrupt as exc:
            return [exc.message]
        found = [str(r[0]) for r in rows if str(r[0]) != "ok"]
        out = [f"SQLite file {self.path}: {line}" for line in found]
        try:  # a ref row whose task_id is damaged belongs to no task, so no check of a task reports it
            out += [line for row, line in self._damaged_refs() if type(row[0]) is not str]
        except StoreCorrupt as exc:
            out.append(exc.message)
        return out

    def stored_bytes(self) -> int:
        """Size of the database file after folding the WAL into it (``wal_checkpoint(TRUNCATE)``)."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.OperationalError:
                pass  # a reader holds the WAL open: the figure below then includes the log
        total = 0
        for suffix in ("", "-wal"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                total += p.stat().st_size
        return total

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"
