"""Queue rows edited outside overnight: a bad cell never stops a worker or a listing.

Each test writes the bad cell into a real store -- with the ``sqlite3`` module into the SQLite file,
with ``psycopg`` into a real PostgreSQL schema -- then runs a real worker process or the queue API.
The row is named (its task id, else its ``seq``/``rowid``) with a typed error
(:class:`~overnight.store.queue.QueueRowInvalid`, a ``SchemaError``), parked ``failed`` with a
reason naming the column, and every other task still runs; ``overnight retry`` queues it again once
the cell is fixed.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from _fleet import cli, project, start_worker, stop

DEEP = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
"""params nested far past what json.loads (and the runner's codec) can take."""

SQLITE_CASES = {
    # case: (column, SQL value written into qa's cell, what the reason says)
    "params-not-json": ("params", "'{'", "column params is not JSON"),
    "params-deep": ("params", f"'{DEEP}'", "column params nests more than 100 levels"),
    "token-text": ("claim_token", "'x'", "column claim_token is not an integer"),
    "params-not-utf8": ("params", "CAST(x'7bff7d' AS TEXT)", "column params is bytes"),
    "task-id-null": ("task_id", "NULL", "column task_id is NULL"),
}


def _open(url: str) -> Any:
    from overnight.store import open_store

    return open_store(url)


def _submit(url: str, *ids: str, steps: int = 1) -> None:
    """Queue ``tasks/chaos.py`` under each id (as ``overnight submit --id`` does, without a process each)."""
    from overnight.store.queue import QueuedTask
    from overnight.store.queue_open import queue_for

    s = _open(url)
    try:
        for task_id in ids:
            queue_for(s).submit(QueuedTask(task_id=task_id, entry="tasks/chaos.py:task", params={"steps": steps}))
    finally:
        s.close()


def _edit(url: str, sql: str, args: tuple = ()) -> None:
    """Run ``sql`` on the store's queue table as another client would: the sqlite3 module on the file,
    psycopg on the schema (``{s}`` is the schema prefix)."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as db:
            db.execute(sql.replace("{s}.", ""), args)
        return
    import psycopg

    from overnight.store.postgres import parse_url

    conninfo, schema, _ = parse_url(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.replace("{s}.", f'"{schema}".').replace("?", "%s"), args)


def _raw(url: str, task_id: str) -> tuple[str, str | None]:
    """``(status, reason)`` of a row as stored, read without overnight."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as db:
            return db.execute("SELECT status, reason FROM queue WHERE task_id=?", (task_id,)).fetchone()
    import psycopg

    from overnight.store.postgres import parse_url

    conninfo, schema, _ = parse_url(url)
    with psycopg.connect(conninfo) as conn:
        return conn.execute(f'SELECT status, reason FROM "{schema}".queue WHERE task_id=%s', (task_id,)).fetchone()


def _run_worker(tmp_path: Path, url: str) -> tuple[int, str]:
    """A real ``overnight worker --idle-exit 1``; its exit status and log. A worker that does not
    exit (a loop on a bad row) fails the test after 90 s."""
    proc = start_worker(tmp_path, url, "--idle-exit", "1", "--lease", "5")
    try:
        code = proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail(f"the worker did not exit; its log:\n{(tmp_path / 'w.err').read_text()[-3000:]}")
    return code, (tmp_path / "w.err").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SQLITE_CASES))
def test_worker_parks_a_malformed_row_and_runs_the_others(tmp_path: Path, case: str) -> None:
    """A bad cell in one SQLite row: the worker names and parks that row, runs the others, exits 0;
    ``overnight ls`` lists the parked row with the column; after a fix, ``retry`` runs it."""
    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    column, value, says = SQLITE_CASES[case]
    _submit(url, "qa", "qb", "qc")
    _edit(url, f"UPDATE queue SET {column}={value} WHERE task_id='qa'")

    code, log = _run_worker(tmp_path, url)
    assert code == 0, log
    assert "Traceback" not in log and "store unavailable" not in log, log
    named = "queue row seq 1" if column == "task_id" else "task 'qa'"
    assert named in log and says in log and "parked failed" in log, log
    with sqlite3.connect(tmp_path / "q.db") as db:
        rows = dict(db.execute("SELECT seq, status FROM queue").fetchall())
        reason = db.execute("SELECT reason FROM queue WHERE seq=1").fetchone()[0]
    assert rows == {1: "failed", 2: "complete", 3: "complete"}
    assert reason.startswith("malformed queue row: " + says)

    ls = cli(tmp_path, "ls", "--store", url, "--json")
    assert ls.returncode == 0, ls.stderr
    listed = {t["task_id"]: t["status"] for t in json.loads(ls.stdout)}
    bad_id = "(seq 1)" if column == "task_id" else "qa"
    assert listed["qb"] == listed["qc"] == "complete"
    assert listed[bad_id].startswith("failed (malformed queue row: " + says), listed

    if column == "task_id":
        return  # nothing to retry by name: the row is named by its seq
    fixed = {"params": "'{\"steps\": 1}'", "claim_token": "1"}[column]
    _edit(url, f"UPDATE queue SET {column}={fixed} WHERE task_id='qa'")
    retry = cli(tmp_path, "retry", "qa", "--store", url)
    assert retry.returncode == 0 and "qa: queued" in retry.stdout, retry.stderr
    code, log = _run_worker(tmp_path, url)
    assert code == 0, log
    assert _raw(url, "qa")[0] == "complete"


@pytest.mark.slow
def test_worker_on_postgres_parks_params_that_are_not_json(tmp_path: Path, pg_schema: tuple[str, str]) -> None:
    """The same on PostgreSQL: ``params='{'`` written with psycopg; the worker parks it and runs the rest."""
    project(tmp_path)
    url = f"{pg_schema[0]}?schema={pg_schema[1]}"
    _submit(url, "qa", "qb", "qc")
    _edit(url, "UPDATE {s}.queue SET params='{' WHERE task_id='qa'")

    code, log = _run_worker(tmp_path, url)
    assert code == 0, log
    assert "task 'qa'" in log and "column params is not JSON" in log and "parked failed" in log, log
    assert [_raw(url, t)[0] for t in ("qa", "qb", "qc")] == ["failed", "complete", "complete"]
    ls = cli(tmp_path, "ls", "--store", url, "--json")
    assert ls.returncode == 0, ls.stderr
    assert {t["task_id"]: t["status"] for t in json.loads(ls.stdout)}["qa"].startswith(
        "failed (malformed queue row: column params is not JSON")


PG_CASES = {
    "not-json": ("'{'", "column params is not JSON"),
    "deep": (f"'{DEEP}'", "column params nests more than 100 levels"),
    "not-an-object": ("'[1, 2]'", "column params is not a JSON object"),
}


@pytest.mark.parametrize("case", list(PG_CASES))
def test_claim_and_listings_survive_a_malformed_row(tmp_path: Path, any_url: str, case: str) -> None:
    """The queue API on both stores: ``list``/``get`` show the bad row ``failed`` naming the column,
    ``row_to_task``'s error is typed, and a claim parks it (fenced) and returns the next task --
    also when the bad row is a ``running`` one whose claim expired (a takeover)."""
    from overnight.errors import SchemaError
    from overnight.store.queue import QueueRowInvalid
    from overnight.store.queue_open import queue_for

    value, says = PG_CASES[case]
    _submit(any_url, "qa", "qb", "qc")
    _edit(any_url, f"UPDATE {{s}}.queue SET params={value} WHERE task_id IN ('qa', 'qb')")
    # qb: held by a worker whose claim expired -- a claim would take it over
    _edit(any_url, "UPDATE {s}.queue SET status='running', claim_token=4, worker_id='gone', claim_expires_ms=1 "
          "WHERE task_id='qb'")
    s = _open(any_url)
    try:
        q = queue_for(s)
        listed = {t.task_id: t for t in q.list()}
        assert set(listed) == {"qa", "qb", "qc"} and listed["qc"].status == "queued"
        for t in ("qa", "qb"):
            assert listed[t].status == "failed" and says in listed[t].reason
            assert q.get(t).reason == listed[t].reason

        parked: list[QueueRowInvalid] = []
        got = q.claim("w1", ["default"], 30_000, on_parked=parked.append)
        assert got is not None and got.task_id == "qc" and got.params == {"steps": 1}
        assert [e.task_id for e in parked] == ["qa", "qb"]
        for e in parked:
            assert isinstance(e, SchemaError) and e.column == "params" and e.row == repr(e.task_id)
            assert says in str(e) and f"overnight retry {e.task_id}" in str(e)
        for t in ("qa", "qb"):
            status, reason = _raw(any_url, t)
            assert status == "failed" and reason.startswith(f"malformed queue row: {says}")
        # the holder of qb's expired claim is fenced out: its token and status no longer match
        assert not q.finish("qb", 4, "complete")
        assert q.claim("w1", ["default"], 30_000) is None

        _edit(any_url, "UPDATE {s}.queue SET params='{\"steps\": 2}' WHERE task_id='qa'")
        assert q.retry("qa").status == "queued"
        again = q.claim("w1", ["default"], 30_000)
        assert again is not None and again.task_id == "qa" and again.params == {"steps": 2}
    finally:
        s.close()


def test_sqlite_rows_no_driver_can_read(tmp_path: Path) -> None:
    """Cells SQLite keeps but a typed reader cannot take -- text that is not UTF-8 (as TEXT and as a
    BLOB), text in an INTEGER column, a NULL task id, an unknown status -- each only fails its own
    row: listings name it, a claim parks every one by its rowid and claims the good row."""
    from overnight.store.queue_open import queue_for

    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    _submit(url, "t1", "t2", "t3", "t4", "t5", "good")
    for task_id, sql in [("t1", "host=CAST(x'c3' AS TEXT), worker_id=x'ff'"), ("t2", "priority='high'"),
                         ("t3", "task_id=NULL, seq='x'"), ("t4", "status='bogus'"),
                         ("t5", "entry=x'ff', cancel_requested=CAST(x'ff' AS TEXT)")]:
        _edit(url, f"UPDATE queue SET {sql} WHERE task_id=?", (task_id,))
    s = _open(url)
    try:
        q = queue_for(s)
        listed = {t.task_id: t for t in q.list()}
        assert listed["good"].status == "queued"
        rowid3 = 3
        assert set(listed) == {"t1", "t2", f"(rowid {rowid3})", "t4", "t5", "good"}
        reasons = {t: r.reason for t, r in listed.items() if t != "good"}
        assert "column worker_id is bytes b'\\xff', not UTF-8 text" in reasons["t1"]
        assert "column priority is not an integer (str 'high')" in reasons["t2"]
        assert "column task_id is NULL" in reasons[f"(rowid {rowid3})"]
        assert "column status is 'bogus'" in reasons["t4"]
        assert "column entry is bytes" in reasons["t5"]
        assert q.get("t2").status == "failed" and q.get("nothing") is None

        parked: list[Any] = []
        got = q.claim("w1", ["default"], 30_000, on_parked=parked.append)
        assert got is not None and got.task_id == "good"
        # in claim order: SQLite sorts text after numbers ('high' first by priority DESC, seq 'x' last);
        # t4 ('bogus') is never runnable: not claimed, not parked
        assert [e.row for e in parked] == ["'t2'", "'t1'", "'t5'"]
        assert q.claim("w1", ["default"], 30_000, on_parked=parked.append) is None
        assert parked[-1].row == f"rowid {rowid3}" and parked[-1].task_id is None
        with sqlite3.connect(tmp_path / "q.db") as db:
            stored = dict(db.execute("SELECT rowid, status FROM queue").fetchall())
        assert stored == {1: "failed", 2: "failed", 3: "failed", 4: "bogus", 5: "failed", 6: "running"}
        # a heartbeat reads cancel_requested as a comparison: a bad cell there cannot fail it
        _edit(url, "UPDATE queue SET cancel_requested=CAST(x'ff' AS TEXT) WHERE task_id='good'")
        assert q.heartbeat("good", got.claim_token, 30_000) is True
    finally:
        s.close()


def test_workers_listing_survives_malformed_rows(tmp_path: Path) -> None:
    """``workers()`` (``overnight workers``) shows hand-edited worker rows instead of crashing."""
    from overnight.store.queue import WorkerRow
    from overnight.store.queue_open import queue_for

    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    s = _open(url)
    try:
        q = queue_for(s)
        for w in ("w1", "w2", "w3"):
            q.worker_beat(WorkerRow(w, "h", 1, 1, 1, ["default"], 1))
    finally:
        s.close()
    _edit(url, "UPDATE workers SET pid='x', host=CAST(x'ff' AS TEXT) WHERE worker_id='w1'")
    _edit(url, "UPDATE workers SET worker_id=NULL, queues='[' WHERE worker_id='w2'")
    s = _open(url)
    try:
        rows = {w.worker_id: w for w in queue_for(s).workers()}
    finally:
        s.close()
    assert set(rows) == {"w1", "(rowid 2)", "w3"}
    assert rows["w1"].pid == 0 and rows["w1"].host == "?" and rows["w1"].state.startswith("malformed (column host")
    assert rows["(rowid 2)"].state == "malformed (column worker_id is NULL)" and rows["(rowid 2)"].queues == ["["]
    assert rows["w3"].state == "running" and rows["w3"].queues == ["default"]
    res = cli(tmp_path, "workers", "--all", "--store", url)
    assert res.returncode == 0 and "(rowid 2)" in res.stdout, res.stderr
