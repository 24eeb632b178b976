"""SQLite backend specifics: schema versions and the upgrade from schema 1."""

from __future__ import annotations

import sqlite3

import pytest

from overnight.codec import digest
from overnight.errors import StoreVersionError
from overnight.store.base import ArchiveRow
from overnight.store.sqlite import _SCHEMA, SCHEMA_VERSION, SQLiteStore


def test_a_schema_1_store_is_upgraded_when_opened(tmp_path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA)  # the schema 1 tables, as the first release created them
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    data = b"written by schema 1"
    db.execute("INSERT INTO objects VALUES (?,?,?,?,?)", (digest.sha256(data), "blob", len(data), "none", data))
    db.commit()
    db.close()
    with SQLiteStore(path) as store:
        (stat,) = list(store.iter_object_stats())
        assert stat.digest == digest.sha256(data) and stat.age_ms < 60_000  # dated at the migration
        store.put_archive(ArchiveRow("sha256:" + "1" * 64, "t", "2026", "file:///c", b"m"))
        assert len(store.list_archives("t")) == 1
        assert store.delete_objects([stat.digest], min_age_ms=600_000) == 0
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION) == "2"
    assert {r[1] for r in db.execute("PRAGMA table_info(objects)")} >= {"stored_at_ms"}
    db.close()
    SQLiteStore(path).close()  # opening again: nothing to do


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreVersionError, match="schema version 3"):
        SQLiteStore(path)
