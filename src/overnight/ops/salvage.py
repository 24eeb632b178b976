"""Salvage the rows SQLite can still read from a damaged store file into a new one.

``sqlite3 FILE .recover`` is the usual answer, but the sqlite3 shell shipped with some systems
(3.40 on Debian 12) fails on a damaged overnight store and leaves an empty file. This module does
it with the ``sqlite3`` module alone, table by table:

* rowid tables (``objects``, ``tasks``, ``checkpoints``, ``calls``): every rowid from 1 to past
  the largest found is looked up on its own (``WHERE rowid = ?``), so a damaged page costs the
  rows on it and nothing else; a lookup that errors is skipped;
* ``WITHOUT ROWID`` tables (``refs``, ``journal``, ``archives``; ``leases`` are not copied -- a
  lease of a dead file holds nothing): scanned forwards and backwards by primary key, keeping the
  rows read before each error;
* everything copied goes into a fresh store created by :class:`~overnight.store.sqlite.SQLiteStore`
  (the current schema), with ``INSERT OR IGNORE``; the damaged file is never written.

Nothing here decides what the rows are worth: a salvaged row is as untrusted as any stored row, and
every load verifies it (digests, signatures, chains). :func:`overnight.api.salvage` runs
``verify`` on the result and re-points a ref whose checkpoint did not survive.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from overnight.errors import ConfigError, StoreCorrupt
from overnight.store.sqlite import NotUTF8, read_cells_as_stored

_ROWID_TABLES = ("objects", "tasks", "checkpoints", "calls")
_KEYED_TABLES = {"refs": ("task_id", "branch"), "journal": ("checkpoint_id", "step_key"),
                 "archives": ("task_id", "archive_id")}
_GAP = 4096  # rowids looked up past the largest one found before giving up on a table


@dataclass
class SalvageCopy:
    """What :func:`copy_rows` read: ``rows[table]`` copied, ``errors[table]`` lookups or scans that
    failed (each may have cost one row or a page of them)."""

    source: str
    target: str
    rows: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


def _columns(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> list[str]:
    """The columns both files have (an old source may lack a newer column, which keeps its default)."""
    try:
        theirs = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        theirs = []
    ours = [r[1] for r in dst.execute(f"PRAGMA table_info({table})")]
    return [c for c in ours if c in theirs]


def _rowid_rows(src: sqlite3.Connection, table: str, cols: list[str], out: SalvageCopy) -> list[tuple]:
    found: list[tuple] = []
    select = f"SELECT {', '.join(cols)} FROM {table} WHERE rowid = ?"
    try:
        top = src.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        top = 0
    rowid, last_seen, failed = 1, top, []
    while rowid <= last_seen + _GAP:
        try:
            row = src.execute(select, (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            failed.append(rowid)
            row = None
        if row is not None:
            found.append(row)
            last_seen = max(last_seen, rowid)
        rowid += 1
    lost = sum(1 for r in failed if r <= last_seen)  # failures past the last row read are probing, not loss
    if lost:
        out.errors[table] = out.errors.get(table, 0) + lost
    return found


def _keyed_rows(src: sqlite3.Connection, table: str, cols: list[str], out: SalvageCopy) -> list[tuple]:
    found: dict[tuple, tuple] = {}
    key = _KEYED_TABLES[table]
    positions = [cols.index(k) for k in key]
    for order in ("ASC", "DESC"):
        try:
            cursor = src.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY "
                                 + ", ".join(f"{k} {order}" for k in key))
            for row in cursor:
                found[tuple(row[i] for i in positions)] = row
        except sqlite3.DatabaseError:
            out.errors[table] = out.errors.get(table, 0) + 1
    return list(found.values())


def copy_rows(source: Path, target: Path) -> SalvageCopy:
    """Copy every row SQLite can read from ``source`` into a new store at ``target``.

    Raises:
        ConfigError: ``target`` exists already (salvage never overwrites), or ``source`` is missing.
        StoreCorrupt: not even the table list of ``source`` can be read (its first page is gone).
    """
    from overnight.store.sqlite import SQLiteStore

    if not source.is_file():
        raise ConfigError(f"{source} does not exist", hint="name the damaged SQLite store file")
    if target.exists():
        raise ConfigError(f"{target} exists already; salvage writes a new file and never overwrites one",
                          hint="move it away, or pass another --into")
    src = sqlite3.connect("file:" + urllib.parse.quote(str(source.resolve())) + "?mode=ro&immutable=1", uri=True)
    # tolerate a schema naming root pages past the end of a truncated file (SQLite otherwise
    # refuses the whole schema as malformed); nothing is written: the connection is read-only
    src.execute("PRAGMA writable_schema=ON")
    # a text cell that is not UTF-8 (another client's ``x'ff'``) reads as NotUTF8 instead of
    # failing the lookup or the scan, and its row is left behind (below): copied, it would be as
    # damaged in the new file
    read_cells_as_stored(src)
    out = SalvageCopy(str(source), str(target))
    try:
        try:
            tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise StoreCorrupt(f"{source}: even the list of tables is unreadable ({exc}); nothing can be salvaged "
                               "with SQLite", hint="restore the file from a backup or a replica "
                               "(`overnight repair` for a replicated task)") from exc
        store = SQLiteStore(target)
        try:
            with store.transaction() as dst:
                for table in (*_ROWID_TABLES, *_KEYED_TABLES):
                    if table not in tables:
                        continue
                    cols = _columns(src, dst, table)
                    if not cols:
                        continue
                    rows = (_rowid_rows if table in _ROWID_TABLES else _keyed_rows)(src, table, cols, out)
                    marks = ", ".join("?" * len(cols))
                    for row in rows:
                        if any(type(v) is NotUTF8 for v in row):
                            out.errors[table] = out.errors.get(table, 0) + 1
                            continue
                        try:
                            dst.execute(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) VALUES ({marks})", row)
                        except sqlite3.Error:  # a garbled value in a typed column: that row is lost
                            out.errors[table] = out.errors.get(table, 0) + 1
                            continue
                    out.rows[table] = len(rows)
        finally:
            store.close()
    finally:
        src.close()
    return out
