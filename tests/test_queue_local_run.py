"""A submitted task that is run here (``overnight run`` / ``overnight resume``) before any worker
claims it: once its head is complete, its queue row says ``complete`` (reason: completed by a run
outside the queue), ``status`` / ``ls`` say complete, and no worker claims it. A row a worker holds
(``running``) is never changed by a run here; a worker that claims a task that is already complete
finishes its row ``complete`` without running a step. Real ``python -m overnight`` processes,
workers included, against real SQLite files and PostgreSQL schemas (each dropped afterwards);
nothing is mocked."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from _fleet import cli, project, queue_rows, store_url

OUTSIDE = "completed by a run outside the queue"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: Any, tmp_path: Path) -> str:
    return store_url(request, tmp_path)


STEPS = '''
import os
import overnight

task = overnight.Task("steps", goal="a few steps", level="durable")

@task.step
def plan(ctx):
    for i in range(int(ctx.params.get("n", 3))):
        ctx.add_step("work", i=i)

@task.step(planned=False)
def work(ctx, i: int):
    with open(os.environ["SIDE_LOG"], "a") as f:
        f.write(f"{ctx.task_id} {i} {os.getpid()}\\n")
    return i
'''


def _project(tmp_path: Path) -> Path:
    project(tmp_path)
    (tmp_path / "tasks" / "steps.py").write_text(STEPS)
    return tmp_path


def _side(tmp_path: Path) -> str:
    path = tmp_path / "side.log"
    return path.read_text() if path.exists() else ""


def _status(tmp_path: Path, url: str, task_id: str) -> str:
    out = cli(tmp_path, "status", task_id, "--store", url)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _ls(tmp_path: Path, url: str) -> dict[str, Any]:
    out = cli(tmp_path, "ls", "--store", url, "--json")
    assert out.returncode == 0, out.stderr
    return {t["task_id"]: t for t in json.loads(out.stdout)}


def _place(tmp_path: Path, url: str, task_id: str) -> dict[str, Any]:
    """Where a submitted, not started task stands in the queue (``status --json``'s ``queue``)."""
    out = cli(tmp_path, "status", task_id, "--store", url, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["queue"]


def _reads_complete(tmp_path: Path, url: str, task_id: str, total: int) -> None:
    """The queue row, ``status`` and ``ls`` all say complete; nothing says queued."""
    row = queue_rows(url)[task_id]
    assert (row.status, row.reason, row.attempts, row.claim_token) == ("complete", OUTSIDE, 0, 0), row
    status = _status(tmp_path, url, task_id)
    assert status.splitlines()[0].startswith(f"{task_id} (main): complete, {total}/{total} steps"), status
    assert "queued" not in status, status
    listed = _ls(tmp_path, url)[task_id]
    assert (listed["status"], listed["status_kind"], listed["entry"]) == ("complete", "complete", None), listed


def _no_worker_runs_it(tmp_path: Path, url: str, task_id: str) -> None:
    """A worker started now finds nothing to claim: the row stays as it is, no step runs."""
    before, log = queue_rows(url)[task_id], _side(tmp_path)
    out = cli(tmp_path, "worker", "--store", url, "--idle-exit", "1", "--max-tasks", "1")
    assert out.returncode == 0, out.stderr
    after = queue_rows(url)[task_id]
    assert (after.status, after.attempts, after.claim_token, after.worker_id) == \
        ("complete", before.attempts, before.claim_token, None), (after, out.stderr)
    assert _side(tmp_path) == log
    assert f"claimed {task_id}" not in out.stderr and f"task {task_id}" not in out.stderr, out.stderr


# 1. submit, then `overnight run FILE.py` here before a worker claims it


def test_run_here_of_a_queued_task_completes_its_row(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    out = cli(tmp_path, "submit", "tasks/steps.py", "--store", store)
    assert out.returncode == 0, out.stderr
    out = cli(tmp_path, "submit", "tasks/steps.py", "--id", "later", "--store", store)
    assert out.returncode == 0, out.stderr
    assert queue_rows(store)["steps"].status == "queued"
    assert _place(tmp_path, store, "later")["ahead"] == 1
    out = cli(tmp_path, "run", "tasks/steps.py", "--store", store, "-q")
    assert out.returncode == 0, out.stderr
    assert len(_side(tmp_path).splitlines()) == 3
    _reads_complete(tmp_path, store, "steps", 4)
    # the task submitted after it no longer waits behind it
    assert _place(tmp_path, store, "later")["ahead"] == 0
    assert cli(tmp_path, "cancel", "later", "--store", store).returncode == 0  # the worker below: nothing to claim
    _no_worker_runs_it(tmp_path, store, "steps")
    # retry / cancel of it: nothing to do, as for any complete task
    out = cli(tmp_path, "retry", "steps", "--store", store)
    assert (out.returncode, out.stdout.strip()) == (0, "steps: already complete, nothing to queue"), out.stderr
    assert queue_rows(store)["steps"].status == "complete"


# 2. submit with params (its own id), run part of it here, then `overnight resume TASK` finishes it


def test_resume_here_of_a_queued_task_completes_its_row(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    out = cli(tmp_path, "submit", "tasks/steps.py", "--id", "r1", "--param", "n=5", "--store", store,
              "--not-before", "+2h")  # not claimable yet either: a queued row all the same
    assert out.returncode == 0, out.stderr
    out = cli(tmp_path, "run", "tasks/steps.py", "--id", "r1", "--param", "n=5", "--store", store, "-q",
              "--max-steps", "2")
    assert out.returncode == 75, (out.returncode, out.stderr)
    # stopped early: the row is still the workers' to run
    row = queue_rows(store)["r1"]
    assert (row.status, row.reason) == ("queued", None), row
    assert "queued" in _status(tmp_path, store, "r1")
    out = cli(tmp_path, "resume", "r1", "--store", store, "-q")
    assert out.returncode == 0, out.stderr
    assert len(_side(tmp_path).splitlines()) == 5
    _reads_complete(tmp_path, store, "r1", 6)
    _no_worker_runs_it(tmp_path, store, "r1")


# 3. a row a worker holds (`running`, its claim live) is never changed by a run here


def _open(url: str) -> Any:
    from overnight.store import open_store

    return open_store(url)


def test_run_here_leaves_a_claimed_row_alone(tmp_path: Path, store: str, monkeypatch: Any) -> None:
    _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SIDE_LOG", str(tmp_path / "side.log"))
    out = cli(tmp_path, "submit", "tasks/steps.py", "--id", "held", "--store", store)
    assert out.returncode == 0, out.stderr
    from overnight.runtime.runner import Runner
    from overnight.runtime.task_code import load_task
    from overnight.store.queue_open import queue_for

    s = _open(store)
    try:
        q = queue_for(s)
        claimed = q.claim("w-live", ["default"], 600_000)  # a worker's claim, its session not started yet
        assert claimed is not None and claimed.task_id == "held"
        task = load_task("tasks/steps.py")
        task.id = "held"
        result = Runner(task, s, handle_signals=False).run()
        assert result.status == "complete"
        # the run here completed the task, but the row is the worker's: status, token, claim untouched
        assert not q.settle("held", "complete")
        row = q.get("held")
        assert (row.status, row.reason, row.claim_token, row.worker_id, row.claim_expires_ms) == \
            ("running", None, claimed.claim_token, "w-live", claimed.claim_expires_ms), row
        # the worker then finishes its claim as it would: complete
        assert q.finish("held", claimed.claim_token, "complete")
    finally:
        s.close()
    assert queue_rows(store)["held"].status == "complete"


# 4. a settle of a queued row is fenced at the queue level too: only `queued` (or parked) rows move


def test_settle_moves_only_unclaimed_rows(tmp_path: Path, store: str) -> None:
    from overnight.store.queue import QueuedTask
    from overnight.store.queue_open import queue_for, settle_run

    s = _open(store)
    try:
        q = queue_for(s)
        for tid in ("a", "b", "c"):
            q.submit(QueuedTask(task_id=tid, entry="tasks/steps.py"))
        running = q.claim("w1", ["default"], 600_000)
        assert running is not None and running.task_id == "a"
        assert not settle_run(s, "a", "complete")  # held by a worker
        assert settle_run(s, "b", "complete")  # queued, unclaimed
        assert not settle_run(s, "c", "failed", "boom")  # a failure here leaves a queued row to the workers
        assert not settle_run(s, "nope", "complete")
        rows = {r.task_id: r for r in q.list()}
        assert (rows["a"].status, rows["a"].claim_token) == ("running", running.claim_token)
        assert (rows["b"].status, rows["b"].reason, rows["b"].claim_token) == ("complete", OUTSIDE, 0)
        assert (rows["c"].status, rows["c"].reason) == ("queued", None)
        # nothing claims the settled row; the next claim is c
        nxt = q.claim("w2", ["default"], 600_000)
        assert nxt is not None and nxt.task_id == "c"
        assert q.claim("w2", ["default"], 600_000) is None
    finally:
        s.close()


# 5. a worker that claims a task already complete finishes its row complete, running no step


def test_worker_claiming_a_complete_task_finishes_it_complete(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    out = cli(tmp_path, "run", "tasks/steps.py", "--id", "done1", "--store", store, "-q")
    assert out.returncode == 0, out.stderr
    log = _side(tmp_path)
    assert len(log.splitlines()) == 3
    # a submit looks at the stored head: complete, nothing queued
    out = cli(tmp_path, "submit", "tasks/steps.py", "--id", "done1", "--store", store)
    assert out.returncode == 0 and "already complete, nothing to queue" in out.stdout, (out.stdout, out.stderr)
    assert "done1" not in queue_rows(store)
    # a row queued all the same (by an older version's submit, or a run whose settle failed): a
    # worker claims it and finishes it without running a step
    from overnight.store import open_store
    from overnight.store.queue import QueuedTask
    from overnight.store.queue_open import queue_for

    s = open_store(store)
    try:
        queue_for(s).submit(QueuedTask(task_id="done1", entry="tasks/steps.py:task", params={}))
    finally:
        s.close()
    assert queue_rows(store)["done1"].status == "queued"
    out = cli(tmp_path, "worker", "--store", store, "--idle-exit", "1", "--max-tasks", "1")
    assert out.returncode == 0, out.stderr
    row = queue_rows(store)["done1"]
    assert (row.status, row.attempts) == ("complete", 1), (row, out.stderr)
    assert row.reason is not None and "already complete" in row.reason, row
    assert _side(tmp_path) == log  # no step ran again
    assert _status(tmp_path, store, "done1").splitlines()[0].startswith("done1 (main): complete, 4/4 steps")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


SLOW = '''
import os, time
import overnight

task = overnight.Task("slow", goal="a step that waits", level="durable")

@task.step
def first(ctx):
    ctx.state["n"] = 1

@task.step
def wait(ctx):
    if os.environ.get("SLOW_WAIT"):  # the run here waits (and is killed); a worker's run does not
        with open(os.environ["SIDE_LOG"], "a") as f:
            f.write("waiting\\n")
        time.sleep(120)
'''


@pytest.mark.slow  # waits for the killed run's lease to expire (30 s)
def test_a_run_here_killed_leaves_its_queued_row_saying_when_a_worker_can_claim_it(tmp_path: Path, store: str) -> None:
    """Submitted, then run here and killed -9 mid-step: its row is still ``queued``, but no worker
    can claim it until the dead run's task lease expires -- ``status`` and a waiting worker say so,
    not ``queued`` / "starts in 0 s"."""
    import signal
    import subprocess

    from _fleet import CLI, fleet_env, wait_until

    _project(tmp_path)
    (tmp_path / "tasks" / "slow.py").write_text(SLOW)
    assert cli(tmp_path, "submit", "tasks/slow.py", "--store", store, "--not-before", "+1s").returncode == 0
    run = subprocess.Popen([*CLI, "run", "tasks/slow.py", "--store", store, "-q"], cwd=tmp_path,
                           env=fleet_env(tmp_path, SLOW_WAIT="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: "waiting" in _side(tmp_path), 60, "the run's second step")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    status = _status(tmp_path, store, "slow").splitlines()[0]
    assert "queued (a run of it outside the queue died; a worker can claim it once that run's lease expires in" \
        in status, status
    out = cli(tmp_path, "worker", "--store", store, "--idle-exit", "1", "--max-tasks", "1", timeout=180)
    assert out.returncode == 0, out.stderr
    assert "starts once the task lease of a run outside the queue expires" in out.stderr, out.stderr
    assert _status(tmp_path, store, "slow").splitlines()[0].startswith("slow (main): complete")
