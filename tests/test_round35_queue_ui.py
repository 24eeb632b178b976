"""Round 35: the dashboard says of a coding-agent task what ``ls`` / ``status`` say (in progress,
continued by task_resume -- not ``interrupted`` with a Resume that refuses it); ``cancel`` /
``retry`` suggest only the queue rows they can act on; ``retry`` of a parked row whose task a run
here has since completed settles it ``complete`` instead of queuing a task with nothing to run, and
a cancelled row that never started keeps its ``--not-before``. Real ``python -m overnight`` and
``overnight ui`` processes on real SQLite files (and PostgreSQL schemas); nothing mocked."""

from __future__ import annotations

import html
import json
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from _procs import cli
from _report_project import ok, report_project

CODING_PAUSED = "in progress (coding agent: task_resume in the agent continues it)"


# -- 1. the dashboard's status of a coding-agent task no session holds --------------------------


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo, check=True,
                   capture_output=True, text=True)


@pytest.fixture
def coding_site(tmp_path: Path) -> Path:
    """A git project holding a SQLite store ``s.db`` with one coding-agent task (``task_start`` of
    the MCP tools, as an agent calls it) that no session holds, with one checkpoint after its start."""
    from overnight.mcp.tasks import CodingTasks

    repo = tmp_path / "proj"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "parser.py").write_text("def parse(s):\n    return s.split()\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "initial")
    with CodingTasks(f"sqlite://{repo / 's.db'}", project=repo) as t:
        cp = t.start("Port the parser", plan=["edit src/parser.py", "run the tests"])
        t.checkpoint(cp.task_id, notes="edited half of it")
    (repo / "task_id").write_text(cp.task_id)
    return repo


def test_the_dashboard_says_a_coding_task_is_in_progress_as_ls_does(coding_site: Path) -> None:
    pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    import httpx

    from _ui import UiServer, store_url

    tid = (coding_site / "task_id").read_text()
    rows = json.loads(ok(coding_site, "ls", "--json", "--store", store_url(coding_site)))
    assert [r["status"] for r in rows] == [CODING_PAUSED], rows  # what ls says: the dashboard must agree
    with UiServer(coding_site) as srv:
        data = httpx.get(srv.base + "/tasks.json").json()
        [row] = data["tasks"]
        assert (row["status"], row["status_reason"]) == ("in_progress", CODING_PAUSED[len("in progress ("):-1]), row
        assert data["counts"]["in_progress"] == 1 and data["counts"]["interrupted"] == 0, data["counts"]
        assert data["counts"]["stalled"] == 0
        listing = httpx.get(srv.base + "/").text
        cell = listing.split('class="task-row"', 1)[1].split("</td>", 2)[1]
        assert " ".join(html.unescape(re.sub(r"<[^>]+>", " ", cell)).split()) == CODING_PAUSED, cell
        filtered = httpx.get(srv.base + "/tasks.json", params={"status": "in_progress"}).json()
        assert [t["task_id"] for t in filtered["tasks"]] == [tid]
        # the task page offers no Resume (which would refuse it): it says who continues it
        page = httpx.get(srv.base + "/task", params={"id": tid})
        assert page.status_code == 200, page.text[:400]
        text = html.unescape(page.text)
        assert 'id="resume-workers"' not in text and f"overnight resume {tid}" not in text, text
        refused = text.split('id="resume-refused"', 1)[1].split("</p>", 1)[0]
        assert CODING_PAUSED in refused and "task_resume" in refused, refused
        actions = httpx.get(srv.base + "/task.json", params={"id": tid}).json()["actions"]
        assert actions["resume"] is not None and CODING_PAUSED in actions["resume"]["message"], actions
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        r = httpx.post(srv.base + "/actions/resume", data={"csrf": csrf, "task": tid})
        assert r.status_code == 409 and CODING_PAUSED in html.unescape(r.text), (r.status_code, r.text[:400])


# -- 2. cancel / retry: did you mean only a row the command acts on -----------------------------


def test_cancel_suggests_only_queue_rows_it_can_cancel(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "notes", "-q", "--store", url)  # stored, never submitted
    r = cli("cancel", "notse", "--store", url, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "did you mean" not in r.stderr and "notes" not in r.stderr, r.stderr
    # a queued row close by is suggested; a complete one is not
    ok(tmp_path, "submit", "tasks/report.py", "--id", "nightly", "--not-before", "+2h", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "nightly2", "--store", url)
    ok(tmp_path, "worker", "--store", url, "--max-tasks", "1", "--idle-exit", "1")  # runs nightly2: complete
    r = cli("cancel", "nihgtly", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "did you mean nightly?" in r.stderr and "nightly2" not in r.stderr, r.stderr
    # the exact id of a task never submitted still says so
    r = cli("cancel", "notes", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "was run with `overnight run`, not submitted" in r.stderr, r.stderr
    # an id no task can have is still said to be one
    r = cli("cancel", "note[s", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "is not a valid task id" in r.stderr and "did you mean" not in r.stderr, r.stderr


def test_retry_suggests_only_failed_or_cancelled_rows(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "notes", "-q", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "notes2", "--not-before", "+2h", "--store", url)  # queued
    r = cli("retry", "notse", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "did you mean" not in r.stderr, r.stderr
    ok(tmp_path, "cancel", "notes2", "--store", url)
    r = cli("retry", "ntoes2", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "did you mean notes2?" in r.stderr, r.stderr
    r = cli("retry", "a\udcff", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "is not a valid task id" in r.stderr, r.stderr


def test_the_library_suggests_as_the_cli_does(tmp_path: Path) -> None:
    from overnight import api
    from overnight.errors import TaskNotFound

    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "notes", "-q", "--store", url)
    for call in (api.cancel, api.retry):
        with pytest.raises(TaskNotFound) as info:
            call("notse", store=url)
        assert "did you mean" not in (info.value.hint or ""), info.value.hint


# -- 3. retry of a parked row whose task is complete; retry's not-before ------------------------


def _row(url: str, task_id: str) -> Any:
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    with open_store(url) as s:
        return queue_for(s).get(task_id)


def _park(db: Path, task_id: str, status: str, **cols: Any) -> None:
    """Set a queue row's status (and columns) directly: a row parked before a run here completed the
    task, whose settling of the row did not happen (an older version, or the store busy then)."""
    sets = ", ".join(["status=?", *(f"{k}=?" for k in cols)])
    with sqlite3.connect(db) as c:
        assert c.execute(f"UPDATE queue SET {sets} WHERE task_id=?", (status, *cols.values(), task_id)).rowcount == 1


@pytest.mark.parametrize("parked", ["failed", "cancelled"])
def test_retry_of_a_parked_row_of_a_complete_task_settles_it(tmp_path: Path, parked: str) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "rep", "--not-before", "+2h", "--store", url)
    ok(tmp_path, "cancel", "rep", "--store", url)
    ok(tmp_path, "run", "tasks/report.py", "--id", "rep", "-q", "--store", url)  # completed here
    _park(tmp_path / "q.db", "rep", parked, reason="disk was full" if parked == "failed" else None)
    assert _row(url, "rep").status == parked
    out = ok(tmp_path, "retry", "rep", "--store", url)
    assert out.strip() == "rep: already complete, nothing to queue", out
    row = _row(url, "rep")
    assert row.status == "complete" and row.attempts == 0, row
    # and the library says the same: the row, settled
    from overnight import api

    assert api.retry("rep", store=url).status == "complete"


def test_retry_of_a_cancelled_row_that_never_started_keeps_its_not_before(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--not-before", "+2h", "--store", url)
    before = _row(url, "later").not_before_ms
    ok(tmp_path, "cancel", "later", "--store", url)
    out = ok(tmp_path, "retry", "later", "--store", url)
    assert out.startswith("later: queued (starts in "), out
    row = _row(url, "later")
    assert (row.status, row.not_before_ms, row.attempts) == ("queued", before, 0), row
    # a failed row: retry means now
    _park(tmp_path / "q.db", "later", "failed", reason="boom", attempts=1)
    assert ok(tmp_path, "retry", "later", "--store", url).strip() == "later: queued"
    row = _row(url, "later")
    assert (row.status, row.not_before_ms) == ("queued", 0), row
    # a cancelled row that ran once (attempts 1) starts now too
    _park(tmp_path / "q.db", "later", "cancelled", not_before_ms=before)
    ok(tmp_path, "retry", "later", "--store", url)
    assert _row(url, "later").not_before_ms == 0


def test_retry_not_before_on_postgres(pg_schema: Any, tmp_path: Path) -> None:
    """The same statement on PostgreSQL: a cancelled row that never started keeps its not-before."""
    base, schema = pg_schema
    url = f"{base}?schema={schema}"
    report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--not-before", "+2h", "--store", url)
    before = _row(url, "later").not_before_ms
    ok(tmp_path, "cancel", "later", "--store", url)
    ok(tmp_path, "retry", "later", "--store", url)
    assert (_row(url, "later").status, _row(url, "later").not_before_ms) == ("queued", before)


def test_retry_help_says_both() -> None:
    r = cli("retry", "--help", cwd=Path.cwd())
    text = " ".join(r.stdout.split())
    assert "already complete" in text and "not-before" in text and "never started" in text, text
