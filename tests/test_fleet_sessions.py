"""A worker's session processes run one task after another, as a fresh process per task would:
what one task changes in the process (environment variables, directory, alarms, ``sys.path``)
does not reach the next; the project's code is imported anew for every task (an edit made while
a task ran, two task files of the same name, a module whose top level sets the environment); a
session whose installed code changed is replaced; a session that dies or stops while idle costs
no task a death; ``--session-tasks 1`` starts a fresh process per task. Real worker processes on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from _fleet import cli, fleet_env, project, queue_rows, start_worker, stop, store_url, wait_until

ENV_TASK = '''
import decimal, gc, json, logging, os, signal, time, warnings
import overnight

os.environ.setdefault("SET_AT_IMPORT", "yes")  # as load_dotenv() does
logging.getLogger("myapp").addHandler(logging.StreamHandler())  # once per process: once per task here

task = overnight.Task("envtask", goal="reports the world it starts in", level="durable")

@task.step
def look(ctx):
    time.sleep(float(ctx.params.get("sleep", 0)))
    with open(os.environ["SIDE_LOG"], "a") as f:
        f.write(json.dumps({"task": ctx.task_id, "pid": os.getpid(), "leak": os.environ.get("LEAKED"),
                            "cwd": os.getcwd(), "version": VERSION, "import_env": os.environ.get("SET_AT_IMPORT"),
                            "ext": __import__("extmod").WHO if ctx.params.get("ext") else None,
                            "vendored": __import__("vendmod").LOADS if ctx.params.get("vendor") else None,
                            "world": [decimal.getcontext().prec, warnings.filters[0][0], gc.isenabled(), time.tzname[0],
                                      sys_limit(), len(logging.getLogger("myapp").handlers)]}) + "\\n")
    os.environ["LEAKED"] = ctx.task_id  # a task that changes its process's world
    decimal.getcontext().prec = 3
    warnings.simplefilter("error")
    gc.disable()
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    import sys
    sys.setrecursionlimit(500)
    os.makedirs("elsewhere", exist_ok=True)
    os.chdir("elsewhere")
    if ctx.params.get("alarm"):
        signal.alarm(1)  # would kill whatever the session runs next
    if ctx.params.get("exit0"):
        os._exit(0)
    return {"ok": True}

def sys_limit():
    import sys
    return sys.getrecursionlimit()

VERSION = 1
'''


def _setup(tmp_path: Path) -> Path:
    project(tmp_path)
    source = tmp_path / "tasks" / "envtask.py"
    source.write_text(ENV_TASK)
    return source


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request, tmp_path: Path) -> str:
    _setup(tmp_path)
    return store_url(request, tmp_path)


def _submit(tmp_path: Path, store: str, task_id: str, *params: str, file: str = "tasks/envtask.py") -> None:
    res = cli(tmp_path, "submit", file, "--store", store, "--id", task_id, *[a for p in params for a in ("--param", p)])
    assert res.returncode == 0, res.stderr


def _seen(tmp_path: Path) -> dict[str, dict]:
    path = tmp_path / "side.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return {d["task"]: d for d in map(json.loads, lines)}


def _status(store: str, task_id: str) -> str | None:
    row = queue_rows(store).get(task_id)
    return row.status if row is not None else None


@pytest.mark.slow
def test_one_session_runs_tasks_in_turn_each_in_the_world_it_started_with(tmp_path: Path, any_url: str) -> None:
    _submit(tmp_path, any_url, "t1", "alarm=1")
    _submit(tmp_path, any_url, "t2", "sleep=1.5")  # outlives t1's alarm, had it been left pending
    _submit(tmp_path, any_url, "t3")
    w = start_worker(tmp_path, any_url, "--idle-exit", "2")
    assert w.wait(timeout=120) == 0, (tmp_path / "w.err").read_text()
    seen = _seen(tmp_path)
    rows = queue_rows(any_url)
    assert {t: (rows[t].status, rows[t].deaths) for t in seen} == dict.fromkeys(("t1", "t2", "t3"), ("complete", 0))
    assert len({d["pid"] for d in seen.values()}) == 1  # one session process ran all three
    # the previous task's environment variable and directory did not reach the next one; what the
    # module sets when it is imported is there for every task (it is imported anew for each)
    assert [d["leak"] for d in seen.values()] == [None, None, None]
    assert [d["import_env"] for d in seen.values()] == ["yes", "yes", "yes"]
    assert {d["cwd"] for d in seen.values()} == {str(tmp_path)}
    # decimal precision, warnings filters, gc, time zone, recursion limit, a project logger's handlers
    assert seen["t2"]["world"] == seen["t3"]["world"] == seen["t1"]["world"] and seen["t1"]["world"][-1] == 1


@pytest.mark.slow
def test_session_tasks_1_starts_a_process_per_task(tmp_path: Path) -> None:
    _setup(tmp_path)
    store = f"sqlite://{tmp_path / 'q.db'}"
    for tid in ("t1", "t2"):
        _submit(tmp_path, store, tid)
    w = start_worker(tmp_path, store, "--idle-exit", "2", "--session-tasks", "1")
    assert w.wait(timeout=120) == 0, (tmp_path / "w.err").read_text()
    seen = _seen(tmp_path)
    assert set(seen) == {"t1", "t2"} and seen["t1"]["pid"] != seen["t2"]["pid"]
    bad = cli(tmp_path, "worker", "--store", store, "--session-tasks", "0")
    assert bad.returncode == 2


@pytest.mark.slow
def test_same_named_task_files_in_two_folders_each_run_their_own_code(tmp_path: Path) -> None:
    project(tmp_path)
    for who in ("a", "b"):
        folder = tmp_path / "tasks" / who
        folder.mkdir(parents=True)
        (folder / "helper.py").write_text(f"WHO = {who!r}\n")
        (folder / "t.py").write_text(f'''
import dataclasses, json, os
import overnight

@dataclasses.dataclass
class Res:
    who: str

task = overnight.Task("t{who}", goal="g", level="durable")

@task.step
def look(ctx):
    import helper
    ctx.state["res"] = Res(helper.WHO)
    with open(os.environ["SIDE_LOG"], "a") as f:
        f.write(json.dumps({{"task": ctx.task_id, "helper": helper.WHO, "cls": type(ctx.state["res"]).__module__}}) + "\\n")
''')
    store = f"sqlite://{tmp_path / 'q.db'}"
    _submit(tmp_path, store, "ta", file="tasks/a/t.py")
    _submit(tmp_path, store, "tb", file="tasks/b/t.py")
    w = start_worker(tmp_path, store, "--idle-exit", "2")
    assert w.wait(timeout=120) == 0, (tmp_path / "w.err").read_text()
    seen = _seen(tmp_path)
    assert {t: (d["helper"], d["cls"]) for t, d in seen.items()} == {"ta": ("a", "t"), "tb": ("b", "t")}
    assert {_status(store, t) for t in ("ta", "tb")} == {"complete"}


@pytest.mark.slow
def test_edits_stops_and_deaths_around_a_reused_session(tmp_path: Path) -> None:
    source = _setup(tmp_path)
    ext = tmp_path.parent / f"{tmp_path.name}-ext"  # an installed module: outside the project
    ext.mkdir()
    (ext / "extmod.py").write_text("WHO = 'v1'\n")
    vendor = tmp_path / "vendor"  # installed inside the project (pip install --target vendor/)
    vendor.mkdir()
    (vendor / "vendmod.py").write_text("import builtins\nbuiltins.vendmod_loads = getattr(builtins, 'vendmod_loads', 0) + 1\n"
                                       "LOADS = builtins.vendmod_loads\n")
    store = f"sqlite://{tmp_path / 'q.db'}"
    w = start_worker(tmp_path, store, "--lease", "3",
                     PYTHONPATH=os.pathsep.join([str(ext), str(vendor), fleet_env(tmp_path)["PYTHONPATH"]]))
    try:
        # the task file is edited while a task runs: the next task runs the new code
        _submit(tmp_path, store, "v1", "sleep=2", "ext=1", "vendor=1")
        wait_until(lambda: (tmp_path / "side.log").exists(), 60, "the first task's step")
        source.write_text(ENV_TASK.replace("VERSION = 1", "VERSION = 2"))
        wait_until(lambda: _status(store, "v1") == "complete", 60, "the first task complete")
        _submit(tmp_path, store, "v2", "vendor=1")
        wait_until(lambda: _status(store, "v2") == "complete", 60, "the task after the edit")
        first, second = _seen(tmp_path)["v1"], _seen(tmp_path)["v2"]
        assert (first["version"], first["ext"], second["version"]) == (1, "v1", 2)
        assert (first["vendored"], second["vendored"]) == (1, 1)  # installed code is imported once
        assert second["pid"] == first["pid"]  # the same session, with the file imported anew

        # an installed module changes on disk: that session is replaced, not the task's death
        (ext / "extmod.py").write_text("WHO = 'v2!'\n")
        _submit(tmp_path, store, "v3", "ext=1")
        wait_until(lambda: _status(store, "v3") == "complete", 60, "the task after the upgrade")
        third = _seen(tmp_path)["v3"]
        assert third["ext"] == "v2!" and third["pid"] != first["pid"]

        # a session killed while it waits for work: the next task runs elsewhere, without a death
        os.kill(third["pid"], signal.SIGKILL)
        _submit(tmp_path, store, "v4")
        wait_until(lambda: _status(store, "v4") == "complete", 60, "the task after the idle session's death")
        fourth = _seen(tmp_path)["v4"]

        # a session stopped (SIGSTOP) while it waits: the worker gives its task to another one
        os.kill(fourth["pid"], signal.SIGSTOP)
        _submit(tmp_path, store, "v5")
        wait_until(lambda: _status(store, "v5") == "complete", 60, "the task after the stopped session")
        assert _seen(tmp_path)["v5"]["pid"] not in (first["pid"], third["pid"], fourth["pid"])

        # a step that ends its process with status 0 is a death, not a task left running
        _submit(tmp_path, store, "v6", "exit0=1")
        wait_until(lambda: (queue_rows(store)["v6"].deaths or 0) >= 1, 60, "the death of the exiting session")
        rows = queue_rows(store)
        assert [rows[t].deaths for t in ("v1", "v2", "v3", "v4", "v5")] == [0, 0, 0, 0, 0]
    finally:
        stop(w, signal.SIGTERM)
    log = (tmp_path / "w.err").read_text()
    assert w.returncode == 0, log
    assert f"task v3: {ext / 'extmod.py'} changed since this session (pid {first['pid']}) imported it" in log
    assert f"idle session {third['pid']} exited (killed by signal 9)" in log
    assert f"session {fourth['pid']} did not take task v5" in log
    assert "session exited with status 0 before its task ended" in log
