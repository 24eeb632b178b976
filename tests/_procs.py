"""Shared helpers for the process-level tests (crash, concurrency, signals).

Everything here drives real processes (``sys.executable -m overnight ...``) against real SQLite
files and inspects the result with the library itself; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from overnight.store.sqlite import SQLiteStore

CLI = [sys.executable, "-m", "overnight"]

THREE_STEPS = '''
import overnight

task = overnight.Task("t5", goal="three steps", data={"n": 0})


@task.step
def a(ctx):
    ctx.state["n"] += 1


@task.step
def b(ctx):
    ctx.state["n"] += 1
    ctx.write_text("out.txt", "hello")


@task.step
def c(ctx):
    return ctx.state["n"]
'''
"""A task file (``t5``: three steps, one artifact) for the store-fault tests, which kill it or
plant files around it."""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("OVERNIGHT_STORE", None)
    e.pop("OVERNIGHT_SIGNING_KEY", None)
    e["PYTHONUNBUFFERED"] = "1"
    e["COLUMNS"] = "200"
    return e


def run_limited(argv: list[str], *, cwd: Path, limit_bytes: int = 1 << 30, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python ARGV`` with its address space capped at ``limit_bytes`` (RLIMIT_AS), so an
    allocation of a planted size fails the process instead of the machine; asserts it ended without
    a traceback or MemoryError (the bound must refuse the input before any allocation)."""
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    e = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    e["COLUMNS"] = "300"
    r = subprocess.run([sys.executable, *argv], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout,
                       preexec_fn=limited)
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    return r


def cli(*args: str, cwd: Path, timeout: float = 60, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m overnight ARGS`` to completion (``extra_env``: variables to set for it)."""
    return subprocess.run([*CLI, *args], cwd=cwd, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def spawn(*args: str, cwd: Path, stderr_path: Path | None = None, argv: list[str] | None = None) -> subprocess.Popen:
    """Start ``python -m overnight ARGS`` (or ``argv``) in the background; stderr to a file."""
    err = open(stderr_path, "wb") if stderr_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(argv or [*CLI, *args], cwd=cwd, env=env(), stdout=subprocess.DEVNULL, stderr=err)
    finally:
        if stderr_path is not None:
            err.close()  # type: ignore[union-attr]


def wait_for(pred: Callable[[], Any], timeout: float, interval: float = 0.002, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns a truthy value; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def read_events(path: Path, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
    """JSON lines of an ``--events`` file between byte offsets ``start`` and ``end``.

    A trailing partial line (a process killed mid-write) is ignored.
    """
    if not path.exists():
        return []
    data = path.read_bytes()[start:end]
    out = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def main_chain(store: SQLiteStore, task_id: str, branch: str = "main") -> list[Any]:
    """Checkpoint rows from the branch head to the root, following parent pointers."""
    cid = store.get_ref(task_id, branch)
    chain = []
    seen = set()
    while cid is not None:
        assert cid not in seen, f"cycle in the parent chain at {cid}"
        seen.add(cid)
        row = store.get_checkpoint(cid)
        chain.append(row)
        cid = row.parent_id
    return chain


def assert_linear_history(store: SQLiteStore, task_id: str, branch: str = "main") -> list[Any]:
    """The branch is one straight line: seq head..0 each exactly once, and no checkpoint of the
    task is off that line (nobody forked the history). Returns the chain (head first)."""
    chain = main_chain(store, task_id, branch)
    seqs = [r.seq for r in chain]
    assert seqs == list(range(len(chain) - 1, -1, -1)), f"parent chain seqs are not head..0 in steps of 1: {seqs}"
    assert chain[-1].parent_id is None
    rows = [r for r in store.list_checkpoints(task_id) if r.branch == branch]
    by_seq: dict[int, list[str]] = {}
    for r in rows:
        by_seq.setdefault(r.seq, []).append(r.checkpoint_id)
    forks = {s: ids for s, ids in by_seq.items() if len(ids) > 1}
    assert not forks, f"history forked: several checkpoints share a seq on {branch}: {forks}"
    off_chain = {r.checkpoint_id for r in rows} - {r.checkpoint_id for r in chain}
    assert not off_chain, f"checkpoints not on the {branch} chain (a fork): {sorted(off_chain)}"
    return chain


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
