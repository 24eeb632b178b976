"""Round 35 of the fresh-user fixes: ``verify`` no longer prints ``main ok`` next to a "problems"
table for a damaged original that its verified ditto copy serves -- the branch line says the copy
serves it, the original is listed apart as healable, and the exit stays 3 until ``verify --repair``
rewrites it; a resume that read it from the copy names that command. Real ``python -m overnight``
processes on a real SQLite store; nothing mocked."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from _procs import cli
from _report_project import ok, report_project


def _damage_head_record(db_path: Path, task_id: str) -> str:
    """Flip one byte of ``task_id``'s head record body in place (its ditto copy stays)."""
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        head = db.execute("SELECT checkpoint_id FROM refs WHERE task_id=? AND branch='main'", (task_id,)).fetchone()[0]
        body = bytes(db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0])
        db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (body[:-1] + bytes([body[-1] ^ 1]), head))
    finally:
        db.close()
    return head


def test_verify_lists_a_record_its_ditto_copy_serves_apart_from_problems(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "2", "--store", url)
    head = _damage_head_record(Path(url.removeprefix("sqlite://")), "r")

    checked = cli("verify", "r", "--store", url, cwd=tmp_path)
    assert checked.returncode == 3, checked.stdout + checked.stderr  # the store still holds damage
    out = checked.stdout
    assert "r: main ok (1 damaged original(s) served by their ditto copies, below)" in out, out
    assert "problems" not in out, out  # no "problems" table: nothing is lost
    assert "1 damaged original(s) whose verified ditto copy serves every read" in out, out
    assert f"record {head[7:19]} is damaged" in out and out.rstrip().endswith("branches ok"), out

    resumed = cli("resume", "r", "--store", url, "--max-steps", "1", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (f"healed record {head[7:19]} from its ditto copy (body does not match its digest; original left as is: "
            "`overnight verify --repair` rewrites it)") in resumed.stderr, resumed.stderr

    repaired = cli("verify", "r", "--repair", "--store", url, cwd=tmp_path)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    again = cli("verify", "r", "--store", url, cwd=tmp_path)
    assert again.returncode == 0 and "served by" not in again.stdout and again.stdout.rstrip().endswith("ok"), \
        again.stdout


def test_verify_still_tables_what_no_ditto_copy_heals(tmp_path: Path) -> None:
    """A damaged head record whose copy is gone is a problem (the branch falls back), as before."""
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "2", "--store", url)
    db_path = Path(url.removeprefix("sqlite://"))
    head = _damage_head_record(db_path, "r")
    from overnight.chain.ditto import ditto_key
    db = sqlite3.connect(db_path, isolation_level=None)
    assert db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),)).rowcount == 1
    db.close()
    checked = cli("verify", "r", "--store", url, cwd=tmp_path)
    assert checked.returncode == 3 and "problems" in checked.stdout and "served by" not in checked.stdout, \
        checked.stdout


def test_a_command_in_a_project_subfolder_names_the_store_further_up(tmp_path: Path) -> None:
    """Fresh user: ``overnight ls`` in a subfolder of the project said only that no store exists
    (the default store's path is relative to the current directory), as if nothing had run."""
    report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "1")  # the default store
    store = tmp_path / ".overnight" / "overnight.db"
    sub = tmp_path / "tasks" / "deeper"
    sub.mkdir()
    for args in (("ls",), ("status", "r"), ("verify", "--all")):
        r = cli(*args, cwd=sub)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert f"a store exists further up, at {store}: run the command in {tmp_path}, or pass --store " \
               f"sqlite://{store}" in r.stderr, (args, r.stderr)
    r = cli("ls", "--store", f"sqlite://{store}", cwd=sub)
    assert r.returncode == 0 and "r" in r.stdout, r.stderr
    elsewhere = cli("ls", cwd=tmp_path.parent)  # no store here or above: the plain advice
    assert elsewhere.returncode == 2 and "further up" not in elsewhere.stderr, elsewhere.stderr
