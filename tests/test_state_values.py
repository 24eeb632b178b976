"""Large user-state values stored as their own blobs (record format 3, state document ``values``):
an unchanged value is stored once and costs each checkpoint a reference; it loads back in its
place; a forged document or a damaged value blob is refused or healed, never loaded as is."""

from __future__ import annotations

import sqlite3

import overnight
from overnight.chain.ditto import ditto_key
from overnight.chain.read import load_head
from overnight.codec import digest
from overnight.codec.canonical import dumps, dumps_sorted, loads
from overnight.runtime.task import Task
from overnight.store.base import CheckpointRow, Commit
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.store.sqlite import SQLiteStore

BIG = "a value that stays the same while the task runs " * 200  # ~9.6 KB


def _task(steps: int) -> Task:
    task = Task("values", goal="keep a large value while a small one changes")

    @task.step
    def setup(ctx):
        ctx.state["n"] = 0
        ctx.state["big"] = BIG
        ctx.state["after"] = [1, 2]
        for i in range(1, steps + 1):
            ctx.add_step("tick", position="end", i=i)

    @task.step(planned=False)
    def tick(ctx, i):
        assert ctx.state["big"] == BIG
        ctx.state["n"] = i

    return task


def _run(tmp_path, steps: int = 5) -> str:
    url = f"sqlite://{tmp_path / 's.db'}"
    assert overnight.run(_task(steps), url, handle_signals=False).status == "complete"
    return url


def _docs(s: SQLiteStore) -> list[dict]:
    reader = BlobReader(s)
    return [loads(reader.get(loads(r.body)["state"]["digest"])) for r in s.list_checkpoints("values")]


def test_an_unchanged_large_value_is_one_blob_named_by_every_checkpoint(tmp_path):
    _run(tmp_path)
    with SQLiteStore(tmp_path / "s.db") as s:
        head, _ = load_head(s, "values")
        assert list(head.state.data.items()) == [("n", 5), ("big", BIG), ("after", [1, 2])]  # order kept
        docs = [d for d in _docs(s) if d["values"]]
        assert len(docs) == 6  # setup and the five ticks
        assert {d["values"]["big"]["digest"] for d in docs} == {digest.sha256(dumps(BIG))}
        assert all(d["data"]["big"] is None and "after" not in d["values"] for d in docs)


def _forge(s: SQLiteStore, edit) -> str:
    """Commit a child of the head whose state document is ``edit(document)``; returns its id."""
    head = s.get_ref("values", "main")
    record = loads(s.get_checkpoint(head).body)
    doc = edit(loads(BlobReader(s).get(record["state"]["digest"])))
    writer = BlobWriter(s)
    raw = dumps(doc)
    record.update(parent_id=head, seq=record["seq"] + 1, state={"digest": writer.put(raw), "size": len(raw)})
    body = dumps_sorted(record)
    row = CheckpointRow(digest.sha256(body), "values", head, "main", record["seq"], record["created_at"],
                        "forged", "step", None, body, None, 0)
    s.commit(Commit(row, head, writer.commit_objects()))
    return row.checkpoint_id


def test_a_document_naming_a_value_its_data_does_not_hold_as_null_is_refused(tmp_path):
    _run(tmp_path)
    with SQLiteStore(tmp_path / "s.db") as s:
        head = s.get_ref("values", "main")
        forged = _forge(s, lambda d: {**d, "data": {**d["data"], "big": "something else"}})
        loaded, fallback = load_head(s, "values")
        assert loaded.id == head and loaded.state.data["big"] == BIG
        (skipped,) = fallback.skipped
        assert (skipped.checkpoint_id, skipped.error) == (forged, "SchemaError")
        assert "does not hold as null" in skipped.reason


def test_a_damaged_value_blob_is_healed_from_its_copy(tmp_path):
    """The value every checkpoint shares has a ditto copy (made when it became shared): a damaged
    stored value is read from the copy, verified, and rewritten."""
    _run(tmp_path)
    d = digest.sha256(dumps(BIG))
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT count(*) FROM objects WHERE digest=?", (ditto_key(d),)).fetchone() == (1,)
        (data,) = db.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()
        db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes(data[:-1]) + bytes([data[-1] ^ 1]), d))
    with SQLiteStore(tmp_path / "s.db") as s:
        loaded, fallback = load_head(s, "values")
        assert fallback is None and loaded.state.data["big"] == BIG
        assert d in {h.digest for h in loaded.healed}
        assert BlobReader(s).get(d) == dumps(BIG)  # rewritten from the copy


def test_the_state_document_keeps_its_size_as_the_history_grows(tmp_path):
    """With three pages or more, the inner page references live in a ``middle`` blob: the state
    document holds two page references per collection however long the done list grows, and a
    document naming a page list with other than two inline pages is refused."""
    _run(tmp_path, steps=200)  # 201 done entries: 4 done pages
    with SQLiteStore(tmp_path / "s.db") as s:
        head, _ = load_head(s, "values")
        assert [len(p.tree) for p in head.done_pages] == [64, 64, 64, 9]
        rows = sorted(s.list_checkpoints("values"), key=lambda r: r.seq)
        sizes = {r.seq: loads(r.body)["state"]["size"] for r in rows}
        assert sizes[200] - sizes[140] <= 4  # only counts changed (digits), no page reference was added
        doc = loads(BlobReader(s).get(head.record.state.digest))
        assert len(doc["done"]["pages"]) == 2 and doc["done"]["middle"] is not None
        forged = _forge(s, lambda d: {**d, "done": {**d["done"], "pages": [d["done"]["pages"][0], *d["done"]["pages"]]}})
        loaded, fallback = load_head(s, "values")
        assert loaded.id == head.id and [x.checkpoint_id for x in fallback.skipped] == [forged]
        assert "not 2" in fallback.skipped[0].reason


def test_a_page_list_naming_a_page_twice_is_refused(tmp_path):
    """A forged ``middle`` list that names one done page twice (counts unchanged, every page
    intact) would load 64 done steps twice and 64 never: refused, the load falls back past it."""
    _run(tmp_path, steps=200)  # 4 done pages: two in the middle list
    with SQLiteStore(tmp_path / "s.db") as s:
        head, _ = load_head(s, "values")
        middle = [r.model_dump() for r in head.done_pages.refs[1:-1]]
        assert len(middle) == 2
        raw = dumps([middle[0], middle[0]])
        writer = BlobWriter(s)
        twice = {"digest": writer.put(raw), "size": len(raw)}
        s.put_objects(writer.commit_objects())
        forged = _forge(s, lambda d: {**d, "done": {**d["done"], "middle": twice}})
        loaded, fallback = load_head(s, "values")
        assert loaded.id == head.id and [x.checkpoint_id for x in fallback.skipped] == [forged]
        assert "names a page twice" in fallback.skipped[0].reason
