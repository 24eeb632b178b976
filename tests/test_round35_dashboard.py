"""Round 35: what the dashboard's task page says of a task is what it checked, and says it plainly.

* The timeline calls a checkpoint ``verified`` only when it was: every shown row's record, state
  document and pages are checked (as ``overnight show`` checks each row), so a damaged state object
  under a non-head checkpoint is ``damaged`` there, as ``show`` marks it INVALID; a row whose artifact
  bytes were not hashed is ``record verified``, not ``verified``; after "Verify now" each row says
  what that run found (damage it found in artifact bytes too), and the tasks page counts the task.
* The "Verify now" page renders its problems as a table (checkpoint link, check, detail), escaped.
* The task page and ``/task.json`` carry the task's status, as the tasks page derives it.
* A task a worker ran (its route names no medium) shows the medium its store is, not ``-``.

Real SQLite stores written by real runs, damaged with sqlite3; the dashboard is served by starlette's
TestClient (in-process, real HTTP requests through the whole app) or a real ``overnight ui`` process.
"""

from __future__ import annotations

import html
import re
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

import overnight  # noqa: E402
from overnight import api  # noqa: E402
from overnight.chain.ditto import ditto_key  # noqa: E402
from overnight.chain.integrity import load_checkpoint, parse_record  # noqa: E402
from overnight.codec.digest import sha256  # noqa: E402
from overnight.store import open_url  # noqa: E402
from overnight.web.app import create_app  # noqa: E402

OLD = "the first version of v.txt\n" * 30
NEW = "the second version of v.txt\n" * 30


def _task(task_id: str = "api-report-email", steps: int = 8) -> overnight.Task:
    task = overnight.Task(task_id, goal="write files, overwrite one", data={"n": 0}, expected_span="3d")

    @task.step
    def plan(ctx):
        for i in range(steps):
            ctx.add_step("work", i=i)

    @task.step(planned=False)
    def work(ctx, i):
        ctx.state["n"] += 1
        if i == 1:  # named by the checkpoints of steps 1 and 2 only: step 3 overwrites it
            ctx.write_text("v.txt", OLD)
        if i == 3:
            ctx.write_text("v.txt", NEW)
        return {"i": i}

    return task


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "s.db"
    res = overnight.run(_task(), f"sqlite://{path}", signing_key=b"", handle_signals=False)
    assert res.status == "complete", res.status
    return path


def _flip(path: Path, d: str) -> None:
    """Flip a byte of the object's stored data and spoil its ditto copy (if any): nothing heals it."""
    db = sqlite3.connect(path, isolation_level=None)
    data = bytes(db.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()[0])
    db.execute("UPDATE objects SET data=? WHERE digest=?", (data[:-1] + bytes([data[-1] ^ 1]), d))
    db.execute("UPDATE objects SET data=x'00' WHERE digest=?", (ditto_key(d),))
    db.close()


def _client(path: Path) -> TestClient:
    return TestClient(create_app(f"sqlite://{path}", loopback=False))


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def _rows(data: dict) -> dict[int, dict]:
    return {e["seq"]: e for e in data["timeline"]}


def _damage_state_of_seq(path: Path, task_id: str, seq: int) -> str:
    """Damage the state document of the checkpoint at ``seq`` (an object no other checkpoint names)."""
    with open_url(f"sqlite://{path}") as s:
        rows = s.list_checkpoints(task_id)
        row = next(r for r in rows if r.seq == seq)
        d = parse_record(row, key=None).state.digest
        assert all(parse_record(r, key=None).state.digest != d for r in rows if r is not row)
        assert s.get_ref(task_id, "main") != row.checkpoint_id
    _flip(path, d)
    return row.checkpoint_id


# -- 1. the timeline says what it checked ---------------------------------------------------------------


def test_a_damaged_object_under_a_non_head_checkpoint_is_damaged_on_the_task_page_as_show_says(tmp_path):
    path = _store(tmp_path)
    cid = _damage_state_of_seq(path, "api-report-email", 7)
    shown = {c.checkpoint_id: c for c in api.show("api-report-email", store=f"sqlite://{path}").chain}
    assert not shown[cid].valid and "DigestMismatch" in shown[cid].problem  # what `overnight show` marks
    with _client(path) as c:
        data = c.get("/task.json", params={"id": "api-report-email"}).json()
        rows = _rows(data)
        assert rows[7]["checkpoint_id"] == cid
        assert rows[7]["integrity"] == "damaged" and "DigestMismatch" in rows[7]["problem"], rows[7]
        # every row agrees with `overnight show`: damaged there <=> damaged here
        assert {e["checkpoint_id"] for e in data["timeline"] if e["integrity"] == "damaged"} \
            == {k for k, v in shown.items() if not v.valid}
        # nothing is called "verified" that was not: the head (loaded, artifacts hashed) is
        head = data["branches"]["main"]["head"]
        assert {e["integrity"] for e in data["timeline"] if e["checkpoint_id"] != cid} \
            <= {"verified", "record verified"}
        assert next(e for e in data["timeline"] if e["checkpoint_id"] == head)["integrity"] == "verified"
        page = c.get("/task", params={"id": "api-report-email"}).text
        row_html = page.split(f'data-checkpoint="{cid}"', 1)[1].split("</tr>", 1)[0]
        assert ">damaged<" in row_html and "DigestMismatch" in row_html
        cp = c.get("/checkpoint.json", params={"task": "api-report-email", "id": cid}).json()
        assert cp["integrity"] == "damaged"


def test_artifact_damage_only_verify_finds_shows_after_verify_now_on_both_pages(tmp_path):
    path = _store(tmp_path)
    with open_url(f"sqlite://{path}") as s:
        users = {r.checkpoint_id for r in s.list_checkpoints("api-report-email")
                 if load_checkpoint(s, r.checkpoint_id, key=None).artifacts.get("v.txt") is not None
                 and load_checkpoint(s, r.checkpoint_id, key=None).artifacts["v.txt"].digest == sha256(OLD.encode())}
        head = s.get_ref("api-report-email", "main")
    assert len(users) == 2 and head not in users
    _flip(path, sha256(OLD.encode()))
    with _client(path) as c:
        before = _rows(c.get("/task.json", params={"id": "api-report-email"}).json())
        for e in before.values():  # artifact bytes of non-heads are not hashed by the page: not "verified"
            if e["checkpoint_id"] != head:
                assert e["integrity"] == "record verified", e
        page = c.get("/task", params={"id": "api-report-email"}).text
        done = c.post("/actions/verify", data={"csrf": _csrf(page), "task": "api-report-email"})
        assert done.status_code == 200 and "problems" in done.text
        after = c.get("/task.json", params={"id": "api-report-email"}).json()
        damaged = {e["checkpoint_id"] for e in after["timeline"] if e["integrity"] == "damaged"}
        assert damaged == users, after["timeline"]
        assert all(sha256(OLD.encode()) in e["problem"] or "DigestMismatch" in e["problem"]
                   for e in after["timeline"] if e["checkpoint_id"] in users), after["timeline"]
        # the rest: checked by that verify run, so verified now
        assert {e["integrity"] for e in after["timeline"] if e["checkpoint_id"] not in users} == {"verified"}
        html_page = c.get("/task", params={"id": "api-report-email"}).text
        for cid in users:
            assert ">damaged<" in html_page.split(f'data-checkpoint="{cid}"', 1)[1].split("</tr>", 1)[0]
        tasks = c.get("/tasks.json").json()
        assert tasks["damaged"] == 1, tasks
        assert "damaged 1" in c.get("/").text


def test_verify_now_counts_a_task_with_a_damaged_non_head_on_the_tasks_page(tmp_path):
    """A damaged state object under a non-head checkpoint: "Verify now" finds it, and the tasks
    page's damaged count then counts the task (it was 0: only heads were counted)."""
    path = _store(tmp_path)
    _damage_state_of_seq(path, "api-report-email", 7)
    with _client(path) as c:
        assert c.get("/tasks.json").json()["damaged"] == 0  # the head verifies
        page = c.get("/task", params={"id": "api-report-email"}).text
        c.post("/actions/verify", data={"csrf": _csrf(page), "task": "api-report-email"})
        assert c.get("/tasks.json").json()["damaged"] == 1


# -- 2. the verify page's problems --------------------------------------------------------------------


def test_verify_now_renders_problems_as_an_escaped_table_not_reprs(tmp_path):
    path = _store(tmp_path)
    cid = _damage_state_of_seq(path, "api-report-email", 7)
    with _client(path) as c:
        page = c.get("/task", params={"id": "api-report-email"}).text
        out = c.post("/actions/verify", data={"csrf": _csrf(page), "task": "api-report-email"}).text
    assert "Problem(" not in out and "task_id=" not in out
    table = out.split('<table class="problems"', 1)[1].split("</table>", 1)[0]
    assert re.search(f'href="/checkpoint\\?task=api-report-email&(amp;)?id={cid.replace(":", "%3A")}"', table), table
    assert ">record<" in table or ">object<" in table or ">state<" in table
    assert "DigestMismatch" in table


def test_verify_page_escapes_hostile_problem_text(tmp_path):
    """The template escapes a detail or check holding markup (rendered from the report's data)."""
    from starlette.requests import Request

    from overnight.verify.fsck import Problem, VerifyReport
    from overnight.web.app import Dashboard, verify_data

    hostile = "<img src=x onerror=alert(1) id=pwned>"
    rep = VerifyReport(checkpoints=1, checkpoints_invalid=1,
                       problems=[Problem("t<b>", "sha256:" + "ab" * 32, "record<i>", "DigestMismatch: " + hostile,
                                         "sha256:" + "cd" * 32)])
    path = _store(tmp_path)
    with open_url(f"sqlite://{path}") as s:
        d = Dashboard(s, read_only=False, store_arg=None)
        data = verify_data(rep, "t<b>", d.cli("verify", "t<b>"))
        body = d.html("verified.html", data, Request({"type": "http", "method": "POST", "path": "/", "headers": [],
                                                        "query_string": b""})).body.decode()
    assert hostile not in body and "<i>" not in body and "id=pwned" not in body.replace("id=pwned&gt;", "")
    assert html.escape(hostile) in body or html.escape(hostile, quote=False) in body


# -- 3. status on the task page -------------------------------------------------------------------------


def test_task_page_and_json_carry_the_status_the_tasks_page_shows(tmp_path):
    path = _store(tmp_path)
    with _client(path) as c:
        row = c.get("/tasks.json").json()["tasks"][0]
        data = c.get("/task.json", params={"id": "api-report-email"}).json()
        assert (data["status"], data["status_reason"]) == (row["status"], row["status_reason"]) == ("complete", None)
        page = c.get("/task", params={"id": "api-report-email"}).text
        assert re.search(r'<dt>status</dt><dd><span class="st st-complete"[^>]*>complete</span>', page), page[:3000]


# -- 4. the medium of a task a worker ran -------------------------------------------------------------------


WORKER_TASK = '''
import overnight

task = overnight.Task("by-worker", goal="run by a worker", expected_span="3d")

@task.step
def only(ctx):
    ctx.state["x"] = 1
'''


@pytest.mark.slow
def test_a_task_a_worker_ran_shows_the_medium_of_its_store(tmp_path):
    from _ui import run_cli

    root = tmp_path / "site"
    root.mkdir()
    (root / "w_task.py").write_text(WORKER_TASK)
    sub = run_cli(root, "submit", "w_task.py")
    assert sub.returncode == 0, sub.stderr
    worker = run_cli(root, "worker", "--idle-exit", "2")
    assert worker.returncode == 0, worker.stderr
    with open_url(f"sqlite://{root / 's.db'}") as s:
        from overnight.codec.canonical import loads

        assert loads(s.get_task("by-worker").spec)["route"]["media"] == []  # what the worker records: unchanged
    with _client(root / "s.db") as c:
        row = c.get("/tasks.json").json()["tasks"][0]
        data = c.get("/task.json", params={"id": "by-worker"}).json()
        assert row["media"] == data["media"] == []  # recorded
        assert row["stored_on"] == data["stored_on"] == ["local"], (row, data)
        assert row["store_kind"] == data["store_kind"] == "sqlite"
        assert c.get("/storage.json").json()["by_medium"].keys() == {"local"}
        for page in (c.get("/").text, c.get("/task", params={"id": "by-worker"}).text, c.get("/storage").text):
            assert "durable · -" not in page and re.search(r"durable · <span[^>]*>local</span>", page), page
