"""Round 32 of the fresh-user fixes: what a dry run's JSON says, how a submitted task that no
worker has started yet reads in ``ls``/``show``/``log``/``verify``, and the session line of a task
that never calls a model. Real CLI processes on real SQLite stores; nothing mocked."""

from __future__ import annotations

import json
from pathlib import Path

from _procs import cli
from test_gc import scenario, snapshot

from overnight.store import open_store

REPORT = '''
import overnight

task = overnight.Task("report", goal="write the quarterly report")


@task.step
def a(ctx):
    ctx.state["x"] = 1


@task.step
def b(ctx):
    ctx.state["y"] = 2
'''

CHAT = '''
import overnight

task = overnight.Task("chat", goal="ask once")


@task.step
def ask(ctx):
    reply = ctx.model.complete([{"role": "user", "content": "Question: what is two plus two?"}], max_tokens=32)
    ctx.state["a"] = reply.text
'''


def _project(tmp_path: Path) -> Path:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "report.py").write_text(REPORT)
    (tmp_path / "tasks" / "chat.py").write_text(CHAT)
    (tmp_path / "overnight.toml").write_text("")
    return tmp_path


def _submitted(tmp_path: Path) -> str:
    """A project with ``tasks/report.py`` submitted to the queue of a SQLite store (no worker)."""
    url = f"sqlite://{_project(tmp_path) / 'q.db'}"
    r = cli("submit", "tasks/report.py", "--store", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return url


# -- 1. gc --json on a dry run says it is one -----------------------------------------------


def test_gc_dry_run_json_says_dry_run_and_lists_would_delete_not_deleted(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    with open_store(url) as store:
        sc = scenario(store)
        before = snapshot(store)
    r = cli("gc", "--grace", "0", "--json", "--store", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    assert dry["dry_run"] is True and dry["applied"] is False
    would = sorted(c for t in dry["tasks"] for c in t["would_delete"])
    assert would == sorted(sc["dangling"])  # what would go is listed ...
    assert all(t["deleted"] == [] for t in dry["tasks"])  # ... and nothing claims to be gone
    assert dry["checkpoints_deleted"] == 0 and dry["objects_deleted"] == 0
    assert dry["checkpoints_would_delete"] == len(sc["dangling"]) and dry["objects_would_delete"] > 0
    with open_store(url) as s:
        assert snapshot(s) == before  # indeed nothing was deleted
    # the real run keeps its shape: what went is under "deleted"
    done = json.loads(cli("gc", "--apply", "--grace", "0", "--json", "--store", url, cwd=tmp_path).stdout)
    assert done["applied"] is True and done["dry_run"] is False and done["tasks"][0]["would_delete"] == []
    assert set(done) == set(dry)  # one shape for both runs
    assert sorted(c for t in done["tasks"] for c in t["deleted"]) == would
    assert done["checkpoints_deleted"] == len(sc["dangling"])
    assert done["objects_deleted"] == dry["objects_would_delete"]


# -- 2. ls of a submitted task that has not started ------------------------------------------


def test_ls_shows_a_queued_task_as_queued_with_its_entry_not_as_a_goal(tmp_path):
    url = _submitted(tmp_path)
    r = cli("ls", "--store", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("report")]
    assert "queued from tasks/report.py" in line  # labelled as the code location it is
    assert "0/0" not in line and "—" in line  # no plan known yet: no made-up progress
    assert "(tasks/report.py" not in line  # not dressed up as a goal
    (row,) = json.loads(cli("ls", "--json", "--store", url, cwd=tmp_path).stdout)
    assert row["status"] == "queued" and row["entry"] == "tasks/report.py:task"
    assert row["goal"] == "" and row["checkpoints"] == 0 and row["branches"] == []


def test_ls_json_of_a_task_with_checkpoints_has_its_goal_and_no_entry(tmp_path):
    _project(tmp_path)
    url = f"sqlite://{tmp_path / 'r.db'}"
    assert cli("run", "tasks/report.py", "--store", url, cwd=tmp_path).returncode == 0
    (row,) = json.loads(cli("ls", "--json", "--store", url, cwd=tmp_path).stdout)
    assert row["goal"] == "write the quarterly report" and row["entry"] is None
    assert (row["done"], row["total"]) == (2, 2)
    line = [x for x in cli("ls", "--store", url, cwd=tmp_path).stdout.splitlines() if x.startswith("report")][0]
    assert "2/2" in line and "write the quarterly report" in line and "queued from" not in line


# -- 3. show / log / verify of a submitted task that has not started -------------------------


def test_show_log_verify_of_a_queued_task_say_it_is_queued_with_no_checkpoint(tmp_path):
    url = _submitted(tmp_path)
    for command in ("show", "log", "verify"):
        r = cli(command, "report", "--store", url, cwd=tmp_path)
        assert r.returncode == 2, (command, r.stderr)  # as for a task not in the store: nothing to show yet
        first = r.stderr.splitlines()[0]
        assert "no task" not in first, (command, first)
        assert "task 'report' is queued (submitted" in first and "ago), no checkpoint yet" in first, (command, first)
        assert "a worker has not started it" in first
        assert "overnight status report" in r.stderr and "overnight worker" in r.stderr  # what to do next
        assert "Traceback" not in r.stderr
    # a task that was never submitted still reads as not found
    missing = cli("show", "nothing-here", "--store", url, cwd=tmp_path)
    assert missing.returncode == 2 and "no task 'nothing-here'" in missing.stderr


# -- 4. the session line of a task that never calls a model ----------------------------------


def test_run_of_a_model_free_task_says_session_not_context_window(tmp_path):
    _project(tmp_path)
    url = f"sqlite://{tmp_path / 'r.db'}"
    for n, args, code in ((1, ["--max-steps", "1"], 75), (2, [], 0)):  # the first run, then the resume that ends it
        r = cli("run", "tasks/report.py", "--store", url, *args, cwd=tmp_path)
        assert r.returncode == code, r.stderr
        assert "context window" not in r.stderr
        assert f"session #{n}" in r.stderr and "no model used" in r.stderr
    again = cli("run", "tasks/report.py", "--store", url, cwd=tmp_path)  # complete: records nothing, names no session
    assert again.returncode == 0 and "session #" not in again.stderr and "0 run now" in again.stderr, again.stderr


def test_run_of_a_task_that_calls_a_model_keeps_the_context_window_line(tmp_path):
    _project(tmp_path)
    url = f"sqlite://{tmp_path / 'c.db'}"
    r = cli("run", "tasks/chat.py", "--store", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "context window #1" in r.stderr and "no model used" not in r.stderr


# -- 5. status of a queued task says where it stands in the queue ------------------------------


def test_status_of_a_queued_task_says_its_place_in_the_queue(tmp_path):
    _project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    for args in (["--id", "a"], ["--id", "b", "--priority", "3", "--param", "topic=x"], ["--id", "c"]):
        assert cli("submit", "tasks/report.py", "--store", url, *args, cwd=tmp_path).returncode == 0
    places = {}
    for task_id in ("a", "b", "c"):
        out = json.loads(cli("status", task_id, "--store", url, "--json", cwd=tmp_path).stdout)
        assert out["seq"] == -1 and out["status_kind"] == "queued"
        places[task_id] = out["queue"]
    assert {k: v["ahead"] for k, v in places.items()} == {"b": 0, "a": 1, "c": 2}  # priority first, then order
    assert places["b"]["params"] == {"topic": "x"} and places["b"]["priority"] == 3
    assert places["a"]["entry"] == "tasks/report.py:task" and places["a"]["queue"] == "default"
    text = cli("status", "c", "--store", url, cwd=tmp_path).stdout
    assert "queue default, priority 0; 2 task(s) of its queue go first" in text, text
