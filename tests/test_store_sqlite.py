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


# -- damage below the record level: typed errors, nothing committed lost ------------------------

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from _tasks import plan_task  # noqa: E402

import overnight  # noqa: E402
from overnight import api  # noqa: E402
from overnight.errors import StoreCorrupt, StoreFull  # noqa: E402


def _work(ctx, i):
    ctx.write_artifact(f"part-{i}.bin", os.urandom(20_000))  # incompressible: pages fill up
    return i


def _task(n: int = 6) -> overnight.Task:
    return plan_task("damage", n, _work, goal="g")


def test_a_full_disk_is_store_full_and_loses_nothing_committed(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    overnight.run(_task(), url, max_steps=3)
    with SQLiteStore(tmp_path / "s.db") as store:
        head = store.get_ref("damage", "main")
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count={pages + 2}")  # SQLite's own SQLITE_FULL, as on a full disk
        with pytest.raises(StoreFull) as err:
            overnight.run(_task(), store)
        assert "rolled back" in err.value.message and err.value.hint
        assert store.get_ref("damage", "main") == head
    result = overnight.run(_task(), url)  # space again (a new connection has no page cap): it continues
    assert result.status == "complete" and result.steps_run == 4


def _flip_page(path, page_no: int) -> None:
    with open(path, "r+b") as f:
        page = 4096
        f.seek(page * (page_no - 1) + 8)
        f.write(os.urandom(256))


def test_a_damaged_database_file_is_store_corrupt_and_verify_reports_it(tmp_path):
    db = tmp_path / "s.db"
    overnight.run(_task(), f"sqlite://{db}")
    with SQLiteStore(db) as store:
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        assert store.check_medium() == []
    for p in range(2, pages + 1):  # damage every b-tree page but the first: whatever is read fails
        _flip_page(db, p)
    proc = subprocess.run([sys.executable, "-m", "overnight", "verify", "--all", "--json", "--store", f"sqlite://{db}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    if proc.stdout.strip():
        report = json.loads(proc.stdout)
        assert any(p["check"] == "medium" for p in report["problems"])
    else:
        assert "is damaged" in proc.stderr
    with pytest.raises(StoreCorrupt) as err:
        with SQLiteStore(db) as store:
            store.list_checkpoints("damage")
            overnight.run(_task(), store)
    assert "overnight repair --salvage" in err.value.hint


def test_verify_reports_an_edited_index_column(tmp_path):
    db = tmp_path / "s.db"
    overnight.run(_task(2), f"sqlite://{db}")
    conn = sqlite3.connect(db)
    conn.execute("UPDATE checkpoints SET step='not what ran' WHERE seq=2")
    conn.commit()
    conn.close()
    report = api.verify(store=f"sqlite://{db}")
    assert not report.ok
    (problem,) = [p for p in report.problems if p.check == "index"]
    assert "step column" in problem.detail


def test_a_text_column_that_is_not_utf8_is_damage_of_its_row_not_a_raw_sqlite_error(tmp_path):
    """Bytes that are not UTF-8 where SQLite promises text damage their row (named by table and
    column), not the whole store: ``verify --all`` reports it, ``ls`` still lists, no traceback."""
    db = tmp_path / "s.db"
    overnight.run(_task(), f"sqlite://{db}")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE checkpoints SET created_at = CAST(x'32303236ff' AS TEXT)")
    checked = subprocess.run([sys.executable, "-m", "overnight", "verify", "--all", "--store", f"sqlite://{db}"],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 3 and "not UTF-8" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    listed = subprocess.run([sys.executable, "-m", "overnight", "ls", "--store", f"sqlite://{db}"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode in (0, 3) and "Traceback" not in checked.stderr + listed.stderr, listed.stderr


def test_a_blob_that_is_not_utf8_in_a_text_column_is_damage_of_its_row(tmp_path):
    db = tmp_path / "s.db"
    overnight.run(_task(), f"sqlite://{db}")
    with sqlite3.connect(db) as conn:  # a BLOB where overnight keeps text (a lease's holder)
        assert conn.execute("UPDATE leases SET holder = x'fffe00'").rowcount
    proc = subprocess.run([sys.executable, "-m", "overnight", "ls", "--store", f"sqlite://{db}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "damage" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr


def test_an_object_digest_that_is_not_utf8_is_reported_by_verify_all(tmp_path):
    """An object row whose digest another client set to bytes that are not text is one problem of
    ``verify --all`` (exit 3), not a traceback (found by the randomized salvage test)."""
    db = tmp_path / "s.db"
    overnight.run(_task(), f"sqlite://{db}")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE objects SET digest = CAST(x'736861ff' AS TEXT) WHERE rowid = (SELECT MAX(rowid) FROM objects)")
    checked = subprocess.run([sys.executable, "-m", "overnight", "verify", "--all", "--store", f"sqlite://{db}"],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 3 and "Traceback" not in checked.stderr, checked.stderr
    assert "a digest that is not text" in checked.stdout + checked.stderr, checked.stdout


def test_a_reader_waits_for_a_store_another_process_is_creating(tmp_path):
    """The file of a new store exists before its schema commits: a reading command that opens it
    in that moment (``overnight ls`` / the dashboard polling while ``overnight run`` starts) waits
    for the schema as for a lock instead of calling it "not an overnight store"; an empty file
    left long ago is refused at once."""
    import threading
    import time

    from overnight.errors import ConfigError
    from overnight.store.sqlite import SQLiteStore

    path = tmp_path / "new.db"
    path.write_bytes(b"")  # created a moment ago, schema not committed yet
    creator = threading.Timer(0.3, lambda: SQLiteStore(path).close())
    creator.start()
    try:
        reader = SQLiteStore(path, read_only=True)
        assert reader.list_tasks() == []
        reader.close()
    finally:
        creator.join()

    stale = tmp_path / "stale.db"
    stale.write_bytes(b"")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    started = time.monotonic()
    with pytest.raises(ConfigError):
        SQLiteStore(stale, read_only=True)
    assert time.monotonic() - started < 2


def test_a_listing_of_every_object_ends_and_names_each_row_once_whatever_its_digest_holds(tmp_path, monkeypatch):
    """Rows written by another SQLite client may hold a digest of another type (a BLOB sorts after
    every TEXT) or an empty one; the listing pages on the rowid, so it still ends, and names every
    row once -- ``verify --all`` then reports what it cannot verify."""
    import overnight.store.sqlite as sq
    from overnight.store.base import ObjectRecord

    monkeypatch.setattr(sq, "_PAGE", 3)
    path = tmp_path / "s.db"
    with SQLiteStore(path) as s:
        datas = [f"object {i}".encode() for i in range(7)]
        s.put_objects(ObjectRecord(digest.sha256(d), "blob", len(d), "none", d) for d in datas)
    with sqlite3.connect(path) as db:
        for d in (b"sha256:" + b"b" * 64, ""):  # a BLOB digest; an empty one
            db.execute("INSERT INTO objects (digest, kind, size, codec, data, stored_at_ms) VALUES (?, 'blob', 1, "
                       "'none', x'00', 0)", (d,))
    with SQLiteStore(path) as s:
        listed = list(s.iter_object_digests())
    assert len(listed) == 9 and len(set(listed)) == 9
    assert {digest.sha256(d) for d in datas} | {"", "sha256:" + "b" * 64} == set(listed)


def test_verify_all_reports_an_object_row_without_a_digest(tmp_path):
    """A row another SQLite client wrote with a NULL digest (SQLite allows it in a TEXT primary
    key): ``verify --all`` names it as a problem instead of failing or passing over it."""
    from overnight.verify.fsck import verify_store

    path = tmp_path / "s.db"
    overnight.run(plan_task("t", 3, lambda ctx, i: i), f"sqlite://{path}", handle_signals=False)
    with SQLiteStore(path) as s:
        assert verify_store(s, all_objects=True).ok
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO objects (digest, kind, size, codec, data, stored_at_ms) "
                   "VALUES (NULL, 'blob', 1, 'none', x'00', 0)")
    with SQLiteStore(path) as s:
        report = verify_store(s, all_objects=True)
    assert not report.ok and any("no digest" in p.detail for p in report.problems), report.problems


def test_verify_all_reports_an_object_row_with_a_non_ascii_digest(tmp_path):
    """Another client's row whose digest is not ASCII (a bidi control among its characters) fails
    verification by name; the check does not crash on it."""
    from overnight.verify.fsck import verify_store

    path = tmp_path / "s.db"
    overnight.run(plan_task("t", 3, lambda ctx, i: i), f"sqlite://{path}", handle_signals=False)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO objects (digest, kind, size, codec, data, stored_at_ms) "
                   "VALUES (?, 'blob', 1, 'none', x'00', 0)", ("sha256:\u00e9\u202e",))
    with SQLiteStore(path) as s:
        report = verify_store(s, all_objects=True)
    assert not report.ok and [p.object for p in report.problems] == ["sha256:\u00e9\u202e"], report.problems
