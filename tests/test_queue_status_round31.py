"""A new user's round on what a task's status says after it left the workers' hands: a task a
worker parked (``cancelled``, ``failed``) that ``overnight resume`` then runs here reads the latest
run's outcome -- in ``status``, ``ls --json`` and the queue row the workers and the dashboard read --
and no worker runs it again; ``overnight resume --submit`` and ``overnight retry`` of a complete task
queue nothing and say so. Real ``python -m overnight`` processes, workers included, against real
SQLite files and PostgreSQL schemas; nothing is mocked."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from _fleet import cli, project, queue_rows, start_worker, stop, store_url, wait_until


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: Any, tmp_path: Path) -> str:
    return store_url(request, tmp_path)


FLAKY = '''
import os, time
import overnight

task = overnight.Task("flaky", goal="fails while FAIL exists", level="durable")

@task.step
def plan(ctx):
    for i in range(int(ctx.params.get("n", 5))):
        ctx.add_step("work", i=i)

@task.step(planned=False, retries=1)
def work(ctx, i: int):
    with open(os.environ["SIDE_LOG"], "a") as f:
        f.write(f"{ctx.task_id} {i} {os.getpid()}\\n")
    if i == 2 and os.path.exists("FAIL"):
        raise RuntimeError(open("FAIL").read().strip())
    time.sleep(float(os.environ.get("SLOW", "0")))  # set for a worker only: a resume here is fast
    return i
'''


def _project(tmp_path: Path) -> Path:
    project(tmp_path)
    (tmp_path / "tasks" / "flaky.py").write_text(FLAKY)
    return tmp_path


def _status(tmp_path: Path, url: str, task_id: str) -> str:
    out = cli(tmp_path, "status", task_id, "--store", url)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()[0]


def _ls(tmp_path: Path, url: str) -> dict[str, Any]:
    out = cli(tmp_path, "ls", "--store", url, "--json")
    assert out.returncode == 0, out.stderr
    return {t["task_id"]: t for t in json.loads(out.stdout)}


def _no_worker_runs_it(tmp_path: Path, url: str, task_id: str) -> None:
    """A worker started now finds nothing to claim: the row's attempts stay, no step runs."""
    before = queue_rows(url)[task_id]
    log = (tmp_path / "side.log").read_text() if (tmp_path / "side.log").exists() else ""
    out = cli(tmp_path, "worker", "--store", url, "--idle-exit", "1", "--max-tasks", "1")
    assert out.returncode == 0, out.stderr
    after = queue_rows(url)[task_id]
    assert (after.status, after.attempts) == ("complete", before.attempts), (after, out.stderr)
    assert ((tmp_path / "side.log").read_text() if (tmp_path / "side.log").exists() else "") == log
    assert f"claimed {task_id}" not in out.stderr and f"task {task_id}" not in out.stderr, out.stderr


# 1a. cancel a task a worker runs, resume it here: status, ls and the queue row say complete


def test_resume_here_after_cancel_reads_complete(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    assert cli(tmp_path, "submit", "tasks/flaky.py", "--id", "c1", "--store", store,
               "--param", "n=20").returncode == 0
    w = start_worker(tmp_path, store, SLOW="0.5")  # 10 s of steps: the cancel lands long before the end
    try:
        wait_until(lambda: queue_rows(store)["c1"].status == "running" and (tmp_path / "side.log").exists(), 60,
                   "the worker to start the task")
        assert cli(tmp_path, "cancel", "c1", "--store", store).returncode == 0
        wait_until(lambda: queue_rows(store)["c1"].status == "cancelled", 60, "the worker to stop the task")
    finally:
        stop(w)
    assert _status(tmp_path, store, "c1").startswith("c1 (main): cancelled")
    out = cli(tmp_path, "resume", "c1", "--store", store, "-q")
    assert out.returncode == 0, out.stderr
    assert _status(tmp_path, store, "c1").startswith("c1 (main): complete, 21/21 steps")
    listed = _ls(tmp_path, store)["c1"]
    assert (listed["status"], listed["done"], listed["total"]) == ("complete", 21, 21)
    assert queue_rows(store)["c1"].status == "complete"
    _no_worker_runs_it(tmp_path, store, "c1")
    # retry of it now: nothing to queue (as cancel of a complete task says)
    out = cli(tmp_path, "retry", "c1", "--store", store)
    assert (out.returncode, out.stdout.strip()) == (0, "c1: already complete, nothing to queue"), out.stderr
    out = cli(tmp_path, "cancel", "c1", "--store", store)
    assert (out.returncode, out.stdout.strip()) == (0, "c1: already complete, nothing to cancel"), out.stderr


# 1b. a worker parks a task `failed`; the cause is fixed and it is resumed here


def test_resume_here_after_a_worker_parked_it_failed_reads_complete(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    (tmp_path / "FAIL").write_text("disk was full")
    assert cli(tmp_path, "submit", "tasks/flaky.py", "--id", "f1", "--store", store).returncode == 0
    out = cli(tmp_path, "worker", "--store", store, "--max-tasks", "1", "--idle-exit", "1")
    assert out.returncode == 0, out.stderr
    row = queue_rows(store)["f1"]
    assert row.status == "failed" and "disk was full" in row.reason
    assert "failed (step 'work[i=2]' failed after 2 attempt(s)" in _status(tmp_path, store, "f1")
    # a run here that fails again, for another reason: the latest failure is what status says
    (tmp_path / "FAIL").write_text("the network was down")
    out = cli(tmp_path, "resume", "f1", "--store", store, "-q")
    assert out.returncode != 0
    assert "the network was down" in _status(tmp_path, store, "f1")
    assert "the network was down" in _ls(tmp_path, store)["f1"]["status"]
    assert "the network was down" in queue_rows(store)["f1"].reason
    # the cause fixed, resumed here: complete everywhere, and no worker runs it again
    (tmp_path / "FAIL").unlink()
    out = cli(tmp_path, "resume", "f1", "--store", store, "-q")
    assert out.returncode == 0, out.stderr
    assert _status(tmp_path, store, "f1").startswith("f1 (main): complete, 6/6 steps")
    assert _ls(tmp_path, store)["f1"]["status"] == "complete"
    row = queue_rows(store)["f1"]
    assert (row.status, row.reason) == ("complete", None)
    _no_worker_runs_it(tmp_path, store, "f1")


def test_retry_still_queues_a_parked_task_for_the_workers(tmp_path: Path) -> None:
    """`overnight retry` of a task parked `failed` queues it; a worker completes it."""
    _project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    (tmp_path / "FAIL").write_text("first")
    assert cli(tmp_path, "submit", "tasks/flaky.py", "--id", "r1", "--store", url).returncode == 0
    assert cli(tmp_path, "worker", "--store", url, "--max-tasks", "1", "--idle-exit", "1").returncode == 0
    assert queue_rows(url)["r1"].status == "failed"
    (tmp_path / "FAIL").unlink()
    out = cli(tmp_path, "retry", "r1", "--store", url)
    assert (out.returncode, out.stdout.strip()) == (0, "r1: queued"), out.stderr
    assert cli(tmp_path, "worker", "--store", url, "--max-tasks", "1", "--idle-exit", "1").returncode == 0
    assert queue_rows(url)["r1"].status == "complete"
    assert _status(tmp_path, url, "r1").startswith("r1 (main): complete")


# 2. `overnight resume --submit` of a complete task queues nothing


def test_resume_submit_of_a_complete_task_queues_nothing(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    assert cli(tmp_path, "submit", "tasks/flaky.py", "--id", "s1", "--store", store).returncode == 0
    assert cli(tmp_path, "worker", "--store", store, "--max-tasks", "1", "--idle-exit", "1").returncode == 0
    assert queue_rows(store)["s1"].status == "complete"
    out = cli(tmp_path, "resume", "s1", "--submit", "--store", store)
    assert (out.returncode, out.stdout.strip()) == (0, "s1: already complete, nothing to queue"), out.stderr
    assert queue_rows(store)["s1"].status == "complete"
    assert _ls(tmp_path, store)["s1"]["status"] == "complete"
    _no_worker_runs_it(tmp_path, store, "s1")


def test_resume_submit_of_a_task_completed_here_queues_nothing(tmp_path: Path) -> None:
    """Never submitted, run to the end with `overnight run`: --submit makes no queue row for it,
    and the plain run created no queue tables in the store."""
    _project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    out = cli(tmp_path, "run", "tasks/flaky.py", "--store", url, "-q")
    assert out.returncode == 0, out.stderr
    tables = {r[0] for r in sqlite3.connect(tmp_path / "q.db").execute("SELECT name FROM sqlite_master")}
    assert "queue" not in tables, tables
    out = cli(tmp_path, "resume", "flaky", "--submit", "--store", url)
    assert (out.returncode, out.stdout.strip()) == (0, "flaky: already complete, nothing to queue"), out.stderr
    assert "flaky" not in queue_rows(url)


# 3. `overnight retry` of a complete task says nothing was queued


def test_retry_of_a_complete_task_says_nothing_was_queued(tmp_path: Path, store: str) -> None:
    _project(tmp_path)
    assert cli(tmp_path, "submit", "tasks/flaky.py", "--id", "t1", "--store", store).returncode == 0
    assert cli(tmp_path, "worker", "--store", store, "--max-tasks", "1", "--idle-exit", "1").returncode == 0
    out = cli(tmp_path, "retry", "t1", "--store", store)
    assert (out.returncode, out.stdout.strip()) == (0, "t1: already complete, nothing to queue"), out.stderr
    assert queue_rows(store)["t1"].status == "complete"
