"""Round 37: what stop 36 noticed and left alone, fixed -- "did you mean" after ``rm`` of a task with
params no longer offers every other task of the same code. Real ``python -m overnight`` processes
on a real SQLite store; nothing mocked."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from _procs import cli
from _report_project import ok, report_project


def test_a_removed_params_task_is_not_mistaken_for_another_params_digest(tmp_path: Path) -> None:
    """Stop 36's attacker: ``status`` of a ``report-<digest>`` id already removed suggested
    ``report-<another digest>``, a task with other params that merely shares the ``report-`` prefix.
    A one-character typo of a digest still gets its suggestion."""
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--param", "who=ada", "--store", url)
    (gone,) = [r["task_id"] for r in json.loads(ok(tmp_path, "ls", "--json", "--store", url))]
    ok(tmp_path, "submit", "tasks/report.py", "--param", "who=barbara", "--store", url)
    (kept,) = [r["task_id"] for r in json.loads(ok(tmp_path, "ls", "--json", "--store", url)) if r["task_id"] != gone]
    assert gone.startswith("report-") and kept.startswith("report-"), (gone, kept)
    # these two params give digests difflib alone calls close (the case the attacker met)
    assert difflib.SequenceMatcher(None, gone, kept).ratio() >= 0.6, (gone, kept)
    ok(tmp_path, "rm", gone, "--yes", "--store", url)
    r = cli("status", gone, "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and kept not in r.stderr, r.stderr
    typo = kept[:-1] + ("0" if kept[-1] != "0" else "1")
    r = cli("status", typo, "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and f"did you mean {kept}?" in r.stderr, r.stderr


def test_an_id_in_another_case_is_suggested_before_params_digests(tmp_path: Path) -> None:
    """``status Report`` with a task ``report`` and a ``report-<digest>`` listed ``report`` last."""
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "report", "-q", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--param", "who=ada", "--store", url)
    r = cli("status", "Report", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "did you mean report or report-" in r.stderr, r.stderr
