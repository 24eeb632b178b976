"""Workers whose clocks disagree, on a shared PostgreSQL store: leases and queue claims are set and
judged by the server's clock, so a machine whose clock runs ahead never takes a live holder's lease
or claim early, and one whose clock runs behind does not lose its own.

Each skewed side is a real process whose ``time.time`` runs ``SKEW_S`` off (set before overnight
is imported, so every reading of the wall clock in it is skewed, as on a machine with a wrong
clock). On SQLite every writer is on one host and shares its clock; nothing changes there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SKEW_S = 120
"""How far off the skewed process's clock is: beyond any lease or claim TTL used here (30 s)."""

TTL_MS = 30_000

_SKEWED = textwrap.dedent("""
    import json, sys, time
    _real = time.time
    time.time = lambda: _real() + float(sys.argv[1])   # this machine's clock is wrong
    from overnight.errors import TaskBusy
    from overnight.store import open_store
    from overnight.store.leases import Holder
    from overnight.store.queue_open import queue_for
    store = open_store(sys.argv[2])
    action = sys.argv[3]
    out = {}
    if action == "acquire":
        try:
            lease = store.acquire_lease("t", "main", "skewed", Holder.current().to_json(), %(ttl)d)
            out = {"took": True, "expires_at_ms": lease.expires_at_ms}
        except TaskBusy as exc:
            out = {"took": False, "message": exc.message}
    elif action == "hold":  # acquire, renew once, and leave the lease held (the process is gone after)
        lease = store.acquire_lease("t", "main", "skewed", Holder.current().to_json(), %(ttl)d)
        lease = store.renew_lease(lease, %(ttl)d)
        out = {"expires_at_ms": lease.expires_at_ms}
    elif action == "claim":
        task = queue_for(store).claim("skewed-worker", ["default"], %(ttl)d)
        out = {"claimed": task.task_id if task else None}
    elif action == "claim-and-beat":
        q = queue_for(store)
        task = q.claim("skewed-worker", ["default"], %(ttl)d)
        q.heartbeat(task.task_id, task.claim_token, %(ttl)d)
        out = {"claimed": task.task_id, "expires": q.get(task.task_id).claim_expires_ms}
    out["clock_ms"] = store.clock_ms()
    out["own_ms"] = int(time.time() * 1000)
    store.close()
    print(json.dumps(out))
""") % {"ttl": TTL_MS}


def _skewed(skew_s: float, url: str, action: str) -> dict:
    """Run ``action`` in a fresh process whose wall clock is ``skew_s`` seconds off."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", _SKEWED, str(skew_s), url, action], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def pg_store(pg_schema):
    from overnight.store import open_store

    url, schema = pg_schema
    store_url = f"{url}?schema={schema}"
    with open_store(store_url) as s:
        yield store_url, s


def _hold_here(store) -> None:
    from overnight.store.leases import Holder

    store.acquire_lease("t", "main", "here", Holder.current().to_json(), TTL_MS)  # this process: alive


def test_a_process_whose_clock_runs_ahead_does_not_take_a_live_lease(pg_store) -> None:
    url, store = pg_store
    _hold_here(store)
    got = _skewed(SKEW_S, url, "acquire")
    assert got["own_ms"] - got["clock_ms"] > (SKEW_S - 10) * 1000  # the skew is real in that process
    assert not got["took"], got
    assert "is busy" in got["message"] and "expires in" in got["message"]
    assert store.read_lease("t", "main").holder_id == "here"


def test_a_holder_whose_clock_runs_behind_keeps_its_lease(pg_store) -> None:
    from overnight.errors import TaskBusy
    from overnight.store.leases import Holder

    url, store = pg_store
    held = _skewed(-SKEW_S, url, "hold")
    # its expiry is the server's now + TTL, not its own (two minutes in the past)
    assert held["expires_at_ms"] > store.clock_ms() + TTL_MS // 2
    # the holder is another process on this host that has exited: is_gone() would let a takeover in;
    # make it a holder on another machine, which only its lease's expiry can vouch for
    lease = store.read_lease("t", "main")
    other = json.loads(lease.holder)
    other["host"] = "another-machine"
    with store.transaction() as cur:
        cur.execute(store.sql("UPDATE {s}.leases SET holder=convert_to(%s, 'UTF8')"), (json.dumps(other),))
    with pytest.raises(TaskBusy):
        store.acquire_lease("t", "main", "here", Holder.current().to_json(), TTL_MS)


def _submit(store, task_id: str) -> None:
    from overnight.store.queue import QueuedTask
    from overnight.store.queue_open import queue_for

    queue_for(store).submit(QueuedTask(task_id=task_id, entry="tasks/job.py:task", params={}))


def test_a_worker_whose_clock_runs_ahead_does_not_take_a_live_claim(pg_store) -> None:
    from overnight.store.queue_open import queue_for

    url, store = pg_store
    _submit(store, "job-1")
    q = queue_for(store)
    mine = q.claim("worker-here", ["default"], TTL_MS)
    assert mine is not None and mine.task_id == "job-1"
    assert _skewed(SKEW_S, url, "claim")["claimed"] is None
    row = q.get("job-1")
    assert (row.status, row.worker_id, row.claim_token) == ("running", "worker-here", mine.claim_token)
    q.heartbeat("job-1", mine.claim_token, TTL_MS)  # still this worker's claim


def test_a_worker_whose_clock_runs_behind_keeps_its_claim(pg_store) -> None:
    from overnight.store.queue_open import queue_for

    url, store = pg_store
    _submit(store, "job-2")
    theirs = _skewed(-SKEW_S, url, "claim-and-beat")
    assert theirs["claimed"] == "job-2"
    assert theirs["expires"] > store.clock_ms() + TTL_MS // 2  # by the server's clock
    assert queue_for(store).claim("worker-here", ["default"], TTL_MS) is None


def test_the_store_clock_is_the_servers_on_postgres_and_this_machines_elsewhere(pg_store, tmp_path: Path) -> None:
    """What ``overnight ls`` and ``workers`` judge ages by (a listing reads it once)."""
    from overnight.store.sqlite import SQLiteStore
    from overnight.store.leases import now_ms

    url, _ = pg_store
    skewed = _skewed(SKEW_S, url, "claim")  # nothing queued: claims nothing, reads both clocks
    assert abs(skewed["clock_ms"] - now_ms()) < 60_000  # the server's, not its own two minutes ahead
    with SQLiteStore(tmp_path / "s.db") as s:
        assert abs(s.clock_ms() - now_ms()) < 5_000


# --- the commands of a machine whose clock is off: submit, a session's release, `overnight workers` ----------

_RUN_SKEWED = ("import runpy, sys, time; _real = time.time; _skew = float(sys.argv[1]); "
               "time.time = lambda: _real() + _skew; del sys.argv[:2]; "  # this machine's clock is wrong
               "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def _run_skewed(skew_s: float, cwd: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` in ``cwd``, in a process whose wall clock is ``skew_s`` seconds off."""
    from _fleet import fleet_env

    return subprocess.run([sys.executable, "-c", _RUN_SKEWED, str(skew_s), module, *args], cwd=cwd,
                          env=fleet_env(cwd), capture_output=True, text=True, timeout=120)


def _start_skewed(skew_s: float, cwd: Path, module: str, *args: str) -> subprocess.Popen:
    """:func:`_run_skewed`, started in the background (its output in ``cwd/skewed.err``)."""
    from _fleet import fleet_env

    with open(cwd / "skewed.err", "ab") as log:
        return subprocess.Popen([sys.executable, "-c", _RUN_SKEWED, str(skew_s), module, *args], cwd=cwd,
                                env=fleet_env(cwd), stdout=log, stderr=log)


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_submit_not_before_a_relative_time_counts_from_the_store_clock(pg_store, tmp_path: Path,
                                                                       skew_s: int) -> None:
    """``overnight submit --not-before +60s`` from a machine whose clock is two minutes off: the
    task starts a minute from now by the clock claims are judged by -- not at once (behind), not
    in three minutes (ahead). An absolute time stays as given."""
    from _fleet import project
    from overnight.store.queue_open import queue_for

    url, store = pg_store
    project(tmp_path)
    done = _run_skewed(skew_s, tmp_path, "overnight", "submit", "tasks/chaos.py", "--store", url, "--id", "later",
                       "--not-before", "+60s", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert 40_000 < row["not_before_ms"] - store.clock_ms() <= 60_000, row
    assert queue_for(store).claim("worker-here", ["default"], TTL_MS) is None  # not claimable yet
    done = _run_skewed(skew_s, tmp_path, "overnight", "submit", "tasks/chaos.py", "--store", url, "--id", "at",
                       "--not-before", "2030-01-01T00:00", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["not_before_ms"] == 1_893_456_000_000


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_a_task_busy_elsewhere_is_queued_again_a_lease_later_by_the_store_clock(pg_store, tmp_path: Path,
                                                                               skew_s: int) -> None:
    """A claimed task whose lease another live process holds (an ``overnight run`` here) is put
    back ``queued`` for one lease's length by the store's clock, whatever the session's clock says."""
    from _fleet import project
    from overnight.store.leases import Holder
    from overnight.store.queue import QueuedTask
    from overnight.store.queue_open import queue_for

    url, store = pg_store
    project(tmp_path)
    q = queue_for(store)
    q.submit(QueuedTask(task_id="busy", entry="tasks/chaos.py:task", params={}))
    claim = q.claim("skewed-worker", ["default"], TTL_MS)
    store.acquire_lease("busy", "main", "here", Holder.current().to_json(), TTL_MS)  # this process: alive
    done = _run_skewed(skew_s, tmp_path, "overnight.fleet.child", url, "busy", str(claim.claim_token), str(TTL_MS),
                       str(os.getpid()))
    assert done.returncode == 0, done.stderr
    row = q.get("busy")
    assert row.status == "queued" and row.claim_token == claim.claim_token
    assert TTL_MS // 2 < row.not_before_ms - store.clock_ms() <= TTL_MS, row


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
def test_overnight_workers_ages_a_skewed_worker_by_the_store_clock(pg_store, tmp_path: Path, skew_s: int) -> None:
    """``overnight workers`` on a worker whose machine's clock is two minutes off: listed
    ``running`` (not ``dead``), started seconds ago (not minus two minutes, nor two minutes ago)."""
    from _fleet import cli, project, stop, wait_until
    from overnight import api

    url, store = pg_store
    project(tmp_path)
    proc = _start_skewed(skew_s, tmp_path, "overnight", "worker", "--store", url, "--worker-id", "skewed")
    try:
        wait_until(lambda: any(w.worker_id == "skewed" for w in api.workers(store=url)), 60,
                   "the skewed worker registers")
        listed = cli(tmp_path, "workers", "--store", url, "--json")
        assert listed.returncode == 0, listed.stderr
        rows = [w for w in json.loads(listed.stdout) if w["worker_id"] == "skewed"]
        assert [w["state"] for w in rows] == ["running"], (listed.stdout, (tmp_path / "skewed.err").read_text())
        assert 0 <= store.clock_ms() - rows[0]["started_ms"] <= 30_000, rows
    finally:
        stop(proc, signal.SIGTERM)


def test_a_workers_start_is_compared_with_its_pid_on_this_machines_clock() -> None:
    """A worker row's start is by the store's clock, its pid's start by this machine's: ``dead``
    (a pid that started well after the row says, i.e. recycled) is judged after shifting by the
    offset between the two clocks, so a machine whose clock is off does not see its workers dead."""
    import socket
    import time

    from overnight.store.leases import now_ms
    from overnight.store.queue import WorkerRow, worker_process_gone

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        store_ms = now_ms() - SKEW_S * 1000  # a store clock two minutes behind this machine's
        w = WorkerRow("w", socket.gethostname(), proc.pid, store_ms, store_ms, ["default"], 1)
        assert not worker_process_gone(w, SKEW_S * 1000)  # shifted onto this machine's clock: it runs
        assert worker_process_gone(w, 0)  # unshifted, it would seem to have started two minutes late
    finally:
        proc.kill()
        proc.wait()
