"""Round 35, damage words: ``ls``, ``show``, ``verify`` and ``rm`` agree about damage.

* A damaged record whose verified ditto copy serves it loads and resumes: ``ls`` counts it apart
  (``served by its ditto copy``) and ``show`` marks it ``HEALED`` with its real session, not
  ``DAMAGED`` / ``INVALID`` -- as ``verify`` counts it (not invalid); what no copy heals stays
  ``DAMAGED`` / ``INVALID``, in the same numbers as ``verify``'s invalid ones.
* ``ls`` checks records and heads, not every past checkpoint's objects (a read per checkpoint: too
  slow for a listing of many tasks), and says so under its table.
* ``verify --all`` lists a damaged object a load reads once per checkpoint that needs it, under
  check ``object`` (not ``record``, not again as a stored object), and a damaged ditto copy under
  its original's task and checkpoint, naming the original.
* ``rm`` of a task while another task's past object is damaged says that no object was deleted
  because of it (it keeps every object) and what to run.

Real ``python -m overnight`` processes on real SQLite stores; nothing mocked.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from _procs import cli
from _report_project import damage_head_record, ok, report_project, steps_source

from overnight.chain.ditto import ditto_key


def _steps_store(tmp_path: Path, *task_ids: str) -> tuple[str, Path]:
    """A store with a complete 8-checkpoint task of each id; returns its URL and file."""
    db = tmp_path / "s.db"
    url = f"sqlite://{db}"
    for tid in task_ids:
        (tmp_path / f"{tid}.py").write_text(steps_source(tid, 6))
        ok(tmp_path, "run", f"{tid}.py", "-q", "--store", url)
    return url, db


def _damage_past_state(url: str, db_path: Path, task_id: str, seq: int = 3) -> tuple[str, str]:
    """Flip a byte of the state document of ``task_id``'s checkpoint ``seq`` (not the head) and of
    its ditto copy: nothing heals it. Returns (checkpoint id, state digest)."""
    from overnight.chain.integrity import load_checkpoint
    from overnight.store import open_store

    with open_store(url) as store:
        row = next(r for r in store.list_checkpoints(task_id) if r.seq == seq)
        d = load_checkpoint(store, row.checkpoint_id).record.state.digest
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        for key in (d, ditto_key(d)):
            data = bytes(db.execute("SELECT data FROM objects WHERE digest=?", (key,)).fetchone()[0])
            db.execute("UPDATE objects SET data=? WHERE digest=?", (data[:-1] + bytes([data[-1] ^ 1]), key))
    finally:
        db.close()
    return row.checkpoint_id, d


def test_a_record_its_ditto_copy_serves_is_healed_in_ls_and_show_as_verify_counts_it(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "2", "--store", url)
    head = damage_head_record(Path(url.removeprefix("sqlite://")), "r")

    checked = cli("verify", "r", "--store", url, cwd=tmp_path)
    assert checked.returncode == 3 and "(0 invalid)" in checked.stdout, checked.stdout

    listed = cli("ls", "--store", url, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "DAMAGED" not in listed.stdout and "(1 served by its ditto copy)" in listed.stdout, listed.stdout
    assert "r: 1 damaged checkpoint record(s) read from their verified ditto copies" in listed.stderr, listed.stderr
    assert "`overnight verify --repair r` rewrites them" in listed.stderr, listed.stderr
    (as_json,) = json.loads(cli("ls", "--store", url, "--json", cwd=tmp_path).stdout)
    assert as_json["damaged"] == 0 and as_json["served_by_copy"] == 1, as_json

    shown = cli("show", "r", "--store", url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "INVALID" not in out and "never load" not in out and "damaged checkpoint(s)" not in out, out
    assert "1 checkpoint(s) with a damaged original read from its verified ditto copy" in out, out
    assert "`overnight verify --repair r` rewrites the originals" in out, out
    row = next(line for line in out.splitlines() if head[7:15] in line and "HEALED" in line)
    assert f"HEALED: record {head[7:19]} is damaged (body does not match its digest), read from its ditto copy" \
        in row, row
    assert not re.search(r"│ +\? │", row) and re.search(r"│ +1 │", row), row  # its session, read from the copy
    report = json.loads(cli("show", "r", "--store", url, "--json", cwd=tmp_path).stdout)
    entry = next(c for c in report["chain"] if c["checkpoint_id"] == head)
    assert report["damaged"] == 0 and report["served_by_copy"] == 1, report
    assert entry["valid"] is True and entry["session"] == 1 and entry["served_by_copy"], entry

    status = cli("status", "r", "--store", url, cwd=tmp_path)  # says it as ls and show do
    assert status.returncode == 0, status.stderr
    assert f"self-heal: healed record {head[7:19]} from its ditto copy (body does not match its digest; " \
           "original left as is: `overnight verify --repair r` rewrites it)" in " ".join(status.stdout.split()), \
        status.stdout
    assert json.loads(cli("status", "r", "--store", url, "--json", cwd=tmp_path).stdout)["healed"], status.stdout


def test_a_record_no_copy_heals_stays_damaged_in_the_numbers_verify_counts(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "2", "--store", url)
    db_path = Path(url.removeprefix("sqlite://"))
    head = damage_head_record(db_path, "r")
    db = sqlite3.connect(db_path, isolation_level=None)
    assert db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),)).rowcount == 1
    db.close()
    checked = json.loads(cli("verify", "r", "--store", url, "--json", cwd=tmp_path).stdout)
    assert checked["checkpoints_invalid"] == 1, checked
    (listed,) = json.loads(cli("ls", "--store", url, "--json", cwd=tmp_path).stdout)
    assert listed["damaged"] == 1 and listed["served_by_copy"] == 0, listed
    assert "(1 DAMAGED)" in cli("ls", "--store", url, cwd=tmp_path).stdout
    shown = json.loads(cli("show", "r", "--store", url, "--json", cwd=tmp_path).stdout)
    assert shown["damaged"] == 1 and shown["served_by_copy"] == 0, shown
    text = cli("show", "r", "--store", url, cwd=tmp_path).stdout
    assert "INVALID" in text and "HEALED" not in text, text


def test_ls_says_it_checks_records_and_heads_not_every_past_checkpoints_content(tmp_path: Path) -> None:
    """A damaged object only a past checkpoint needs: ``ls`` (records and heads only, for cost)
    cannot see it, and its --help says what it checks and what checks the rest."""
    url, db = _steps_store(tmp_path, "t")
    cid, _ = _damage_past_state(url, db, "t")
    listed = cli("ls", "--store", url, cwd=tmp_path)
    assert listed.returncode == 0 and "DAMAGED" not in listed.stdout, listed.stdout
    helped = " ".join(cli("ls", "--help", cwd=tmp_path).stdout.split())
    assert "Of the other checkpoints each record is checked" in helped and "overnight verify TASK" in helped, helped
    checked = cli("verify", "t", "--store", url, cwd=tmp_path)
    assert checked.returncode == 3 and "(1 invalid)" in checked.stdout, checked.stdout
    shown = cli("show", "t", "--store", url, cwd=tmp_path).stdout
    assert "INVALID" in next(line for line in shown.splitlines() if cid[7:15] in line), shown


def test_verify_all_lists_a_damaged_object_once_per_checkpoint_and_names_the_original_of_its_copy(
        tmp_path: Path) -> None:
    url, db = _steps_store(tmp_path, "t")
    cid, d = _damage_past_state(url, db, "t")
    copy = ditto_key(d)

    every = cli("verify", "--all", "--store", url, "--json", cwd=tmp_path)
    assert every.returncode == 3, every.stderr
    got = json.loads(every.stdout)
    of_d = [p for p in got["problems"] if p["object"] == d]
    assert [(p["task_id"], p["checkpoint_id"], p["check"]) for p in of_d] == [("t", cid, "object")], of_d
    assert "DigestMismatch" in of_d[0]["detail"]
    (of_copy,) = [p for p in got["problems"] if p["object"] == copy]
    assert (of_copy["task_id"], of_copy["checkpoint_id"], of_copy["check"]) == ("t", cid, "object"), of_copy
    assert f"the ditto copy of object {d} (needed by checkpoint {cid[7:19]}) is damaged" in of_copy["detail"], of_copy
    assert "found by store" not in of_copy["detail"] and "nothing heals the original" in of_copy["detail"], of_copy
    assert got["checkpoints_invalid"] == 1 and got["objects_invalid"] == 2, got
    assert len(got["problems"]) == 2, got["problems"]

    alone = json.loads(cli("verify", "t", "--store", url, "--json", cwd=tmp_path).stdout)
    assert [(p["checkpoint_id"], p["check"], p["object"]) for p in alone["problems"]] == [(cid, "object", d)]
    assert alone["objects_invalid"] == 1, alone

    text = cli("verify", "--all", "--store", url, cwd=tmp_path, extra_env={"COLUMNS": "400"}).stdout
    assert sum(d in line for line in text.splitlines()) == 2, text  # the object's row and its copy's
    assert "needed by store" not in text and "found by store" not in text, text


def test_rm_of_another_task_says_no_object_was_deleted_because_of_the_damage(tmp_path: Path) -> None:
    url, db = _steps_store(tmp_path, "t", "u")
    _damage_past_state(url, db, "t")
    removed = cli("rm", "u", "--yes", "--store", url, cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    err = " ".join(removed.stderr.split())
    assert "0 object(s)" in err, err
    assert "not protected" not in err, err
    assert ("1 part(s) of checkpoints of task(s) t are damaged and cannot be read, so which objects they need is "
            "unknown: rm deleted no object of u because of it (nothing of t was deleted;") in err, err
    assert "`overnight verify --all` names the damage" in err, err
