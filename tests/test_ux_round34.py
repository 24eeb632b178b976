"""Round 34 of the fresh-user fixes: an id no task can have is said to be one (which character),
a very long id is not echoed whole in errors, ``ls --json`` says null for what a row does not
know (a queued task's creation time, the steps of a row with no plan), and ``submit -q`` prints
only the task id. Real ``python -m overnight`` processes on real SQLite stores; nothing mocked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _report_project import REPORT, lg_threads, ok, report_project
from _procs import cli


# -- 1. an id no task can have: "not a valid task id", naming the character ----------------------


@pytest.mark.parametrize("cmd", ["status", "show", "resume"])
@pytest.mark.parametrize(("asked", "named"), [("[red]x", "'['"), ("a\nb", "'\\n' (U+000A)"),
                                              ("ta\x07sk", "'\\x07' (U+0007)"), ("-x", "cannot start with '-'")])
def test_an_invalid_task_id_is_said_to_be_one(tmp_path: Path, cmd: str, asked: str, named: str) -> None:
    """Fresh user: ``overnight status '[red]x'`` (or an id holding a line break or a control
    character) said only that the store has no such task, with a hint about ephemeral tasks."""
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    r = cli(cmd, "--store", url, "--", asked, cwd=tmp_path)  # "--": "-x" is an argument, not an option
    assert r.returncode == 2, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"error: {asked!r} is not a valid task id: "), r.stderr
    assert named in first and f"(task {asked!r})" not in r.stderr, r.stderr  # named once
    assert "ephemeral" not in r.stderr and "Traceback" not in r.stderr
    assert "1-200 ASCII letters" in r.stderr  # the rule, as Task states it
    assert f"`overnight ls --store {url}` lists the tasks" in r.stderr


def test_an_invalid_task_id_without_a_store_option_is_said_to_be_one(tmp_path: Path) -> None:
    """``resume ID`` with no --store looks in the default store and the configured media."""
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q")  # the default store
    r = cli("resume", "[red]x", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: '[red]x' is not a valid task id: '[' is not allowed"), \
        r.stderr
    del url


def test_a_valid_id_not_found_and_a_stored_odd_id_are_unchanged(tmp_path: Path) -> None:
    """A valid id still gets "no task" (and its did-you-mean); a LangGraph thread whose id holds a
    character a Task id cannot is found as before, and a missing one is not called invalid."""
    url = lg_threads(tmp_path, "a b")
    ok(tmp_path, "status", "langgraph:a b", "--store", url)
    r = cli("status", "langgraph:a c", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "not a valid task id" not in r.stderr and "did you mean langgraph:a b?" in r.stderr, \
        r.stderr
    r = cli("status", "nosuch", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "no task 'nosuch'" in r.stderr and "not a valid" not in r.stderr, r.stderr


def test_an_invalid_id_is_a_typed_error_in_the_library(tmp_path: Path) -> None:
    from overnight import api
    from overnight.errors import TaskNotFound

    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    with pytest.raises(TaskNotFound) as info:
        api.status("[red]x", store=url)
    assert info.value.message.startswith("'[red]x' is not a valid task id: '[' is not allowed")
    assert info.value.task_id == "[red]x"


# -- 2. a long id is not repeated whole -----------------------------------------------------------


@pytest.mark.parametrize("cmd", ["status", "show", "resume", "retry", "cancel"])
@pytest.mark.parametrize("asked", ["y" * 3000, "[" + "y" * 3000])
def test_a_long_id_is_shortened_in_the_error(tmp_path: Path, cmd: str, asked: str) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    r = cli(cmd, asked, "--store", url, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert asked[:81] not in r.stderr and len(r.stderr) < 1000, r.stderr
    assert f"{asked[:80]!r}"[:-1] + "…' (3001 characters)" in r.stderr or \
        f"{asked[:80]!r}"[:-1] + "…' (3000 characters)" in r.stderr, r.stderr


def test_a_long_id_is_shortened_without_a_store_option(tmp_path: Path) -> None:
    report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q")
    r = cli("resume", "z" * 5000, cwd=tmp_path)
    assert r.returncode == 2 and "z" * 81 not in r.stderr and "(5000 characters)" in r.stderr, r.stderr


def test_shown_task_id() -> None:
    from overnight.errors import shown_task_id

    assert shown_task_id("report") == "'report'"
    assert shown_task_id("x" * 80) == repr("x" * 80)
    assert shown_task_id("x" * 81) == "'" + "x" * 80 + "…' (81 characters)"
    assert shown_task_id("\n" * 100).startswith("'\\n\\n") and shown_task_id("\n" * 100).endswith("…' (100 characters)")


# -- 3. ls --json: null for what a row does not know ---------------------------------------------


def test_ls_json_is_null_for_a_queued_tasks_times_and_steps(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "done1", "-q", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "later", "--store", url)
    rows: dict[str, Any] = {t["task_id"]: t for t in json.loads(ok(tmp_path, "ls", "--json", "--store", url))}
    later, done = rows["later"], rows["done1"]
    assert later["created_at"] is None and later["updated_at"] is None
    assert later["done"] is None and later["total"] is None
    assert later["submitted_ms"] > 0 and later["entry"] == "tasks/report.py:task"
    # a task with checkpoints: unchanged
    assert done["done"] == 1 and done["total"] == 1
    assert done["created_at"] and done["updated_at"] and done["created_at"] <= done["updated_at"]
    assert set(done) == set(later)


def test_ls_json_is_null_for_the_steps_of_a_langgraph_thread(tmp_path: Path) -> None:
    url = lg_threads(tmp_path, "a")
    (row,) = json.loads(ok(tmp_path, "ls", "--json", "--store", url))
    assert row["status_kind"] == "open" and row["done"] is None and row["total"] is None, row
    assert row["created_at"] and row["updated_at"]  # a thread has checkpoints: its times are known


# -- 4. submit -q prints only the task id ---------------------------------------------------------


def test_submit_quiet_prints_only_the_task_id(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    out = ok(tmp_path, "submit", "-q", "tasks/report.py", "--param", "who=ada", "--store", url)
    (task_id,) = [r["task_id"] for r in json.loads(ok(tmp_path, "ls", "--json", "--store", url))]
    assert out == f"{task_id}\n"
    # submitted again (same id): still only the id, for `id=$(overnight submit -q ...)`
    assert ok(tmp_path, "submit", "--quiet", "tasks/report.py", "--param", "who=ada", "--store", url) == out
    assert ok(tmp_path, "submit", "tasks/report.py", "--id", "plain", "--store", url).startswith("plain queued:")
    r = cli("submit", "--help", cwd=tmp_path)
    assert "--quiet" in r.stdout and "-q" in r.stdout and "only the task id" in r.stdout


@pytest.mark.parametrize(("task_id", "problem"), [
    ("", "it is empty"), (".hidden", "it cannot start with '.'"), ("[red]x", "'[' is not allowed"),
    ("a b", "' ' (U+0020) is not allowed"), ("ok\n", "'\\n' (U+000A) is not allowed"),
    ("раз", "'р' (U+0440) is not allowed"), ("a" * 201, "it is longer than 200 characters"),
    ("report-1.v2_x", None), ("a" * 200, None)])
def test_task_id_problem_names_what_is_wrong(task_id: str, problem: str | None) -> None:
    """The rule Task enforces, said as a reason (the CLI's "is not a valid task id: ...")."""
    from overnight.errors import SpecError
    from overnight.runtime.task import Task, task_id_problem

    assert task_id_problem(task_id) == problem
    if problem is None:
        Task(task_id, goal="g")
    else:
        with pytest.raises(SpecError, match="invalid task id"):
            Task(task_id, goal="g")


def test_help_names_what_each_option_takes(tmp_path: Path) -> None:
    """``--store URL``, ``--max-steps N``, an argument as its name alone -- not typer's ``<str>``,
    ``<int range>`` or ``TASK_ID <str>``."""
    run = ok(tmp_path, "run", "--help")
    for shown in ("--store URL", "--branch NAME", "--max-steps N", "--events FILE", "--base-url URL",
                  "--max-context-tokens N"):
        assert shown in run, shown
    status = ok(tmp_path, "status", "--help")
    assert "--file FILE.py[:NAME]" in status
    for text in (run, status, ok(tmp_path, "route", "--help"), ok(tmp_path, "worker", "--help"),
                 ok(tmp_path, "bench", "commit", "--help")):
        assert "<str>" not in text and "range>" not in text and "<int>" not in text, text
    assert "--at TIME" in ok(tmp_path, "route", "--help")
    assert "--concurrency N" in ok(tmp_path, "worker", "--help")


@pytest.mark.parametrize("command", ["cancel", "retry", "status"])
@pytest.mark.parametrize(("task_id", "why"), [("a\udcff", "'\\udcff' (U+DCFF) is not allowed"), ("", "it is empty")])
def test_queue_commands_say_an_id_is_not_valid(tmp_path: Path, command: str, task_id: str, why: str) -> None:
    """An id that is not UTF-8 (``$'a\\xff'`` in a shell) or empty: the queue commands say it is no
    task id, exit 2 -- not a UnicodeEncodeError traceback from the store."""
    store = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--store", store, "-q")
    r = cli(command, task_id, "--store", store, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"is not a valid task id: {why}" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_submit_refuses_a_stored_task_of_other_code_and_queues_nothing_for_a_complete_one(tmp_path: Path) -> None:
    """``overnight run`` made task "report"; ``submit`` of other code under that id is refused as
    ``run`` refuses it (a worker would park it failed), and ``submit`` of the same, complete task
    queues nothing -- as ``resume --submit`` says."""
    store = report_project(tmp_path)
    (tmp_path / "tasks" / "other.py").write_text(REPORT)
    ok(tmp_path, "run", "tasks/report.py", "--store", store, "-q")
    r = cli("submit", "tasks/other.py", "--store", store, cwd=tmp_path)
    assert r.returncode == 2 and "already exists, created by tasks/report.py:task; this code is tasks/other.py:task" \
        in r.stderr, r.stderr
    assert "already complete, nothing to queue" in ok(tmp_path, "submit", "tasks/report.py", "--store", store)
    r = cli("submit", "tasks/report.py", "--id", "report", "--param", "a=1", "--store", store, cwd=tmp_path)
    assert r.returncode == 2 and "is complete with params {}" in r.stderr, r.stderr
    rows = json.loads(ok(tmp_path, "ls", "--json", "--store", store))
    assert [(t["task_id"], t["status"]) for t in rows] == [("report", "complete")]
