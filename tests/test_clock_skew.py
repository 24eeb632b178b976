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
