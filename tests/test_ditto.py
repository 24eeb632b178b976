"""Ditto copies (``overnight/chain/ditto.py``): a damaged or missing record or object is healed
from its verified copy on load and by ``verify --repair``, and says so; both damaged falls back as
before; a forged copy never loads; gc keeps copies with their originals and drops them with them.
On sqlite, file, postgres (own schema) and memory stores."""

from __future__ import annotations

import sqlite3
import uuid

import pytest

import overnight
from overnight.codec.canonical import loads
from overnight.errors import NoValidCheckpoint
from overnight.store import open_url
from overnight.store.base import ObjectRecord
from overnight.chain.read import load_head
from overnight.chain.ditto import KIND, _record_body, ditto_key, parse
from overnight.verify.fsck import verify_store
from overnight.ops.gc import collect, remove_task

KEY = b"ditto-test-key"
BACKENDS = ["sqlite", "file", "postgres", "memory"]


def build_task(task_id: str = "ditto") -> overnight.Task:
    task = overnight.Task(task_id, goal="keep a log", data={"lines": []})

    @task.step
    def plan(ctx):
        for i in range(4):
            ctx.add_step("write", i=i)

    @task.step(planned=False)
    def write(ctx, i):
        ctx.state["lines"].append(f"line {i}")
        ctx.write_text(f"note-{i}.txt", f"note {i}")
        return {"i": i}

    return task


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path):
    kind = request.param
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'd.db'}"
    if kind == "file":
        return f"file://{tmp_path / 'store'}"
    if kind == "memory":
        return f"memory://ditto-{uuid.uuid4().hex}"
    server, schema = request.getfixturevalue("pg_schema")
    return f"{server}?schema={schema}"


def _run(url: str, task_id: str = "ditto", max_steps: int | None = None) -> None:
    result = overnight.run(build_task(task_id), url, signing_key=KEY, handle_signals=False, max_steps=max_steps)
    assert result.status == ("complete" if max_steps is None else "stopped"), result.status


def _head_objects(store, task_id: str = "ditto") -> tuple[str, str, dict]:
    head = store.get_ref(task_id, "main")
    record = loads(store.get_checkpoint(head).body)
    return head, record["state"]["digest"], record


def test_every_commit_writes_copies_of_what_its_lineage_depends_on(url):
    _run(url)
    store = open_url(url)
    try:
        head, state, record = _head_objects(store)
        keys = [ditto_key(head), ditto_key(state), ditto_key(record["fingerprint"]["world"]["digest"])]
        found = store.get_objects(keys)
        assert set(found) == set(keys)
        for k, obj in found.items():
            assert obj.kind == KIND and parse(obj) is not None
        assert _record_body(parse(found[ditto_key(head)])) == store.get_checkpoint(head).body
    finally:
        store.close()


def test_deleted_original_heals_on_load_and_says_so(url):
    _run(url)
    store = open_url(url)
    try:
        head, state, _ = _head_objects(store)
        store.delete_objects([state])
        assert store.missing_objects([state]) == {state}
        loaded, fallback = load_head(store, "ditto", key=KEY)
        assert fallback is None and loaded.id == head
        assert [(h.digest, h.what, h.reason, h.written) for h in loaded.healed] == [(state, "object", "missing", True)]
        assert "healed object" in loaded.healed[0].describe()
        assert not store.missing_objects([state])  # rewritten from the copy
        loaded, _ = load_head(store, "ditto", key=KEY)
        assert loaded.healed == ()
    finally:
        store.close()


def test_forged_copy_is_refused(url):
    _run(url)
    store = open_url(url)
    try:
        head, state, _ = _head_objects(store)
        good = store.get_objects([ditto_key(state)])[ditto_key(state)]
        p = parse(good)
        forged_payload = b'{"forged":true}'
        header = f"ditto 1 blob {state} none {len(forged_payload)} -\n".encode()
        forged = ObjectRecord(ditto_key(state), KIND, len(header) + len(forged_payload), "none", header + forged_payload)
        assert p is not None and forged.data != good.data
        store.delete_objects([state, ditto_key(state)])
        store.put_objects([forged])
        loaded, fallback = load_head(store, "ditto", key=KEY)
        assert loaded.id != head and fallback is not None  # fell back, the forgery never loaded
        assert all(h.digest != state for h in loaded.healed)
        rep = verify_store(store, ["ditto"], key=KEY, repair=True)
        assert not rep.ok and not any(state[7:19] in line for line in rep.healed)
    finally:
        store.close()


def test_gc_keeps_copies_of_live_objects_and_drops_copies_of_dead_ones(url):
    _run(url, "keep")
    _run(url, "drop")
    store = open_url(url)
    try:
        head_k, state_k, _ = _head_objects(store, "keep")
        head_d, state_d, _ = _head_objects(store, "drop")
        copies_k = [ditto_key(head_k), ditto_key(state_k)]
        copies_d = [ditto_key(head_d), ditto_key(state_d)]
        collect(store, apply=True, grace_s=0)
        assert not store.missing_objects(copies_k + copies_d)
        remove_task(store, "drop", grace_s=0)
        assert store.missing_objects(copies_d) == set(copies_d)
        assert not store.missing_objects(copies_k)
        collect(store, apply=True, grace_s=0)
        assert not store.missing_objects(copies_k)
        loaded, fallback = load_head(store, "keep", key=KEY)
        assert fallback is None and loaded.id == head_k
    finally:
        store.close()


def test_verify_reports_healable_and_repair_heals(url):
    _run(url)
    store = open_url(url)
    try:
        head, state, _ = _head_objects(store)
        store.delete_objects([state])
        rep = verify_store(store, ["ditto"], key=KEY)
        assert not rep.ok and any(p.check == "ditto" for p in rep.problems)
        assert store.missing_objects([state]) == {state}  # a plain verify writes nothing
        rep = verify_store(store, ["ditto"], key=KEY, repair=True)
        assert rep.ok and any("healed object" in line for line in rep.healed)
        rep = verify_store(store, ["ditto"], key=KEY, all_objects=True)
        assert rep.ok and not rep.healed and not rep.problems
    finally:
        store.close()


# -- in-place damage (SQLite: the bytes on disk change under the same key) --------------------------

def _flip(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def test_damaged_record_and_object_heal_on_resume_and_in_log(tmp_path):
    path = tmp_path / "d.db"
    _run(f"sqlite://{path}", max_steps=2)  # stopped half way: the resume below moves the branch on
    with open_url(f"sqlite://{path}") as store:
        head, state, _ = _head_objects(store)
        parent = store.get_checkpoint(head).parent_id
        assert verify_store(store, ["ditto"], key=KEY, repair=True).healed == []
    db = sqlite3.connect(path, isolation_level=None)
    body = db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0]
    db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (_flip(bytes(body)), head))
    data = db.execute("SELECT data FROM objects WHERE digest=?", (state,)).fetchone()[0]
    db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes(data)[:-3], state))
    db.close()
    with open_url(f"sqlite://{path}") as store:
        loaded, fallback = load_head(store, "ditto", key=KEY)
        assert fallback is None and loaded.id == head
        assert {(h.what, h.digest) for h in loaded.healed} == {("record", head), ("object", state)}
    # a resume says so, and the next checkpoint records it for `overnight log`
    events = []
    result = overnight.run(build_task(), f"sqlite://{path}", signing_key=KEY, handle_signals=False, on_event=events.append)
    resumes = [e for e in events if e.kind == "resume"]
    assert resumes and "healed record" in (resumes[0].detail or "") and result.fallback is None
    assert result.status == "complete"
    log = overnight.api.log("ditto", store=f"sqlite://{path}")
    healed = {e.row.checkpoint_id: e.healed for e in log if e.healed}
    assert len(healed) == 2 and any("healed record" in v for k, v in healed.items() if k != head), healed  # the resume's
    assert healed[head].startswith("served by its ditto copy: record "), healed  # still damaged, read from its copy
    assert all(e.valid for e in log)  # served by a copy: not INVALID, as verify counts it
    # the damaged head record is rewritten once the branch moved on, by verify --repair
    with open_url(f"sqlite://{path}") as store:
        rep = verify_store(store, ["ditto"], key=KEY, repair=True)
        assert any("healed record" in line for line in rep.healed), rep
        assert verify_store(store, ["ditto"], key=KEY).ok
        assert store.get_checkpoint(parent).parent_id is not None


def test_both_damaged_falls_back_as_before(tmp_path):
    path = tmp_path / "d.db"
    _run(f"sqlite://{path}")
    with open_url(f"sqlite://{path}") as store:
        head, state, _ = _head_objects(store)
    db = sqlite3.connect(path, isolation_level=None)
    data = db.execute("SELECT data FROM objects WHERE digest=?", (state,)).fetchone()[0]
    db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes(data)[:-3], state))
    copy = db.execute("SELECT data FROM objects WHERE digest=?", (ditto_key(state),)).fetchone()[0]
    db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes(copy)[:-3] + b"xyz", ditto_key(state)))
    db.close()
    with open_url(f"sqlite://{path}") as store:
        loaded, fallback = load_head(store, "ditto", key=KEY)
        assert fallback is not None and loaded.id != head and loaded.healed == ()
        rep = verify_store(store, ["ditto"], key=KEY, repair=True)
        assert not rep.ok and not rep.healed


def test_store_without_copies_still_loads(tmp_path):
    """A store written before ditto copies (simulated: every copy removed) opens and loads."""
    path = tmp_path / "old.db"
    _run(f"sqlite://{path}")
    db = sqlite3.connect(path, isolation_level=None)
    n = db.execute("DELETE FROM objects WHERE kind=?", (KIND,)).rowcount
    db.close()
    assert n > 0
    with open_url(f"sqlite://{path}") as store:
        loaded, fallback = load_head(store, "ditto", key=KEY)
        assert fallback is None and loaded.healed == ()
        assert verify_store(store, ["ditto"], key=KEY, all_objects=True).ok
        with pytest.raises(NoValidCheckpoint):
            state = loads(store.get_checkpoint(loaded.id).body)["state"]["digest"]
            store.delete_objects([state])
            for cid in [r.checkpoint_id for r in store.list_checkpoints("ditto")]:
                st = loads(store.get_checkpoint(cid).body)["state"]["digest"]
                store.delete_objects([st])
            load_head(store, "ditto", key=KEY)


def test_every_shared_page_and_fingerprint_has_a_copy_across_sessions(tmp_path):
    """Copies go where a lineage is fragile: every page or world fingerprint that two or more
    checkpoints share has a copy -- also one shared across a session boundary (copied by the next
    session's first commit) -- and every record and plain state document has one."""
    url = f"sqlite://{tmp_path / 'd.db'}"
    overnight.run(build_task(), url, signing_key=KEY, handle_signals=False, max_steps=2)
    db = sqlite3.connect(tmp_path / "d.db", isolation_level=None)
    assert db.execute("DELETE FROM objects WHERE kind=?", (KIND,)).rowcount  # as an old store: no copies
    db.close()
    for steps in (1, None):  # two more sessions: what they share with the old checkpoints gets its copy
        overnight.run(build_task(), url, signing_key=KEY, handle_signals=False, max_steps=steps)
    store = open_url(url)
    try:
        uses: dict[str, int] = {}
        for row in store.list_checkpoints("ditto")[3:]:  # those written after the copies were lost
            record = loads(row.body)
            assert not store.missing_objects([ditto_key(row.checkpoint_id)])
            state = record["state"]["digest"]
            assert not store.missing_objects([ditto_key(state)])
            from overnight.store.blobs import BlobReader
            doc = loads(BlobReader(store).get(state))
            refs = [p["digest"] for k in ("todo", "done", "artifacts") for p in doc[k]["pages"]]
            if record.get("fingerprint"):
                refs.append(record["fingerprint"]["world"]["digest"])
            for d in set(refs):
                uses[d] = uses.get(d, 0) + 1
        shared = [d for d, n in uses.items() if n >= 2]
        assert shared
        assert not store.missing_objects(ditto_key(d) for d in shared)
    finally:
        store.close()
