"""A user's round of CLI problems around the queue and the plumbing's stderr, each driven as the user
met it: real ``python -m overnight`` processes -- workers included -- against real SQLite files and
PostgreSQL schemas; nothing is mocked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from _fleet import cli, project, queue_rows, start_worker, stop, store_url, wait_until
from _procs import CLI, env


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: Any, tmp_path: Path) -> str:
    return store_url(request, tmp_path)


def _has_checkpoint(url: str, task_id: str) -> bool:
    from overnight.store import open_store

    s = open_store(url)
    try:
        return s.get_ref(task_id, "main") is not None
    finally:
        s.close()


def _stderr_to_file(tmp_path: Path, name: str, *args: str) -> tuple[int, str]:
    path = tmp_path / f"{name}.err"
    with open(path, "wb") as fh:
        rc = subprocess.run([*CLI, *args], check=False, cwd=tmp_path, env={**env(), "SIDE_LOG": str(tmp_path / "side.log")},
                            stdout=subprocess.DEVNULL, stderr=fh, timeout=120).returncode
    return rc, path.read_text(encoding="utf-8")


# 1. `overnight resume TASK` of a task a worker runs: the hint names the worker and `overnight cancel`


def test_resume_of_a_task_a_worker_runs_names_the_worker_and_cancel(tmp_path: Path) -> None:
    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    assert cli(tmp_path, "submit", "tasks/chaos.py", "--id", "busy", "--store", url,
               "--param", "steps=400", "--param", "sleep=0.05").returncode == 0
    w = start_worker(tmp_path, url, "--worker-id", "night-shift")
    try:
        wait_until(lambda: _has_checkpoint(url, "busy") and queue_rows(url)["busy"].status == "running", 60,
                   "the worker to start the task")
        # the fast path (`resume ID --store URL`) and the full CLI (`--events`) say the same
        for extra in ([], ["--events", str(tmp_path / "ev.jsonl")]):
            out = cli(tmp_path, "resume", "busy", "--store", url, *extra)
            assert out.returncode == 4, out.stderr
            assert "Traceback" not in out.stderr
            assert "worker night-shift" in out.stderr, out.stderr
            assert f"overnight cancel busy --store {url}" in out.stderr, out.stderr
            assert "Ctrl-C / kill" not in out.stderr, out.stderr
        # `overnight rm` of it says the same
        out = cli(tmp_path, "rm", "busy", "--store", url, "--yes")
        assert out.returncode == 4, out.stderr
        assert "worker night-shift" in out.stderr and f"overnight cancel busy --store {url}" in out.stderr
        assert "--force" in out.stderr
        # the hint's advice works: cancel, then resume here
        assert cli(tmp_path, "cancel", "busy", "--store", url).returncode == 0
        wait_until(lambda: queue_rows(url)["busy"].status == "cancelled", 60, "the worker to stop the task")
        out = cli(tmp_path, "resume", "busy", "--store", url, "--max-steps", "1", "-q")
        assert out.returncode == 75, out.stderr
    finally:
        stop(w)
        w.wait(30)


SLOW = """
import time
import overnight

task = overnight.Task("slow", goal="holds its lease for a while", level="durable")

@task.step
def plan(ctx):
    for i in range(600):
        ctx.add_step("work", i=i)

@task.step(planned=False)
def work(ctx, i: int):
    time.sleep(0.1)
"""


def test_a_task_a_plain_run_holds_keeps_the_plain_hint_and_rm_says_so_on_its_first_line(tmp_path: Path) -> None:
    """No worker runs it (no queue row): the holder is a plain `overnight run`, there is no worker
    to name nor anything to cancel; rm's refusal, raised under its progress bar, is stderr's first line."""
    (tmp_path / "overnight.toml").write_text("")
    (tmp_path / "slow.py").write_text(SLOW)
    url = f"sqlite://{tmp_path / 'q.db'}"
    with open(tmp_path / "run.err", "wb") as log:
        run = subprocess.Popen([*CLI, "run", "slow.py", "--store", url, "-q"], cwd=tmp_path, env=env(),
                               stdout=log, stderr=log)
    try:
        wait_until(lambda: _has_checkpoint(url, "slow"), 60, "the run to start")
        out = cli(tmp_path, "resume", "slow", "--store", url)
        assert out.returncode == 4, out.stderr
        assert "is busy (held by pid" in out.stderr and "overnight cancel" not in out.stderr, out.stderr
        rc, err = _stderr_to_file(tmp_path, "rm-busy", "rm", "slow", "--store", url, "--yes")
        assert rc == 4 and err.startswith("error: task 'slow' is busy"), repr(err)
        assert "\x1b" not in err and "\n\n" not in err
    finally:
        stop(run)
        run.wait(30)


# 2. `overnight rm TASK` of a submitted task without a checkpoint removes it


def test_rm_of_a_submitted_task_removes_its_queue_row(tmp_path: Path, store: str) -> None:
    project(tmp_path)
    out = cli(tmp_path, "submit", "tasks/chaos.py", "--id", "later", "--store", store)
    assert out.returncode == 0, out.stderr
    # without --yes and no terminal: the question says what would go, nothing goes
    out = cli(tmp_path, "rm", "later", "--store", store)
    assert out.returncode == 2, out.stderr
    assert "submitted" in out.stderr and "queued" in out.stderr and "--yes" in out.stderr, out.stderr
    assert "later" in queue_rows(store)
    out = cli(tmp_path, "rm", "later", "--store", store, "--yes")
    assert out.returncode == 0, out.stderr
    assert "no task" not in out.stderr
    assert "deleted submitted task later" in out.stderr and "queued" in out.stderr, out.stderr
    assert "later" not in queue_rows(store)
    # it is gone: a worker never runs it, and a second rm says there is no such task
    out = cli(tmp_path, "rm", "later", "--store", store, "--yes")
    assert out.returncode == 2 and "no task 'later'" in out.stderr, out.stderr
    out = cli(tmp_path, "worker", "--store", store, "--idle-exit", "0.5", "--max-tasks", "1")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "side.log").exists()


def test_rm_of_a_failed_submitted_task_json(tmp_path: Path) -> None:
    """A task parked ``failed`` before its first checkpoint (its code is not found) is removed too;
    --json reports its queue status."""
    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    assert cli(tmp_path, "submit", "tasks/chaos.py", "--id", "gone", "--store", url).returncode == 0
    (tmp_path / "tasks" / "chaos.py").unlink()
    assert cli(tmp_path, "worker", "--store", url, "--idle-exit", "0.5", "--max-tasks", "1").returncode == 0
    assert queue_rows(url)["gone"].status == "failed"
    out = cli(tmp_path, "rm", "gone", "--store", url, "--yes", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["applied"] is True and doc["checkpoints"] == 0 and doc["queue_status"] == "failed"
    assert "gone" not in queue_rows(url)


def test_rm_of_a_stored_task_reports_its_queue_status_and_unknown_ids_stay_unknown(tmp_path: Path) -> None:
    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    assert cli(tmp_path, "run", "tasks/chaos.py", "--store", url, "-q").returncode == 0
    out = cli(tmp_path, "rm", "chaos", "--store", url, "--yes", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["checkpoints"] >= 1 and doc["queue_status"] is None
    out = cli(tmp_path, "rm", "nothing-here", "--store", url, "--yes")
    assert out.returncode == 2 and "no task 'nothing-here'" in out.stderr
    # a file:// store has no queue: an unknown id is still just unknown, a stored task goes as before
    files = f"file://{tmp_path / 'files'}"
    assert cli(tmp_path, "run", "tasks/chaos.py", "--store", files, "-q").returncode == 0
    out = cli(tmp_path, "rm", "nothing-here", "--store", files, "--yes")
    assert out.returncode == 2 and "no task 'nothing-here'" in out.stderr, out.stderr
    out = cli(tmp_path, "rm", "chaos", "--store", files, "--yes", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["queue_status"] is None


# 3. rm / gc / verify with stderr redirected: no stray blank line, no control characters


def test_plumbing_stderr_has_no_blank_line_when_redirected(tmp_path: Path) -> None:
    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    assert cli(tmp_path, "run", "tasks/chaos.py", "--store", url, "-q").returncode == 0

    rc, err = _stderr_to_file(tmp_path, "verify", "verify", "chaos", "--store", url)
    assert rc == 0 and err == "", repr(err)
    rc, err = _stderr_to_file(tmp_path, "verify-all", "verify", "--all", "--store", url)
    assert rc == 0 and err == "", repr(err)
    rc, err = _stderr_to_file(tmp_path, "gc", "gc", "--store", url)
    assert rc == 0 and err.startswith("dry run: nothing deleted"), repr(err)
    rc, err = _stderr_to_file(tmp_path, "rm", "rm", "chaos", "--store", url, "--yes")
    assert rc == 0 and err.startswith("deleted task chaos"), repr(err)
    for name in ("verify", "verify-all", "gc", "rm"):
        text = (tmp_path / f"{name}.err").read_text(encoding="utf-8")
        assert "\x1b" not in text and "\r" not in text and "\n\n" not in text, (name, text)


def test_the_hint_for_a_submitted_task_without_a_checkpoint_names_its_store(tmp_path: Path) -> None:
    """`overnight log ID --store URL` of a task submitted but not started: the hint's commands carry
    the same `--store`, so pasting them reaches the queue the task is in."""
    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    assert cli(tmp_path, "submit", "tasks/chaos.py", "--id", "waiting", "--store", url).returncode == 0
    out = cli(tmp_path, "log", "waiting", "--store", url)
    assert out.returncode == 2, out.stderr
    flat = " ".join(out.stderr.split())
    assert f"overnight status waiting --store {url}" in flat and f"overnight worker --store {url}" in flat, out.stderr


def test_a_table_on_a_pipe_keeps_each_row_on_one_line(tmp_path: Path) -> None:
    """`overnight ls | grep ID` finds the whole row: on a pipe (no `$COLUMNS`) a table row is never
    folded, however long its goal; a `--store` hint names the store it was given."""
    (tmp_path / "long.py").write_text(
        "import overnight\n"
        f"task = overnight.Task('long-row', goal={'a goal that goes on ' * 20!r})\n"
        "@task.step\ndef a(ctx):\n    ctx.state['x'] = 1\n")
    url = f"sqlite://{tmp_path / 's.db'}"
    assert cli(tmp_path, "run", "long.py", "--store", url, "-q").returncode == 0
    run_env = {k: v for k, v in env().items() if k != "COLUMNS"}
    out = subprocess.run([*CLI, "ls", "--store", url], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    row = [line for line in out.stdout.splitlines() if "long-row" in line]
    assert len(row) == 1 and row[0].rstrip().endswith("a goal that goes on"), out.stdout
    assert len(out.stdout.splitlines()) == 3  # the header, its rule, the one row
    missing = cli(tmp_path, "status", "long-rwo", "--store", url)
    assert missing.returncode == 2 and f"overnight ls --store {url}" in " ".join(missing.stderr.split())


def test_rm_of_a_task_a_worker_just_claimed_is_refused_not_left_to_be_recreated(tmp_path: Path, store: str) -> None:
    """Between a worker's claim and its session's lease there is no lease to find: `rm` then used
    to delete the queue row and report success while the session went on to create and run the
    task. Now the row goes only while no live claim holds it: a claimed task is refused (exit 4,
    naming the worker), and `--force` deletes it anyway."""
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    project(tmp_path)
    url = store
    assert cli(tmp_path, "submit", "tasks/chaos.py", "--id", "claimed", "--store", url).returncode == 0
    s = open_store(url)
    try:
        row = queue_for(s).claim("night-shift", ["default"], 60_000)  # as a worker does, its session not started
        assert row is not None and row.task_id == "claimed"
    finally:
        s.close()
    out = cli(tmp_path, "rm", "claimed", "--store", url, "--yes")
    assert out.returncode == 4, out.stderr
    assert "worker night-shift" in out.stderr and "overnight cancel claimed" in " ".join(out.stderr.split())
    assert queue_rows(url)["claimed"].status == "running"  # nothing removed
    forced = cli(tmp_path, "rm", "claimed", "--store", url, "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "claimed" not in queue_rows(url)


def _artifact_damaged(tmp_path: Path, task_id: str, steps: dict[str, str], damaged: str) -> str:
    """A task ``task_id`` run to the end in ``tmp_path/s.db`` -- one step per ``steps`` item, each
    writing that artifact -- then artifact ``damaged``'s bytes zeroed and its ditto copy deleted (no
    verified copy to heal it from). Returns the store URL."""
    import sqlite3

    from overnight.chain.ditto import ditto_key
    from overnight.chain.read import load_head
    from overnight.store import open_store

    code = [f"import overnight\ntask = overnight.Task({task_id!r}, goal='writes artifacts')\n"]
    code += [f"@task.step\ndef s{i}(ctx):\n    ctx.write_text({name!r}, {text!r} * 200)\n"
             for i, (name, text) in enumerate(steps.items())]
    (tmp_path / f"{task_id}.py").write_text("".join(code))
    url = f"sqlite://{tmp_path / 's.db'}"
    assert cli(tmp_path, "run", f"{task_id}.py", "--store", url, "-q").returncode == 0
    with open_store(url) as s:
        head, _ = load_head(s, task_id)
        d = head.artifacts[damaged].digest
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("DELETE FROM objects WHERE digest = ?", (ditto_key(d),))
        assert db.execute("UPDATE objects SET data = zeroblob(length(data)) WHERE digest = ?", (d,)).rowcount
    return url


def test_verify_repair_says_what_it_could_not_heal(tmp_path: Path) -> None:
    """`verify --repair` of damage with no verified ditto copy (an artifact's bytes): the same
    problems as `verify`, and a line saying nothing could rewrite them and what a resume does."""
    url = _artifact_damaged(tmp_path, "art", {"notes.md": "some notes "}, "notes.md")
    out = cli(tmp_path, "verify", "art", "--store", url, "--repair")
    assert out.returncode == 3, out.stderr
    flat = " ".join(out.stderr.split())
    assert "no verified ditto copy" in flat and "falls back" in flat, out.stderr
    plain = cli(tmp_path, "verify", "art", "--store", url)
    assert plain.returncode == 3 and "ditto copy" not in plain.stderr  # only --repair says it


def test_a_ctrl_c_on_a_worker_reads_as_the_workers_stop_in_its_log(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) on a worker: each session gets it as SIGTERM, and the worker's log says the
    worker's stop reached the session, not a bare SIGTERM nobody sent."""
    import signal

    project(tmp_path)
    url = f"sqlite://{tmp_path / 'q.db'}"
    assert cli(tmp_path, "submit", "tasks/chaos.py", "--id", "stopme", "--store", url,
               "--param", "steps=30", "--param", "sleep=0.3").returncode == 0
    w = start_worker(tmp_path, url)
    try:
        wait_until(lambda: _has_checkpoint(url, "stopme") and queue_rows(url)["stopme"].status == "running", 60,
                   "the worker to start the task")
        w.send_signal(signal.SIGINT)
        assert w.wait(timeout=60) == 0
    finally:
        stop(w)
    log = (tmp_path / "w.err").read_text(errors="replace")
    assert "task stopme: the worker's stop reached this session (SIGTERM" in log, log[-2000:]


def test_log_and_show_say_a_rollback_was_an_automatic_fallback(tmp_path: Path) -> None:
    """A resume that fell back past damage commits a `rollback` record: `log`, `show` and their JSON
    say it was an automatic fallback, so it does not read as someone's `overnight rollback`."""
    url = _artifact_damaged(tmp_path, "two", {"a.md": "first ", "b.md": "second "}, "b.md")
    assert cli(tmp_path, "resume", "two", "--store", url, "-q").returncode == 0
    log = cli(tmp_path, "log", "two", "--store", url)
    line = next(x for x in log.stdout.splitlines() if " rollback" in x)
    assert "(automatic fallback)" in line, log.stdout
    show = cli(tmp_path, "show", "two", "--store", url)
    assert "automatic fallback" in show.stdout, show.stdout
    entries = json.loads(cli(tmp_path, "log", "two", "--store", url, "--json").stdout)
    assert [e["rollback"] for e in entries if e["event"] == "rollback"] == ["automatic fallback"]
