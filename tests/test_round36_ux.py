"""Round 36: what a worker leaving by ``--idle-exit`` says about a task queued for later; the
temporary file a killed ``write_file_atomic`` leaves is swept.

A worker started with ``--idle-exit`` waits for work due within a lease; a task submitted with a
``--not-before`` further out is not work it waits for, and the worker exits -- now saying which
task is queued, when it starts and that a worker must be running then. Real ``python -m
overnight`` processes on a real SQLite store; nothing mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

from _procs import cli
from _report_project import ok, report_project


def test_idle_exit_names_the_task_queued_for_later(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "nightly", "--not-before", "+2h", "--store", url)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "weekly", "--not-before", "+3h", "--store", url)
    r = cli("worker", "--idle-exit", "1", "--store", url, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "nothing to run for 1 s (--idle-exit): exiting; task nightly is queued to start in " in said, said
    assert "(and 1 more): a worker must be running then" in said, said
    assert ok(tmp_path, "status", "nightly", "--store", url).startswith("nightly: queued"), "still queued"


def test_idle_exit_with_nothing_queued_says_only_that(tmp_path: Path) -> None:
    url = report_project(tmp_path)
    ok(tmp_path, "submit", "tasks/report.py", "--id", "now", "--store", url)
    ok(tmp_path, "worker", "--idle-exit", "1", "--store", url)  # runs it, then leaves
    r = cli("worker", "--idle-exit", "1", "--store", url, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "nothing to run for 1 s (--idle-exit): exiting" in said and "queued to start" not in said, said


# -- the temporary file a killed write_file_atomic leaves is swept ---------------------------------

_KILLED_WRITER = """
import os, sys, time
import json
from pathlib import Path
from overnight import keys
os.fsync = lambda fd: (print("written", flush=True), time.sleep(60))  # held here until killed
keys.write_file_atomic(Path(sys.argv[1]), b"new bytes")
"""


def _killed_writer_leftover(target: Path) -> Path:
    """Kill (SIGKILL) a real process inside ``write_file_atomic(target)``, after its temporary file
    is written; returns that leftover temporary file."""
    import signal
    import subprocess
    import sys

    before = set(target.parent.iterdir())
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    (leftover,) = [p for p in set(target.parent.iterdir()) - before if p.name.startswith(f".{target.name}.")]
    assert leftover.read_bytes() == b"new bytes" and target.read_bytes() != b"new bytes"  # the old file stays
    return leftover


def test_a_killed_writers_temporary_file_is_swept_by_the_next_write(tmp_path: Path) -> None:
    import os
    import time

    from overnight.keys import sweep_temp_files, write_file_atomic

    target = tmp_path / "high-water.json"
    target.write_bytes(b"old")
    stale = _killed_writer_leftover(target)
    hour_ago = time.time() - 2 * 3600
    os.utime(stale, (hour_ago, hour_ago))
    # a leftover of a writer still running (this process), however old, and a folder named like one stay
    mine = tmp_path / f".{target.name}.{os.getpid()}.1.{'a' * 16}.tmp"
    mine.write_bytes(b"x")
    os.utime(mine, (hour_ago, hour_ago))
    folder = tmp_path / f".{target.name}.999999.1.{'b' * 16}.tmp"
    folder.mkdir()
    os.utime(folder, (hour_ago, hour_ago))

    write_file_atomic(target, b"newer")
    assert target.read_bytes() == b"newer"
    assert not stale.exists() and mine.exists() and folder.is_dir()

    fresh = _killed_writer_leftover(target)  # a leftover younger than an hour stays (its writer may be stopped)
    assert sweep_temp_files(target) == [] and fresh.exists()
    assert sweep_temp_files(target, older_than_s=0) == [fresh] and not fresh.exists()


# -- an idempotency key names one request ----------------------------------------------------------

def _key_reuse(tmp_path: Path, url: str) -> None:
    first = ok(tmp_path, "submit", "tasks/report.py", "--param", "sections=4", "--idempotency-key", "K1",
               "--store", url)
    task_id = first.split()[0]
    again = ok(tmp_path, "submit", "tasks/report.py", "--param", "sections=4", "--idempotency-key", "K1",
               "--not-before", "+10m", "--store", url)  # the same request (a later moment is no other request)
    assert again.startswith(f"{task_id} already submitted (queued)"), again
    for args, said in ((("--param", "sections=5"), 'params {"sections":4} there, {"sections":5} here'),
                       (("--param", "sections=4", "--queue", "q2"), "queue default there, q2 here"),
                       (("--param", "sections=4", "--priority", "9"), "priority 0 there, 9 here"),
                       (("--param", "sections=4", "--id", "mine"), f"task id {task_id} there, mine here")):
        r = cli("submit", "tasks/report.py", *args, "--idempotency-key", "K1", "--store", url, cwd=tmp_path)
        text = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert f"idempotency key 'K1' was used by task '{task_id}' (queued) with another request" in text, text
        assert said in text and "submit this one with another key" in text, text
    listed = cli("ls", "--json", "--store", url, cwd=tmp_path)
    assert [t["task_id"] for t in json.loads(listed.stdout)] == [task_id]  # nothing else queued


def test_an_idempotency_key_reused_for_another_request_is_refused(tmp_path: Path) -> None:
    """Attacker: a key reused with other code, params, queue, priority or id returned the first
    task, exit 0, and the second request was dropped without a word."""
    _key_reuse(tmp_path, report_project(tmp_path))


def test_an_idempotency_key_reused_for_another_request_is_refused_on_postgres(pg_schema, tmp_path: Path) -> None:
    base, schema = pg_schema
    report_project(tmp_path)
    _key_reuse(tmp_path, f"{base}?schema={schema}")


def test_a_param_that_is_not_json_is_a_string_as_the_help_says(tmp_path: Path) -> None:
    """Attacker: ``--param v=NaN`` was refused ("finite numbers") although the help says VALUE as
    JSON, else a string: Python's json reads NaN and Infinity, which JSON does not have."""
    url = report_project(tmp_path)
    out = ok(tmp_path, "submit", "tasks/report.py", "--param", "v=NaN", "--param", "w=-Infinity", "--param", "n=3",
             "--id", "p1", "--json", "--store", url)
    assert json.loads(out)["params"] == {"v": "NaN", "w": "-Infinity", "n": 3}, out
    r = cli("submit", "tasks/report.py", "--params", '{"v": NaN}', "--id", "p2", "--store", url, cwd=tmp_path)
    assert r.returncode == 2 and "--params is not JSON: NaN is not JSON" in r.stderr, r.stderr


_BAD_VALUE = '''
import overnight
task = overnight.Task("fail", goal="a step that stores a bad value", expected_span="5h")
@task.step
def a(ctx):
    ctx.state["x"] = 1
@task.step
def c(ctx):
    ctx.state["when"] = object()
'''


def test_a_step_whose_value_cannot_be_stored_reads_failed_as_under_a_worker(tmp_path: Path) -> None:
    """Fresh user: run in a terminal, it read ``interrupted`` (which invites a resume that fails the
    same way); a worker parks the same task ``failed (EncodeError: ...)``."""
    (tmp_path / "f.py").write_text(_BAD_VALUE)
    url = f"sqlite://{tmp_path / 's.db'}"
    r = cli("run", "f.py", "--store", url, cwd=tmp_path)
    assert r.returncode == 1 and "cannot store value of type object at state.data.when" in r.stderr, r.stderr
    status = ok(tmp_path, "status", "fail", "--store", url)
    assert status.startswith("fail (main): failed (EncodeError: cannot store value of type object at "
                             "state.data.when), 1/2 steps"), status
    (row,) = json.loads(ok(tmp_path, "ls", "--json", "--store", url))
    assert row["status_kind"] == "failed", row
    # fixed and resumed: the latest run's outcome
    (tmp_path / "f.py").write_text(_BAD_VALUE.replace("object()", '"noon"'))
    ok(tmp_path, "resume", "fail", "--store", url)
    assert ok(tmp_path, "status", "fail", "--store", url).startswith("fail (main): complete, 2/2 steps")


def test_with_overnight_toml_every_subfolder_reaches_the_projects_store(tmp_path: Path) -> None:
    """Fresh user: with the README's empty ``overnight.toml`` at the top of the checkout, a submit
    from a subfolder recorded its code relative to the top but queued it in a new store in the
    subfolder, and a worker started at the top never saw it (0 claimed). The default store is now
    beside ``overnight.toml``, from wherever in the project a command runs."""
    report_project(tmp_path)  # writes the empty overnight.toml
    sub = tmp_path / "tasks"
    r = cli("submit", "report.py", "--id", "from-sub", cwd=sub)
    assert r.returncode == 0 and "code tasks/report.py:task" in r.stdout, (r.stdout, r.stderr)
    assert not (sub / ".overnight").exists() and (tmp_path / ".overnight" / "overnight.db").exists()
    w = cli("worker", "--idle-exit", "1", cwd=tmp_path, timeout=120)
    assert w.returncode == 0 and "1 task(s) claimed" in w.stderr, w.stderr
    for where in (tmp_path, sub):
        assert ok(where, "status", "from-sub").startswith("from-sub (main): complete"), where
