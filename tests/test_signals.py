"""SIGINT / SIGTERM during a long step, against the real CLI (``overnight run FILE.py``).

Once: the step in flight finishes, is checkpointed, exit 75; resuming does not run it again.
Twice: the step is abandoned (nothing of it committed), exit 75; resuming runs it exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from overnight.store.sqlite import SQLiteStore
from overnight.verify.chain import load_head

from _procs import assert_linear_history, cli, read_events, spawn, wait_for

TASK_ID = "sig"
SLOW_S = 1.5

TASK_FILE = '''
import os, time
import overnight

task = overnight.Task({task_id!r}, goal="signal test task", expected_span="1h")


def record(text):
    with open({log!r}, "a") as fh:
        fh.write(text + "\\n")


@task.step
def first(ctx):
    record("start first")
    record("end first")
    return 1


@task.step
def slow(ctx):
    record("start slow")
    time.sleep({slow_s})
    record("end slow")
    ctx.write_text("slow.txt", "slow result\\n")
    return 2


@task.step
def last(ctx):
    record("start last")
    record("end last")
    return 3
'''


def _setup(tmp: Path) -> tuple[Path, Path, str]:
    log = tmp / "runs.log"
    f = tmp / "sigtask.py"
    f.write_text(TASK_FILE.format(task_id=TASK_ID, log=str(log), slow_s=SLOW_S))
    return f, log, f"sqlite://{tmp / 'store.db'}"


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _done(tmp: Path) -> list[str]:
    with SQLiteStore(tmp / "store.db") as s:
        loaded, fallback = load_head(s, TASK_ID)
        assert fallback is None
        assert_linear_history(s, TASK_ID)
        journal = [j.step_name for j in s.journal(TASK_ID)]
        done = [d["name"] for d in loaded.state_tree["done"]]
        assert journal == done, f"journal {journal} != done {done}"
        return done


def _interrupt(tmp: Path, signals: list[signal.Signals]) -> tuple[int, float, list[dict]]:
    """Run the task, signal it (each signal 0.3 s apart) once ``slow`` has started; return
    (exit code, seconds from the last signal to exit, events)."""
    task_file, log, store = _setup(tmp)
    events = tmp / "ev1.jsonl"
    p = spawn("run", str(task_file), "--store", store, "--events", str(events), "-q", cwd=tmp,
              stderr_path=tmp / "err1.txt")
    try:
        wait_for(lambda: p.poll() is not None or "start slow" in _lines(log), timeout=30, what="slow to start")
        assert p.poll() is None, (tmp / "err1.txt").read_text()
        time.sleep(0.1)
        for k, sig in enumerate(signals):
            if k:
                time.sleep(0.3)
            os.kill(p.pid, sig)
        t_last = time.monotonic()
        rc = p.wait(timeout=30)
        return rc, time.monotonic() - t_last, read_events(events)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _resume(tmp: Path) -> list[dict]:
    events = tmp / "ev2.jsonl"
    r = cli("resume", TASK_ID, "--store", f"sqlite://{tmp / 'store.db'}", "--events", str(events), "-q", cwd=tmp)
    assert r.returncode == 0, f"resume exit {r.returncode}\n{r.stderr}"
    return read_events(events)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_finishes_and_checkpoints_the_step_in_flight(tmp_path: Path, sig: signal.Signals) -> None:
    rc, after, events = _interrupt(tmp_path, [sig])
    err = (tmp_path / "err1.txt").read_text()
    assert rc == 75, f"exit {rc}\n{err}"
    log = tmp_path / "runs.log"
    assert _lines(log) == ["start first", "end first", "start slow", "end slow"], "slow did not finish, or last ran"
    assert after > 0.5, "the process stopped before the step in flight could finish"
    assert any(e["kind"] == "stop_requested" for e in events)
    assert [e["step"] for e in events if e["kind"] == "step_end"] == ["first", "slow"]
    assert events[-1]["kind"] == "end" and events[-1]["detail"] == "interrupted"
    assert _done(tmp_path) == ["first", "slow"], "the finished step was not checkpointed"

    ev2 = _resume(tmp_path)
    assert [e["step"] for e in ev2 if e["kind"] == "step_start"] == ["last"]
    assert _lines(log).count("start slow") == 1, "resume ran the checkpointed step again"
    assert _done(tmp_path) == ["first", "slow", "last"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_two_signals_abandon_the_step_in_flight(tmp_path: Path, sig: signal.Signals) -> None:
    rc, after, events = _interrupt(tmp_path, [sig, sig])
    err = (tmp_path / "err1.txt").read_text()
    assert rc == 75, f"exit {rc}\n{err}"
    log = tmp_path / "runs.log"
    assert _lines(log) == ["start first", "end first", "start slow"], "the step was not abandoned"
    assert after < SLOW_S - 0.5, f"took {after:.2f} s after the second signal: the step was not abandoned"
    assert [e["step"] for e in events if e["kind"] == "step_end"] == ["first"]
    assert events[-1]["kind"] == "end" and events[-1]["detail"] == "interrupted"
    assert _done(tmp_path) == ["first"], "the abandoned step was committed"
    with SQLiteStore(tmp_path / "store.db") as s:
        loaded, _ = load_head(s, TASK_ID)
        assert "slow.txt" not in loaded.state_tree["artifacts"]
        assert [t["name"] for t in loaded.state_tree["todo"]] == ["slow", "last"]

    ev2 = _resume(tmp_path)
    assert [e["step"] for e in ev2 if e["kind"] == "step_start"] == ["slow", "last"]
    lines = _lines(log)
    assert lines.count("start slow") == 2 and lines.count("end slow") == 1, lines
    assert _done(tmp_path) == ["first", "slow", "last"]
