"""Damage is visible: after a fallback, ``show`` (and ``--json``), ``log``, ``ls`` and ``status``
mark the damaged checkpoints and the head that fell back, and ``verify`` exits 3 while any damaged
record is in the store -- used by a branch or not (``--ignore-dangling`` accepts the latter).

Real SQLite files damaged with :mod:`overnight.testing.faults`; real CLI processes.
"""

from __future__ import annotations

import json
import shutil
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from _tasks import plan_task

import overnight
from overnight.testing.faults import Faults


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**e, "COLUMNS": "200"}, timeout=120)


def _work(ctx, i):
    ctx.write_text(f"part-{i}.txt", f"part {i}\n" * 50)
    ctx.state[f"k{i}"] = i


def _task():
    return plan_task("dmg", 4, _work, goal="five steps", expected_span="3h", level="session")


@pytest.mark.parametrize("kind", ["removed_blob", "bit_flip"])
@pytest.mark.slow
def test_a_damaged_head_is_marked_everywhere_and_verify_fails_until_it_is_gone(tmp_path, kind):
    db = tmp_path / "s.db"
    url = f"sqlite://{db}"
    overnight.run(_task(), url, max_steps=3)
    pristine = tmp_path / "pristine.db"
    shutil.copy(db, pristine)
    for seed in range(3, 40):  # a fault some older checkpoint survives (not the fingerprint all of them share)
        shutil.copy(pristine, db)
        inj = Faults(db, random.Random(seed), copies=True).inject(kind, "dmg")  # copies too: no self-heal
        if inj.expected is not None:
            break
    bad = inj.bad_head[7:19]

    shown = json.loads(cli("show", "dmg", "--store", url, "--json", cwd=tmp_path).stdout)
    marked = {c["checkpoint_id"]: c for c in shown["chain"]}
    assert marked[inj.bad_head]["valid"] is False and marked[inj.bad_head]["problem"]
    assert shown["damaged"] >= 1
    assert shown["fell_back"].startswith(f"fell back from {bad} to {inj.expected[7:19]}")
    text = cli("show", "dmg", "--store", url, cwd=tmp_path).stdout
    assert f"head fell back from {bad}" in text and "INVALID" in text

    status = cli("status", "dmg", "--store", url, cwd=tmp_path)
    assert status.returncode == 0 and f"fell back from {bad}" in status.stdout
    log = json.loads(cli("log", "dmg", "--store", url, "--json", cwd=tmp_path).stdout)
    assert any(e["checkpoint_id"] == inj.bad_head and e["valid"] is False for e in log)
    (listed,) = json.loads(cli("ls", "--store", url, "--json", cwd=tmp_path).stdout)
    assert listed["fell_back"].startswith(f"fell back from {bad}")
    assert "FELL BACK" in cli("ls", "--store", url, cwd=tmp_path).stdout

    assert cli("verify", "dmg", "--store", url, cwd=tmp_path).returncode == 3
    # the run falls back and goes on; the damaged record stays, no branch uses it any more
    result = overnight.run(_task(), url)
    assert result.status == "complete"
    after = cli("verify", "dmg", "--store", url, "--json", cwd=tmp_path)
    report = json.loads(after.stdout)
    shown = json.loads(cli("show", "dmg", "--store", url, "--json", cwd=tmp_path).stdout)
    assert shown["fell_back"] is None  # the head is fine now
    if not report["problems"]:  # the re-run step stored the removed object again (content addressing)
        assert kind == "removed_blob" and after.returncode == 0 and shown["damaged"] == 0
        return
    assert after.returncode == 3, after.stdout  # dangling, but damaged: not ok
    assert report["ok"] is False and all(p["dangling"] for p in report["problems"])
    assert cli("verify", "dmg", "--store", url, "--ignore-dangling", cwd=tmp_path).returncode == 0
    assert shown["damaged"] >= 1  # the damage still shows


def test_a_head_whose_artifact_bytes_changed_is_marked_as_a_resume_would_find_it(tmp_path):
    """An artifact object of the head damaged in place (its bytes no longer hash to its digest, no
    ditto copy): ``show`` (``valid: false``, counted in ``damaged``), ``log``, ``ls``, ``status``
    and the dashboard say the head falls back -- what ``resume`` then does -- not that it is
    healthy."""
    import sqlite3

    import httpx
    from _ui import UiServer

    from overnight.chain.ditto import ditto_key
    from overnight.chain.read import load_head
    from overnight.store import open_store

    db = tmp_path / "s.db"  # where the dashboard helper opens the store
    url = f"sqlite://{db}"
    overnight.run(_task(), url)
    with open_store(url) as s:
        head, _ = load_head(s, "dmg")
        target = head.artifacts["part-3.txt"].digest  # written by the last step alone
    with sqlite3.connect(db) as con:
        con.execute("DELETE FROM objects WHERE digest = ?", (ditto_key(target),))
        data = con.execute("SELECT data FROM objects WHERE digest = ?", (target,)).fetchone()[0]
        flipped = data[:-1] + bytes([data[-1] ^ 0x01])
        assert con.execute("UPDATE objects SET data = ? WHERE digest = ?", (flipped, target)).rowcount == 1
    bad = head.id[7:19]

    shown = json.loads(cli("show", "dmg", "--store", url, "--json", cwd=tmp_path).stdout)
    marked = {c["checkpoint_id"]: c for c in shown["chain"]}
    assert marked[head.id]["valid"] is False and "part-3.txt" in marked[head.id]["problem"]
    assert shown["damaged"] >= 1 and shown["fell_back"].startswith(f"fell back from {bad}")
    log = json.loads(cli("log", "dmg", "--store", url, "--json", cwd=tmp_path).stdout)
    assert any(e["checkpoint_id"] == head.id and e["valid"] is False for e in log)
    (listed,) = json.loads(cli("ls", "--store", url, "--json", cwd=tmp_path).stdout)
    assert listed["fell_back"].startswith(f"fell back from {bad}")
    assert f"fell back from {bad}" in cli("status", "dmg", "--store", url, cwd=tmp_path).stdout
    cat = cli("cat", "dmg", "part-3.txt", "--store", url, cwd=tmp_path)  # named: task, checkpoint, what to do
    assert cat.returncode == 3 and "dmg" in cat.stderr and bad in cat.stderr and "--at CHECKPOINT" in cat.stderr
    with UiServer(tmp_path) as srv:
        task = httpx.get(srv.base + "/task.json", params={"id": "dmg"}).json()
        assert "failed verification" in json.dumps(task), task
    assert overnight.run(_task(), url).status == "complete"  # the resume falls back and redoes the step
