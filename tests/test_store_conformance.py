"""The Store contract. Every backend runs this same module (parametrize ``store`` over backends)."""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest
from conftest import S3_BUCKET

from overnight.codec import digest
from overnight.errors import CheckpointNotFound, LeaseLost, StaleHead, TaskBusy, TaskNotFound
from overnight.store import open_store
from overnight.store.base import CheckpointRow, Commit, JournalRow, ObjectRecord, Store, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.store.leases import Holder


def sqlite_store(request, tmp_path):
    return open_store(f"sqlite://{tmp_path / 'store.db'}")


def file_store(request, tmp_path):
    return open_store(f"file://{tmp_path / 'store'}")


def postgres_store(request, tmp_path):
    server, schema = request.getfixturevalue("pg_schema")  # a fresh schema, dropped after the test
    return open_store(f"{server}?schema={schema}")


def s3_store(request, tmp_path):
    endpoint = request.getfixturevalue("s3_endpoint")  # moto's server, started once per session
    return open_store(f"s3://{S3_BUCKET}/t-{uuid.uuid4().hex}?endpoint_url={endpoint}")


# name -> (request, tmp_path) -> a new, empty store; every test below runs against each one
BACKENDS = {"sqlite": sqlite_store, "file": file_store, "postgres": postgres_store, "s3": s3_store}


@pytest.fixture(params=sorted(BACKENDS))
def store(request, tmp_path):
    s = BACKENDS[request.param](request, tmp_path)
    yield s
    s.close()


def _row(task_id: str, parent: str | None, seq: int, branch: str = "main", body_extra: str = "") -> CheckpointRow:
    body = json.dumps({"task": task_id, "seq": seq, "parent": parent, "x": body_extra}, sort_keys=True).encode()
    return CheckpointRow(digest.sha256(body), task_id, parent, branch, seq, f"2026-11-30T00:00:{seq:02d}+00:00",
                         "sess", "step", f"s{seq}", body, None, 0)


def _obj(data: bytes) -> ObjectRecord:
    return ObjectRecord(digest.sha256(data), "blob", len(data), "none", data)


def _task(task_id: str) -> TaskRow:
    return TaskRow(task_id, "2026-11-30T00:00:00+00:00", "goal", None, b"{}")


def test_is_a_store(store):
    assert isinstance(store, Store)


def test_objects_are_written_once_and_deduplicated(store):
    a, b = _obj(b"alpha"), _obj(b"beta")
    store.put_objects([a, b, a])
    assert store.missing_objects([a.digest, b.digest, digest.sha256(b"gamma")]) == {digest.sha256(b"gamma")}
    got = store.get_objects([a.digest, b.digest, digest.sha256(b"nope")])
    assert set(got) == {a.digest, b.digest}
    assert got[a.digest].data == b"alpha"
    # a second insert of the same digest with different bytes does not overwrite (immutable)
    store.put_objects([ObjectRecord(a.digest, "blob", 3, "none", b"xyz")])
    assert store.get_objects([a.digest])[a.digest].data == b"alpha"


def test_commit_moves_ref_by_cas_and_reports_added_bytes(store):
    r0 = _row("t", None, 0)
    added = store.commit(Commit(r0, None, [_obj(b"state0")], [], None, _task("t")))
    assert added == len(r0.body) + len(b"state0")
    assert store.get_ref("t", "main") == r0.checkpoint_id
    r1 = _row("t", r0.checkpoint_id, 1)
    # same object again: nothing new stored for it
    assert store.commit(Commit(r1, r0.checkpoint_id, [_obj(b"state0")])) == len(r1.body)
    assert store.get_ref("t", "main") == r1.checkpoint_id
    assert store.get_checkpoint(r1.checkpoint_id).stored_bytes == len(r1.body)
    assert [r.seq for r in store.list_checkpoints("t")] == [0, 1]


def test_stale_head_is_refused_and_nothing_is_written(store):
    r0 = _row("t", None, 0)
    store.commit(Commit(r0, None, [], [], None, _task("t")))
    r1 = _row("t", r0.checkpoint_id, 1)
    store.commit(Commit(r1, r0.checkpoint_id))
    fork = _row("t", r0.checkpoint_id, 1, body_extra="other")
    lost = _obj(b"should not be stored")
    with pytest.raises(StaleHead):
        store.commit(Commit(fork, r0.checkpoint_id, [lost]))
    assert store.get_ref("t", "main") == r1.checkpoint_id
    with pytest.raises(CheckpointNotFound):
        store.get_checkpoint(fork.checkpoint_id)
    assert store.missing_objects([lost.digest]) == {lost.digest}
    # creating a branch that already exists is stale too
    with pytest.raises(StaleHead):
        store.commit(Commit(_row("t", None, 0, body_extra="again"), None))


def test_set_ref_cas_create_move_delete(store):
    r0 = _row("t", None, 0)
    store.commit(Commit(r0, None, [], [], None, _task("t")))
    store.set_ref("t", "b", r0.checkpoint_id, None)
    assert store.list_refs("t") == {"b": r0.checkpoint_id, "main": r0.checkpoint_id}
    with pytest.raises(StaleHead):
        store.set_ref("t", "b", r0.checkpoint_id, None)
    store.set_ref("t", "b", None, r0.checkpoint_id)
    assert store.get_ref("t", "b") is None


def test_tasks_and_journal(store):
    r0 = _row("t", None, 0)
    j = JournalRow("t", r0.checkpoint_id, 0, "sha256:" + "0" * 64, "s0", "sess", "2026", 1.5, 10, 20)
    store.commit(Commit(r0, None, [], [j], None, _task("t")))
    assert store.get_task("t").goal == "goal"
    assert [t.task_id for t in store.list_tasks()] == ["t"]
    assert store.journal("t") == [j]
    with pytest.raises(TaskNotFound):
        store.get_task("nope")


def test_lease_busy_takeover_and_fencing(store):
    me, other = Holder.current(), Holder.current()
    lease = store.acquire_lease("t", "main", me.id, me.to_json(), 60_000)
    with pytest.raises(TaskBusy) as err:
        store.acquire_lease("t", "main", other.id, other.to_json(), 60_000)
    assert "held by" in str(err.value)
    # another branch of the same task is independent
    store.release_lease(store.acquire_lease("t", "b", other.id, other.to_json(), 60_000))
    # an expired lease is taken over; the old holder's commits are then fenced off
    store.release_lease(lease)
    lease = store.acquire_lease("t", "main", me.id, me.to_json(), 1)
    import time

    time.sleep(0.01)
    taken = store.acquire_lease("t", "main", other.id, other.to_json(), 60_000)
    assert taken.token == lease.token + 1
    with pytest.raises(LeaseLost):
        store.renew_lease(lease, 60_000)
    r0 = _row("t", None, 0)
    with pytest.raises(LeaseLost):
        store.commit(Commit(r0, None, [], [], lease, _task("t")))
    store.commit(Commit(r0, None, [], [], taken, _task("t")))


def test_lease_of_dead_local_process_is_taken_over_at_once(store):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = Holder.current()
        from overnight.store.leases import _proc_start

        dead = Holder(dead.id, dead.host, proc.pid, _proc_start(proc.pid), "sleeper")
        store.acquire_lease("t", "main", dead.id, dead.to_json(), 600_000)
        me = Holder.current()
        with pytest.raises(TaskBusy):
            store.acquire_lease("t", "main", me.id, me.to_json(), 60_000)
    finally:
        proc.kill()
        proc.wait()
    lease = store.acquire_lease("t", "main", me.id, me.to_json(), 60_000)
    assert lease.holder_id == me.id


def test_blobs_chunk_dedup_and_verify(store):
    data = os.urandom(300_000)
    w = BlobWriter(store)
    d = w.put(data)
    assert d == digest.sha256(data)
    store.put_objects(w.objects.values())
    first = len(w.objects)
    assert first > 10  # chunked
    # append 1 KB: only a few new objects
    w2 = BlobWriter(store)
    d2 = w2.put(data + os.urandom(1024))
    assert len(w2.objects) <= 5
    store.put_objects(w2.objects.values())
    r = BlobReader(store)
    assert r.get(d) == data
    assert r.get(d2)[:300_000] == data


def test_concurrent_commits_from_threads_never_fork(store):
    r0 = _row("t", None, 0)
    store.commit(Commit(r0, None, [], [], None, _task("t")))
    wins, losses = [], []

    def attempt(i: int) -> None:
        try:
            store.commit(Commit(_row("t", r0.checkpoint_id, 1, body_extra=str(i)), r0.checkpoint_id))
            wins.append(i)
        except StaleHead:
            losses.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert len(store.list_checkpoints("t")) == 2
