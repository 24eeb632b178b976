"""Record formats 1, 2 and 3 -> 4: stores written by earlier releases, and records written from the
format-1 spec, open and load through ``overnight/chain/migrate.py``; a task continues from them and
writes format 4; a format from the future is refused; nothing malformed is written."""

from __future__ import annotations

import json

import pytest
from _tasks import plan_task

import overnight
from overnight.codec import digest
from overnight.codec.canonical import dumps, dumps_sorted, loads
from overnight.errors import FormatTooNew, RecordInvalid
from overnight.store import open_store
from overnight.store.base import CheckpointRow, Commit, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.chain.write import ChainWriter, utc_now
from overnight.chain.read import load_head
from overnight.chain.integrity import load_checkpoint
from overnight.chain.pages import artifact_pages, done_pages, todo_pages
from overnight.chain.records import FORMAT_VERSION, event, initial_state, todo_entry

RUNS: list[int] = []


def _work(ctx, i):
    RUNS.append(i)
    ctx.state["sum"] = ctx.state.get("sum", 0) + i
    ctx.write_text(f"part-{i}.txt", f"part {i}")
    return i * 10


def _task():
    return plan_task("old", 5, _work, goal="five parts", data={"sum": 0}, deps=[])


def _strict_v1_entry(kind: str, e: dict) -> dict:
    """An entry as the format-1 spec listed it (none of the members format 2 added)."""
    if kind == "todo":
        return {k: e[k] for k in ("name", "fn", "args", "added_by")}
    out = {k: v for k, v in e.items() if k not in ("added_by", "produced", "replayed_tokens")}
    out["reads"] = {k: v for k, v in e["reads"].items() if k != "state"}
    return out


def write_v1(url: str, tree: dict, *, strict: bool, fmt: int = 1) -> str:
    """Commit ``tree`` (a state as this version holds it) as a new task's one format-``fmt``
    checkpoint (1, 2 or 3): for format 1 ``strict`` as the format-1 spec said, else as overnight 0.1
    wrote it (format 1 with the extra members); format 2 holds the whole user state in ``data``;
    format 3 adds ``values`` (empty) and ``middle`` (a blob of the inner page references with
    three pages or more), its done page references without an index.
    Built by hand: digests valid, canonical bytes."""
    with open_store(url) as store:
        writer = BlobWriter(store)
        for blob in tree["_blobs"]:  # the artifacts' bytes
            writer.put(blob)

        def pages(kind, cut, entries):
            refs = []
            for page in cut(entries):
                if strict and kind != "artifacts":
                    page = [_strict_v1_entry(kind, e) for e in page]
                raw = dumps(page)
                refs.append({"digest": writer.put(raw), "size": len(raw)})
            if fmt < 3:
                return {"count": len(entries), "pages": refs}
            if len(refs) < 3:
                return {"count": len(entries), "pages": refs, "middle": None}
            raw = dumps(refs[1:-1])
            return {"count": len(entries), "pages": [refs[0], refs[-1]],
                    "middle": {"digest": writer.put(raw), "size": len(raw)}}

        ctx = tree["context"]
        doc = {"format": fmt, "task": tree["task"], "todo": pages("todo", todo_pages, tree["todo"]),
               "done": pages("done", done_pages, tree["done"]),
               "artifacts": pages("artifacts", artifact_pages, tree["artifacts"]), "data": tree["data"],
               "context": {"summary": ctx["summary"], "compactions": ctx["compactions"]} if strict else ctx}
        if not strict:
            doc["recompute"] = tree["recompute"]
        if fmt >= 3:
            doc["values"] = {}
        state = dumps(doc)
        created = utc_now()
        record = {"format": fmt, "task_id": tree["task"]["id"], "parent_id": None, "branch": "main", "seq": 0,
                  "session": {"id": "v1", "n": 1}, "created_at": created,
                  "event": {"kind": "init", "step": None, "key": None, "ref": None, "detail": None},
                  "state": {"digest": writer.put(state), "size": len(state)}, "fingerprint": None}
        body = dumps_sorted(record)
        cid = digest.sha256(body)
        row = CheckpointRow(cid, tree["task"]["id"], None, "main", 0, created, "v1", "init", None, body, None, 0)
        task = TaskRow(tree["task"]["id"], created, tree["task"]["goal"], None, dumps_sorted(tree["task"]["spec"]))
        store.commit(Commit(row, None, writer.commit_objects(), [], None, task))
        return cid


@pytest.fixture
def half_done(tmp_path):
    """The state of task ``old`` after plan + 2 parts, as this version wrote it."""
    url = f"sqlite://{tmp_path / 'now.db'}"
    overnight.run(_task(), url, max_steps=3, handle_signals=False)
    with open_store(url) as s:
        loaded, _ = load_head(s, "old")
        blobs = [BlobReader(s).get(a.digest) for a in loaded.artifacts.values()]
        return {**loaded.state_tree, "_blobs": blobs}


@pytest.mark.parametrize("strict", [False, True], ids=["written-by-0.1", "strict-spec"])
def test_a_format_1_store_loads_and_the_task_continues_in_format_4(tmp_path, half_done, strict):
    url = f"sqlite://{tmp_path / 'v1.db'}"
    v1 = write_v1(url, half_done, strict=strict)
    with open_store(url) as s:
        loaded, fallback = load_head(s, "old")
        assert fallback is None and loaded.id == v1
        st = loaded.state
        assert st.format == FORMAT_VERSION == 4
        assert [d.name for d in st.done] == ["plan", "work[i=0]", "work[i=1]"]
        assert [t.name for t in st.todo] == ["work[i=2]", "work[i=3]", "work[i=4]"]
        assert st.context.messages == [] and st.context.tokens == 0 and st.recompute is None
        part = st.done[2]
        if strict:  # what format 1 did not record is marked unknown, so a recompute re-checks it
            assert part.added_by is None and part.replayed_tokens == 0 and part.reads["state"] == ["*"]
            assert part.produced == {"output": digest.sha256(dumps(10)), "state": {"*": "unknown"},
                                     "artifacts": {"part-1.txt": "unknown"}}
            assert all(t.previous is None for t in st.todo)
        else:  # written by 0.1: the members it had are kept as they were
            assert part.added_by == "plan" and part.reads["state"] == half_done["done"][2]["reads"]["state"]
            assert part.produced == half_done["done"][2]["produced"]
        assert any(p.migrated for p in loaded.done_pages) == strict

    RUNS.clear()
    result = overnight.run(_task(), url, handle_signals=False)
    assert result.status == "complete" and not result.created and RUNS == [2, 3, 4]  # nothing done ran again
    assert overnight.api.cat("old", "part-4.txt", store=url) == b"part 4"
    with open_store(url) as s:
        head, fallback = load_head(s, "old")
        assert fallback is None and head.state.data == {"sum": 10}
        reader = BlobReader(s)
        for cid in (head.id, head.record.parent_id):  # every new record and page is format 4, complete
            c = load_checkpoint(s, cid)
            assert json.loads(c.row.body)["format"] == 4
            assert loads(reader.get(c.record.state.digest))["format"] == 4
            assert all(r.names is not None and r.summary is not None for r in c.done_pages.refs)
            for p in c.done_pages:
                assert not p.migrated
                assert all("produced" in e and "state" in e["reads"] for e in loads(reader.get(p.ref["digest"])))
        first = load_checkpoint(s, v1)  # the format-1 record itself is untouched
        assert json.loads(first.row.body)["format"] == 1


def test_a_format_2_store_loads_and_its_large_values_move_to_their_own_blobs(tmp_path, half_done):
    """A format-2 document holds a large value inline in ``data``; it loads (``values`` empty, the
    pages reused as they are) and the next commit stores the value as its own blob, in its place."""
    notes = "a note that is long enough to be stored apart " * 100
    url = f"sqlite://{tmp_path / 'v2.db'}"
    v2 = write_v1(url, {**half_done, "data": {**half_done["data"], "notes": notes}}, strict=False, fmt=2)
    with open_store(url) as s:
        loaded, fallback = load_head(s, "old")
        assert fallback is None and loaded.id == v2 and loaded.doc.values == {}
        assert loaded.state.data == {"sum": 1, "notes": notes} and not any(p.migrated for p in loaded.done_pages)
    RUNS.clear()
    result = overnight.run(_task(), url, handle_signals=False)
    assert result.status == "complete" and RUNS == [2, 3, 4]
    with open_store(url) as s:
        head, _ = load_head(s, "old")
        assert list(head.state.data.items()) == [("sum", 10), ("notes", notes)]  # order kept
        doc = loads(BlobReader(s).get(head.record.state.digest))
        assert doc["format"] == 4 and doc["data"] == {"sum": 10, "notes": None}
        assert loads(BlobReader(s).get(doc["values"]["notes"]["digest"])) == notes
        assert json.loads(load_checkpoint(s, v2).row.body)["format"] == 2  # untouched


def test_a_format_3_store_loads_and_the_task_continues_with_indexed_done_pages(tmp_path, half_done):
    """A format-3 document's done page references (inline and in its ``middle`` blob) carry no
    index: it loads (``names``/``summary`` null), a look-up reads the pages as format 3 did, and the
    next commit names the very same pages with their index (nothing re-stored)."""
    filler = [{**half_done["done"][2], "name": f"older-{i}", "key": f"k{i}"} for i in range(140)]
    tree = {**half_done, "done": [*filler, *half_done["done"]]}  # 143 entries: 3 pages, one in `middle`
    url = f"sqlite://{tmp_path / 'v3.db'}"
    v3 = write_v1(url, tree, strict=False, fmt=3)
    with open_store(url) as s:
        loaded, fallback = load_head(s, "old", lazy_done=True)
        assert fallback is None and loaded.id == v3 and loaded.doc.done.middle is not None
        assert len(loaded.done_pages.refs) == 3 and all(r.names is None for r in loaded.done_pages.refs)
        assert loaded.done_pages.summary() is None
        assert not loaded.lazy_done  # an upgraded document is read in full
        stored = [r.digest for r in loaded.done_pages.refs]
    RUNS.clear()
    result = overnight.run(_task(), url, handle_signals=False)
    assert result.status == "complete" and RUNS == [2, 3, 4]  # plan, work[i=0], work[i=1] not run again
    with open_store(url) as s:
        head = load_checkpoint(s, s.get_ref("old", "main"))  # every page read: each index checked
        refs = head.done_pages.refs
        assert [r.digest for r in refs[:2]] == stored[:2]  # full pages kept as they were
        assert all(r.names is not None and len(r.names) == 8 * head.done_pages.size(i) for i, r in enumerate(refs))
        assert json.loads(load_checkpoint(s, v3).row.body)["format"] == 3  # untouched


def test_a_format_from_the_future_is_refused(tmp_path, half_done):
    url = f"sqlite://{tmp_path / 'v1.db'}"
    write_v1(url, half_done, strict=False)
    with open_store(url) as s:
        row = s.get_checkpoint(s.get_ref("old", "main"))
        record = loads(row.body)
        record.update(format=FORMAT_VERSION + 1, parent_id=row.checkpoint_id, seq=1)
        body = dumps_sorted(record)
        new = CheckpointRow(digest.sha256(body), "old", row.checkpoint_id, "main", 1, record["created_at"], "v1",
                            "init", None, body, None, 0)
        s.commit(Commit(new, row.checkpoint_id, [], []))
        with pytest.raises(FormatTooNew, match=f"format {FORMAT_VERSION + 1}"):
            load_head(s, "old")


def test_a_writer_refuses_a_malformed_record_and_writes_nothing(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    with open_store(url) as s:
        chain = ChainWriter(s, "bad", "main", key=None, session_id="x", session_n=1)
        good = initial_state("bad", "g", {}, todo=[todo_entry("a", "a", {})])
        broken = {**good, "todo": [{"name": "a", "fn": "a", "args": {}}]}  # no added_by, no previous
        with pytest.raises(RecordInvalid, match="todo page.*added_by") as info:
            chain.commit(broken, event("init"), task_row=TaskRow("bad", utc_now(), "g", None, b"{}"))
        assert info.value.task_id == "bad"
        no_context = {**good, "context": {"summary": None, "compactions": 0}}
        with pytest.raises(RecordInvalid, match="state document.*context"):
            chain.commit(no_context, event("init"), task_row=TaskRow("bad", utc_now(), "g", None, b"{}"))
        assert s.get_ref("bad", "main") is None
        chain.commit(good, event("init"), task_row=TaskRow("bad", utc_now(), "g", None, b"{}"))
        assert load_head(s, "bad")[0].state.todo[0].name == "a"
    with pytest.raises(RecordInvalid, match="kind"):
        event("started")
