"""Tests that notice when a promise breaks (issue 15).

Each test is named for the promise it guards and fails when that promise is broken by the
smallest edit that breaks it (the README's "How the guarantees are tested" lists which edit each
one was checked against):

1. SQLite commits are durable: the store's own connection runs ``synchronous=FULL`` in WAL mode,
   fresh and after a schema migration (a ``kill -9`` cannot show this: the page cache survives it;
   ``tests/test_power_loss.py`` drops unsynced writes for real);
2. ``file://`` commits are durable: every file a commit publishes is fsynced before the link or
   rename that names it, its directory after, and all of it before the ref swap that makes the new
   head visible -- but the new head's index entry, made durable by the next commit before its own
   swap (observed: the test records the calls the store makes, it does not replace them);
3. fencing is by token, not by holder id: the same holder re-acquiring outranks its old lease, and
   on ``file://``/S3 a stale lease record put back does not let the old holder commit (the ref's
   fence refuses it);
4. a done step is never run again, even when a (forged or migrated) state lists its key in todo;
5. records are checked for canonical form: the fault kinds that need no key are caught with
   ``key=None``, each by the exact check that guards against it, and the fallback refuses a
   damaged head without a key;
6. a signed LangGraph thread refuses a forged head (``ThreadCorrupt``);
7. every codec tag that names a class refuses a function, a module-level callable and an
   unrelated class, and nothing named by stored data runs (a sentinel file stays absent);

plus the call journal's request-digest key: a recorded model answer is replayed only for the very
same request.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest
from _tasks import plan_task
from test_faults import build_task
from test_store_conformance import BACKENDS, _obj, _row, _task, store  # noqa: F401 - ``store``: every backend

import overnight
from overnight.codec.canonical import from_tree, loads
from overnight.errors import (
    DecodeError,
    DigestMismatch,
    LeaseLost,
    MissingObject,
    NoValidCheckpoint,
    SchemaError,
    SignatureError,
    StepFailed,
)
from overnight.models.extractive import ExtractiveModel
from overnight.runtime.task import todo_entry
from overnight.store import open_store
from overnight.store import layout
from overnight.store.base import Commit
from overnight.store.sqlite import _SCHEMA, SQLiteStore
from overnight.chain.write import ChainWriter
from overnight.chain.read import load_head
from overnight.testing.faults import KINDS, NEEDS_KEY, Faults
from overnight.chain.records import event


def _append(into, loaded, state: dict, ev: dict, *, key: bytes | None) -> str:
    """Commit ``state`` as a child of ``loaded`` on its branch, as someone holding ``key`` (None:
    unsigned) could: a well-formed, digested record (the head's fingerprint kept)."""
    record = loaded.record
    chain = ChainWriter(into, record.task_id, record.branch, key=key, session_id="forged", session_n=record.session.n)
    chain.start_from(loaded, None)
    return chain.commit(state, ev, fingerprint=loads(loaded.row.body)["fingerprint"])


# -- 1. durable SQLite commits ------------------------------------------------------------------

SYNCHRONOUS_FULL = 2  # PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA (sqlite.org/pragma.html)


def _durability(s: SQLiteStore) -> tuple[str, int]:
    db = s._db  # the store's own connection: PRAGMA synchronous is per connection
    return db.execute("PRAGMA journal_mode").fetchone()[0].lower(), db.execute("PRAGMA synchronous").fetchone()[0]


def _schema_1_file(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA)  # the schema 1 tables, as the first release created them
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.commit()
    db.close()


def test_sqlite_commit_is_durable_synchronous_full(tmp_path):
    """WAL with ``synchronous=FULL`` (or EXTRA) on the connection that commits: in WAL mode
    ``NORMAL`` loses the last commits at a power cut, ``OFF`` anything not yet written back."""
    fresh = tmp_path / "fresh.db"
    migrated = tmp_path / "v1.db"
    _schema_1_file(migrated)
    for path in (fresh, migrated):
        with open_store(f"sqlite://{path}") as s:
            assert isinstance(s, SQLiteStore)
            mode, sync = _durability(s)
            assert mode == "wal", f"{path.name}: journal_mode {mode}"
            assert sync >= SYNCHRONOUS_FULL, f"{path.name}: PRAGMA synchronous={sync}, not FULL"
            s.commit(Commit(_row("t", None, 0), None, [_obj(b"x")], [], None, _task("t")))
            assert _durability(s) == (mode, sync)  # still so on the connection after a commit


# -- 2. durable file:// commits -----------------------------------------------------------------


class _SyscallLog:
    """Records, in order, the fsync/link/rename/replace/mkdir calls this process makes (from any
    thread) while installed. The calls still run: this observes the store, it does not replace it."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        real = {n: getattr(os, n) for n in ("fsync", "fdatasync", "link", "rename", "replace", "mkdir")}

        def sync(name):
            def wrapper(fd):
                path = os.readlink(f"/proc/self/fd/{fd if isinstance(fd, int) else fd.fileno()}")
                self._add(name, path, None)
                return real[name](fd)
            return wrapper

        def move(name):
            def wrapper(src, dst, *a, **kw):
                out = real[name](src, dst, *a, **kw)
                self._add(name, os.path.abspath(src), os.path.abspath(dst))
                return out
            return wrapper

        def mkdir(path, *a, **kw):
            out = real["mkdir"](path, *a, **kw)
            self._add("mkdir", os.path.abspath(path), None)
            return out

        for n in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, n, sync(n))
        for n in ("link", "rename", "replace"):
            monkeypatch.setattr(os, n, move(n))
        monkeypatch.setattr(os, "mkdir", mkdir)

    def _add(self, *ev) -> None:
        with self._lock:
            self.events.append(ev)

    def synced(self, path: str, after: int, before: int) -> bool:
        """Was ``path`` fsynced (fsync or fdatasync) between event indexes ``after`` and ``before``?"""
        return any(kind in ("fsync", "fdatasync") and p == path for kind, p, _ in self.events[after + 1:before])


def test_file_commit_is_durable_fsync_before_publish(tmp_path, monkeypatch):
    """Every file a ``file://`` commit writes reaches the disk before the name that publishes it,
    and every new name (and new directory) before the ref swap that makes the head visible --
    among them the old head's index entry, which the previous commit wrote without waiting for it."""
    root = Path(os.path.realpath(tmp_path)) / "store"  # as /proc/self/fd names it
    with open_store(f"file://{root}") as s:
        r0 = _row("t", None, 0)
        s.commit(Commit(r0, None, [_obj(b"first")], [], None, _task("t")))
        log = _SyscallLog(monkeypatch)
        # six new objects: written by the store's thread pool, in shard directories (objects/ab/) that
        # that are new (all six sharing the one shard of the first commit: a chance of 1 in 256^6)
        objects = [_obj(f"object {i} {uuid.uuid4()}".encode()) for i in range(6)]
        r1 = _row("t", r0.checkpoint_id, 1)
        s.commit(Commit(r1, r0.checkpoint_id, objects, [], None, None))
        monkeypatch.undo()
        assert s.get_ref("t", "main") == r1.checkpoint_id
    events = log.events
    ref_path = str(root / layout.ref_key("t", "main"))
    publishes = [(i, kind, src, dst) for i, (kind, src, dst) in enumerate(events)
                 if kind in ("link", "rename", "replace") and dst.startswith(str(root))
                 and not os.path.basename(dst).startswith(".tmp-")]
    ref_swaps = [i for i, _, _, dst in publishes if dst == ref_path]
    assert len(ref_swaps) == 1, f"expected one ref swap, saw {events}"
    ref_at = ref_swaps[0]
    published = {dst for _, _, _, dst in publishes}
    for d in objects:
        assert str(root / layout.object_key(d.digest)) in published, "an object was not written through link/rename"
    assert str(root / layout.checkpoint_key(r1.checkpoint_id)) in published
    new_head_entry = str(root / layout.index_key("t", r1.checkpoint_id))
    assert os.path.exists(root / layout.index_key("t", r0.checkpoint_id))
    assert log.synced(str(root / layout.index_dir("t")), -1, ref_at), \
        "the old head's index entry was not made durable before the ref moved away from it"
    for i, kind, src, dst in publishes:
        assert log.synced(src, -1, i), f"{kind} of {dst} before its data was fsynced"
        if dst == new_head_entry:
            continue  # written after the swap, durable by the next commit (listings add the heads meanwhile)
        # what the new head depends on is durable before the ref names it; the ref by the time commit returns
        deadline = len(events) if dst == ref_path else ref_at
        assert log.synced(os.path.dirname(dst), i, deadline), f"directory of {dst} not fsynced after the {kind}" + (
            "" if deadline == len(events) else " and before the ref swap")
    new_dirs = [(i, p) for i, (kind, p, _) in enumerate(events) if kind == "mkdir" and p.startswith(str(root))]
    assert new_dirs, "the commit created no directory"
    for i, p in new_dirs:
        assert log.synced(os.path.dirname(p), i, ref_at), f"new directory {p} not made durable in its parent before the ref swap"


# -- 3. fencing by token --------------------------------------------------------------------------


def test_lease_fencing_is_by_token_not_holder_id(store):  # noqa: F811 - the conformance fixture
    """The same holder id acquiring again gets a new token; its old lease is then fenced off:
    commits and renewals with it get LeaseLost, the new one commits."""
    first = store.acquire_lease("t", "main", "same-holder", "{}", 60_000)
    second = store.acquire_lease("t", "main", "same-holder", "{}", 60_000)
    assert second.token > first.token
    r0 = _row("t", None, 0)
    with pytest.raises(LeaseLost):
        store.commit(Commit(r0, None, [], [], first, _task("t")))
    with pytest.raises(LeaseLost):
        store.renew_lease(first, 60_000)
    assert store.get_ref("t", "main") is None
    store.commit(Commit(r0, None, [], [], second, _task("t")))
    assert store.get_ref("t", "main") == r0.checkpoint_id
    # and once the branch exists, the old token cannot advance it either
    with pytest.raises(LeaseLost):
        store.commit(Commit(_row("t", r0.checkpoint_id, 1, body_extra="old"), r0.checkpoint_id, [], [], first))
    assert store.get_ref("t", "main") == r0.checkpoint_id


@pytest.fixture(params=["file", "s3"])
def keyed_store(request, tmp_path):
    """The key-value backends, as the conformance module opens them."""
    s = BACKENDS[request.param](request, tmp_path)
    yield s
    s.close()


def test_keyed_commit_is_fenced_by_the_ref_even_with_a_stale_lease_record(keyed_store):
    """``file://``/S3: the old holder's lease record is put back after a takeover (a restored
    backup, a delayed write): the lease check then passes, and only the ref's fence -- raised to
    the new token by the takeover -- keeps the old holder from committing."""
    s = keyed_store
    r0 = _row("t", None, 0)
    old = s.acquire_lease("t", "main", "old", "{}", 1)
    s.commit(Commit(r0, None, [], [], old, _task("t")))
    key = layout.lease_key("t", "main")
    old_record, _ = s._c.read(key)  # the raw record, through the store's container (directory or bucket)
    time.sleep(0.01)
    new = s.acquire_lease("t", "main", "new", "{}", 60_000)
    assert new.token > old.token
    _, version = s._c.read(key)
    assert s._c.swap(key, old_record, version) is not None  # the stale record is back
    assert layout.decode_lease(s._c.read(key)[0]).holder_id == "old"
    with pytest.raises(LeaseLost):
        s.commit(Commit(_row("t", r0.checkpoint_id, 1, body_extra="old"), r0.checkpoint_id, [], [], old))
    assert s.get_ref("t", "main") == r0.checkpoint_id


# -- 4. a done step never runs again ----------------------------------------------------------------


def _counting_task(task_id: str, runs: list[str]) -> overnight.Task:
    def section(ctx, n):
        runs.append(f"section {n}")
        ctx.write_text(f"s{n}.md", f"section {n}")
        return n

    return plan_task(task_id, (1, 2, 3), section, step="section", arg="n", goal="three sections",
                     level="session", deps=[])


def test_a_done_step_is_never_run_again_even_if_todo_lists_it(tmp_path):
    """A state whose todo list holds the key of a done step (forged, migrated, or from a future
    code path -- ``add_step`` and merge drop such names) resumes without running that step again."""
    url = f"sqlite://{tmp_path / 's.db'}"
    runs: list[str] = []
    task = _counting_task("redo", runs)
    overnight.run(task, url, max_steps=3, handle_signals=False)  # plan, section 1, section 2
    assert runs == ["section 1", "section 2"]
    with open_store(url) as s:
        loaded, _ = load_head(s, "redo")
        tree = loaded.state_tree
        (first,) = [d for d in tree["done"] if d["fn"] == "section" and from_tree(d["args"]) == {"n": 1}]
        again = todo_entry(first["name"], "section", {"n": 1}, first["added_by"])
        assert again["args"] == first["args"]  # the same step key
        _append(s, loaded, {**tree, "todo": [again, *tree["todo"]]}, event("step", step="forged"), key=None)
    result = overnight.run(task, url, handle_signals=False)
    assert result.status == "complete"
    assert runs == ["section 1", "section 2", "section 3"], f"a done step ran again: {runs}"
    assert result.steps_reused == 1 and result.steps_run == 1
    with open_store(url) as s:
        names = [d.name for d in load_head(s, "redo")[0].state.done]
    assert len(names) == len(set(names)) == 4, names


# -- 5. canonical form and the other keyless checks -------------------------------------------------

# which check catches each fault kind with no signing key: the error of the skipped head
KEYLESS = {
    "removed_field": SchemaError,
    "removed_blob": MissingObject,
    "duplicated_member": SchemaError,
    "reordered_members": SchemaError,
    "torn_write": DigestMismatch,
}


@pytest.fixture(scope="module")
def unsigned_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("keyless") / "base.db"
    result = overnight.run(build_task(), f"sqlite://{path}", handle_signals=False)  # test_faults' task, unsigned
    assert result.status == "complete" and result.done == 9
    return path


@pytest.mark.parametrize("kind", sorted(set(KINDS) - NEEDS_KEY))
def test_fault_kinds_are_detected_without_a_key(kind, unsigned_store, tmp_path):
    """With no signing key, each fault kind that needs none is still refused -- by the check that
    guards against it (``duplicated_member``/``reordered_members``: the canonical-form check) --
    and loading falls back to exactly the newest checkpoint the damage does not reach."""
    for seed in range(3):
        path = tmp_path / f"{kind}-{seed}.db"
        shutil.copy(unsigned_store, path)
        inj = Faults(path, random.Random(seed), copies=True).inject(kind, "faulty")  # no self-heal
        with SQLiteStore(path) as s:
            if inj.expected is None:
                with pytest.raises(NoValidCheckpoint):
                    load_head(s, "faulty", key=None)
                continue
            loaded, fallback = load_head(s, "faulty", key=None)
        assert fallback is not None and loaded.id == inj.expected, f"{kind}: {inj.detail}: loaded {loaded.id}"
        first = fallback.skipped[0]
        assert first.checkpoint_id == inj.bad_head
        if kind in KEYLESS:
            assert first.error == KEYLESS[kind].__name__, f"{kind}: {inj.detail}: {first.error}: {first.reason}"
        else:  # bit_flip / truncation / swapped_blob: a record or object no longer hashes to its id
            assert first.error in ("DigestMismatch", "SchemaError"), f"{kind}: {first.error}: {first.reason}"
        if kind == "reordered_members":
            assert "not in canonical form" in first.reason, first.reason
        if kind == "duplicated_member":  # refused by the strict parser, before the canonical check
            assert "duplicate JSON object keys" in first.reason, first.reason


@pytest.mark.parametrize("variant", ["reordered", "re-spaced", "escaped"])
def test_a_record_not_in_canonical_form_is_refused_without_a_key(variant, unsigned_store, tmp_path):
    """A head record holding the same tree in other bytes -- members reordered, whitespace added,
    a character escaped -- under its own correct digest is refused with no signing key: it was
    not written by overnight (SchemaError, "not in canonical form"); its parent loads."""
    import json

    from overnight.codec import digest
    from overnight.store.base import CheckpointRow

    path = tmp_path / "s.db"
    shutil.copy(unsigned_store, path)
    with SQLiteStore(path) as s:
        head = s.get_ref("faulty", "main")
        record = loads(s.get_checkpoint(head).body)
        record.update(parent_id=head, seq=record["seq"] + 1, created_at="2099-01-01T00:00:00.000000+00:00")
        if variant == "reordered":
            body = json.dumps(dict(reversed(list(record.items()))), separators=(",", ":")).encode()
        elif variant == "re-spaced":
            body = json.dumps(record, sort_keys=True).encode()  # ", " and ": "
        else:
            body = json.dumps(record, sort_keys=True, separators=(",", ":")).replace('"format"', '"\\u0066ormat"').encode()
        assert loads(body) == record
        row = CheckpointRow(digest.sha256(body), "faulty", head, "main", record["seq"], record["created_at"],
                            "forged", "step", None, body, None, 0)
        s.commit(Commit(row, head))
        loaded, fallback = load_head(s, "faulty", key=None)
    assert loaded.id == head and fallback is not None
    (skipped,) = fallback.skipped
    assert (skipped.checkpoint_id, skipped.error) == (row.checkpoint_id, "SchemaError")
    assert "not in canonical form" in skipped.reason, skipped.reason


def test_fallback_refuses_a_damaged_head_without_a_key(unsigned_store, tmp_path):
    """No signing key: a head record with one bit flipped is never loaded; the run continues from
    its parent, redoes the step the damaged record held, and says so."""
    path = tmp_path / "s.db"
    shutil.copy(unsigned_store, path)
    with SQLiteStore(path) as s:
        head = s.get_ref("faulty", "main")
        parent = s.get_checkpoint(head).parent_id
        body = bytearray(s.get_checkpoint(head).body)
    body[len(body) // 2] ^= 0x04
    from overnight.chain.ditto import ditto_key
    with sqlite3.connect(path) as db:
        db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (bytes(body), head))
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),))  # no copy to heal from
    with SQLiteStore(path) as s:
        loaded, fallback = load_head(s, "faulty", key=None)
        assert loaded.id == parent and fallback is not None
        assert [(x.checkpoint_id, x.error) for x in fallback.skipped] == [(head, "DigestMismatch")]
    events = []
    result = overnight.run(build_task(), f"sqlite://{path}", handle_signals=False, on_event=events.append)
    assert result.status == "complete" and result.fallback is not None and result.fallback.used_id == parent
    assert result.steps_run == 1
    assert any(e.kind == "resume" and "failed verification" in (e.detail or "") for e in events)
    with SQLiteStore(path) as s:
        state = load_head(s, "faulty")[0].state
        assert len(state.data["lines"]) == 8 and len(state.done) == 9


# -- 6. signed LangGraph threads ----------------------------------------------------------------------

LG_KEY = b"the thread's signing key"


@pytest.mark.parametrize("forger_key", [None, b"a key that is not the thread's"], ids=["unsigned", "wrong-key"])
def test_signed_langgraph_thread_refuses_a_forged_head(tmp_path, forger_key):
    """An ``OvernightSaver`` with a signing key refuses a head committed without that key -- a
    record as the saver itself would write it, valid in every other way -- with ThreadCorrupt."""
    pytest.importorskip("langgraph.checkpoint.conformance")
    from langchain_core.messages import HumanMessage
    from test_langgraph import _echo_graph

    from overnight.adapters.langgraph import OvernightSaver
    from overnight.errors import ThreadCorrupt
    from overnight.chain.integrity import load_checkpoint

    url = f"sqlite://{tmp_path / 'lg.db'}"
    cfg = {"configurable": {"thread_id": "t1"}}
    with OvernightSaver.from_url(url, key=LG_KEY) as saver:
        app = _echo_graph().compile(checkpointer=saver)
        for q in "ab":
            app.invoke({"messages": [HumanMessage(q)]}, cfg)
        assert saver.get_tuple(cfg) is not None  # the signed thread reads back with its key
        s = saver.store
        task_id = saver.task_id("t1")
        head = s.get_ref(task_id, "main")
        loaded = load_checkpoint(s, head, key=LG_KEY)
        _append(s, loaded, loaded.state_tree, loaded.record.event.model_dump(), key=forger_key)
    with OvernightSaver.from_url(url, key=LG_KEY) as saver:
        with pytest.raises(ThreadCorrupt, match="LangGraph thread 't1'") as err:
            saver.get_tuple(cfg)
        assert isinstance(err.value.__cause__, SignatureError)
        with pytest.raises(ThreadCorrupt):
            list(saver.list(cfg))


# -- 7. class-naming codec tags ---------------------------------------------------------------------


def _payloads(target: str, sentinel: str) -> dict[str, dict]:
    """A stored value of every class-naming tag pointed at ``target``; if the class (or function)
    it names were called with the stored arguments, it would create ``sentinel``."""
    argv = ["touch", sentinel]
    shell = f"touch {sentinel}"
    arg = shell if target == "os:system" else argv
    return {
        "enum": {"$t": "enum", "cls": target, "v": arg},
        "model": {"$t": "model", "cls": target, "fields": [["args", arg]]},
        "dataclass": {"$t": "dataclass", "cls": target, "fields": [["args", arg]]},
        "namedtuple": {"$t": "namedtuple", "cls": target, "items": [arg]},
        "defaultdict": {"$t": "defaultdict", "factory": f"type:{target}", "items": [["k", 1]]},
    }


# a function, a module-level callable that runs a process, and classes unrelated to each tag's kind
TARGETS = ["os:system", "subprocess:Popen", "subprocess:run", "pathlib:Path", "collections:OrderedDict",
           "os:stat_result"]
CLASS_TAGS = ["enum", "model", "dataclass", "namedtuple", "defaultdict"]


@pytest.mark.parametrize("tag", CLASS_TAGS)
def test_class_naming_tags_refuse_anything_but_their_kind(tag, tmp_path):
    """A stored tag naming a function, ``subprocess:Popen`` or a class of another kind fails the
    load with a DecodeError naming it, and nothing it names is called."""
    import subprocess  # noqa: F401 - imported, so a lookup in sys.modules would find it

    sentinel = tmp_path / "sentinel"
    for target in TARGETS:
        tree = _payloads(target, str(sentinel))[tag]
        try:
            value = from_tree(tree, "state.data")
        except DecodeError as exc:
            assert target in str(exc), f"{tag} -> {target}: the error does not name it: {exc}"
        else:
            if isinstance(value, __import__("subprocess").Popen):
                value.wait()
            pytest.fail(f"tag {tag!r} naming {target!r} decoded to {value!r}")
        finally:
            assert not sentinel.exists(), f"tag {tag!r} naming {target!r} ran it"


# -- the call journal's key -----------------------------------------------------------------------------


def test_call_journal_replays_only_the_same_request(tmp_path):
    """A model answer recorded by a step that then failed is replayed on resume only if the step
    sends the same request again (same step key, position and request digest); a changed prompt
    is a new call. Uses the offline extractive model: no optional package."""
    url = f"sqlite://{tmp_path / 's.db'}"
    prompt = {"text": "Alpha is the first answer. More text.", "fail": True}
    task = overnight.Task("journal", goal="ask once", level="session", deps=[])

    @task.step
    def ask(ctx):
        ctx.state["answer"] = ctx.model.complete([{"role": "user", "content": prompt["text"]}], max_tokens=32).text
        if prompt["fail"]:
            raise RuntimeError("after the call, before the commit")

    model = ExtractiveModel()
    with pytest.raises(StepFailed):
        overnight.run(task, url, model=model, handle_signals=False)
    with open_store(url) as s:
        (first,) = s.calls("journal")
    assert loads(first.response)["text"] == "Alpha is the first answer."

    prompt.update(text="Beta is the second answer. More text.", fail=True)  # another request: a new call
    with pytest.raises(StepFailed):
        overnight.run(task, url, model=model, handle_signals=False)
    with open_store(url) as s:
        calls = s.calls("journal")
    assert len(calls) == 2 and calls[0].request_digest != calls[1].request_digest, \
        "a changed request was answered from the journal"
    assert loads(calls[1].response)["text"] == "Beta is the second answer."

    prompt.update(fail=False)  # the same request again: replayed, no new call
    result = overnight.run(task, url, model=model, handle_signals=False)
    assert result.status == "complete"
    with open_store(url) as s:
        assert len(s.calls("journal")) == 2, "the same request was sent to the model again"
        assert load_head(s, "journal")[0].state.data["answer"] == "Beta is the second answer."
