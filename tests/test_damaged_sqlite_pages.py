"""A SQLite file damaged below overnight's rows -- bytes overwritten in its pages, as a bad disk
or a stray write leaves it -- is damage the reading commands report (StoreCorrupt / DigestMismatch,
exit 3, or a fallback or heal, exit 0), never a traceback; and ``gc`` deletes nothing while a row
that keeps checkpoints alive (a ref, a task, a checkpoint's lineage cells) cannot be read.

* a page write can leave the index entry of object D pointing at a row whose digest cell is no
  longer text (bytes that are not UTF-8): the row is D's, damaged -- the error names D, and D is
  healed from its ditto copy (the error named the garbled cell, and healing it crashed);
* a damaged ``sqlite_master`` row makes SQLite's own message hold bytes that are not UTF-8
  (``malformed database schema (\\xff...)``): the sqlite3 module raised a bare UnicodeDecodeError;
* a damaged schema row can rename a column (``no such column: size``);
* an ``objects.digest`` cell holding an integer made ``verify --all`` allocate that many bytes;
* a ref row with a cell that is not UTF-8 listed as a placeholder head: ``gc --apply`` took every
  checkpoint and object of its task.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from test_tampered_cells import JOB  # the same three-step task

from overnight.chain.ditto import HealingReader, ditto_key
from overnight.chain.read import load_head
from overnight.errors import DigestMismatch
from overnight.store.sqlite import NotUTF8, SQLiteStore


STORE = "sqlite://store.db"
READING = (["ls"], ["show", "job"], ["log", "job"], ["status", "job"], ["verify", "--all"])


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    env["COLUMNS"] = "400"
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A project whose store holds task ``job`` complete (init, a, b, c), its WAL folded in."""
    base = tmp_path_factory.mktemp("pages") / "pristine"
    base.mkdir()
    (base / "job.py").write_text(JOB)
    r = cli("run", "job.py", "--store", STORE, cwd=base)
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(base / "store.db") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return base


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "project"
    dst.mkdir()
    for name in ("job.py", "store.db"):
        shutil.copy(src / name, dst / name)
    return dst


def _counts(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        return (db.execute("SELECT count(*) FROM checkpoints").fetchone()[0],
                db.execute("SELECT count(*) FROM objects").fetchone()[0])


def _state_digest(path: Path) -> str:
    import json

    with sqlite3.connect(path) as db:
        (cid,) = db.execute("SELECT checkpoint_id FROM refs WHERE task_id='job' AND branch='main'").fetchone()
        (body,) = db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (cid,)).fetchone()
    return json.loads(body)["state"]["digest"]


def _no_traceback(r: subprocess.CompletedProcess, what: str) -> None:
    assert "Traceback" not in r.stderr, f"{what}: exit {r.returncode}\n{r.stderr}"


class _Garbled:
    """What SQLite returned for the reported file: the lookup of ``wanted`` (a damaged index page)
    yields a row whose digest cell is not UTF-8 (the rest of the row as stored)."""

    def __init__(self, store: SQLiteStore, wanted: str) -> None:
        self.store, self.wanted, self.real = store, wanted, store._read

    def __call__(self, sql: str, args: tuple = ()) -> list[tuple]:
        rows = self.real(sql, args)
        if sql.startswith("SELECT digest, kind, size, codec, data FROM objects") and self.wanted in args:
            return [(NotUTF8(b"sha256\xff" + self.wanted[7:].encode()[:40]), *r[1:]) if r[0] == self.wanted else r
                    for r in rows]
        return rows


def test_a_row_whose_digest_cell_is_not_utf8_found_under_a_digest_is_that_digest_damaged(pristine, tmp_path):
    """The error names the digest asked for (what a reader heals from its ditto copy or reports),
    never the garbled cell (bytes, not a digest)."""
    project = _copy(pristine, tmp_path)
    state = _state_digest(project / "store.db")
    store = SQLiteStore(str(project / "store.db"), read_only=True)
    try:
        store._read = _Garbled(store, state)  # type: ignore[method-assign]
        with pytest.raises(DigestMismatch) as err:
            store.get_objects(["sha256:" + "0" * 64, state])
        assert err.value.object_digest == state
        assert "not UTF-8" in err.value.message
    finally:
        store.close()


def test_a_heal_of_a_row_whose_digest_cell_is_not_utf8_reads_the_copy(pristine, tmp_path):
    """The user's report: loading the head healed the object through its ditto copy with the
    garbled cell as the digest (``'NotUTF8' object has no attribute 'encode'`` in ``ditto_key``)."""
    project = _copy(pristine, tmp_path)
    state = _state_digest(project / "store.db")
    store = SQLiteStore(str(project / "store.db"), read_only=True)
    try:
        store._read = _Garbled(store, state)  # type: ignore[method-assign]
        loaded, fallback = load_head(store, "job", "main")
        assert fallback is None and [h.digest for h in loaded.healed] == [state]
        reader = HealingReader(store)
        assert reader.get(state, "the test") and [h.digest for h in reader.healed] == [state]
    finally:
        store.close()


def test_a_damage_error_naming_no_digest_is_not_healed():
    """Whatever a store puts in ``object_digest``, healing only ever looks up a digest (text)."""

    class Store:
        def get_objects(self, digests):
            raise DigestMismatch("row damaged", object_digest=NotUTF8(b"sha256\xff"))

    with pytest.raises(DigestMismatch, match="row damaged"):
        HealingReader(Store()).get("sha256:" + "1" * 64, "the test")  # type: ignore[arg-type]
    assert ditto_key(NotUTF8(b"\xff")).startswith("sha256:")  # a copy key for any cell: none is stored


def _every_reading_command_is_typed(project: Path) -> dict[str, subprocess.CompletedProcess]:
    out = {}
    for args in READING:
        r = cli(*args, "--store", STORE, cwd=project)
        _no_traceback(r, " ".join(args))
        assert r.returncode in (0, 3), f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        out[args[0]] = r
    return out


@pytest.mark.slow  # five CLI processes per pattern
@pytest.mark.parametrize(("offset", "length", "byte", "first_page", "stride"), [
    (100, 40, 0xFF, 2, 1),  # the reported pattern
    (300, 40, 0xFF, 2, 1),
    (3000, 40, 0xFF, 2, 1),
    (100, 40, 0x00, 2, 1),
    (1000, 200, 0x00, 1, 2),
    (3000, 8, 0xFF, 1, 3),
    (1179, 100, 0xFF, 1, 7),
], ids=lambda v: str(v))
def test_bytes_overwritten_in_pages_are_damage_not_a_crash(pristine, tmp_path, offset, length, byte, first_page, stride):
    project = _copy(pristine, tmp_path)
    path = project / "store.db"
    data = bytearray(path.read_bytes())
    for page in range(first_page, len(data) // 4096, stride):
        at = page * 4096 + offset
        data[at : at + length] = bytes([byte]) * length
    path.write_bytes(bytes(data))
    _every_reading_command_is_typed(project)


def test_a_schema_row_whose_name_is_not_utf8_is_store_corrupt(pristine, tmp_path):
    """SQLite quotes the damaged name in its message; the sqlite3 module failed decoding it."""
    project = _copy(pristine, tmp_path)
    path = project / "store.db"
    data = bytearray(path.read_bytes())
    at = data.find(b"tablecheckpointscheckpoints")
    assert at >= 0
    data[at + 5 : at + 16] = b"\xff" * 11
    path.write_bytes(bytes(data))
    for args in READING:
        r = cli(*args, "--store", STORE, cwd=project)
        _no_traceback(r, " ".join(args))
        assert r.returncode == 3 and "is damaged" in r.stderr, f"{args}: {r.stderr}"


def test_a_column_renamed_by_schema_damage_is_store_corrupt(pristine, tmp_path):
    project = _copy(pristine, tmp_path)
    path = project / "store.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA writable_schema=ON")
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name='objects'").fetchone()
        db.execute("UPDATE sqlite_master SET sql=? WHERE name='objects'", (sql.replace("size ", "sizf "),))
    for args in READING:
        r = cli(*args, "--store", STORE, cwd=project)
        _no_traceback(r, " ".join(args))
        assert r.returncode in (0, 3), f"{args}: exit {r.returncode}\n{r.stderr}"
    r = cli("status", "job", "--store", STORE, cwd=project)
    assert r.returncode == 3 and "schema" in r.stderr, r.stderr


def test_an_integer_digest_cell_is_reported_not_allocated(pristine, tmp_path):
    """``bytes()`` of the integer allocated that many bytes (MemoryError)."""
    project = _copy(pristine, tmp_path)
    path = project / "store.db"
    with sqlite3.connect(path) as db:
        (d,) = db.execute("SELECT digest FROM objects ORDER BY digest LIMIT 1").fetchone()
        db.execute("PRAGMA writable_schema=ON")
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name='objects'").fetchone()
        db.execute("UPDATE sqlite_master SET sql=? WHERE name='objects'",
                   (sql.replace("digest TEXT PRIMARY KEY", "digest PRIMARY KEY"),))
    with sqlite3.connect(path) as db:  # no TEXT affinity now: the integer stays an integer
        assert db.execute("UPDATE objects SET digest=9223372036854775807 WHERE digest=?", (d,)).rowcount == 1
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA writable_schema=ON")
        db.execute("UPDATE sqlite_master SET sql=? WHERE name='objects'", (sql,))
    r = cli("verify", "--all", "--store", STORE, cwd=project)
    _no_traceback(r, "verify --all")
    assert r.returncode == 3 and "not text" in r.stdout, r.stdout


# -- gc ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "named"), [
    ("UPDATE refs SET checkpoint_id = CAST(x'ff00' AS TEXT)", "refs.checkpoint_id"),
    ("UPDATE refs SET task_id = CAST(x'ff' AS TEXT)", "refs.task_id"),
    ("UPDATE refs SET branch = CAST(x'c3' AS TEXT)", "refs.branch"),
    ("UPDATE tasks SET task_id = CAST(x'ff00' AS TEXT)", "tasks.task_id"),
    ("UPDATE checkpoints SET parent_id = CAST(x'ff' AS TEXT) WHERE seq=2", "checkpoints.parent_id"),
], ids=["ref-head", "ref-task", "ref-branch", "task-id", "parent-id"])
def test_gc_deletes_nothing_while_a_row_that_keeps_checkpoints_alive_cannot_be_read(pristine, tmp_path, sql, named):
    """The ref's head listed as a placeholder no checkpoint has (or the ref, or the task, listed
    under no task; or the lineage cut): ``gc --apply --grace 0`` deleted the task's checkpoints and
    every object. gc refuses as on file:// (``_refuse_hidden_damage``), naming the row."""
    project = _copy(pristine, tmp_path)
    path = project / "store.db"
    before = _counts(path)
    with sqlite3.connect(path) as db:
        assert db.execute(sql).rowcount == 1
    for apply in ([], ["--apply"]):
        r = cli("gc", *apply, "--grace", "0", "--store", STORE, cwd=project)
        _no_traceback(r, "gc")
        assert r.returncode == 3 and "gc deletes nothing" in r.stderr and named in r.stderr, r.stdout + r.stderr
    assert _counts(path) == before


def test_gc_of_a_sound_store_still_runs(pristine, tmp_path):
    project = _copy(pristine, tmp_path)
    before = _counts(project / "store.db")
    r = cli("gc", "--apply", "--grace", "0", "--store", STORE, cwd=project)
    assert r.returncode == 0, r.stderr
    assert _counts(project / "store.db") == before  # nothing dangling in a complete task
    assert cli("verify", "job", "--store", STORE, cwd=project).returncode == 0
