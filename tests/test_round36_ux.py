"""Round 36: what a worker leaving by ``--idle-exit`` says about a task queued for later.

A worker started with ``--idle-exit`` waits for work due within a lease; a task submitted with a
``--not-before`` further out is not work it waits for, and the worker exits -- now saying which
task is queued, when it starts and that a worker must be running then. Real ``python -m
overnight`` processes on a real SQLite store; nothing mocked.
"""

from __future__ import annotations

from pathlib import Path

from _procs import cli
from _report_project import ok, report_project


def test_idle_exit_names_the_task_queued_for_later(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "nightly", "--not-before", "+2h", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "weekly", "--not-before", "+3h", "--store", url)
    r = cli("worker", "--idle-exit", "1", "--store", url, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "nothing to run for 1 s (--idle-exit): exiting; task nightly is queued to start in " in said, said
    assert "(and 1 more): a worker must be running then" in said, said
    assert ok(tmp_path, "status", "nightly", "--store", url).startswith("nightly: queued"), "still queued"


def test_idle_exit_with_nothing_queued_says_only_that(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "now", "--store", url)
    ok(tmp_path, "worker", "--idle-exit", "1", "--store", url)  # runs it, then leaves
    r = cli("worker", "--idle-exit", "1", "--store", url, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "nothing to run for 1 s (--idle-exit): exiting" in said and "queued to start" not in said, said
