"""A growing list page is encoded and validated only in its new entries (the done list's tail
grows by one entry every step): what a user relies on is that the stored bytes are exactly a
whole canonical encoding -- digests, dedup and ``verify`` see no difference -- whatever the
entries hold (non-ASCII text, small floats, nested values), and that an entry that does not
match the record format is still refused."""

from __future__ import annotations

import pytest

import overnight
from overnight.chain.integrity import encode_state
from overnight.chain.pages import PageWriter
from overnight.chain.records import DONE_PAGE, TODO_PAGE
from overnight.codec import compress
from overnight.errors import RecordInvalid
from overnight.store import open_store
from overnight.store.blobs import BlobWriter
from overnight.verify.fsck import verify_store

ODD = ["ascii", "ünïcödé ✓", "emoji 🦉", "\x7f del", 'quote " and \\ slash', "\u2028 line sep"]


def _todo(i: int) -> dict:
    return {"name": f"step {ODD[i % len(ODD)]} {i}", "args": {"x": [i, 1e-05 * i, {"s": ODD[i % len(ODD)]}]},
            "fn": "work", "added_by": None, "previous": None}


def _stored(writer: BlobWriter, ref: dict) -> bytes:
    obj = writer.objects[ref["digest"]]
    return compress.decompress(obj.codec, obj.data, obj.size)


def test_an_appended_page_has_the_bytes_of_a_whole_encoding(tmp_path):
    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    try:
        pw = PageWriter()
        entries: list[dict] = []
        for i in range(12):
            entries = [*entries, _todo(i)]
            w = BlobWriter(store)
            refs = pw.refs([entries], w, TODO_PAGE, "todo page")
            (ref,) = refs["pages"]
            assert _stored(w, ref) == encode_state(entries), i
            pw.accept()
    finally:
        store.close()


def test_a_bad_appended_entry_is_refused(tmp_path):
    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    try:
        pw = PageWriter()
        page = [_todo(0)]
        pw.refs([page], BlobWriter(store), TODO_PAGE, "todo page")
        pw.accept()
        with pytest.raises(RecordInvalid, match="todo page"):
            pw.refs([[*page, {"name": 3}]], BlobWriter(store), TODO_PAGE, "todo page")
    finally:
        store.close()


def test_a_long_run_with_odd_outputs_verifies(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    steps = DONE_PAGE + 7
    task = overnight.Task("odd-pages", goal="outputs that take the reference encoder", level="session")

    @task.step
    def plan(ctx):
        for i in range(steps):
            ctx.add_step("work", i=i)

    @task.step(planned=False)
    def work(ctx, i: int):
        return {"text": ODD[i % len(ODD)], "small": 1e-05 * (i + 1), "i": i}

    assert overnight.run(task, store=url).status == "complete"
    store = open_store(url)
    try:
        report = verify_store(store, ["odd-pages"], all_objects=True)
        assert report.ok, report
    finally:
        store.close()
