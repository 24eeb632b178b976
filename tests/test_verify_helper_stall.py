"""``overnight verify`` never hangs on a stuck helper process: a helper that is SIGSTOPped as soon
as it starts (so it holds batches and answers none) is killed after the stall period
(``OVERNIGHT_VERIFY_HELPER_STALL_S``), named once on stderr, and its batches are checked by the
calling thread -- the exit code and the problems found are exactly those of the store.

Real processes: a real SQLite store, ``python -m overnight verify`` in a subprocess, its helpers
found as its children in /proc and stopped with SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import overnight
from test_verify_batches import _task  # the same store: many artifacts, so verify starts helpers
from overnight.store import open_url
from overnight.store.blobs import BlobReader
from overnight.verify.fsck import verify_store

STALL_S = 2
LIMIT_S = 120  # wall clock for the whole verify (it takes a few seconds when it does not hang)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or (os.cpu_count() or 1) < 2,
                                reason="needs /proc, and 2 cores (verify starts no helper on one)")


def _store(tmp_path: Path) -> Path:
    """A store with ~12 MB of artifact content: past the 4 MB after which verify starts helpers."""
    path = tmp_path / "s.db"
    overnight.run(_task(60, 200_000), f"sqlite://{path}", handle_signals=False)
    return path


def _helpers_of(pid: int) -> list[int]:
    """Pids of the verify helper processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"overnight.verify.content_proc" in cmdline:
            found.append(int(entry))
    return found


def _verify_stopping_helpers(path: Path) -> tuple[subprocess.CompletedProcess, set[int]]:
    """``overnight verify --all --json`` on ``path``, each helper SIGSTOPped as soon as it appears;
    the pids stopped. Fails (rather than hangs) when verify does not end within :data:`LIMIT_S`."""
    env = {**os.environ, "OVERNIGHT_VERIFY_HELPER_STALL_S": str(STALL_S), "PYTHONUNBUFFERED": "1"}
    env.pop("OVERNIGHT_STORE", None)
    env.pop("OVERNIGHT_SIGNING_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "overnight", "verify", "--all", "--json", "--store",
                             f"sqlite://{path}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    stopped: set[int] = set()
    deadline = time.monotonic() + LIMIT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for pid in _helpers_of(proc.pid):
                if pid not in stopped:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.add(pid)
            time.sleep(0.005)
        hung = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in stopped:  # (if verify did not kill them: they hold its stderr open)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
    if hung:
        pytest.fail(f"verify did not end within {LIMIT_S} s with its helpers {sorted(stopped)} stopped:\n{err.decode()}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()), stopped


def _named_once(stderr: str, stopped: set[int]) -> None:
    """Every stuck helper that verify named is named once, with the stall; at least one is."""
    lines = [line for line in stderr.splitlines() if "helper" in line]
    named = [pid for pid in stopped if any(f"process {pid} " in line for line in lines)]
    assert named, stderr
    for pid in named:
        (line,) = [line for line in lines if f"process {pid} " in line]
        assert line.startswith("warning:") and f"for {STALL_S} s" in line and "killed" in line, line


def test_a_stuck_helper_is_killed_and_an_intact_store_verifies(tmp_path):
    path = _store(tmp_path)
    store = open_url(f"sqlite://{path}")
    fields = ("checkpoints", "objects_checked", "objects_invalid", "dangling_objects", "bytes_verified", "heads")
    threads = verify_store(store, all_objects=True, processes=0)  # no helper: what the check must find
    store.close()
    assert threads.ok and not threads.problems

    started = time.monotonic()
    done, stopped = _verify_stopping_helpers(path)
    assert stopped, "verify started no helper process"
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr)
    report = json.loads(done.stdout)
    assert report["ok"] and not report["problems"]
    assert {f: report[f] for f in fields} == {f: getattr(threads, f) for f in fields}  # every object, once
    _named_once(done.stderr, stopped)
    assert time.monotonic() - started < LIMIT_S
    for pid in stopped:  # killed and reaped by verify: gone, not a zombie
        assert not Path(f"/proc/{pid}").exists()


def test_damage_is_still_reported_when_a_helper_was_stuck(tmp_path):
    """One damaged chunk of an artifact in the middle of the task (in one of the batches the stopped
    helper held: helpers start once 4 MB were queued, at the 20th artifact):
    verify names it, exactly as it does with no helper stuck, and exits 3."""
    path = _store(tmp_path)
    store = open_url(f"sqlite://{path}")
    from overnight.chain.integrity import load_checkpoint

    head = store.list_checkpoints("many")[-1]
    victim = load_checkpoint(store, head.checkpoint_id).artifacts["a/0030.txt"]
    chunk = BlobReader(store).reachable(victim.digest)[-1]
    with sqlite3.connect(path) as db:
        data = db.execute("SELECT data FROM objects WHERE digest=?", (chunk,)).fetchone()[0]
        db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes([data[0] ^ 1]) + data[1:], chunk))
    threads = verify_store(store, all_objects=True, processes=0)  # no helper: what the check must find
    store.close()

    done, stopped = _verify_stopping_helpers(path)
    assert stopped, "verify started no helper process"
    assert done.returncode == 3, (done.stdout[-2000:], done.stderr)
    report = json.loads(done.stdout)
    named = [p for p in report["problems"] if chunk in p["detail"]]
    assert {p["check"] for p in named} == {"artifact 'a/0030.txt'", "object"}, report["problems"]
    assert report["objects_invalid"] == threads.objects_invalid == 2  # the chunk, and the artifact made of it
    assert sorted(((p["task_id"], p["checkpoint_id"], p["check"], p["detail"]) for p in report["problems"]), key=repr) \
        == sorted(((p.task_id, p.checkpoint_id, p.check, p.detail) for p in threads.problems), key=repr)  # nothing else
    assert report["bytes_verified"] == threads.bytes_verified
    _named_once(done.stderr, stopped)


@pytest.mark.parametrize("value", ["1e10", "9223372037", "1e308", "0", "-1", "nan", "inf"])
def test_a_stall_outside_its_range_is_a_usage_error(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from overnight.errors import ConfigError
    from overnight.verify import fsck

    monkeypatch.setenv("OVERNIGHT_VERIFY_HELPER_STALL_S", value)
    with pytest.raises(ConfigError, match="OVERNIGHT_VERIFY_HELPER_STALL_S"):  # 1e10 s overflowed the wait
        fsck._helper_stall_s()
