"""``gc`` / ``rm`` never delete what a live checkpoint may need when part of it is unreadable
(``overnight/ops/gc.py``, "Damage that hides what a live checkpoint needs"), on a real SQLite store:

* a live head whose record is damaged in place but whose ditto copy verifies is read through the
  copy, as a load reads it: ``gc --apply`` keeps everything it needs, reports nothing unreadable,
  and the task still loads, verifies and resumes (it reported the head unreadable -- "object ...
  is missing" for a damaged record -- and deleted the objects only the head needed);
* with no verified copy, ``gc --apply`` (and the dry run) refuse: StoreCorrupt / exit 3 naming the
  task, branch and checkpoint and what is wrong, suggesting ``overnight verify``; nothing is
  deleted, no object and no checkpoint (it deleted the head's objects and exited 0);
* ``rm`` of another task deletes that task but keeps every object while a live checkpoint of
  another task cannot be read (it deleted the objects the two tasks shared).
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
from overnight.codec.canonical import loads
from overnight.errors import StoreCorrupt
from overnight.store import open_url
from overnight.chain.ditto import ditto_key
from overnight.chain.read import load_head
from overnight.chain.reachability import Reach
from overnight.ops.gc import collect, remove_task
from overnight.verify.fsck import verify_store

KEY = b"gc-unreadable-key"


def build_task(task_id: str = "live") -> overnight.Task:
    task = overnight.Task(task_id, goal="keep a log", data={"lines": []})

    @task.step
    def plan(ctx):
        for i in range(4):
            ctx.add_step("write", i=i)

    @task.step(planned=False)
    def write(ctx, i):
        ctx.state["lines"].append(f"line {i}")
        ctx.write_text(f"note-{i}.txt", f"note {i} " * 64)
        return {"i": i}

    return task


def _run(url: str, task_id: str = "live", max_steps: int | None = None) -> object:
    result = overnight.run(build_task(task_id), url, signing_key=KEY, handle_signals=False, max_steps=max_steps)
    assert result.status == ("complete" if max_steps is None else "stopped"), result.status
    return result


def _damage_head_record(path: Path, head: str, *, drop_copy: bool) -> None:
    """Flip one byte of the head's record body in place (and delete its ditto copy)."""
    db = sqlite3.connect(path, isolation_level=None)
    body = bytes(db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0])
    db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (body[:-1] + bytes([body[-1] ^ 1]), head))
    if drop_copy:
        assert db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),)).rowcount == 1
    db.close()


def _snapshot(path: Path) -> tuple[set, set]:
    db = sqlite3.connect(path)
    try:
        return ({r[0] for r in db.execute("SELECT digest FROM objects")},
                {r[0] for r in db.execute("SELECT checkpoint_id FROM checkpoints")})
    finally:
        db.close()


def _needs(url: str, task_id: str, head: str) -> set[str]:
    """Every object the head needs to load (read before any damage)."""
    with open_url(url) as store:
        reach = Reach(store)
        needs = reach.checkpoint(store.get_checkpoint(head))
        assert not reach.unreadable
        return needs


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_damaged_live_head_record_with_a_verified_copy_keeps_all_it_needs(tmp_path):
    path = tmp_path / "s.db"
    url = f"sqlite://{path}"
    _run(url, max_steps=3)  # stopped half way: the resume below moves the branch on
    with open_url(url) as store:
        head = store.get_ref("live", "main")
    needs = _needs(url, "live", head)
    _damage_head_record(path, head, drop_copy=False)
    with open_url(url) as store:
        assert verify_store(store, ["live"], key=KEY).problems  # verify sees the damage ...
        loaded, fallback = load_head(store, "live", key=KEY)  # ... and a load heals it from the copy
        assert fallback is None and loaded.id == head

    r = cli("gc", "--grace", "0", "--apply", "--json", "--store", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    objects, checkpoints = _snapshot(path)
    assert needs <= objects, sorted(needs - objects)
    assert ditto_key(head) in objects and head in checkpoints
    rep = json.loads(r.stdout)
    assert rep["unreadable"] == [], rep["unreadable"]  # read through the copy, as a load reads it

    with open_url(url) as store:
        loaded, fallback = load_head(store, "live", key=KEY)
        assert fallback is None and loaded.id == head
        assert [h.what for h in loaded.healed] == ["record"]
    result = _run(url)  # resumes from the damaged head, healed
    assert result.fallback is None
    with open_url(url) as store:
        verify_store(store, ["live"], key=KEY, repair=True)  # the old head's record, now off the head
        rep = verify_store(store, ["live"], key=KEY)
        assert rep.ok, rep.problems


def test_damaged_live_head_record_without_a_copy_refuses_and_deletes_nothing(tmp_path):
    path = tmp_path / "s.db"
    url = f"sqlite://{path}"
    _run(url)
    with open_url(url) as store:
        head = store.get_ref("live", "main")
        state = loads(store.get_checkpoint(head).body)["state"]["digest"]
    _damage_head_record(path, head, drop_copy=True)
    before = _snapshot(path)

    with open_url(url) as store:
        for apply in (False, True):  # the dry run says what --apply would do: refuse
            with pytest.raises(StoreCorrupt) as err:
                collect(store, apply=apply, grace_s=0)
            assert err.value.task_id == "live" and err.value.checkpoint_id == head
            text = str(err.value)
            assert "head of branch 'main'" in text and head.split(":")[1][:12] in text
            assert "record is damaged" in text and "no verified ditto copy" in text
            assert "missing" not in err.value.message  # the record is damaged, not missing
            assert "overnight verify --repair live" in (err.value.hint or "")
            assert "falls back past the damaged head" in (err.value.hint or "")  # a head: a resume moves off it

    r = cli("gc", "--grace", "0", "--apply", "--json", "--store", url, cwd=tmp_path)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err_text = " ".join(r.stderr.split())
    assert "gc deletes nothing" in err_text and "'live'" in err_text and "head of branch 'main'" in err_text
    assert "overnight verify" in err_text
    assert _snapshot(path) == before
    assert state in before[0]


def test_a_damaged_past_checkpoint_does_not_advise_a_resume_that_cannot_move_off_it(tmp_path):
    """Fresh user: gc refused by a damaged past checkpoint advised "resuming falls back past the
    damage" -- a resume of a head that loads does not; only gc waits."""
    path = tmp_path / "s.db"
    url = f"sqlite://{path}"
    _run(url)
    with open_url(url) as store:
        head = store.get_ref("live", "main")
        parent = store.get_checkpoint(head).parent_id
    _damage_head_record(path, parent, drop_copy=True)  # the head's parent: a past checkpoint
    with open_url(url) as store:
        with pytest.raises(StoreCorrupt) as err:
            collect(store, apply=False, grace_s=0)
        assert err.value.checkpoint_id == parent
        hint = err.value.hint or ""
        assert "falls back" not in hint and "the branch's head loads and runs on, only gc waits" in hint, hint


def test_rm_keeps_objects_another_tasks_unreadable_live_checkpoint_may_need(tmp_path):
    path = tmp_path / "s.db"
    url = f"sqlite://{path}"
    _run(url, "live")
    _run(url, "other")  # the same notes: their blobs are shared by both tasks
    with open_url(url) as store:
        head = store.get_ref("live", "main")
        loaded, _ = load_head(store, "live", key=KEY)
        shared = loaded.artifacts["note-3.txt"].digest  # written by the head's step alone
    assert shared in _snapshot(path)[0]
    _damage_head_record(path, head, drop_copy=True)
    with open_url(url) as store:
        rep = remove_task(store, "other", grace_s=0)
        assert rep.objects_deleted == 0
        assert store.list_checkpoints("other") == []
    assert shared in _snapshot(path)[0]
