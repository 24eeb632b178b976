"""Round 33 of the fresh-user fixes: what ``ls``, ``show`` and ``verify --all`` say of tasks
submitted to the workers -- the ``goal / code`` column heading, when a queued task was submitted
(``ls --json``), a task's params in ``show``, and the queued tasks ``verify --all`` has nothing of
to verify yet. Real ``python -m overnight`` processes on real SQLite stores; nothing mocked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from _report_project import lg_threads, ok, report_project
from _procs import CLI, cli, env


def _header(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("task ")]
    return line


# -- 1. ls heads the last column "goal / code" when it lists a submitted task ------------------


def test_ls_heads_the_column_goal_code_when_a_queued_task_is_listed(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    head = _header(ok(tmp_path, "ls", "--store", url))
    assert head.split()[-1] == "goal" and "goal / code" not in head  # only goals: unchanged
    ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--store", url)
    out = ok(tmp_path, "ls", "--store", url)
    assert _header(out).rstrip().endswith("goal / code"), out
    assert "queued from tasks/report.py" in out and "write the quarterly report" in out


# -- 2. ls --json says when a queued task was submitted ----------------------------------------


def test_ls_json_carries_submitted_ms_of_a_queued_task(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--store", url)
    rows: dict[str, Any] = {t["task_id"]: t for t in json.loads(ok(tmp_path, "ls", "--json", "--store", url))}
    queue = json.loads(ok(tmp_path, "status", "later", "--json", "--store", url))["queue"]
    assert rows["later"]["submitted_ms"] == queue["submitted_ms"] > 0  # the queue row's time, as status says
    # a task with checkpoints: the key is null, as its other submitted-only key (entry) is
    assert rows["done1"]["submitted_ms"] is None and rows["done1"]["entry"] is None
    assert set(rows["done1"]) == set(rows["later"])  # one shape for every row


# -- 3. show prints the params the task's verified head records --------------------------------


def test_show_prints_params_after_the_status_line(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "p1", "--param", "topic=storage", "--param", "n=3", "-q",
        "--store", url)
    lines = ok(tmp_path, "show", "p1", "--store", url).splitlines()
    (i,) = [k for k, line in enumerate(lines) if line.startswith("status:")]
    assert lines[i + 1] == 'params: {"n":3,"topic":"storage"}', lines  # params_text: keys sorted, canonical
    shown = json.loads(ok(tmp_path, "show", "p1", "--json", "--store", url))
    assert shown["params"] == {"n": 3, "topic": "storage"}


def test_show_of_a_task_without_params_prints_no_params_line(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "plain", "-q", "--store", url)
    out = ok(tmp_path, "show", "plain", "--store", url)
    assert "params:" not in out and "status: complete" in out
    assert json.loads(ok(tmp_path, "show", "plain", "--json", "--store", url))["params"] == {}


# -- 4. verify --all names the queued tasks it has nothing of to verify ------------------------


def test_verify_all_says_which_queued_tasks_have_no_checkpoint_yet(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    out = ok(tmp_path, "verify", "--all", "--store", url)  # nothing queued: no such line
    assert "queued" not in out and out.rstrip().endswith("ok")
    assert json.loads(ok(tmp_path, "verify", "--all", "--json", "--store", url))["queued"] == []
    ids = [f"q{i}" for i in range(1, 7)]
    for task_id in ids:
        ok(tmp_path, "submit", "tasks/report.py", "--id", task_id, "--param", f"i={task_id}", "--store", url)
    r = cli("verify", "--all", "--store", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # exit code unchanged: nothing is damaged
    assert "6 queued task(s) have no checkpoint yet (not verified): q1, q2, q3, q4, q5, …" in r.stdout, r.stdout
    assert "q6" not in r.stdout and r.stdout.startswith("1 task(s)")
    rep = json.loads(ok(tmp_path, "verify", "--all", "--json", "--store", url))
    assert rep["queued"] == ids and rep["ok"] is True and rep["tasks"] == 1  # existing keys kept
    assert "queued" in json.loads(ok(tmp_path, "verify", "done1", "--json", "--store", url))  # one shape


# -- 5. a LangGraph thread is open, never complete; ":a:" in its id is text, not an emoji -------


def test_a_langgraph_thread_is_open_and_its_id_prints_as_text(tmp_path: Path) -> None:
    """Fresh user: ``ls``/``status`` said ``complete, 0/0 steps`` of a thread killed mid-turn (a
    thread has no plan to complete), and ``verify --all`` printed ``langgraph:a`` as
    ``langgraph🅰`` (rich's emoji code ``:a:``)."""
    url = lg_threads(tmp_path, "a", "a")
    rows = {r["task_id"]: r for r in json.loads(ok(tmp_path, "ls", "--json", "--store", url))}
    assert rows["langgraph:a"]["status"] == "open (LangGraph thread)"
    assert rows["langgraph:a"]["status_kind"] == "open"
    listed = [line for line in ok(tmp_path, "ls", "--store", url).splitlines() if line.startswith("langgraph:a")]
    assert listed and "open (LangGraph thread)" in listed[0] and "0/0" not in listed[0]
    status = ok(tmp_path, "status", "langgraph:a", "--store", url)
    assert "open (LangGraph thread)" in status and "0/0" not in status
    shown = ok(tmp_path, "show", "langgraph:a", "--store", url)
    assert "status: open (LangGraph thread), stored" in shown and "0/0" not in shown
    r = cli("status", "a", "--store", url, cwd=tmp_path)  # the thread id alone
    assert r.returncode == 2 and "did you mean langgraph:a?" in r.stderr, r.stderr
    out = ok(tmp_path, "verify", "--all", "--store", url)
    assert "langgraph:a: main ok" in out and "\U0001f170" not in out


# -- 6. "did you mean" names the task a --param gave an id of its own ---------------------------


def test_a_task_id_without_its_params_digest_suggests_the_submitted_one(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--param", "who=ada", "--store", url)
    (task_id,) = [r["task_id"] for r in json.loads(ok(tmp_path, "ls", "--json", "--store", url))]
    assert task_id.startswith("report-") and len(task_id) == len("report-") + 8
    for asked in ("report", "Report"):
        r = cli("status", asked, "--store", url, cwd=tmp_path)
        assert r.returncode == 2 and f"did you mean {task_id}?" in r.stderr, r.stderr


def test_a_task_not_found_without_a_close_id_says_an_ephemeral_task_is_not_kept(tmp_path: Path) -> None:
    """Fresh user: after an ``ephemeral`` run, ``status``/``resume`` of its id said only that the
    store has no such task; the run had said so, but a user asks later."""
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--store", url, "-q")
    for cmd in ("status", "resume"):
        r = cli(cmd, "quick", "--store", url, cwd=tmp_path)
        assert r.returncode == 2 and "ephemeral" in r.stderr and "overnight route" in r.stderr, r.stderr


# -- 7. attacker: a thread id is one line in verify, and a long one does not squeeze ls -------------


def test_a_thread_id_with_a_line_break_or_of_400_characters_keeps_the_listings_readable(tmp_path: Path) -> None:
    """Attacker (round 33): ``verify --all`` printed a LangGraph thread id holding a line break as
    two lines (a forged ``langgraph:fake complete 9/9`` row), and a 400-character thread id took
    the whole width of ``ls`` on a terminal, every other column squeezed to nothing."""
    url = lg_threads(tmp_path, "a\nlanggraph:fake   complete   9/9", "x" * 400)
    out = ok(tmp_path, "verify", "--all", "--store", url)
    assert not any(line.startswith("langgraph:fake") for line in out.splitlines()), out
    assert "langgraph:a\\nlanggraph:fake   complete   9/9: main ok" in out
    r = cli("ls", "--store", url, cwd=tmp_path, extra_env={"COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("langgraph:xxx"))
    assert "open" in row and "…" in row and len(row) <= 120, r.stdout
    bare = {k: v for k, v in env().items() if k != "COLUMNS"}  # a pipe without COLUMNS: whole, on one line
    piped = subprocess.run([*CLI, "ls", "--store", url], cwd=tmp_path, env=bare, capture_output=True, text=True,
                           timeout=60)
    assert piped.returncode == 0 and "langgraph:" + "x" * 400 in piped.stdout, piped.stderr
