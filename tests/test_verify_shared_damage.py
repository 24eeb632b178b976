"""``verify`` and shared or healable damage (``overnight/verify/fsck.py``, ``overnight/chain/ditto.py``).

* An object is checked once a run (content addressing stores it once), but every branch head that
  needs it is invalid when it is damaged: two tasks whose heads share an artifact (the same page),
  and a head sharing an earlier checkpoint's page, are reported invalid by ``verify --all`` just as
  by verifying each task alone.
* A damaged head record whose ditto copy verifies: what ``verify`` promises, ``verify --repair``
  does -- it rewrites the row (committed again on its branch, the ref left where it is) where the
  store replaces a damaged row on commit; elsewhere (a key-value store, or the head of a branch
  other than its own) neither promises a rewrite before the branch moves on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import overnight
from overnight.chain.ditto import ditto_key
from overnight.chain.integrity import load_checkpoint
from overnight.chain.read import load_head
from overnight.codec.digest import sha256
from overnight.store import layout, open_url
from overnight.verify.fsck import verify_store

KEY = b"shared-damage-key"
SHARED = "shared content\n" * 40


def _task(task_id: str) -> overnight.Task:
    task = overnight.Task(task_id, goal="write one shared file, then count", data={"n": 0})

    @task.step
    def plan(ctx):
        for i in range(3):
            ctx.add_step("work", i=i)

    @task.step(planned=False)
    def work(ctx, i):
        ctx.state["n"] += 1
        if i == 0:  # every later checkpoint shares this artifact page
            ctx.write_text("shared.txt", SHARED)
        return {"i": i}

    return task


def _run(url: str, task_id: str) -> None:
    result = overnight.run(_task(task_id), url, signing_key=KEY, handle_signals=False)
    assert result.status == "complete", result.status


def _flip(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def _damage_shared_artifact(path: Path) -> str:
    """Flip a byte of the shared artifact's stored data, and spoil its ditto copy (if any), so
    nothing heals it. Returns its digest."""
    with open_url(f"sqlite://{path}") as store:
        loaded = load_checkpoint(store, store.get_ref("a", "main"), key=KEY)
        d = next(a.digest for p in loaded.artifact_pages for n, a in p.entries.items() if n == "shared.txt")
    db = sqlite3.connect(path, isolation_level=None)
    data = db.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()[0]
    db.execute("UPDATE objects SET data=? WHERE digest=?", (_flip(bytes(data)), d))
    db.execute("UPDATE objects SET data=x'00' WHERE digest=?", (ditto_key(d),))
    db.close()
    return d


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**env, "COLUMNS": "200", "OVERNIGHT_SIGNING_KEY": KEY.decode()}, timeout=120)


# -- 1. a damaged object every head needs ---------------------------------------------------------------

def test_verify_all_fails_every_head_that_needs_a_shared_damaged_object(tmp_path):
    path = tmp_path / "s.db"
    for t in ("a", "b"):
        _run(f"sqlite://{path}", t)
    d = _damage_shared_artifact(path)
    with open_url(f"sqlite://{path}") as store:
        heads = {t: store.get_ref(t, "main") for t in ("a", "b")}
        rep = verify_store(store, key=KEY, all_objects=True)
        assert rep.heads == {"a": {"main": "invalid"}, "b": {"main": "invalid"}}, rep.problems
        for t in ("a", "b"):  # each head is named with the object, as verifying the task alone does
            assert any(p.task_id == t and p.checkpoint_id == heads[t] and p.object == d for p in rep.problems), t
            alone = verify_store(store, [t], key=KEY)
            assert alone.heads == {t: {"main": "invalid"}}
            assert any(p.checkpoint_id == heads[t] and p.object == d for p in alone.problems)
        # checked once: one object counted invalid, its full error given once
        assert rep.objects_invalid >= 1 and sum("DigestMismatch" in p.detail for p in rep.problems if p.object == d) == 1
    out = _cli("verify", "--all", "--store", f"sqlite://{path}", "--json", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    got = json.loads(out.stdout)
    assert got["heads"] == {"a": {"main": "invalid"}, "b": {"main": "invalid"}}
    assert {p["task_id"] for p in got["problems"] if p["object"] == d} == {"a", "b"}


def test_a_head_sharing_an_earlier_checkpoints_damaged_artifact_is_invalid(tmp_path):
    path = tmp_path / "one.db"
    _run(f"sqlite://{path}", "a")
    d = _damage_shared_artifact(path)
    with open_url(f"sqlite://{path}") as store:
        head = store.get_ref("a", "main")
        for rep in (verify_store(store, ["a"], key=KEY), verify_store(store, key=KEY, all_objects=True)):
            assert rep.heads == {"a": {"main": "invalid"}}, rep.problems
            assert any(p.checkpoint_id == head and p.object == d for p in rep.problems)


# -- 2. a damaged head record with a verified copy ---------------------------------------------------------

def _damage_head_record(url: str, path: Path | None, task_id: str = "a", branch: str = "main") -> str:
    with open_url(url) as store:
        cid = store.get_ref(task_id, branch)
        if path is None:  # memory: the same in-process store
            inner = getattr(store, "hot", store)
            row = inner._checkpoints[cid]
            inner._checkpoints[cid] = dataclasses.replace(row, body=_flip(row.body))
            return cid
    db = sqlite3.connect(path, isolation_level=None)
    body = db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (cid,)).fetchone()[0]
    db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (_flip(bytes(body)), cid))
    db.close()
    return cid


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_repair_rewrites_a_damaged_head_record_that_verify_says_it_rewrites(tmp_path, kind):
    path = tmp_path / "r.db" if kind == "sqlite" else None
    url = f"sqlite://{path}" if path is not None else f"memory://shared-{uuid.uuid4().hex}"
    _run(url, "a")
    head = _damage_head_record(url, path)
    with open_url(url) as store:
        rep = verify_store(store, key=KEY, all_objects=True)
        ditto = [p for p in rep.problems if p.check == "ditto"]
        assert len(ditto) == 1 and ditto[0].checkpoint_id == head and "--repair a` rewrites it" in ditto[0].detail
        fixed = verify_store(store, key=KEY, all_objects=True, repair=True)
        assert fixed.ok and not fixed.problems, fixed.problems
        assert any(line.startswith("healed record") and "original rewritten" in line for line in fixed.healed)
        assert store.get_ref("a", "main") == head  # the ref stays
        assert sha256(store.get_checkpoint(head).body) == head
        after = verify_store(store, key=KEY, all_objects=True)
        assert after.ok and not after.problems and not after.healed
        loaded, fallback = load_head(store, "a", key=KEY)
        assert loaded.id == head and fallback is None and not loaded.healed


def test_a_head_record_the_store_cannot_rewrite_is_not_promised_to_repair(tmp_path):
    """A key-value store keeps a stored record (the first write wins) and never deletes a head:
    verify says the record is rewritten once the branch moves on, with or without --repair."""
    url = f"file://{tmp_path / 'store'}"
    _run(url, "a")
    with open_url(url) as store:
        head = store.get_ref("a", "main")
        c = store.hot._c if hasattr(store, "hot") else store._c
        data, version = c.read(layout.checkpoint_key(head))
        row, journal = layout.decode_checkpoint(data)
        bad = dataclasses.replace(row, body=_flip(row.body))
        assert c.swap(layout.checkpoint_key(head), layout.encode_checkpoint(bad, row.stored_bytes, journal), version)
    with open_url(url) as store:
        for repair in (False, True):
            rep = verify_store(store, key=KEY, repair=repair)
            ditto = [p for p in rep.problems if p.check == "ditto"]
            assert len(ditto) == 1 and "--repair a` rewrites it" not in ditto[0].detail, ditto
            assert "once the branch moves on" in ditto[0].detail
            assert not rep.healed


def test_a_record_heading_only_another_branch_is_not_promised_to_repair(tmp_path):
    """The head of a fork that has not moved on, whose own branch moved on: no commit rewrites it
    without moving a ref, and a ref names it (never deleted) -- so no promise either way."""
    path = tmp_path / "f.db"
    url = f"sqlite://{path}"
    _run(url, "a")
    with open_url(url) as store:
        parent = store.get_checkpoint(store.get_ref("a", "main")).parent_id
        store.set_ref("a", "exp", parent, None)
    _damage_head_record(url, path, branch="exp")
    with open_url(url) as store:
        for repair in (False, True):
            rep = verify_store(store, key=KEY, repair=repair)
            ditto = [p for p in rep.problems if p.check == "ditto"]
            assert len(ditto) == 1 and ditto[0].checkpoint_id == parent, rep.problems
            assert "--repair a` rewrites it" not in ditto[0].detail and "once the branch moves on" in ditto[0].detail
            assert store.get_ref("a", "main") != parent and store.get_ref("a", "exp") == parent
