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

from overnight.store.leases import now_ms
from overnight.store.sqlite import SQLiteStore
from overnight.chain.read import load_head

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


BIG_TASK_FILE = '''
import os, time
import overnight

task = overnight.Task("sigbig", goal="signal during a slow load", expected_span="1h")


@task.step
def make(ctx):
    ctx.write_artifact("big.bin", os.urandom({size}))  # deep verification on resume reads all of it


@task.step
def after(ctx):
    with open({log!r}, "a") as fh:
        fh.write("start after\\n")
    time.sleep(1.0)
'''


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc to see the lease heartbeat thread")
@pytest.mark.slow
def test_two_signals_while_resume_loads_the_head_exit_resumable(tmp_path: Path) -> None:
    """Ctrl-C twice while a resume is still loading/verifying the head (before any step runs):
    still a clean, resumable stop (exit 75), never a traceback of an internal exception."""
    import sqlite3

    log = tmp_path / "runs.log"
    f = tmp_path / "bigtask.py"
    f.write_text(BIG_TASK_FILE.format(size=100_000_000, log=str(log)))
    store = f"sqlite://{tmp_path / 'store.db'}"
    first = cli("run", str(f), "--store", store, "--max-steps", "1", "-q", cwd=tmp_path)
    assert first.returncode == 75, first.stderr

    missed = []
    for trial in range(5):
        events, err_path = tmp_path / f"ev{trial}.jsonl", tmp_path / f"err{trial}.txt"
        p = spawn("resume", "sigbig", "--store", store, "--events", str(events), "-q", cwd=tmp_path,
                  stderr_path=err_path)
        try:
            # the heartbeat thread starts right after the lease is taken and just before the signal
            # handlers go in; then the head (with its 100 MB artifact) is loaded and verified
            wait_for(lambda: p.poll() is not None or _threads(p.pid) >= 2, timeout=30, interval=0.001,
                     what="the resume to take its lease")
            time.sleep(0.02)
            os.kill(p.pid, signal.SIGINT)
            # the run's handler acknowledges the first signal with a stop_requested event
            wait_for(lambda: p.poll() is not None
                     or any(e["kind"] == "stop_requested" for e in read_events(events)), timeout=30,
                     what="the first signal to be handled")
            kinds = [e["kind"] for e in read_events(events)]
            in_load = p.poll() is None and "stop_requested" in kinds and "resume" not in kinds
            if p.poll() is None:
                os.kill(p.pid, signal.SIGINT)
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if not in_load:  # the signals missed the load window (a loaded machine): try again
            missed.append((rc, kinds))
            continue
        err = err_path.read_text()
        evs = read_events(events)
        assert not [e for e in evs if e["kind"] == "step_start"]
        assert "Traceback" not in err and "_Abandon" not in err, err
        assert rc == 75, f"exit {rc} (expected 75, resumable)\n{err}"
        con = sqlite3.connect(tmp_path / "store.db")
        leases = con.execute("SELECT COUNT(*) FROM leases WHERE expires_at_ms > ?", (now_ms(),)).fetchone()[0]
        con.close()
        assert leases == 0, "the interrupted run left its lease behind"
        r = cli("resume", "sigbig", "--store", store, "-q", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return
    pytest.fail(f"never got both signals into the load window in 5 tries: {missed}")
