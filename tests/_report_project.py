"""A one-step ``report`` task in a fresh project, and the CLI run on it -- shared by the fresh-user
rounds' tests (test_ux_round33, test_ux_round34)."""

from __future__ import annotations

from pathlib import Path

from _procs import cli

REPORT = '''
import overnight

task = overnight.Task("report", goal="write the quarterly report")


@task.step
def a(ctx):
    ctx.state["x"] = 1
'''


def report_project(tmp_path: Path) -> str:
    """A project with ``tasks/report.py``; returns the URL of a SQLite store in it (not made yet)."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "report.py").write_text(REPORT)
    (tmp_path / "overnight.toml").write_text("")
    return f"sqlite://{tmp_path / 'q.db'}"


def ok(tmp_path: Path, *args: str) -> str:
    """stdout of ``overnight ARGS`` run in ``tmp_path``, which must exit 0."""
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout
