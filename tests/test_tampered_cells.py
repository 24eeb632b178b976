"""Cells another SQLite client left with the wrong type are damage, never a crash.

SQLite keeps any value in any column: ``UPDATE checkpoints SET seq='x'`` or ``UPDATE objects SET
data=9223372036854775807`` succeed. Each such cell -- one at a time, as an attacker's single-cell
fuzzer writes them -- must give a typed error naming the table and column, and the existing
fallback machinery must skip the damaged record: ``status``, ``show``, ``log``, ``verify``, ``cat``
and ``resume`` of the task, and ``ls`` of the whole store, exit with overnight's own codes and no
traceback; a load falls back to the newest checkpoint that verifies; ``ls`` still lists the task.
A stored ``size`` far beyond any object is refused before anything that large is allocated.

Real SQLite files, damaged with :mod:`sqlite3`; real CLI processes (``python -m overnight``).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from overnight.chain.ditto import ditto_key
from overnight.codec.compress import decompress
from overnight.codec.digest import sha256 as digest_of
from overnight.errors import DecodeError

KEY = "tampered-cells-signing-key"

JOB = '''\
import overnight
task = overnight.Task("job", goal="three steps", level="session", deps=[])

def _work(ctx, name):
    ctx.write_text(f"{name}.txt", f"{name}\\n" * 50)
    ctx.state[name] = len(ctx.state)

@task.step
def a(ctx):
    _work(ctx, "a")

@task.step
def b(ctx):
    _work(ctx, "b")

@task.step
def c(ctx):
    _work(ctx, "c")
'''


def cli(*args: str, cwd: Path, key: str | None = None, memory: int | None = None) -> subprocess.CompletedProcess:
    """``python -m overnight ARGS`` in ``cwd``; ``memory``: its address-space limit in bytes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    env["COLUMNS"] = "400"
    if key is not None:
        env["OVERNIGHT_SIGNING_KEY"] = key

    def limit() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180, preexec_fn=limit)


def _made(base: Path, key: str | None) -> Path:
    base.mkdir()
    (base / "job.py").write_text(JOB)
    r = cli("run", "job.py", "--store", "sqlite://store.db", cwd=base, key=key)
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(base / "store.db") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return base


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A project whose store holds task ``job`` complete: init, a, b, c (unsigned)."""
    return _made(tmp_path_factory.mktemp("tampered") / "pristine", None)


@pytest.fixture(scope="module")
def pristine_signed(tmp_path_factory) -> Path:
    """The same task, every record signed with :data:`KEY`."""
    return _made(tmp_path_factory.mktemp("tampered") / "signed", KEY)


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "project"
    dst.mkdir()
    for name in ("job.py", "store.db"):
        shutil.copy(src / name, dst / name)
    return dst


def _head(db: sqlite3.Connection) -> tuple[str, str]:
    """``(head checkpoint id, digest of its state document)``."""
    (cid,) = db.execute("SELECT checkpoint_id FROM refs WHERE task_id='job' AND branch='main'").fetchone()
    (body,) = db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (cid,)).fetchone()
    return cid, json.loads(body)["state"]["digest"]


def _no_traceback(r: subprocess.CompletedProcess, what: str) -> None:
    assert "Traceback" not in r.stderr, f"{what}: exit {r.returncode}\n{r.stderr}"


def _falls_back(project: Path, head: str, named: str) -> None:
    """Every reading command: typed, no traceback; the damaged head is skipped, naming ``named``
    (``table.column``); ``ls`` lists the task; ``resume`` continues from the fallback."""
    store = "sqlite://store.db"
    ls = cli("ls", "--store", store, cwd=project)
    _no_traceback(ls, "ls")
    assert ls.returncode == 0 and "job" in ls.stdout and "FELL BACK" in ls.stdout, ls.stdout
    status = cli("status", "job", "--store", store, cwd=project)
    _no_traceback(status, "status")
    assert status.returncode == 0, status.stderr
    assert f"fell back from {head[7:19]}" in status.stdout and f"{named} holds" in status.stdout, status.stdout
    for args in (["show", "job"], ["log", "job"], ["cat", "job", "a.txt"]):
        r = cli(*args, "--store", store, cwd=project)
        _no_traceback(r, args[0])
        assert r.returncode == 0, f"{args}: {r.stderr}"
    verify = cli("verify", "job", "--store", store, cwd=project)
    _no_traceback(verify, "verify")
    assert verify.returncode == 3 and named in verify.stdout + verify.stderr, verify.stdout + verify.stderr
    resume = cli("resume", "job", "--store", store, cwd=project)
    _no_traceback(resume, "resume")
    assert resume.returncode == 0, resume.stderr
    after = cli("status", "job", "--store", store, cwd=project)
    assert after.returncode == 0 and "complete" in after.stdout and "fell back" not in after.stdout, after.stdout


# -- checkpoint rows ------------------------------------------------------------------------------


@pytest.mark.slow  # real CLI processes, eight per cell
@pytest.mark.parametrize(("column", "value"), [
    ("seq", "'x'"), ("seq", "1.5"), ("seq", "x'07'"),
    ("body", "'abc'"), ("body", "-1"), ("body", "9223372036854775807"), ("body", "1.5"),
    ("stored_bytes", "'x'"),
], ids=lambda v: str(v))
def test_a_checkpoint_cell_of_the_wrong_type_is_skipped_and_the_load_falls_back(pristine, tmp_path, column, value):
    project = _copy(pristine, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        head, _ = _head(db)
        # the record's ditto copy goes too: a body read from it would heal the head instead
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),))
        assert db.execute(f"UPDATE checkpoints SET {column}={value} WHERE checkpoint_id=?", (head,)).rowcount == 1
    _falls_back(project, head, f"checkpoints.{column}")


# -- object rows ----------------------------------------------------------------------------------


@pytest.mark.slow  # real CLI processes, eight per cell
@pytest.mark.parametrize(("column", "value"), [
    ("size", "'x'"), ("size", "1.5"),
    ("data", "'abc'"), ("data", "-1"), ("data", "9223372036854775807"), ("data", "1.5"),
], ids=lambda v: str(v))
def test_an_object_cell_of_the_wrong_type_is_damage_and_the_load_falls_back(pristine, tmp_path, column, value):
    """The head's state document: ``bytes()`` of an integer ``data`` allocated that many bytes
    (9223372036854775807: MemoryError), a text ``size`` broke the size comparison."""
    project = _copy(pristine, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        head, state = _head(db)
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(state),))  # no copy to heal it from
        assert db.execute(f"UPDATE objects SET {column}={value} WHERE digest=?", (state,)).rowcount == 1
    _falls_back(project, head, f"objects.{column}")


@pytest.mark.parametrize("value", ["-1", "9223372036854775807", "'abc'"])
def test_a_damaged_object_row_with_a_sound_copy_is_healed_and_a_write_replaces_it(pristine, tmp_path, value):
    """With its ditto copy the damaged state document serves reads from the copy; ``resume``
    (a writable open) rewrites the original, whose stored row it compares without ``bytes()``."""
    project = _copy(pristine, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        head, state = _head(db)
        (original,) = db.execute("SELECT data FROM objects WHERE digest=?", (state,)).fetchone()
        db.execute(f"UPDATE objects SET data={value} WHERE digest=?", (state,))
    status = cli("status", "job", "--store", "sqlite://store.db", cwd=project)
    _no_traceback(status, "status")
    assert status.returncode == 0 and "complete" in status.stdout and "fell back" not in status.stdout, status.stdout
    resume = cli("resume", "job", "--store", "sqlite://store.db", cwd=project)
    _no_traceback(resume, "resume")
    assert resume.returncode == 0, resume.stderr
    with sqlite3.connect(project / "store.db") as db:
        assert db.execute("SELECT data FROM objects WHERE digest=?", (state,)).fetchone() == (original,)
    assert cli("verify", "job", "--store", "sqlite://store.db", cwd=project).returncode == 0


def _writes_big(task_id: str, content: bytes):
    import overnight

    task = overnight.Task(task_id, goal="one large artifact", level="session", deps=[])

    @task.step
    def write(ctx):
        ctx.write_artifact("big.bin", content)

    return task


@pytest.mark.parametrize(("column", "value"), [
    ("size", "'x'"), ("size", "1.5"), ("data", "-1"), ("data", "'abc'"), ("data", "9223372036854775807"),
    ("kind", "7"),
], ids=lambda v: str(v))
def test_a_commit_reusing_an_object_whose_cell_has_the_wrong_type_heals_it(tmp_path, column, value):
    """A writer looks up the chunks of a large new blob before staging them (``BlobWriter._sound``);
    a stored chunk whose row has a cell of the wrong type reads as a damaged object (DigestMismatch
    from ``get_objects``), so it is staged again -- the commit succeeds and replaces the row -- and
    the intact chunks of the same lookup are still reused."""
    import random

    import overnight
    from overnight import api
    from overnight.store.blobs import BlobReader
    from overnight.store.sqlite import SQLiteStore

    url = f"sqlite://{tmp_path / 'store.db'}"
    content = random.Random(7).randbytes(1_000_000)
    assert overnight.run(_writes_big("one", content), url, handle_signals=False).status == "complete"
    with SQLiteStore(tmp_path / "store.db") as store:
        parts = BlobReader(store).reachable(digest_of(content))
    chunk = parts[-1]
    with sqlite3.connect(tmp_path / "store.db") as db:
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(chunk),))
        (original,) = db.execute("SELECT data FROM objects WHERE digest=?", (chunk,)).fetchone()
        assert db.execute(f"UPDATE objects SET {column}={value} WHERE digest=?", (chunk,)).rowcount == 1
    assert not api.verify(store=url, all_objects=True).ok

    # another task commits the same content: the lookup meets the damaged chunk
    assert overnight.run(_writes_big("two", content), url, handle_signals=False).status == "complete"
    with sqlite3.connect(tmp_path / "store.db") as db:
        assert db.execute("SELECT kind, size, data FROM objects WHERE digest=?", (chunk,)).fetchone()[2] == original
    report = api.verify(store=url, all_objects=True)
    assert report.ok and not report.problems, report.problems
    with SQLiteStore(tmp_path / "store.db") as store:
        assert BlobReader(store).get(digest_of(content)) == content


# -- task rows ------------------------------------------------------------------------------------


@pytest.mark.slow  # real CLI processes, six per cell
@pytest.mark.parametrize(("column", "value", "held"), [
    ("spec", "'abc'", "text"), ("spec", "-1", "an integer"), ("spec", "9223372036854775807", "an integer"),
    ("spec", "1.5", "a real"), ("task_id", "NULL", "NULL"),
], ids=lambda v: str(v))
def test_a_task_cell_of_the_wrong_type_is_a_typed_error_and_ls_still_lists_the_store(
        pristine, tmp_path, column, value, held):
    project = _copy(pristine, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        assert db.execute(f"UPDATE tasks SET {column}={value}").rowcount == 1
    ls = cli("ls", "--store", "sqlite://store.db", cwd=project)
    _no_traceback(ls, "ls")
    assert ls.returncode == 0 and "three steps" in ls.stdout, ls.stdout
    for args in (["status", "job"], ["show", "job"], ["log", "job"], ["verify", "job"], ["cat", "job", "a.txt"]):
        r = cli(*args, "--store", "sqlite://store.db", cwd=project)
        _no_traceback(r, args[0])
        assert r.returncode == 3 and f"tasks.{column} holds {held}" in r.stderr, f"{args}: {r.stderr}"


@pytest.mark.parametrize(("column", "value", "held"), [
    ("spec", "'abc'", "text"), ("spec", "-1", "an integer"), ("spec", "1.5", "a real"), ("task_id", "NULL", "NULL"),
], ids=lambda v: str(v))
def test_verify_all_reports_a_task_cell_of_the_wrong_type_as_verify_task_does(
        pristine, tmp_path, column, value, held):
    """``verify job`` refuses the row (StoreCorrupt naming the cell); ``verify --all`` -- which
    lists the tasks, and gets this row with placeholders -- reports the same cell and exits 3.
    (The text columns turn a number into text, and a blob there is read as text: only ``spec``
    and a NULL ``task_id`` can hold another type.)"""
    project = _copy(pristine, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        assert db.execute(f"UPDATE tasks SET {column}={value}").rowcount == 1
    every = cli("verify", "--all", "--store", "sqlite://store.db", cwd=project)
    _no_traceback(every, "verify --all")
    assert every.returncode == 3 and f"tasks.{column} holds {held}" in every.stdout, every.stdout + every.stderr
    as_json = cli("verify", "--all", "--json", "--store", "sqlite://store.db", cwd=project)
    assert as_json.returncode == 3
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert [p["check"] for p in report["problems"]] == ["task"]
    assert f"tasks.{column} holds {held}" in report["problems"][0]["detail"]


# -- signatures -----------------------------------------------------------------------------------


@pytest.mark.slow  # real CLI processes
def test_a_non_ascii_signature_is_a_signature_error_not_a_crash(pristine_signed, tmp_path):
    """``hmac.compare_digest`` refuses to compare non-ASCII text (TypeError): such a signature is
    forged, so the record is skipped as any forged one is -- the head alone, or every record."""
    project = _copy(pristine_signed, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        head, _ = _head(db)
        db.execute("UPDATE checkpoints SET signature='\u00e9\u00e9\u00e9' WHERE checkpoint_id=?", (head,))
    status = cli("status", "job", "--store", "sqlite://store.db", cwd=project, key=KEY)
    _no_traceback(status, "status")
    assert status.returncode == 0 and f"fell back from {head[7:19]}" in status.stdout, status.stdout
    assert "SignatureError" in status.stdout, status.stdout
    resume = cli("resume", "job", "--store", "sqlite://store.db", cwd=project, key=KEY)
    _no_traceback(resume, "resume")
    assert resume.returncode == 0, resume.stderr

    with sqlite3.connect(project / "store.db") as db:  # every record: nothing verifies
        db.execute("UPDATE checkpoints SET signature='\u00e9\u00e9\u00e9'")
    for args in (["status", "job"], ["verify", "job"], ["resume", "job"]):
        r = cli(*args, "--store", "sqlite://store.db", cwd=project, key=KEY)
        _no_traceback(r, args[0])
        assert r.returncode == 3 and "SignatureError" in r.stdout + r.stderr, f"{args}: {r.stdout}{r.stderr}"
    ls = cli("ls", "--store", "sqlite://store.db", cwd=project, key=KEY)
    _no_traceback(ls, "ls")
    assert ls.returncode == 0 and "invalid" in ls.stdout, ls.stdout


# -- decompression bounds -------------------------------------------------------------------------


@pytest.mark.slow  # real CLI processes
def test_a_size_claim_beyond_any_object_is_refused_before_it_is_allocated(pristine, tmp_path):
    """The state document's object: a small zstd frame that does not state its content size, and
    a stored ``size`` of 1.5 GB. ``status`` under a 1 GiB address-space limit refuses the object as
    damaged and falls back, instead of reserving 1.5 GB for the output (MemoryError)."""
    project = _copy(pristine, tmp_path)
    with sqlite3.connect(project / "store.db") as db:
        head, state = _head(db)
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(state),))
        codec, data, size = db.execute("SELECT codec, data, size FROM objects WHERE digest=?", (state,)).fetchone()
        payload = decompress(codec, data, size)
        frame = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
        db.execute("UPDATE objects SET codec='zstd', data=?, size=1500000000 WHERE digest=?", (frame, state))
    status = cli("status", "job", "--store", "sqlite://store.db", cwd=project, memory=1 << 30)
    _no_traceback(status, "status")
    assert status.returncode == 0 and f"fell back from {head[7:19]}" in status.stdout, status.stdout
    assert "1500000000" in status.stdout, status.stdout


_FRAME = zstandard.ZstdCompressor().compress(b"x" * 100)


@pytest.mark.parametrize(("codec", "data", "size"), [
    ("zstd", _FRAME, "100"), ("zstd", _FRAME, 100.0), ("zstd", "abc", 3), ("zstd", 7, 3), ("none", -1, 0),
    ("none", "abc", 3),
], ids=["size-text", "size-real", "zstd-data-text", "zstd-data-int", "data-int", "data-text"])
def test_decompress_refuses_a_size_or_data_of_the_wrong_type_with_a_decode_error(codec, data, size):
    """What another store backend hands over unchecked is refused by the codec itself, typed."""
    with pytest.raises(DecodeError):
        decompress(codec, data, size)


# -- text cells that are not UTF-8 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory) -> Path:
    """A store holding tasks ``job`` and ``other``, both complete."""
    base = _made(tmp_path_factory.mktemp("tampered") / "two", None)
    (base / "other.py").write_text(JOB.replace('Task("job"', 'Task("other"').replace("three steps", "other goal"))
    assert cli("run", "other.py", "--store", "sqlite://store.db", cwd=base).returncode == 0
    with sqlite3.connect(base / "store.db") as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return base


@pytest.mark.slow  # real CLI processes
@pytest.mark.parametrize("sql", [
    "UPDATE tasks SET goal=x'ff' WHERE task_id='job'",
    "UPDATE tasks SET goal=CAST(x'ff' AS TEXT) WHERE task_id='job'",
    "UPDATE refs SET checkpoint_id=x'ff' WHERE task_id='job'",
    "UPDATE refs SET branch=x'ff' WHERE task_id='job'",
    "UPDATE checkpoints SET step=x'ff' WHERE checkpoint_id=(SELECT checkpoint_id FROM refs WHERE task_id='job')",
], ids=["tasks.goal", "tasks.goal-text", "refs.checkpoint_id", "refs.branch", "checkpoints.step"])
def test_a_text_cell_that_is_not_utf8_is_damage_of_that_row_not_of_the_store(two_tasks, tmp_path, sql):
    """Decoding one cell failed the whole query ("store is damaged: Could not decode to UTF-8"):
    ``ls``, ``verify --all`` and ``repair --salvage`` exited 3 for the store, and the salvaged copy
    failed the same way. Now the cell is damage of its row, named by table and column."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("job.py", "other.py", "store.db"):
        shutil.copy(two_tasks / name, project / name)
    with sqlite3.connect(project / "store.db") as db:
        assert db.execute(sql).rowcount == 1
    store = "sqlite://store.db"
    ls = cli("ls", "--store", store, cwd=project)
    _no_traceback(ls, "ls")
    assert ls.returncode == 0 and "other goal" in ls.stdout and "job" in ls.stdout, ls.stdout + ls.stderr
    every = cli("verify", "--all", "--store", store, cwd=project)
    _no_traceback(every, "verify --all")
    assert every.returncode == 3 and "other: main ok" in every.stdout, every.stdout + every.stderr
    assert "not UTF-8" in every.stdout or "refs." in every.stdout, every.stdout
    resume = cli("resume", "other", "--store", store, cwd=project)
    _no_traceback(resume, "resume")
    assert resume.returncode == 0, resume.stderr
    salvage = cli("repair", "--salvage", "store.db", cwd=project)
    _no_traceback(salvage, "repair --salvage")
    assert salvage.returncode == 0, salvage.stdout + salvage.stderr
    salvaged = cli("verify", "--all", "--store", "sqlite://store.salvaged.db", cwd=project)
    assert salvaged.returncode == 0 and "other: main ok" in salvaged.stdout, salvaged.stdout + salvaged.stderr
