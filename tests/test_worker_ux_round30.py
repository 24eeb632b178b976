"""Worker UX found by a fresh user (round 30), end to end with real processes and real stores:
a killed worker's `held` in `overnight workers`, `overnight rm --force` of a task a worker runs, and `overnight worker` on a store without a queue."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from _fleet import cli, project, queue_rows, side_log, start_worker, stop, wait_until


def _submit(tmp_path: Path, store: str, *args: str) -> str:
    res = cli(tmp_path, "submit", "tasks/chaos.py", "--store", store, "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["task_id"]


def _workers(tmp_path: Path, store: str) -> list[dict]:
    res = cli(tmp_path, "workers", "--store", store, "--all", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _log(tmp_path: Path, name: str = "w") -> str:
    path = tmp_path / f"{name}.err"
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_killed_worker_is_not_shown_holding_tasks(tmp_path: Path, sqlite_url: str) -> None:
    tid = _submit(tmp_path, sqlite_url, "--param", "steps=200", "--param", "sleep=0.5")
    w = start_worker(tmp_path, sqlite_url, "--worker-id", "doomed")
    try:
        wait_until(lambda: side_log(tmp_path), 60, "a step of the task")
        wait_until(lambda: [r for r in _workers(tmp_path, sqlite_url) if r["held"] == 1], 30, "held 1 recorded")
        live = _workers(tmp_path, sqlite_url)[0]
        assert live["alive"] is True and live["state"] == "running"
        table = cli(tmp_path, "workers", "--store", sqlite_url)
        assert "1/1" in table.stdout and "—" not in table.stdout, table.stdout
    finally:
        stop(w, signal.SIGKILL)
    assert queue_rows(sqlite_url)[tid].worker_id == "doomed"
    [row] = _workers(tmp_path, sqlite_url)
    # truthful JSON: the count its last heartbeat wrote stays, with whether the worker still runs
    assert row["state"] == "dead" and row["alive"] is False and row["held"] == 1, row
    assert row["recorded_state"] == "running"
    res = cli(tmp_path, "workers", "--store", sqlite_url, "--all")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "doomed" in ln)
    assert "dead" in line and "— (last seen 1/1)" in line, res.stdout
    assert " 1/1 " not in line.replace("(last seen 1/1)", "")
    # not listed without --all
    res = cli(tmp_path, "workers", "--store", sqlite_url)
    assert "doomed" not in res.stdout and "no live worker" in res.stderr


def test_rm_of_a_task_a_worker_runs_is_logged_by_the_worker(tmp_path: Path, any_url: str) -> None:
    tid = _submit(tmp_path, any_url, "--id", "gone1", "--param", "steps=200", "--param", "sleep=0.3")
    w = start_worker(tmp_path, any_url, "--lease", "3", "--idle-exit", "2")
    try:
        wait_until(lambda: len(side_log(tmp_path)) >= 2, 60, "two steps of the task")
        res = cli(tmp_path, "rm", tid, "--store", any_url, "--yes", "--force")
        assert res.returncode == 0, res.stderr
        # the session stops at its lost claim, the worker says why in one line, then idles out
        assert w.wait(timeout=60) == 0
    finally:
        stop(w, signal.SIGTERM)
    log = _log(tmp_path)
    lines = [ln for ln in log.splitlines() if "removed from the store" in ln]
    assert len(lines) == 1 and f"task {tid} was removed from the store while it ran" in lines[0], log
    assert "Traceback" not in log and "" not in log.splitlines(), log  # no traceback, no blank line
    ls = json.loads(cli(tmp_path, "ls", "--store", any_url, "--json").stdout)
    assert tid not in {t["task_id"] for t in ls}


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_worker_on_a_store_without_a_queue_fails_at_once(tmp_path: Path, scheme: str) -> None:
    project(tmp_path)
    where = tmp_path / "fs"
    url = f"file://{where}" if scheme == "file" else "memory://ux30"
    res = cli(tmp_path, "worker", "--store", url, "--idle-exit", "1", timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.splitlines()
    assert lines[0] == f"error: store {url} has no queue; workers need sqlite:// or postgresql://", res.stderr
    assert "claiming" not in res.stderr and "stopped" not in res.stderr
    assert res.stdout == ""
    assert not where.exists()  # nothing made for a store the worker cannot use
