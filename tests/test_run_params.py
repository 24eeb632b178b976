"""`overnight run FILE --param/--params/--id`: a task run here with parameters, as `overnight submit`
queues it -- same id rule, same spec, and `overnight resume` runs the same definition with the same
params. Real CLI processes on a SQLite store in a fresh project folder."""

from __future__ import annotations

import json
from pathlib import Path

from _procs import cli
from overnight.fleet.submit import default_id
from overnight.runtime.task import Task

TASK_FILE = '''
import json, os
import overnight

task = overnight.Task("report", goal="write a short report on a topic", expected_span="5m")


def _note(ctx, step):
    with open(os.environ["SIDE_FILE"], "a") as f:
        f.write(json.dumps({"step": step, "task": ctx.task_id, "params": dict(ctx.params)}) + "\\n")


@task.step
def outline(ctx):
    _note(ctx, "outline")


@task.step
def draft(ctx):
    _note(ctx, "draft")
'''


def _project(tmp_path: Path) -> Path:
    (tmp_path / "overnight.toml").write_text("")
    (tmp_path / "report.py").write_text(TASK_FILE)
    return tmp_path


def _run(tmp_path: Path, *args: str):  # noqa: ANN202
    return cli(*args, "--store", f"sqlite://{tmp_path / 's.db'}", cwd=tmp_path,
               extra_env={"SIDE_FILE": str(tmp_path / "side.jsonl")})


def _side(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "side.jsonl").read_text().splitlines()]


def test_run_with_params_uses_the_submit_id_and_resume_keeps_the_params(tmp_path: Path) -> None:
    _project(tmp_path)
    params = {"topic": "storage", "n": 3}
    expected = default_id(Task("report", goal="x"), params)
    assert expected.startswith("report-") and expected != "report"
    first = _run(tmp_path, "run", "report.py", "--param", "topic=storage", "--param", "n=3", "--max-steps", "1")
    assert first.returncode == 75, first.stderr
    assert f"overnight resume {expected}" in first.stderr + first.stdout
    listed = json.loads(_run(tmp_path, "ls", "--json").stdout)
    assert [t["task_id"] for t in listed] == [expected]
    second = _run(tmp_path, "resume", expected)
    assert second.returncode == 0, second.stderr
    assert _side(tmp_path) == [{"step": s, "task": expected, "params": params} for s in ("outline", "draft")]
    # the same params again: the same task (complete), not a new one
    again = _run(tmp_path, "run", "report.py", "--params", '{"n": 3, "topic": "storage"}')
    assert again.returncode == 0, again.stderr
    assert [t["task_id"] for t in json.loads(_run(tmp_path, "ls", "--json").stdout)] == [expected]


def test_run_with_an_id_and_without_params(tmp_path: Path) -> None:
    _project(tmp_path)
    done = _run(tmp_path, "run", "report.py", "--id", "report-q4")
    assert done.returncode == 0, done.stderr
    assert _side(tmp_path) == [{"step": s, "task": "report-q4", "params": {}} for s in ("outline", "draft")]
    again = _run(tmp_path, "run", "report.py", "--id", "report-q4")  # complete: runs and records nothing
    assert again.returncode == 0 and "0 run now" in again.stderr, again.stderr
    assert "session #" not in again.stderr and "context window #" not in again.stderr, again.stderr
    plain = _run(tmp_path, "run", "report.py")  # the definition's own id is another task
    assert plain.returncode == 0, plain.stderr
    assert sorted(t["task_id"] for t in json.loads(_run(tmp_path, "ls", "--json").stdout)) == ["report", "report-q4"]


def test_bad_params_and_ids_are_refused_before_anything_runs(tmp_path: Path) -> None:
    _project(tmp_path)
    for args, says in ((["--param", "topic"], "is not KEY=VALUE"), (["--params", "[1, 2]"], "must be a JSON object"),
                       (["--params", "{"], "--params is not JSON"), (["--id", "../etc"], "invalid task id")):
        proc = _run(tmp_path, "run", "report.py", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert says in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "side.jsonl").exists()


def test_a_copy_with_params_keeps_whether_criticality_was_given() -> None:
    plain = Task("t", goal="g")
    assert plain.submitted_as("t-1", {"a": 1}).criticality_explicit is False
    given = Task("t", goal="g", criticality="important")
    copy = given.submitted_as("t-1", {"a": 1})
    assert copy.criticality_explicit is True and copy.criticality == "important"
    assert (copy.id, copy.params, copy.definition) == ("t-1", {"a": 1}, "t")


COLLIDING = ({"n": 7335}, {"n": 13654})
"""Two param sets whose default ids collide (8 hex digits of their digest: ``report-8e3265b9``)."""


def test_a_stored_task_never_runs_with_other_params(tmp_path: Path) -> None:
    _project(tmp_path)
    first = _run(tmp_path, "run", "report.py", "--id", "x1", "--param", "topic=cats", "--max-steps", "1")
    assert first.returncode == 75, first.stderr
    for args in (["--param", "topic=dogs"], [], ["--params", '{"topic": "cats", "evil": true}']):
        proc = _run(tmp_path, "run", "report.py", "--id", "x1", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "was created with params {\"topic\":\"cats\"}" in proc.stderr and "Traceback" not in proc.stderr
    resumed = _run(tmp_path, "resume", "x1")  # with its own params
    assert resumed.returncode == 0, resumed.stderr
    assert [r["params"] for r in _side(tmp_path)] == [{"topic": "cats"}] * 2


def test_params_whose_default_ids_collide_are_not_merged(tmp_path: Path) -> None:
    _project(tmp_path)
    task = Task("report", goal="x")
    assert default_id(task, COLLIDING[0]) == default_id(task, COLLIDING[1])
    first = _run(tmp_path, "run", "report.py", "--param", "n=7335", "--max-steps", "1")
    assert first.returncode == 75, first.stderr
    second = _run(tmp_path, "run", "report.py", "--param", "n=13654")
    assert second.returncode == 2 and "was created with params {\"n\":7335}" in second.stderr, second.stderr
    store = f"sqlite://{tmp_path / 'q.db'}"
    one = cli("submit", "report.py", "--param", "n=7335", "--store", store, cwd=tmp_path)
    other = cli("submit", "report.py", "--param", "n=13654", "--store", store, cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert other.returncode == 2 and "already submitted (queued) with params {\"n\":7335}" in other.stderr, other.stderr
    again = cli("submit", "report.py", "--param", "n=7335", "--store", store, cwd=tmp_path)
    assert again.returncode == 0 and "already submitted" in again.stdout + again.stderr


def test_non_finite_and_deep_params_are_refused(tmp_path: Path) -> None:
    _project(tmp_path)
    deep = '{"a":' * 3000 + "1" + "}" * 3000
    for args in (["--param", "x=-1e400"], ["--param", "x=1e400"], ["--params", '{"x": Infinity}'], ["--params", deep],
                 ["--param", "x=" + "9" * 5000], ["--id", "nanid", "--param", "x=1e999"]):
        proc = _run(tmp_path, "run", "report.py", *args)
        assert proc.returncode == 2, (args[:1], proc.stderr[-500:])
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "side.jsonl").exists()


def test_json_status_kind_is_one_of_a_fixed_set(tmp_path: Path) -> None:
    from overnight.store.queue import STATES, state_of

    assert [state_of(s) for s in ("queued (starts in 30 min)", "failed (step x raised)", "in progress",
                                  "rolled back", "running (worker w on h, heartbeat 1 s ago)", "odd")] == [
        "queued", "failed", "in_progress", "rolled_back", "running", "unknown"]
    _project(tmp_path)
    assert _run(tmp_path, "run", "report.py", "--id", "k", "--max-steps", "1").returncode == 75
    listed = json.loads(_run(tmp_path, "ls", "--json").stdout)
    assert [(t["status"], t["status_kind"]) for t in listed] == [("interrupted", "interrupted")]
    for verb in ("status", "show"):
        out = json.loads(_run(tmp_path, verb, "k", "--json").stdout)
        assert out["status_kind"] in STATES and out["status_kind"] == state_of(out["status"]), out


def test_run_of_a_queued_task_with_other_params_is_refused(tmp_path: Path) -> None:
    _project(tmp_path)
    store = f"sqlite://{tmp_path / 's.db'}"
    assert cli("submit", "report.py", "--id", "q1", "--param", "topic=q1", "--store", store, cwd=tmp_path).returncode == 0
    proc = _run(tmp_path, "run", "report.py", "--id", "q1", "--param", "topic=other")
    assert proc.returncode == 2, proc.stderr
    assert 'submitted (queued, not started) with params {"topic":"q1"}' in proc.stderr, proc.stderr
    assert not (tmp_path / "side.jsonl").exists()
    same = _run(tmp_path, "run", "report.py", "--id", "q1", "--param", "topic=q1")  # its own params: runs here
    assert same.returncode == 0, same.stderr
    again = cli("submit", "report.py", "--id", "q1", "--param", "topic=x", "--store", store, cwd=tmp_path)
    # run here to the end: complete with its own params, so other params are refused as such
    assert again.returncode == 2 and 'is complete with params {"topic":"q1"}' in again.stderr, again.stderr
