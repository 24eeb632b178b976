"""Concurrent confirmations of current-task pointers (``confirmed-pointers.json`` in the per-user
state folder): several processes -- hooks, the MCP server -- confirming at the same instant must
not lose one another's entries, and a reader must never see a torn file."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import time
from pathlib import Path

from overnight.mcp.tasks import CONFIRMED_FILE, CONFIRMED_MAX, confirm_pointer, pointer_confirmed

PROCS = 8
EACH = 12  # PROCS * EACH stays within CONFIRMED_MAX: every entry must be kept
assert PROCS * EACH <= CONFIRMED_MAX


def _confirmer(state: str, root: str, store: str, worker: int, barrier, errors) -> None:
    os.environ["OVERNIGHT_STATE_DIR"] = state
    try:
        barrier.wait(timeout=30)
        for i in range(EACH):
            confirm_pointer(Path(root), f"task-{worker}-{i}", store)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        errors.put(f"worker {worker}: {e!r}")


def _reader(path: str, stop, errors) -> None:
    """Read the file over and over while the confirmers write it: every read is whole JSON."""
    torn = 0
    while not stop.is_set():
        try:
            text = Path(path).read_text("utf-8")
        except FileNotFoundError:
            time.sleep(0.001)
            continue
        try:
            json.loads(text)
        except ValueError:
            torn += 1
        time.sleep(0.001)
    if torn:
        errors.put(f"reader saw {torn} torn file(s)")


def test_concurrent_confirmations_keep_every_entry_and_never_tear_the_file(tmp_path: Path, monkeypatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(state))
    root = tmp_path / "project"
    root.mkdir()
    store = f"sqlite://{tmp_path / 'shared' / 'overnight.db'}"  # a store outside the project
    path = state / CONFIRMED_FILE

    ctx = multiprocessing.get_context("fork")
    barrier, errors, stop = ctx.Barrier(PROCS), ctx.Queue(), ctx.Event()
    reader = ctx.Process(target=_reader, args=(str(path), stop, errors))
    reader.start()
    workers = [ctx.Process(target=_confirmer, args=(str(state), str(root), store, w, barrier, errors))
               for w in range(PROCS)]
    for p in workers:
        p.start()
    deadline = time.monotonic() + 60
    for p in workers:
        p.join(max(0.1, deadline - time.monotonic()))
    stop.set()
    reader.join(10)
    for p in workers + [reader]:
        if p.is_alive():
            p.kill()
            p.join()
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert not problems, problems
    assert all(p.exitcode == 0 for p in workers + [reader]), [p.exitcode for p in workers + [reader]]

    missing = [f"task-{w}-{i}" for w in range(PROCS) for i in range(EACH)
               if not pointer_confirmed([root], f"task-{w}-{i}", store)]
    assert not missing, f"{len(missing)} of {PROCS * EACH} confirmations lost: {missing[:10]}"
    data = json.loads(path.read_text("utf-8"))
    assert data["version"] == 1 and len(data["entries"]) == PROCS * EACH
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [p.name for p in state.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind


def test_a_fifo_or_a_held_lock_in_the_state_folder_never_hangs_a_confirmation(tmp_path, monkeypatch) -> None:
    """A FIFO planted where the confirmation file lives, or a lock another (stopped) process holds:
    the confirmation gives up -- the pointer then needs task_resume again -- instead of hanging."""
    import fcntl
    import time as clock

    from overnight.mcp import tasks

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(state))
    os.mkfifo(state / tasks.CONFIRMED_FILE)
    t0 = clock.monotonic()
    tasks.confirm_pointer(tmp_path, "t", f"sqlite://{tmp_path / 'x.db'}")  # replaced by the rename
    assert clock.monotonic() - t0 < 5
    assert tasks.pointer_confirmed([tmp_path], "t", f"sqlite://{tmp_path / 'x.db'}")

    monkeypatch.setattr(tasks, "CONFIRMED_LOCK_S", 0.5)
    with open(state / (tasks.CONFIRMED_FILE + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # (flock locks belong to the open file: this one blocks the next)
        t0 = clock.monotonic()
        tasks.confirm_pointer(tmp_path, "u", f"sqlite://{tmp_path / 'y.db'}")
        assert 0.4 < clock.monotonic() - t0 < 5
    assert not tasks.pointer_confirmed([tmp_path], "u", f"sqlite://{tmp_path / 'y.db'}")
