"""Workers, end to end with real processes: submit, claim order, parking, cancel, graceful stop,
paused holder and dropped connections (SQLite, and PostgreSQL with a schema per test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from _fleet import (chain_check, cli, client_ports, descendants, fleet_env, project, queue_rows, side_log, start_worker, stop,
                    wait_until, wasted)
from _procs import CLI




def _submit(tmp_path: Path, store: str, *args: str) -> dict:
    res = cli(tmp_path, "submit", "tasks/chaos.py", "--store", store, "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_submit_ids_params_idempotency(tmp_path: Path, sqlite_url: str) -> None:
    a = _submit(tmp_path, sqlite_url, "--param", "steps=2")
    again = _submit(tmp_path, sqlite_url, "--params", '{"steps": 2}')
    other = _submit(tmp_path, sqlite_url, "--param", "steps=3")
    assert a["created"] and not again["created"] and again["task_id"] == a["task_id"]
    assert a["task_id"].startswith("chaos-") and other["task_id"] != a["task_id"]
    assert a["entry"] == "tasks/chaos.py:task"  # relative to the project root, never absolute
    k1 = _submit(tmp_path, sqlite_url, "--id", "keyed", "--idempotency-key", "K")
    k2 = _submit(tmp_path, sqlite_url, "--id", "keyed", "--idempotency-key", "K")
    assert k1["created"] and not k2["created"] and k2["task_id"] == "keyed"
    # the key names that request: another one under it is refused (exit 2), not swapped for the first
    other_request = cli(tmp_path, "submit", "tasks/chaos.py", "--store", sqlite_url, "--id", "keyed-2",
                        "--idempotency-key", "K", "--param", "steps=9")
    assert other_request.returncode == 2 and "idempotency key 'K' was used by task 'keyed'" in other_request.stderr
    assert set(queue_rows(sqlite_url)) == {a["task_id"], other["task_id"], "keyed"}
    (tmp_path / "tasks" / "nothing.py").write_text("x = 1\n")
    bad = cli(tmp_path, "submit", "tasks/nothing.py", "--store", sqlite_url)
    assert bad.returncode == 2 and "defines no overnight.Task" in bad.stderr


def test_claim_order_priority_and_not_before(tmp_path: Path, any_url: str) -> None:
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    _submit(tmp_path, any_url, "--id", "low-1")
    _submit(tmp_path, any_url, "--id", "later", "--priority", "9", "--not-before", "+1h")
    _submit(tmp_path, any_url, "--id", "high", "--priority", "5")
    _submit(tmp_path, any_url, "--id", "low-2")
    _submit(tmp_path, any_url, "--id", "other-queue", "--priority", "9", "--queue", "q2")
    s = open_store(any_url)
    try:
        q = queue_for(s)
        order = [q.claim("w1", ["default"], 30_000) for _ in range(4)]
        assert [t.task_id if t else None for t in order] == ["high", "low-1", "low-2", None]
        assert [t.claim_token for t in order[:3]] == [1, 1, 1]
        assert q.claim("w1", ["q2"], 30_000).task_id == "other-queue"
    finally:
        s.close()


@pytest.mark.slow
def test_worker_runs_queued_tasks_and_ls_shows_them(tmp_path: Path, sqlite_url: str) -> None:
    ids = [_submit(tmp_path, sqlite_url, "--param", f"steps={n}", "--param", f"tag={'x' * n}")["task_id"]
           for n in (2, 3, 4)]
    ls = cli(tmp_path, "ls", "--store", sqlite_url, "--json")
    assert {t["task_id"]: t["status"] for t in json.loads(ls.stdout)} == dict.fromkeys(ids, "queued")
    st = cli(tmp_path, "status", ids[0], "--store", sqlite_url)  # submitted, not started: its queue state
    assert st.returncode == 0 and "queued, no checkpoint yet" in st.stdout, st.stderr
    shown = cli(tmp_path, "show", ids[0], "--store", sqlite_url)
    assert shown.returncode == 2 and "submitted but has no checkpoint yet" in shown.stderr
    w = start_worker(tmp_path, sqlite_url, "--concurrency", "2", "--idle-exit", "2", "--worker-id", "solo")
    assert w.wait(timeout=120) == 0, (tmp_path / "w.err").read_text()
    rows = queue_rows(sqlite_url)
    assert {i: rows[i].status for i in ids} == dict.fromkeys(ids, "complete")
    log = side_log(tmp_path)
    assert len(log) == 2 + 3 + 4 and wasted(log) == 0
    for tid, n in zip(ids, (2, 3, 4)):
        got = chain_check(sqlite_url, tid)
        assert got["state"] == {f"w{i}": i * i + n for i in range(n)}  # ctx.params reached the steps
    ls = json.loads(cli(tmp_path, "ls", "--store", sqlite_url, "--json").stdout)
    assert {t["status"] for t in ls} == {"complete"}
    workers = json.loads(cli(tmp_path, "workers", "--store", sqlite_url, "--json", "--all").stdout)
    assert [(x["worker_id"], x["state"]) for x in workers] == [("solo", "stopped")]
    assert json.loads(cli(tmp_path, "workers", "--store", sqlite_url, "--json").stdout) == []  # live ones only
    assert "no live worker (1 stopped, dead or silent" in cli(tmp_path, "workers", "--store", sqlite_url).stderr
    # rm takes the queue row too: no worker claims (and re-creates) the deleted task
    assert cli(tmp_path, "rm", ids[0], "--yes", "--store", sqlite_url).returncode == 0
    assert ids[0] not in queue_rows(sqlite_url) and set(ids[1:]) <= set(queue_rows(sqlite_url))


@pytest.mark.slow
def test_submitted_tasks_resume_and_check_drift_under_their_own_ids(tmp_path: Path, sqlite_url: str) -> None:
    """A task submitted under another id than its definition's (``--id``, or the default id with
    the params' digest) is resumable and checkable by that id: the spec records the definition and
    the params, so ``resume`` and ``status --drift`` load the definition and give it the id."""
    named = _submit(tmp_path, sqlite_url, "--id", "c1", "--param", "steps=2")["task_id"]
    digest_id = _submit(tmp_path, sqlite_url, "--param", "steps=3")["task_id"]
    assert named == "c1" and digest_id.startswith("chaos-")
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "2")
    assert w.wait(timeout=120) == 0, (tmp_path / "w.err").read_text()
    for tid, n in ((named, 2), (digest_id, 3)):
        st = cli(tmp_path, "status", tid, "--drift", "--store", sqlite_url)
        assert st.returncode == 0, st.stderr
        res = cli(tmp_path, "resume", tid, "--store", sqlite_url)
        assert res.returncode == 0, res.stderr
        assert chain_check(sqlite_url, tid)["state"] == {f"w{i}": i * i for i in range(n)}


@pytest.mark.slow
def test_poison_unimportable_and_failing_tasks_are_parked(tmp_path: Path, sqlite_url: str) -> None:
    poison = _submit(tmp_path, sqlite_url, "--id", "poison", "--param", "mode=poison")["task_id"]
    failing = _submit(tmp_path, sqlite_url, "--id", "failing", "--param", "mode=fail")["task_id"]
    (tmp_path / "tasks" / "gone.py").write_text((tmp_path / "tasks" / "chaos.py").read_text())
    res = cli(tmp_path, "submit", "tasks/gone.py", "--store", sqlite_url, "--id", "unimportable")
    assert res.returncode == 0, res.stderr
    (tmp_path / "tasks" / "gone.py").unlink()
    fine = _submit(tmp_path, sqlite_url, "--id", "fine")["task_id"]
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "3", "--backoff", "0.1", "--max-deaths", "3")
    assert w.wait(timeout=180) == 0, (tmp_path / "w.err").read_text()
    rows = queue_rows(sqlite_url)
    assert rows[poison].status == "failed" and "died 3 times in a row" in rows[poison].reason
    assert rows[poison].attempts == 3
    assert rows[failing].status == "failed" and "this step always fails" in rows[failing].reason
    assert rows["unimportable"].status == "failed" and rows["unimportable"].reason.startswith("cannot import tasks/gone.py")
    assert rows[fine].status == "complete"
    ls = {t["task_id"]: t["status"] for t in json.loads(cli(tmp_path, "ls", "--store", sqlite_url, "--json").stdout)}
    assert ls[poison].startswith("failed (died 3 times")
    # retry re-queues a parked task (it dies again: parked again, attempts go on)
    assert cli(tmp_path, "retry", poison, "--store", sqlite_url).returncode == 0
    assert queue_rows(sqlite_url)[poison].status == "queued"


@pytest.mark.slow
def test_cancel_stops_at_a_step_boundary(tmp_path: Path, any_url: str) -> None:
    # the default lease (30 s: a heartbeat every 10 s) -- the session asks after every step (SQLite)
    # or is told at once (PostgreSQL's NOTIFY), so the cancel lands at the next step boundary, not
    # at the next heartbeat
    sqlite_url = any_url
    tid = _submit(tmp_path, sqlite_url, "--param", "steps=40", "--param", "sleep=0.4")["task_id"]
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "2")
    try:
        wait_until(lambda: len(side_log(tmp_path)) >= 2, 60, "two steps")
        assert cli(tmp_path, "cancel", tid, "--store", sqlite_url).returncode == 0
        ran_at_cancel = len(side_log(tmp_path))
        assert w.wait(timeout=60) == 0
    finally:
        stop(w)
    row = queue_rows(sqlite_url)[tid]
    assert row.status == "cancelled"
    got = chain_check(sqlite_url, tid)
    assert len(side_log(tmp_path)) <= ran_at_cancel + 1  # the step in flight, then the boundary
    assert len(got["done"]) == len(side_log(tmp_path)) + 1 and wasted(side_log(tmp_path)) == 0
    ls = {t["task_id"]: t["status"] for t in json.loads(cli(tmp_path, "ls", "--store", sqlite_url, "--json").stdout)}
    assert ls[tid] == "cancelled"


@pytest.mark.slow
def test_postgres_pushes_a_cancel_to_the_running_session_and_no_other(tmp_path: Path, pg_schema) -> None:
    import threading

    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    project(tmp_path)
    url, schema = pg_schema
    store = f"{url}?schema={schema}"
    for tid in ("mine", "other", "early"):
        _submit(tmp_path, store, "--id", tid)
    s = open_store(store)
    try:
        q = queue_for(s)
        claims = {t.task_id: t for t in (q.claim("w1", ["default"], 30_000) for _ in range(3))}
        q.cancel("early")  # before its session listens: the listener asks the row once it holds
        early = threading.Event()
        q.watch_cancel("early", early.set)
        assert early.wait(10)
        del claims["early"]
        told: dict[str, threading.Event] = {t: threading.Event() for t in claims}
        watches = {t: q.watch_cancel(t, told[t].set) for t in claims}
        wait_until(lambda: all(w.alive for w in watches.values()), 10, "the LISTEN connection")
        # one listening thread, with one connection, serves every task this process watches
        assert [t.name for t in threading.enumerate()].count("overnight-cancel-listen") == 1
        import psycopg

        from overnight.store.queue_postgres import CANCEL_CHANNEL

        with psycopg.connect(url, autocommit=True) as forger:  # a NOTIFY alone cancels nothing
            forger.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, json.dumps([schema, "mine"])))
        assert not told["mine"].wait(1.5)
        q.cancel("other")
        assert told["other"].wait(5) and not told["mine"].is_set()
        # the same task id in another schema of the same server is another task
        url2 = f"{url}?schema={schema}_b"
        try:
            _submit(tmp_path, url2, "--id", "mine")
            s2 = open_store(url2)
            q2 = queue_for(s2)
            q2.claim("w1", ["default"], 30_000)
            q2.cancel("mine")
            s2.close()
            assert not told["mine"].wait(1.5)
        finally:
            from conftest import drop_schema
            drop_schema(url, f"{schema}_b")
        q.cancel("mine")
        assert told["mine"].wait(5)
        assert q.cancel_requested("mine", claims["mine"].claim_token)  # the row says so too
        for w in watches.values():
            w.close()
    finally:
        s.close()


@pytest.mark.slow
def test_graceful_stop_commits_the_step_in_flight_and_requeues(tmp_path: Path, sqlite_url: str) -> None:
    tid = _submit(tmp_path, sqlite_url, "--param", "steps=30", "--param", "sleep=0.4")["task_id"]
    w = start_worker(tmp_path, sqlite_url, "--lease", "3")
    wait_until(lambda: len(side_log(tmp_path)) >= 2, 60, "two steps")
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    ran = len(side_log(tmp_path))
    assert queue_rows(sqlite_url)[tid].status == "queued"
    assert len(chain_check(sqlite_url, tid)["done"]) == ran + 1  # plan + every step that ran: none lost
    w2 = start_worker(tmp_path, sqlite_url, "--idle-exit", "2", name="w2")
    assert w2.wait(timeout=120) == 0
    assert queue_rows(sqlite_url)[tid].status == "complete"
    log = side_log(tmp_path)
    assert len(log) == 30 and wasted(log) == 0  # nothing ran twice after a graceful stop


@pytest.mark.slow
def test_paused_holder_is_taken_over_and_gets_lease_lost(tmp_path: Path, pg_schema) -> None:
    url, schema = pg_schema
    store = f"{url}?schema={schema}"
    project(tmp_path)
    tid = _submit(tmp_path, store, "--param", "steps=25", "--param", "sleep=0.3")["task_id"]
    a = start_worker(tmp_path, store, "--lease", "1.5", "--worker-id", "A", name="a")
    b = None
    try:
        wait_until(lambda: len(side_log(tmp_path)) >= 2, 60, "A runs steps")
        child = queue_rows(store)[tid].pid
        assert child in descendants(a.pid)
        os.kill(child, signal.SIGSTOP)  # a pause past the lease: A's session stops heartbeating
        paused_at = len(side_log(tmp_path))
        b = start_worker(tmp_path, store, "--lease", "1.5", "--worker-id", "B", "--idle-exit", "3", name="b")
        wait_until(lambda: queue_rows(store)[tid].worker_id == "B" and len(side_log(tmp_path)) >= paused_at + 3,
                   60, "B takes over")
        os.kill(child, signal.SIGCONT)  # the old holder wakes up: its next commit meets LeaseLost
        assert b.wait(timeout=120) == 0, (tmp_path / "b.err").read_text()
        assert "its holder A stopped heartbeating; taking it over" in (tmp_path / "b.err").read_text()
        # A says its claim was taken over, not the new claim's "running" (stop 36's attacker)
        wait_until(lambda: "lease ran out and B claimed it" in (tmp_path / "a.err").read_text(), 30,
                   "A to say it lost the task")
        assert f"task {tid} running" not in (tmp_path / "a.err").read_text()
    finally:
        stop(a, signal.SIGTERM)
        if b is not None:
            stop(b)
    assert queue_rows(store)[tid].status == "complete"
    got = chain_check(store, tid)  # linear history, no step committed twice
    assert len(got["done"]) == 26
    assert wasted(side_log(tmp_path)) <= 1  # at most the step in flight when A was paused


@pytest.mark.slow
def test_dropped_postgres_connections_mid_run(tmp_path: Path, pg_schema) -> None:
    import psycopg

    url, schema = pg_schema
    store = f"{url}?schema={schema}"
    project(tmp_path)
    ids = [_submit(tmp_path, store, "--id", f"t{i}", "--param", "steps=12", "--param", "sleep=0.1")["task_id"]
           for i in range(3)]
    # default --max-deaths (3): a store outage must not count as deaths of the tasks
    w = start_worker(tmp_path, store, "--concurrency", "3", "--lease", "2", "--backoff", "0.2", "--idle-exit", "4")
    dropped = 0
    try:
        for _ in range(3):
            wait_until(lambda: len(side_log(tmp_path)) >= 4, 60, "steps")
            time.sleep(1.5)
            ports = sorted(client_ports([w.pid, *descendants(w.pid)]))  # only this test's connections
            with psycopg.connect(url, autocommit=True) as conn:
                dropped += len(conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND client_port = ANY(%s)", (ports,)).fetchall())
        assert w.wait(timeout=180) == 0, (tmp_path / "w.err").read_text()
    finally:
        stop(w)
    assert dropped >= 3  # the worker's and its sessions' connections were cut
    rows = queue_rows(store)
    assert {i: rows[i].status for i in ids} == dict.fromkeys(ids, "complete")
    for i in ids:
        assert len(chain_check(store, i)["done"]) == 13


SLOW_TASK = '''
import time
import overnight

task = overnight.Task("slow", goal="slow steps", level="durable")

@task.step
def plan(ctx):
    for i in range(50):
        ctx.add_step("work", i=i)

@task.step(planned=False)
def work(ctx, i: int):
    time.sleep(0.3)
    return i
'''


def test_plain_run_shows_running_then_interrupted(tmp_path: Path) -> None:
    """Without workers: a run holds the task lease, so `ls` tells a running task from a killed one."""
    import subprocess

    from _fleet import fleet_env
    from _procs import CLI

    project(tmp_path)
    (tmp_path / "slow.py").write_text(SLOW_TASK)
    store = f"sqlite://{tmp_path / 'q.db'}"
    run = subprocess.Popen([*CLI, "run", "slow.py", "--store", store, "--quiet"], cwd=tmp_path,
                           env=fleet_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def status() -> str:
        res = cli(tmp_path, "ls", "--store", store, "--json")
        rows = json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else []
        return rows[0]["status"] if rows else ""  # [] while the run has made the store but not the task

    try:
        got = wait_until(lambda: (lambda st: st if st.startswith("running") else "")(status()), 60, "running")
        assert got.startswith("running (pid ") and "heartbeat" in got
    finally:
        stop(run)
    assert status() == "interrupted"
    res = cli(tmp_path, "status", "slow", "--store", store)
    assert "interrupted" in res.stdout


FAILING_TASK = '''
import os
import overnight

task = overnight.Task("flaky", goal="a step that fails until FIXED is set")

@task.step
def first(ctx):
    return 1

@task.step(retries=1)
def second(ctx):
    if not os.environ.get("FIXED"):
        raise RuntimeError("the API said no")
    return 2
'''


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "file"])
def test_plain_run_whose_step_fails_shows_failed_with_the_reason_until_resumed(tmp_path: Path, kind: str,
                                                                               request) -> None:
    project(tmp_path)
    (tmp_path / "flaky.py").write_text(FAILING_TASK)
    if kind == "postgres":
        url, schema = request.getfixturevalue("pg_schema")
        store = f"{url}?schema={schema}"
    else:
        store = f"sqlite://{tmp_path / 'q.db'}" if kind == "sqlite" else f"file://{tmp_path / 'fs'}"
    assert cli(tmp_path, "run", "flaky.py", "--store", store, "--quiet").returncode != 0
    rows = json.loads(cli(tmp_path, "ls", "--store", store, "--json").stdout)
    assert rows[0]["status"] == "failed (step 'second' failed after 2 attempt(s): RuntimeError: the API said no)"
    assert "failed (step 'second'" in cli(tmp_path, "status", "flaky", "--store", store).stdout
    assert cli(tmp_path, "resume", "flaky", "--store", store, "--quiet", FIXED="1").returncode == 0
    assert json.loads(cli(tmp_path, "ls", "--store", store, "--json").stdout)[0]["status"] == "complete"


def test_second_signal_abandons_the_step_in_flight(tmp_path: Path, sqlite_url: str) -> None:
    tid = _submit(tmp_path, sqlite_url, "--param", "steps=5", "--param", "sleep=8")["task_id"]
    w = start_worker(tmp_path, sqlite_url, "--lease", "3")
    try:
        wait_until(lambda: len(side_log(tmp_path)) >= 1, 60, "the first step in flight")
        t0 = time.monotonic()
        w.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        w.send_signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 7  # did not wait for the 8 s step
    finally:
        stop(w)
    assert chain_check(sqlite_url, tid)["done"] == ["plan"]  # nothing of the abandoned step committed
    assert queue_rows(sqlite_url)[tid].status == "queued"


@pytest.mark.slow
def test_queue_row_params_changed_behind_the_task_are_refused(tmp_path: Path, sqlite_url: str) -> None:
    """The queue row is not covered by a digest: a resumed task runs with its verified params."""
    import sqlite3

    tid = _submit(tmp_path, sqlite_url, "--id", "p", "--param", "steps=30", "--param", "sleep=0.3")["task_id"]
    w = start_worker(tmp_path, sqlite_url, "--lease", "3")
    wait_until(lambda: len(side_log(tmp_path)) >= 1, 60, "a step")
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    db = sqlite3.connect(tmp_path / "q.db")
    db.execute("UPDATE queue SET params=? WHERE task_id=?", (json.dumps({"steps": 30, "sleep": 0.3, "tag": "x"}), tid))
    db.commit()
    db.close()
    w2 = start_worker(tmp_path, sqlite_url, "--idle-exit", "2", name="w2")
    assert w2.wait(timeout=60) == 0
    row = queue_rows(sqlite_url)[tid]
    assert row.status == "failed" and "params differ" in row.reason


@pytest.mark.slow
def test_a_forged_queue_row_cannot_make_a_worker_call_or_import_other_code(tmp_path: Path, sqlite_url: str) -> None:
    """Whoever can write the store edits queue rows: a worker never imports or calls what a row
    names unless it is a task (or a task factory) in the project, and a task that has checkpoints
    runs only the code its verified head records -- the row naming another project file is refused
    before that file is imported."""
    import sqlite3

    canary = tmp_path / "canary"
    (tmp_path / "tasks" / "other.py").write_text(f"open({str(canary)!r}, 'w').write('imported')\n"
                                                  + (tmp_path / "tasks" / "chaos.py").read_text())
    (tmp_path / "tasks" / "helper.py").write_text(f"def main():\n    open({str(canary)!r}, 'w').write('called')\n")
    forged = {
        "own-web": "overnight.web.server:serve",      # overnight's own functions: never called
        "own-main": "overnight.__main__:task",        # overnight's CLI entry: never imported
        "helper": "tasks/helper.py:main",             # a project function that is not a task factory
    }
    done = _submit(tmp_path, sqlite_url, "--id", "has-history")["task_id"]  # claimed first: runs and completes
    for tid in forged:
        _submit(tmp_path, sqlite_url, "--id", tid)
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "2", "--max-tasks", "1")
    assert w.wait(timeout=120) == 0
    path = sqlite_url.removeprefix("sqlite://")
    with sqlite3.connect(path) as db:
        for tid, entry in forged.items():
            db.execute("UPDATE queue SET entry=? WHERE task_id=?", (entry, tid))
        db.execute("UPDATE queue SET entry='tasks/other.py:task', status='queued' WHERE task_id=?", (done,))
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "2", "--backoff", "0.1", name="w2")
    assert w.wait(timeout=120) == 0, (tmp_path / "w2.err").read_text()
    rows = queue_rows(sqlite_url)
    for tid in [*forged, done]:
        assert rows[tid].status == "failed" and rows[tid].reason.startswith("cannot import"), (tid, rows[tid])
    assert "verified checkpoints say" in rows[done].reason  # EntryMismatch, before importing other.py
    assert not canary.exists()
    assert not (tmp_path / ".claude").exists()


@pytest.mark.slow
def test_a_stop_while_a_session_starts_is_not_a_death_and_is_prompt(tmp_path: Path, sqlite_url: str) -> None:
    """SIGTERM reaching a worker while its session imports slow code (before the runner runs):
    the worker still exits promptly, the task is queued again, and no death is counted -- so
    repeated deploys never park a healthy task as a poison one."""
    (tmp_path / "tasks" / "slowimp.py").write_text("import time\ntime.sleep(4)\n"
                                                    + (tmp_path / "tasks" / "chaos.py").read_text())
    res = cli(tmp_path, "submit", "tasks/slowimp.py", "--store", sqlite_url, "--id", "slow", "--param", "steps=30")
    assert res.returncode == 0, res.stderr
    w = start_worker(tmp_path, sqlite_url)
    wait_until(lambda: queue_rows(sqlite_url)["slow"].status == "running", 60, "the claim")
    w.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert w.wait(timeout=60) == 0, (tmp_path / "w.err").read_text()
    assert time.monotonic() - t0 < 15  # not the whole task (30 steps)
    row = queue_rows(sqlite_url)["slow"]
    assert row.status == "queued" and row.deaths == 0, row
    assert len(side_log(tmp_path)) <= 1


def test_concurrent_submits_with_one_idempotency_key_queue_one_task(tmp_path: Path, any_url: str) -> None:
    """Six processes submit the same request with the same idempotency key at once: every one exits
    0 with the same task, and exactly one row is queued (PostgreSQL's unique index decides a race
    the look-up lost)."""
    procs = [subprocess.Popen([*CLI, "submit", "tasks/chaos.py", "--store", any_url, "--json", "--id", "t",
                               "--idempotency-key", "order-42"], cwd=tmp_path, env=fleet_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert len({json.loads(o)["task_id"] for o, _ in outs}) == 1
    assert len(queue_rows(any_url)) == 1


def test_submit_refuses_values_no_store_holds(tmp_path: Path, sqlite_url: str) -> None:
    """Usage errors (exit 2) naming the field, never a database error or a traceback."""
    for args, words in ((["--priority", str(10**20)], "--priority"), (["--not-before", "1e300"], "--not-before"),
                        (["--not-before", "inf"], "--not-before"), (["--queue", ""], "queue name"),
                        (["--idempotency-key", "a\tb"], "idempotency key"),
                        (["--idempotency-key", "k" * 300], "idempotency key")):
        res = cli(tmp_path, "submit", "tasks/chaos.py", "--store", sqlite_url, *args)
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)


def test_the_readme_worker_example_runs(tmp_path: Path, sqlite_url: str) -> None:
    """README "Running many tasks: workers": examples/report.py submitted with params, run by a
    worker, writes its report."""
    import shutil

    (tmp_path / "examples").mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "report.py", tmp_path / "examples" / "report.py")
    tid = json.loads(cli(tmp_path, "submit", "examples/report.py", "--param", "topic=storage", "--param", "sections=2",
                         "--param", "seconds=0", "--store", sqlite_url, "--json").stdout)["task_id"]
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "2")
    assert w.wait(timeout=120) == 0, (tmp_path / "w.err").read_text()
    report = cli(tmp_path, "cat", tid, "report.md", "--store", sqlite_url)
    assert report.returncode == 0 and report.stdout.startswith("# storage") and "part 2" in report.stdout


def test_a_killed_workers_task_shows_stalled_at_once_on_its_host(tmp_path: Path, sqlite_url: str) -> None:
    """kill -9 of a worker (its sessions die with it): on the same host ``ls`` says the task is
    stalled right away -- not "running, heartbeat 29 s ago" until the 30 s claim expires."""
    tid = _submit(tmp_path, sqlite_url, "--param", "steps=20", "--param", "sleep=0.5")["task_id"]
    w = start_worker(tmp_path, sqlite_url)
    wait_until(lambda: len(side_log(tmp_path)) >= 1, 60, "a step")
    w.kill()
    w.wait(timeout=30)
    def status() -> str:
        return {t["task_id"]: t["status"] for t in json.loads(cli(tmp_path, "ls", "--store", sqlite_url,
                                                                   "--json").stdout)}[tid]
    got = wait_until(lambda: status().startswith("stalled") and status(), 10, "stalled")
    assert "died" in got and "takes it over" in got, got


LOGGING_TASK = '''
import overnight

task = overnight.Task("noisy", goal="logs, then fails")

@task.step
def first(ctx):
    ctx.log.info("fetched 3 sources")
    return 1

@task.step(retries=1)
def second(ctx):
    raise RuntimeError("the API said no")
'''


def test_a_workers_log_names_each_tasks_step_logs_retries_and_the_failures_traceback(tmp_path: Path,
                                                                                    sqlite_url: str) -> None:
    (tmp_path / "noisy.py").write_text(LOGGING_TASK)
    assert cli(tmp_path, "submit", "noisy.py", "--store", sqlite_url).returncode == 0
    w = start_worker(tmp_path, sqlite_url, "--idle-exit", "1")
    assert w.wait(timeout=120) == 0
    log = (tmp_path / "w.err").read_text()
    assert "task noisy: first: fetched 3 sources" in log  # ctx.log.info, named by task
    assert "task noisy: retrying second: RuntimeError: the API said no" in log
    assert "task noisy: Traceback (most recent call last):" in log and 'raise RuntimeError("the API said no")' in log
    assert "task noisy failed: step 'second' failed after 2 attempt(s)" in log
    assert "stopped (1 task(s) claimed, 0 session death(s), 1 parked)" in log  # a step that failed for good parks it


@pytest.mark.slow
def test_a_worker_id_in_use_by_a_live_worker_is_refused(tmp_path: Path, sqlite_url: str) -> None:
    first = start_worker(tmp_path, sqlite_url, "--worker-id", "same", name="first")
    try:
        wait_until(lambda: "same" in cli(tmp_path, "workers", "--store", sqlite_url).stdout, 60, "the first worker")
        second = cli(tmp_path, "worker", "--store", sqlite_url, "--worker-id", "same", "--idle-exit", "1")
        assert second.returncode == 2
        assert f"worker id 'same' is in use by pid {first.pid}" in second.stderr
    finally:
        stop(first, signal.SIGTERM)
    # once it stopped, the id is free again
    again = cli(tmp_path, "worker", "--store", sqlite_url, "--worker-id", "same", "--idle-exit", "1")
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("medium", ["sqlite", "postgres"])
def test_workers_started_at_once_with_one_id_get_it_once(tmp_path: Path, medium: str, request) -> None:
    """The id check and the registration are one transaction: of four workers started together with
    one ``--worker-id``, exactly one runs; the others are refused (exit 2) -- not two rows in one."""
    if medium == "sqlite":
        store = request.getfixturevalue("sqlite_url")
    else:
        url, schema = request.getfixturevalue("pg_schema")
        store = f"{url}?schema={schema}"
    procs = [start_worker(tmp_path, store, "--worker-id", "race", "--idle-exit", "6", name=f"r{i}") for i in range(4)]
    codes = [p.wait(timeout=180) for p in procs]
    assert sorted(codes) == [0, 2, 2, 2], (codes, [(tmp_path / f"r{i}.err").read_text()[-300:] for i in range(4)])
    for i, code in enumerate(codes):
        if code == 2:
            assert "worker id 'race' is in use by pid" in (tmp_path / f"r{i}.err").read_text()


@pytest.mark.parametrize("bad", ["a\nb", "\x1b[31mred", "   ", "x" * 201])
def test_a_worker_id_that_is_not_a_name_is_refused(tmp_path: Path, sqlite_url: str, bad: str) -> None:
    res = cli(tmp_path, "worker", "--store", sqlite_url, "--worker-id", bad, "--idle-exit", "1")
    assert res.returncode == 2 and "is not a name" in res.stderr and "Traceback" not in res.stderr


def test_a_workers_row_edited_by_hand_does_not_break_the_listing(tmp_path: Path, sqlite_url: str) -> None:
    import sqlite3

    assert cli(tmp_path, "worker", "--store", sqlite_url, "--worker-id", "w1", "--idle-exit", "1").returncode == 0
    with sqlite3.connect(sqlite_url.removeprefix("sqlite://")) as db:
        assert db.execute("UPDATE workers SET queues='notjson'").rowcount == 1
    res = cli(tmp_path, "workers", "--store", sqlite_url, "--json", "--all")
    assert res.returncode == 0 and json.loads(res.stdout)[0]["queues"] == ["notjson"], res.stderr


def test_a_killed_worker_on_this_machine_is_listed_as_dead_at_once(tmp_path: Path, sqlite_url: str) -> None:
    """``overnight workers`` after ``kill -9`` of a worker on this machine: ``dead`` (its pid no
    longer runs), not ``running`` until 90 s pass; left out of the live list, kept by ``--all``."""
    w = start_worker(tmp_path, sqlite_url, "--worker-id", "doomed", name="doomed")
    try:
        wait_until(lambda: "doomed" in cli(tmp_path, "workers", "--store", sqlite_url).stdout, 60, "the worker")
    finally:
        stop(w, signal.SIGKILL)
    (row,) = json.loads(cli(tmp_path, "workers", "--store", sqlite_url, "--json", "--all").stdout)
    assert row["state"] == "dead" and row["recorded_state"] == "running" and row["pid"] == w.pid
    assert json.loads(cli(tmp_path, "workers", "--store", sqlite_url, "--json").stdout) == []


@pytest.mark.slow
def test_an_idle_exit_worker_waits_for_a_killed_workers_claim_and_runs_the_task(tmp_path: Path, sqlite_url: str) -> None:
    """A worker started with ``--idle-exit`` right after another was killed does not exit while
    the dead worker's claim runs out: it waits, then takes the task over and completes it."""
    tid = _submit(tmp_path, sqlite_url, "--param", "steps=20", "--param", "sleep=0.2")["task_id"]
    # a lease long enough that the dead worker's claim (heartbeat every third of it) outlives the
    # second worker's start on a loaded machine (~2-4 s at load 7 on 2 cores): else there is no wait
    w = start_worker(tmp_path, sqlite_url, "--lease", "9", name="w1")
    wait_until(lambda: len(side_log(tmp_path)) >= 2, 60, "two steps")
    stop(w, signal.SIGKILL)
    assert queue_rows(sqlite_url)[tid].status == "running"  # the dead worker's claim, not run out yet
    w2 = start_worker(tmp_path, sqlite_url, "--idle-exit", "0.5", name="w2")
    assert w2.wait(timeout=120) == 0
    assert queue_rows(sqlite_url)[tid].status == "complete"
    assert "--idle-exit waits: task" in (tmp_path / "w2.err").read_text()
