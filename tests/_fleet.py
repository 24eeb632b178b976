"""Helpers for the worker tests: a project folder with a task file, workers as real processes,
and checks over the side-effect log and the stored chains (nothing mocked)."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from _procs import CLI, env, wait_for

TASK_FILE = '''
import os, signal, time
import overnight

task = overnight.Task("chaos", goal="a fleet test task", level="durable")

@task.step
def plan(ctx):
    for i in range(int(ctx.params.get("steps", 3))):
        ctx.add_step("work", i=i)

@task.step(planned=False, retries=int(os.environ.get("STEP_RETRIES", "0")))
def work(ctx, i: int):
    with open(os.environ["SIDE_LOG"], "a") as f:
        f.write(f"{ctx.task_id} {i} {os.getpid()}\\n")
    mode = ctx.params.get("mode")
    if mode == "poison":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "fail" and i == 1:
        raise RuntimeError("this step always fails")
    time.sleep(float(ctx.params.get("sleep", 0.02)))
    ctx.state[f"w{i}"] = i * i + len(ctx.params.get("tag", ""))
    return {"i": i, "sq": i * i}
'''


def project(tmp_path: Path) -> Path:
    """A project folder (``overnight.toml``) holding ``tasks/chaos.py``; returns it."""
    (tmp_path / "tasks").mkdir(exist_ok=True)
    (tmp_path / "tasks" / "chaos.py").write_text(TASK_FILE)
    (tmp_path / "overnight.toml").write_text("")
    return tmp_path


def store_url(request: Any, tmp_path: Path) -> str:
    """The store of a test parametrised ``["sqlite", "postgres"]``: a SQLite file in ``tmp_path``,
    or a fresh PostgreSQL schema (the ``pg_schema`` fixture: dropped afterwards)."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'q.db'}"
    url, schema = request.getfixturevalue("pg_schema")
    return f"{url}?schema={schema}"


def fleet_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    e = env()
    e["SIDE_LOG"] = str(tmp_path / "side.log")
    e["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"), e.get("PYTHONPATH", "")])
    e.update(extra)
    return e


def cli(tmp_path: Path, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=tmp_path, env=fleet_env(tmp_path, **extra), capture_output=True,
                          text=True, timeout=timeout)


def start_worker(tmp_path: Path, store: str, *args: str, name: str = "w", **extra: str) -> subprocess.Popen:
    log = open(tmp_path / f"{name}.err", "ab")
    try:
        return subprocess.Popen([*CLI, "worker", "--store", store, *args], cwd=tmp_path,
                                env=fleet_env(tmp_path, **extra), stdout=log, stderr=log)
    finally:
        log.close()


def side_log(tmp_path: Path) -> list[tuple[str, int, int]]:
    path = tmp_path / "side.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        task, i, pid = line.split()
        out.append((task, int(i), int(pid)))
    return out


def queue_rows(store_url: str) -> dict[str, Any]:
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    s = open_store(store_url)
    try:
        return {r.task_id: r for r in queue_for(s).list()}
    finally:
        s.close()


def chain_check(store_url: str, task_id: str) -> dict[str, Any]:
    """The task's main chain from head to root: linear (each parent the previous), no step key
    committed twice; returns ``{"done": [step names], "state": user state, "outputs": {...}}``."""
    from overnight.store import open_store
    from overnight.chain.read import load_head

    s = open_store(store_url)
    try:
        rows = s.list_checkpoints(task_id)
        by_id = {r.checkpoint_id: r for r in rows}
        head = s.get_ref(task_id, "main")
        seen = []
        cur = head
        while cur is not None:
            seen.append(cur)
            cur = by_id[cur].parent_id
        # every checkpoint of the task is on the main chain: nothing forked off it
        assert set(seen) == set(by_id), f"{task_id}: {len(by_id) - len(seen)} checkpoint(s) off the main chain"
        loaded, fallback = load_head(s, task_id, "main", key=None, deep=True)
        assert fallback is None
        done = loaded.state_tree["done"]
        keys = [d["key"] for d in done]
        assert len(keys) == len(set(keys)), f"{task_id}: a step committed twice"
        return {"done": [d["name"] for d in done], "outputs": {d["name"]: d["output"] for d in done},
                "state": loaded.state_tree["data"], "seq": loaded.record.seq}
    finally:
        s.close()


def wait_until(pred, timeout: float, what: str, interval: float = 0.2) -> Any:
    """:func:`_procs.wait_for`, polling every ``interval`` s (5 per second by default)."""
    return wait_for(pred, timeout, interval=interval, what=what)


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the worker's fork server and the sessions it forked)."""
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def sessions_of(store_url: str, worker_id: str) -> list[int]:
    """Pids of the sessions running a task for ``worker_id`` (from the queue rows)."""
    return [r.pid for r in queue_rows(store_url).values() if r.worker_id == worker_id and r.status == "running"
            and r.pid]


def client_ports(pids: list[int]) -> set[int]:
    """Local TCP ports of the sockets these processes hold (to find their PostgreSQL backends by
    ``pg_stat_activity.client_port``)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wasted(log: list[tuple[str, int, int]]) -> int:
    counts = collections.Counter((t, i) for t, i, _ in log)
    return sum(c - 1 for c in counts.values())


__all__ = ["chain_check", "children_of", "descendants", "sessions_of", "cli", "project", "queue_rows", "side_log", "start_worker", "stop",
           "wait_until", "wasted", "sys"]
