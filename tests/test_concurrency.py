"""Several real processes on one SQLite store: leases, busy errors, takeover after kill -9, and
resuming from the latest head (H06, H09)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from overnight.store.leases import now_ms
from overnight.store.sqlite import SQLiteStore
from overnight.chain.read import load_head

from _procs import assert_linear_history, cli, read_events, spawn, wait_for

TASK_ID = "conc"

TASK_FILE = '''
import os, time
import overnight

task = overnight.Task({task_id!r}, goal="concurrency test task", expected_span="3h")


@task.step
def plan(ctx):
    for i in range({n}):
        ctx.add_step("work", name=f"work-{{i}}", i=i)


@task.step(planned=False)
def work(ctx, i):
    with open({log!r}, "a") as fh:
        fh.write(f"start {{os.getpid()}} work-{{i}}\\n")
    time.sleep({delay})
    with open({log!r}, "a") as fh:
        fh.write(f"end {{os.getpid()}} work-{{i}}\\n")
    ctx.write_text(f"out/{{i}}.txt", f"result {{i}}\\n")
    return i
'''


def _task(tmp: Path, n: int, delay: float) -> tuple[Path, Path, str]:
    log = tmp / "work.log"
    f = tmp / "conctask.py"
    f.write_text(TASK_FILE.format(task_id=TASK_ID, n=n, delay=delay, log=str(log)))
    return f, log, f"sqlite://{tmp / 'store.db'}"


def _log(log: Path) -> list[tuple[str, int, str]]:
    if not log.exists():
        return []
    return [(a, int(b), c) for a, b, c in (line.split() for line in log.read_text().splitlines())]


@pytest.mark.parametrize("start", ["resume", "fresh"])
@pytest.mark.slow
def test_H06_two_processes_resume_the_same_task_at_once(tmp_path: Path, start: str) -> None:
    task_file, log, store = _task(tmp_path, n=8, delay=0.4)
    if start == "resume":
        first = cli("run", str(task_file), "--store", store, "--max-steps", "1", "-q", cwd=tmp_path)
        assert first.returncode == 75, first.stderr
        argv = ("resume", TASK_ID, "--store", store)
    else:  # both race to create the task in a store that does not exist yet
        argv = ("run", str(task_file), "--store", store)

    procs, t0 = [], time.monotonic()
    for k in range(2):
        procs.append(spawn(*argv, cwd=tmp_path, stderr_path=tmp_path / f"err-{k}.txt"))
    ended: dict[int, float] = {}
    deadline = t0 + 60
    while len(ended) < 2 and time.monotonic() < deadline:
        for k, p in enumerate(procs):
            if k not in ended and p.poll() is not None:
                ended[k] = time.monotonic() - t0
        time.sleep(0.01)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert len(ended) == 2, "a process did not finish within 60 s"
    codes = [p.returncode for p in procs]
    errs = [(tmp_path / f"err-{k}.txt").read_text() for k in range(2)]
    assert sorted(codes) == [0, 4], f"exit codes {codes}; stderr:\n{errs[0]}\n---\n{errs[1]}"
    loser = codes.index(4)
    winner = 1 - loser
    msg = errs[loser]
    assert "busy" in msg and "held by" in msg, msg
    assert f"pid {procs[winner].pid}" in msg, f"the busy error does not name the holder: {msg}"
    assert ended[loser] < 15, f"the busy process took {ended[loser]:.1f} s to give up"
    assert ended[loser] < ended[winner], "the loser waited for the winner instead of failing fast"
    print(f"\n[H06 {start}] loser gave up after {ended[loser]:.2f} s: {' '.join(msg.split())}")

    # the loser ran nothing; every step ran exactly once
    runs = _log(log)
    assert procs[loser].pid not in {pid for _, pid, _ in runs}
    starts = [name for kind, _, name in runs if kind == "start"]
    assert sorted(starts) == sorted(f"work-{i}" for i in range(8))

    # history never forks
    with SQLiteStore(tmp_path / "store.db") as s:
        chain = assert_linear_history(s, TASK_ID)
        loaded, fallback = load_head(s, TASK_ID)
        assert fallback is None
        assert not loaded.state_tree["todo"]
        assert len(chain) == 1 + 1 + 8  # create + plan + 8 work steps
        live = s._db.execute("SELECT COUNT(*) FROM leases WHERE expires_at_ms > ?", (now_ms(),)).fetchone()[0]
        assert live == 0, "a finished run left its lease behind"


def test_lease_of_a_sigkilled_process_is_taken_over_at_once(tmp_path: Path) -> None:
    task_file, log, store = _task(tmp_path, n=6, delay=0.4)
    events1, events2 = tmp_path / "ev1.jsonl", tmp_path / "ev2.jsonl"
    p = spawn("run", str(task_file), "--store", store, "--events", str(events1), "-q", cwd=tmp_path,
              stderr_path=tmp_path / "err1.txt")
    try:
        wait_for(lambda: p.poll() is not None or sum(e["kind"] == "step_end" for e in read_events(events1)) >= 2,
                 timeout=30, what="two steps to finish")
        assert p.poll() is None, (tmp_path / "err1.txt").read_text()
        time.sleep(0.1)  # mid-step
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()

    # the dead process still holds an unexpired lease: waiting it out would take ~30 s
    con = sqlite3.connect(tmp_path / "store.db")
    row = con.execute("SELECT holder, expires_at_ms FROM leases WHERE task_id=?", (TASK_ID,)).fetchone()
    con.close()
    assert row is not None, "the killed run left no lease (nothing to take over)"
    assert json.loads(row[0])["pid"] == p.pid
    assert row[1] - now_ms() > 20_000, "the lease is about to expire anyway; the test would prove nothing"

    t0 = time.monotonic()
    q = spawn("resume", TASK_ID, "--store", store, "--events", str(events2), "-q", cwd=tmp_path,
              stderr_path=tmp_path / "err2.txt")
    try:
        wait_for(lambda: q.poll() is not None or any(e["kind"] == "resume" for e in read_events(events2)),
                 timeout=20, what="the resumed run to start")
        started = time.monotonic() - t0
        rc = q.wait(timeout=60)
    finally:
        if q.poll() is None:
            q.kill()
            q.wait()
    assert rc == 0, (tmp_path / "err2.txt").read_text()
    assert started < 5, f"took {started:.1f} s to take over the dead holder's lease"
    # only the step in flight ran twice
    starts = [name for kind, _, name in _log(log) if kind == "start"]
    repeated = {n for n in starts if starts.count(n) > 1}
    assert len(repeated) <= 1, f"steps run more than once: {repeated}"
    assert sorted(set(starts)) == sorted(f"work-{i}" for i in range(6))
    with SQLiteStore(tmp_path / "store.db") as s:
        assert_linear_history(s, TASK_ID)


def _show(tmp: Path, store: str) -> dict:
    r = cli("show", TASK_ID, "--store", store, "--json", cwd=tmp)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _head_seq(rep: dict) -> tuple[str, int]:
    head = rep["branches"]["main"]
    seq = next(c["seq"] for c in rep["chain"] if c["checkpoint_id"] == head)
    return head, seq


def test_H09_three_resumes_in_a_row_each_start_from_the_latest_head(tmp_path: Path) -> None:
    task_file, log, store = _task(tmp_path, n=10, delay=0.01)
    first = cli("run", str(task_file), "--store", store, "--max-steps", "2", "-q", cwd=tmp_path)
    assert first.returncode == 75, first.stderr
    rep = _show(tmp_path, store)
    head, seq = _head_seq(rep)
    done = rep["done"]
    assert (seq, done) == (2, 2)  # create, plan, work-0
    for k in range(1, 4):
        events = tmp_path / f"ev{k}.jsonl"
        r = cli("resume", TASK_ID, "--store", store, "--max-steps", "2", "--events", str(events), "-q", cwd=tmp_path)
        assert r.returncode == 75, f"resume #{k}: exit {r.returncode}\n{r.stderr}"
        evs = read_events(events)
        resumes = [e for e in evs if e["kind"] == "resume"]
        assert len(resumes) == 1
        assert resumes[0]["checkpoint_id"] == head, f"resume #{k} started from {resumes[0]['checkpoint_id']}, not the head {head}"
        assert resumes[0]["done"] == done
        ran = [e["step"] for e in evs if e["kind"] == "step_start"]
        assert ran == [f"work-{done - 1}", f"work-{done}"], f"resume #{k} ran {ran}"
        rep = _show(tmp_path, store)
        new_head, new_seq = _head_seq(rep)
        assert new_seq == seq + 2 and rep["done"] == done + 2, (seq, new_seq, done, rep["done"])
        ends = [e for e in evs if e["kind"] == "end"]
        assert ends and ends[-1]["checkpoint_id"] == new_head
        head, seq, done = new_head, new_seq, rep["done"]
    # nothing ran twice across the four sessions
    starts = [name for kind, _, name in _log(log) if kind == "start"]
    assert starts == [f"work-{i}" for i in range(7)]
    with SQLiteStore(tmp_path / "store.db") as s:
        chain = assert_linear_history(s, TASK_ID)
        assert chain[0].checkpoint_id == head
        sessions = [load_head(s, TASK_ID)[0].record.session.n]
        assert sessions == [4]


def test_a_commit_waits_out_a_store_locked_longer_than_its_busy_timeout(tmp_path):
    """Another process holding the SQLite write lock (a huge commit, a backup) past the busy
    timeout delays a commit; it never fails the step that already ran."""
    import subprocess
    import sys
    import time

    import overnight
    from overnight.store.sqlite import SQLiteStore

    db = tmp_path / "s.db"
    task = overnight.Task("locked", goal="g")
    ran: list[int] = []
    holders: list[subprocess.Popen] = []

    @task.step
    def work(ctx):
        ran.append(1)
        holder = subprocess.Popen([sys.executable, "-c", (
            "import sqlite3, sys, time\n"
            f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(3); db.execute('COMMIT')\n")],
            stdout=subprocess.PIPE, text=True)
        holders.append(holder)
        assert holder.stdout.readline().strip() == "locked"  # the commit of this step meets the lock
        return 1

    try:
        with SQLiteStore(db, busy_timeout_ms=300) as store:
            t0 = time.monotonic()
            result = overnight.run(task, store)
            waited = time.monotonic() - t0
    finally:
        for h in holders:
            h.wait(timeout=30)
    assert result.status == "complete" and ran == [1]
    assert waited >= 2.5  # it really waited for the lock, far past its 0.3 s busy timeout
