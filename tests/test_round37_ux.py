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


# -- resume from outside the project ------------------------------------------------------------

PROJECT_TASK = '''
import overnight
task = overnight.Task("inp", goal="read an input file and summarise", expected_span="2d")

@task.step
def read(ctx):
    return {"n": len(ctx.read_input_text("data.txt"))}

@task.step
def b(ctx):
    ctx.write_text("out.txt", str(ctx.outputs["read"]))
'''


def test_resume_from_outside_the_project_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Fresh user (round 37): ``resume --file`` from another folder -- the command the "task file does
    not exist" hint gave -- read the project as moved to that folder, found every input missing and
    recomputed the complete task's steps there (its step then failed: ``/tmp/data.txt``). Now it is
    refused with exit 2, naming the folder to resume from, and the task stays complete; a copy of
    the project still resumes from the copy."""
    import shutil

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "overnight.toml").write_text("")
    (proj / "data.txt").write_text("hello\n")
    (proj / "t.py").write_text(PROJECT_TASK)
    ok(proj, "run", "t.py", "-q")
    url = f"sqlite:///{proj / '.overnight' / 'overnight.db'}"
    head = json.loads(ok(proj, "show", "inp", "--json", "--store", url))["branches"]["main"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = cli("resume", "inp", "--store", url, "--file", str(proj / "t.py"), cwd=elsewhere)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"cd {proj} && overnight resume inp" in r.stderr and "belongs to the project" in r.stderr, r.stderr
    shown = json.loads(ok(proj, "show", "inp", "--json", "--store", url))
    assert shown["branches"]["main"] == head  # no drift checkpoint, nothing recomputed
    status = ok(proj, "status", "inp")
    assert "complete" in status and "2/2" in status, status
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy)  # the store travels with it
    again = cli("resume", "inp", cwd=copy)
    assert again.returncode == 0 and f"project moved: recorded at {proj}, now {copy}" in again.stderr, again.stderr
    assert "complete" in ok(copy, "status", "inp")


# -- the dashboard lists tasks submitted with no checkpoint yet ----------------------------------


def test_the_dashboard_lists_submitted_tasks_with_no_checkpoint_yet(tmp_path: Path) -> None:
    """Fresh user (round 37): ``ls`` listed two submitted tasks as ``queued`` but the dashboard's
    Tasks page said ``queued (0)`` and listed neither; their task page was a bare 404."""
    import pytest

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from _ui import UiServer, make_site, run_cli

    site = make_site(tmp_path / "site", parts=2)
    assert run_cli(site, "submit", "ui_task.py", "--id", "later", "--not-before", "+2h").returncode == 0
    assert run_cli(site, "submit", "ui_task.py", "--id", "now-q").returncode == 0
    with UiServer(site) as srv:
        data = httpx.get(srv.base + "/tasks.json").json()
        rows = {t["task_id"]: t for t in data["tasks"]}
        assert set(rows) == {"report", "later", "now-q"}, rows
        assert data["counts"]["queued"] == 2 and data["total"] == 3, data["counts"]
        assert rows["later"]["status"] == "queued" and "starts in" in (rows["later"]["status_reason"] or "")
        assert rows["now-q"]["entry"] == "ui_task.py:task" and rows["now-q"]["checkpoints"] == 0
        assert rows["report"]["entry"] is None and set(rows["report"]) == set(rows["later"])  # one shape
        only = httpx.get(srv.base + "/tasks.json?status=queued").json()["tasks"]
        assert {t["task_id"] for t in only} == {"later", "now-q"}
        page = httpx.get(srv.base + "/").text
        assert "now-q" in page and "queued from <code>ui_task.py:task</code>" in page
        missing = httpx.get(srv.base + "/task.json?id=now-q")
        assert missing.status_code == 404 and "no checkpoint yet" in missing.json()["message"], missing.text
        assert "overnight worker" in missing.json()["hint"]


def test_a_worker_in_a_project_subfolder_refuses_and_names_the_project_folder(tmp_path: Path) -> None:
    """Fresh user (round 37): without an ``overnight.toml``, ``worker`` in a subfolder made a new,
    empty store there, claimed nothing and exited 0 (``ls`` there refuses, exit 2); its note's
    ``--store`` then made it look the task's code up from the subfolder and park the task
    ``failed``. Now it refuses, naming the folder to start it in, and creates nothing."""
    report_project(tmp_path)
    (tmp_path / "overnight.toml").unlink()  # no project file: the default store is the current directory's
    ok(tmp_path, "submit", "tasks/report.py", "--id", "w1")
    sub = tmp_path / "tasks"
    r = cli("worker", "--idle-exit", "1", cwd=sub)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "the project's store is further up" in r.stderr and f"cd {tmp_path} && overnight worker" in r.stderr, \
        r.stderr
    assert not (sub / ".overnight").exists()
    done = cli("worker", "--idle-exit", "1", cwd=tmp_path)  # where the hint says: it runs the task
    assert done.returncode == 0, done.stderr
    assert "complete" in ok(tmp_path, "status", "w1")


def test_show_prints_unicode_params_as_written(tmp_path: Path) -> None:
    """Fresh user (round 37): ``show`` printed ``params: {"who":"Zo\\u00eb \\ud83d\\udc19"}``."""
    url = report_project(tmp_path)
    ok(tmp_path, "run", "tasks/report.py", "--id", "p1", "--param", "who=Zoë 🐙", "--param", "nl=a\nb", "-q",
       "--store", url)
    shown = ok(tmp_path, "show", "p1", "--store", url)
    assert 'params: {"nl":"a\\nb","who":"Zoë 🐙"}' in shown, shown


def test_params_with_a_repeated_key_are_refused(tmp_path: Path) -> None:
    """Attacker (round 37): ``--params '{"n":2,"n":3}'`` was taken silently, the last value winning."""
    url = report_project(tmp_path)
    for params in ('{"n":2,"n":3}', '{"a":{"k":1,"k":2}}'):
        r = cli("submit", "tasks/report.py", "--params", params, "--store", url, cwd=tmp_path)
        assert r.returncode == 2 and "repeated key" in r.stderr, r.stderr


def test_the_resume_hint_of_an_invisible_branch_name_pastes(tmp_path: Path) -> None:
    """Attacker (round 37): ``fork --branch $'rtl\\u202e'`` printed ``--branch 'rtl\\u202e'``: pasted,
    that names a branch of nine visible characters, which does not exist. The hint now uses bash's
    ``$'...'`` quoting for a name with a character no terminal shows."""
    import shlex
    import subprocess

    from _procs import CLI, env

    url = report_project(tmp_path)
    cli("run", "tasks/report.py", "--id", "f1", "--max-steps", "1", "-q", "--store", url, cwd=tmp_path)
    head = json.loads(ok(tmp_path, "show", "f1", "--json", "--store", url))["branches"]["main"]
    forked = cli("fork", "f1", "--at", head, "--branch", "rtl\u202e", "--store", url, cwd=tmp_path)
    out = forked.stdout + forked.stderr
    assert forked.returncode == 0 and "overnight resume" in out, out
    hint = out[out.index("overnight resume"):].splitlines()[0].strip()
    assert "--branch $'rtl\\u202e'" in hint, hint
    pasted = subprocess.run(["bash", "-c", shlex.join(CLI) + hint[len("overnight"):]], cwd=tmp_path, env=env(),
                            capture_output=True, text=True, timeout=120)
    assert pasted.returncode in (0, 75) and "not found" not in pasted.stderr, pasted.stderr
