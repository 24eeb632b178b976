"""Round 35 of the fresh-user fixes: ``verify`` no longer prints ``main ok`` next to a "problems"
table for a damaged original that its verified ditto copy serves -- the branch line says the copy
serves it, the original is listed apart as healable, and the exit stays 3 until ``verify --repair``
rewrites it; a resume that read it from the copy names that command. Real ``python -m overnight``
processes on a real SQLite store; nothing mocked."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from _procs import cli
from _report_project import damage_head_record, ok, report_project, steps_source


def test_verify_lists_a_record_its_ditto_copy_serves_apart_from_problems(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "2", "--store", url)
    head = damage_head_record(Path(url.removeprefix("sqlite://")), "r")

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
            "`overnight verify --repair r` rewrites it)") in resumed.stderr, resumed.stderr

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
    head = damage_head_record(db_path, "r")
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
    (tmp_path / "overnight.toml").unlink()  # no project file: the default store is the current directory's
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "1")  # the default store
    store = tmp_path / ".overnight" / "overnight.db"
    sub = tmp_path / "tasks" / "deeper"
    sub.mkdir()
    for args in (("ls",), ("status", "r"), ("verify", "--all"), ("resume", "r")):
        r = cli(*args, cwd=sub)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert f"a store exists further up, at {store}: run the command in {tmp_path}, or pass --store " \
               f"sqlite://{store}" in r.stderr, (args, r.stderr)
    r = cli("ls", "--store", f"sqlite://{store}", cwd=sub)
    assert r.returncode == 0 and "r" in r.stdout, r.stderr
    elsewhere = cli("ls", cwd=tmp_path.parent)  # no store here or above: the plain advice
    assert elsewhere.returncode == 2 and "further up" not in elsewhere.stderr, elsewhere.stderr


def test_verify_names_a_damaged_page_once_not_once_per_checkpoint(tmp_path: Path) -> None:
    """Attacker: a damaged done page (and its ditto copy) that 88 checkpoints name printed 88 table
    rows, each repeating the whole error. The error is now given once, by the first checkpoint
    whose load needs the page; the others name that checkpoint, and the table shows three of them
    and counts the rest (``--json`` still lists each, with the object)."""
    import json

    from overnight.chain.ditto import ditto_key
    from overnight.chain.read import load_head
    from overnight.store import open_store

    (tmp_path / "long.py").write_text(steps_source("big", 150))
    url = f"sqlite://{tmp_path / 's.db'}"
    ok(tmp_path, "run", "long.py", "-q", "--store", url)
    with open_store(url) as store:
        loaded, _ = load_head(store, "big", "main", key=None, deep=False)
        page = loaded.done_pages.refs[0].digest
    db = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    data = bytes(db.execute("SELECT data FROM objects WHERE digest=?", (page,)).fetchone()[0])
    db.execute("UPDATE objects SET data=? WHERE digest=?", (data[:-1] + bytes([data[-1] ^ 1]), page))
    assert db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(page),)).rowcount == 1
    db.close()

    as_json = cli("verify", "big", "--json", "--store", url, cwd=tmp_path)
    assert as_json.returncode == 3
    problems = [p for p in json.loads(as_json.stdout)["problems"] if p["object"] == page]
    assert len(problems) > 60 and all(p["check"] == "object" for p in problems), len(problems)  # the page, not a record
    assert sum("DigestMismatch" in p["detail"] for p in problems) == 1, problems[:3]
    first = problems[0]["checkpoint_id"]
    assert all(f"checkpoint {first[7:19]} names the error" in p["detail"] for p in problems[1:])

    shown = cli("verify", "big", "--store", url, cwd=tmp_path, extra_env={"COLUMNS": "400"})
    assert shown.returncode == 3
    rows = [line for line in shown.stdout.splitlines() if page in line]
    assert len(rows) == 4, shown.stdout  # three checkpoints, then the count
    assert f"… and {len(problems) - 3} more checkpoint(s) that need object {page}" in rows[-1], rows[-1]


_FINISH = '''import overnight
task = overnight.Task("fin", goal="writes its result last")

@task.step
def plan(ctx):
    ctx.add_step("work", n=1)
    ctx.add_step("finish")

@task.step(planned=False)
def work(ctx, n):
    ctx.state["n"] = n

@task.step(planned=False)
def finish(ctx):
    ctx.write_text("result.txt", "the result, written by the last step only\\n" * 50)
'''


def test_a_finished_queue_row_whose_head_falls_back_is_resumable_and_requeued(tmp_path: Path) -> None:
    """Fresh user: a task a worker finished, whose last artifact was damaged since, read
    ``complete`` (from its queue row) while its verified head falls back to 2/3 steps; ``retry``
    and ``resume --submit`` both said "already complete, nothing to queue", so no worker would ever
    finish it."""
    import json

    from overnight.chain.read import load_head
    from overnight.store import open_store

    (tmp_path / "fin.py").write_text(_FINISH)
    url = f"sqlite://{tmp_path / 's.db'}"
    ok(tmp_path, "submit", "fin.py", "-q", "--store", url)
    ok(tmp_path, "run", "fin.py", "-q", "--store", url)  # finishes it: the queue row is settled complete
    assert json.loads(ok(tmp_path, "status", "fin", "--json", "--store", url))["status"] == "complete"
    with open_store(url) as store:
        loaded, _ = load_head(store, "fin", "main", key=None, deep=True)
        result = loaded.state_tree["artifacts"]["result.txt"]["digest"]
    db = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    data = bytes(db.execute("SELECT data FROM objects WHERE digest=?", (result,)).fetchone()[0])
    db.execute("UPDATE objects SET data=? WHERE digest=?", (data[:-1] + bytes([data[-1] ^ 1]), result))
    db.close()

    status = json.loads(ok(tmp_path, "status", "fin", "--json", "--store", url))
    assert status["status"] == "interrupted" and status["done"] == 2, status
    r = cli("retry", "fin", "--store", url, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "fin: queued", r.stdout + r.stderr
    assert json.loads(ok(tmp_path, "status", "fin", "--json", "--store", url))["status"] == "queued"


def test_queue_commands_say_what_they_did_and_refuse_a_relative_time_without_unit(tmp_path: Path) -> None:
    """Fresh user: ``--not-before +30`` queued the task 30 hours ahead (a span's bare number is
    hours); ``retry`` of a queued task printed ``queued`` and ``cancel`` of a cancelled one
    ``cancelled``, as if each had done something; ``cancel`` of a task run in a terminal advised
    ``resume`` / ``resume --submit``, which cannot stop it."""
    url = report_project(tmp_path)
    r = cli("submit", "tasks/report.py", "--not-before", "+30", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "--not-before '+30' has no unit" in r.stderr and "+30s, +30m" in r.stderr, r.stderr
    ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--not-before", "+30m", "--store", url)
    assert ok(tmp_path, "retry", "later", "--store", url).startswith("later: already queued (starts in ")
    assert ok(tmp_path, "cancel", "later", "--store", url).strip() == "later: cancelled"
    assert ok(tmp_path, "cancel", "later", "--store", url).strip() == "later: already cancelled, nothing to cancel"
    assert ok(tmp_path, "retry", "later", "--store", url).startswith("later: queued (starts in ")  # kept its time

    ok(tmp_path, "run", "tasks/report.py", "--id", "here", "-q", "--max-steps", "1", "--store", url)
    r = cli("cancel", "here", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "stops with Ctrl-C there" in r.stderr and "--submit" not in r.stderr, r.stderr


def test_a_run_in_a_subfolder_says_it_made_a_new_store_beside_the_one_further_up(tmp_path: Path) -> None:
    """Fresh user: ``run``, ``submit`` and ``worker`` in a project's subfolder silently made a
    second, empty store there, which the project's ``overnight ls`` never lists."""
    report_project(tmp_path)
    (tmp_path / "overnight.toml").unlink()  # no project file: the default store is the current directory's
    ok(tmp_path, "run", "tasks/report.py", "--id", "r", "-q", "--max-steps", "1")  # the project's store
    store = tmp_path / ".overnight" / "overnight.db"
    sub = tmp_path / "tasks"
    r = cli("run", "report.py", "--id", "s", "-q", "--max-steps", "1", cwd=sub)
    assert r.returncode == 0, r.stderr
    assert f"note: no store here, so this one creates a new store at {sub / '.overnight' / 'overnight.db'}; " \
           f"a store exists further up, at {store}" in r.stderr, r.stderr
    again = cli("run", "report.py", "--id", "s", "-q", "--max-steps", "1", cwd=sub)  # its own store now: no note
    assert again.returncode == 0 and "note:" not in again.stderr, again.stderr
    w = cli("worker", "--idle-exit", "0.5", "--store", f"sqlite://{store}", cwd=sub)  # a store named: no note
    assert w.returncode == 0 and "note:" not in w.stderr, w.stderr


def test_submit_echoes_its_start_and_gc_refuses_apply_with_dry_run(tmp_path: Path) -> None:
    """Fresh user: ``submit --not-before`` did not say when the task starts (nor did submitting it
    again), and ``gc --dry-run --apply`` deleted while ``gc --apply --dry-run`` did not: the last
    flag won."""
    url = report_project(tmp_path)
    out = ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--not-before", "+10m", "--store", url)
    assert out.startswith("later queued: ") and "; starts in 10 min" in out, out
    again = ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--store", url)
    assert again.startswith("later already submitted (queued): ") and "; starts in " in again, again
    for flags in (("--dry-run", "--apply"), ("--apply", "--dry-run")):
        r = cli("gc", *flags, "--store", url, cwd=tmp_path)
        assert r.returncode == 2 and "--apply and --dry-run contradict each other" in r.stderr, r.stderr
    assert cli("gc", "--dry-run", "--store", url, cwd=tmp_path).returncode == 0
