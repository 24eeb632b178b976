"""``verify`` fails every checkpoint that needs a damaged shared object, heads or not
(``overnight/verify/fsck.py``).

An object is hashed once a run (content addressing stores it once), yet each checkpoint whose
load would fail because of it -- the head, a non-head sharing the head's artifact page, an older
checkpoint that alone names an artifact later overwritten -- is reported invalid, counted in
``checkpoints_invalid`` and named by a problem carrying the object; a checkpoint that does not
reference it stays valid. The same holds for ``verify TASK``, ``verify --all``, across tasks, and
whether the content is hashed on threads or in helper processes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import overnight
from overnight.chain.ditto import ditto_key
from overnight.chain.integrity import load_checkpoint
from overnight.codec.digest import sha256
from overnight.store import open_url
from overnight.verify.fsck import verify_store

KEY = b"shared-damage-nonhead-key"
SHARED = "shared content\n" * 40
OLD = "the first version of v.txt\n" * 30
NEW = "the second version of v.txt\n" * 30


def _task(task_id: str, steps: int = 6) -> overnight.Task:
    task = overnight.Task(task_id, goal="write a shared file and overwrite another", data={"n": 0})

    @task.step
    def plan(ctx):
        for i in range(steps):
            ctx.add_step("work", i=i)

    @task.step(planned=False)
    def work(ctx, i):
        ctx.state["n"] += 1
        if i == 0:  # every later checkpoint names this artifact (mostly through the same page)
            ctx.write_text("shared.txt", SHARED)
        if i == 1:  # named by the checkpoints of steps 1 and 2 only: step 3 overwrites it
            ctx.write_text("v.txt", OLD)
        if i == 3:
            ctx.write_text("v.txt", NEW)
        return {"i": i}

    return task


def _run(url: str, task_id: str, steps: int = 6) -> None:
    result = overnight.run(_task(task_id, steps), url, signing_key=KEY, handle_signals=False)
    assert result.status == "complete", result.status


def _users(path: Path, task_id: str, name: str, text: str) -> tuple[str, set[str], list[str]]:
    """The digest of artifact ``name`` holding ``text``, the checkpoints of ``task_id`` naming it,
    and all of the task's checkpoints -- read while the store is sound."""
    with open_url(f"sqlite://{path}") as store:
        rows = [r.checkpoint_id for r in store.list_checkpoints(task_id)]
        found: dict[str, set[str]] = {}
        for cid in rows:
            for n, a in load_checkpoint(store, cid, key=KEY).artifacts.items():
                if n == name:
                    found.setdefault(a.digest, set()).add(cid)
        want = sha256(text.encode())
        return want, found.get(want, set()), rows


def _damage(path: Path, d: str) -> None:
    """Flip a byte of the object's stored data and spoil its ditto copy (if any): nothing heals it."""
    db = sqlite3.connect(path, isolation_level=None)
    data = bytes(db.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()[0])
    db.execute("UPDATE objects SET data=? WHERE digest=?", (data[:-1] + bytes([data[-1] ^ 1]), d))
    db.execute("UPDATE objects SET data=x'00' WHERE digest=?", (ditto_key(d),))
    db.close()


def _failed(rep, task_id: str) -> set[str]:
    return {p.checkpoint_id for p in rep.problems if p.task_id == task_id and p.checkpoint_id is not None}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**env, "COLUMNS": "200", "OVERNIGHT_SIGNING_KEY": KEY.decode()}, timeout=120)


MODES = [dict(workers=1, processes=0), dict(workers=4, processes=0), dict(workers=2, processes=2)]


@pytest.mark.parametrize("mode", MODES, ids=["1-thread", "4-threads", "2-processes"])
def test_every_checkpoint_sharing_a_damaged_artifact_with_the_head_is_invalid(tmp_path, mode):
    path = tmp_path / "s.db"
    _run(f"sqlite://{path}", "a")
    d, users, rows = _users(path, "a", "shared.txt", SHARED)
    with open_url(f"sqlite://{path}") as store:
        head = store.get_ref("a", "main")
    assert head in users and len(users) >= 4 and len(users) < len(rows)  # non-heads share it; early ones do not
    _damage(path, d)
    with open_url(f"sqlite://{path}") as store:
        for rep in (verify_store(store, ["a"], key=KEY, **mode),
                    verify_store(store, key=KEY, all_objects=True, **mode)):
            assert rep.heads == {"a": {"main": "invalid"}}, rep.problems
            assert rep.checkpoints == len(rows)
            assert rep.checkpoints_invalid == len(users), rep.problems
            assert _failed(rep, "a") == users  # the checkpoints before step 0 wrote it stay valid
            assert {p.checkpoint_id for p in rep.problems if p.object == d} == users
            # hashed once: one full error for the object, the other users name it
            assert sum("DigestMismatch" in p.detail for p in rep.problems if p.object == d) == 1
            assert rep.objects_invalid == 1 or (rep.objects_invalid == 2 and any(  # --all: the spoiled copy too
                p.check == "object" and p.object == ditto_key(d) for p in rep.problems))


@pytest.mark.parametrize("mode", MODES, ids=["1-thread", "4-threads", "2-processes"])
def test_a_damaged_artifact_only_older_checkpoints_name_fails_each_of_them_and_not_the_head(tmp_path, mode):
    path = tmp_path / "s.db"
    _run(f"sqlite://{path}", "a")
    d, users, rows = _users(path, "a", "v.txt", OLD)
    with open_url(f"sqlite://{path}") as store:
        head = store.get_ref("a", "main")
    assert len(users) == 2 and head not in users  # the checkpoints of steps 1 and 2
    _damage(path, d)
    with open_url(f"sqlite://{path}") as store:
        for rep in (verify_store(store, ["a"], key=KEY, **mode),
                    verify_store(store, key=KEY, all_objects=True, **mode)):
            assert rep.heads == {"a": {"main": "ok"}}, rep.problems
            assert rep.checkpoints_invalid == 2, rep.problems
            assert _failed(rep, "a") == users
            assert {p.checkpoint_id for p in rep.problems if p.object == d} == users
            assert sum("DigestMismatch" in p.detail for p in rep.problems if p.object == d) == 1
            assert not rep.ok


def test_verify_all_fails_every_checkpoint_of_every_task_that_names_the_damaged_object(tmp_path):
    """Two tasks share the artifact (and its page): the second task's checkpoints meet an object
    already found damaged, and each is failed without hashing it again."""
    path = tmp_path / "s.db"
    for t in ("a", "b"):
        _run(f"sqlite://{path}", t)
    d, users_a, rows_a = _users(path, "a", "shared.txt", SHARED)
    d_b, users_b, rows_b = _users(path, "b", "shared.txt", SHARED)
    assert d == d_b and len(users_b) >= 4
    _damage(path, d)
    with open_url(f"sqlite://{path}") as store:
        rep = verify_store(store, key=KEY, all_objects=True)
        assert rep.heads == {"a": {"main": "invalid"}, "b": {"main": "invalid"}}, rep.problems
        assert rep.checkpoints_invalid == len(users_a) + len(users_b), rep.problems
        assert _failed(rep, "a") == users_a and _failed(rep, "b") == users_b
        assert sum("DigestMismatch" in p.detail for p in rep.problems if p.object == d) == 1
        assert rep.objects_invalid == 2 and any(p.check == "object" and p.object == ditto_key(d) for p in rep.problems)
        alone = verify_store(store, ["b"], key=KEY)
        assert alone.checkpoints_invalid == len(users_b) and _failed(alone, "b") == users_b
    out = _cli("verify", "--all", "--store", f"sqlite://{path}", "--json", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    got = json.loads(out.stdout)
    assert got["checkpoints_invalid"] == len(users_a) + len(users_b)
    assert {(p["task_id"], p["checkpoint_id"]) for p in got["problems"] if p["object"] == d} \
        == {("a", c) for c in users_a} | {("b", c) for c in users_b}


def test_a_long_history_fails_each_checkpoint_named_after_the_damage_is_found(tmp_path):
    """Enough checkpoints that the content check finishes batches while later checkpoints are
    still read: those met after the object was found damaged are failed too, and none other."""
    path = tmp_path / "s.db"
    _run(f"sqlite://{path}", "a", steps=150)
    d, users, rows = _users(path, "a", "v.txt", OLD)
    d2, users2, _ = _users(path, "a", "shared.txt", SHARED)
    _damage(path, d)
    _damage(path, d2)
    with open_url(f"sqlite://{path}") as store:
        for mode in MODES:
            rep = verify_store(store, ["a"], key=KEY, **mode)
            assert rep.checkpoints_invalid == len(users | users2), (mode, rep.problems)
            assert _failed(rep, "a") == users | users2
            assert {p.checkpoint_id for p in rep.problems if p.object == d2} == users2
            assert rep.objects_invalid == 2
