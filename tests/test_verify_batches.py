"""``verify`` at speed checks what it checked one object at a time: content hashed in batches on a
thread pool still finds and names one damaged object among many; a page parsed in part (only the
entries appended to the previous one) is refused exactly as a whole parse refuses it; the fast
canonical parse accepts exactly the bytes the strict parse accepts."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest

import overnight
from overnight.codec import digest
from overnight.codec.canonical import dumps, dumps_sorted, loads, canonical_tree
from overnight.errors import DigestMismatch, MissingObject
from overnight.store import open_url
from overnight.chain.read import load_head
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.verify.fsck import verify_store


def _task(n: int, size: int) -> overnight.Task:
    task = overnight.Task("many", goal="many artifacts")

    @task.step
    def plan(ctx):
        for i in range(n):
            ctx.add_step("write", i=i)

    @task.step(planned=False)
    def write(ctx, i):
        ctx.write_text(f"a/{i:04d}.txt", "".join(f"line {i} {j} of artifact {i}\n" for j in range(size // 30)))

    return task


def _damage(path, d: str) -> None:
    with sqlite3.connect(path) as db:
        data = db.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()[0]
        db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes([data[0] ^ 1]) + data[1:], d))


def test_a_damaged_chunk_among_many_batches_is_found_and_named(tmp_path, monkeypatch):
    path = tmp_path / "s.db"
    overnight.run(_task(100, 30_000), f"sqlite://{path}", handle_signals=False)
    store = open_url(f"sqlite://{path}")
    clean = verify_store(store, all_objects=True, workers=4)
    assert clean.ok and not clean.problems and clean.bytes_verified > 100 * 20_000
    head = store.list_checkpoints(store.list_tasks()[0].task_id)[-1]
    from overnight.chain.integrity import load_checkpoint
    arts = load_checkpoint(store, head.checkpoint_id).artifacts
    victim = arts["a/0077.txt"]
    tree = store.get_objects([victim.digest])[victim.digest]
    assert tree.kind == "tree"  # chunked: the damage is in one chunk of it
    chunks = BlobReader(store).reachable(victim.digest)[2:]
    _damage(path, chunks[len(chunks) // 2])

    reports = [verify_store(store, all_objects=True, workers=w, processes=p) for w, p in ((1, 0), (4, 0), (2, 2))]
    from overnight.verify import fsck

    monkeypatch.setattr(fsck, "_HELPER_DEPTH", 1)  # helpers behind: the calling thread checks batches too
    reports.append(verify_store(store, all_objects=True, workers=2, processes=2))
    for report in reports:
        assert not report.ok
        named = [p for p in report.problems if chunks[len(chunks) // 2] in p.detail]
        assert {p.check for p in named} == {"artifact 'a/0077.txt'", "object"}, report.problems
        assert report.bytes_verified == clean.bytes_verified - victim.size  # every other artifact hashed
        assert report.objects_invalid == 2  # the chunk, and the artifact made of it
    a, b, c, d = ([(p.task_id, p.checkpoint_id, p.check, p.detail) for p in r.problems] for r in reports)
    assert sorted(a, key=repr) == sorted(b, key=repr) == sorted(c, key=repr) == sorted(d, key=repr)  # 1 thread, 4, 2 processes
    assert reports[0].checkpoints_invalid == reports[1].checkpoints_invalid == reports[2].checkpoints_invalid \
        == reports[3].checkpoints_invalid >= 1


def test_content_checked_in_helper_processes_counts_what_threads_count(tmp_path, monkeypatch):
    """Helper processes (``processes=2``) verify exactly what the threads verify: the same
    objects, bytes and dangling objects (ditto copies of live objects are not dangling); a helper
    that cannot open the store leaves every batch to the calling thread, with the same result."""
    path = tmp_path / "s.db"
    overnight.run(_task(40, 30_000), f"sqlite://{path}", handle_signals=False)
    store = open_url(f"sqlite://{path}")
    store.put_objects([_loose(b"a dangling blob, referenced by nothing")])
    fields = ("ok", "checkpoints", "objects_checked", "objects_invalid", "dangling_objects", "bytes_verified", "heads")

    def summary(report):
        return {f: getattr(report, f) for f in fields}

    threads = summary(verify_store(store, all_objects=True, processes=0))
    assert threads["ok"] and threads["dangling_objects"] == 1
    assert summary(verify_store(store, all_objects=True, processes=2)) == threads
    assert summary(verify_store(store, ["many"], processes=1)) == summary(verify_store(store, ["many"], processes=0))
    import overnight.verify.fsck as fsck

    monkeypatch.setattr(fsck, "_HELPER_DEPTH", 1)  # most batches checked on the calling thread, beside the helpers
    assert summary(verify_store(store, all_objects=True, processes=2)) == threads
    monkeypatch.setattr(fsck, "reopen_url", lambda s: f"sqlite://{tmp_path / 'no-such-store.db'}")
    assert summary(verify_store(store, all_objects=True, processes=2)) == threads


def _loose(data: bytes):
    from overnight.codec import compress
    from overnight.store.base import ObjectRecord

    codec, stored = compress.compress(data)
    return ObjectRecord(digest.sha256(data), "blob", len(data), codec, stored)


def test_verify_many_names_each_bad_blob_and_checks_the_rest(tmp_path):
    store = open_url(f"sqlite://{tmp_path / 's.db'}")
    writer = BlobWriter(store)
    blobs = [writer.put((f"blob {i} " * (10 + 900 * (i % 3))).encode()) for i in range(120)]
    store.put_objects(writer.commit_objects())
    damaged, missing = blobs[41], blobs[90]
    _damage(tmp_path / "s.db", damaged)
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("DELETE FROM objects WHERE digest=?", (missing,))

    sizes, errors = BlobReader(store).verify_many(blobs, "a test")
    assert set(errors) == {damaged, missing}
    assert isinstance(errors[damaged], DigestMismatch) and damaged in errors[damaged].message
    assert isinstance(errors[missing], MissingObject) and missing in errors[missing].message
    assert set(sizes) == set(blobs) - {damaged, missing}


def test_an_appended_page_entry_is_refused_as_in_a_whole_parse(tmp_path):
    """A forged head whose last done page is the previous page plus an entry that does not
    validate, or an artifact page plus a name it already holds (a duplicated member): verify
    parses only the appended part, and must still refuse it and name the page."""
    url = f"sqlite://{tmp_path / 's.db'}"
    overnight.run(_task(6, 100), url, handle_signals=False)
    store = open_url(url)
    head = store.list_checkpoints(store.list_tasks()[0].task_id)[-1]
    record = loads(head.body)
    state_digest = record["state"]["digest"]
    state = loads(BlobReader(store).get(state_digest))

    def forge(part: str, edit) -> str:
        ref = state[part]["pages"][-1]
        raw = BlobReader(store).get(ref["digest"])
        new = edit(raw)
        writer = BlobWriter(store)
        page = {**ref, "digest": writer.put(new), "size": len(new)}  # a done page keeps its index (format 4)
        doc = {**state, part: {**state[part], "pages": [*state[part]["pages"][:-1], page]}}
        encoded = dumps(doc)
        body = {**record, "state": {**record["state"], "digest": writer.put(encoded), "size": len(encoded)},
                "parent_id": head.checkpoint_id, "seq": head.seq + 1}
        raw_body = dumps_sorted(body)
        store.put_objects(writer.commit_objects())
        row = dataclasses.replace(head, checkpoint_id=digest.sha256(raw_body), parent_id=head.checkpoint_id,
                                  seq=head.seq + 1, body=raw_body)
        store.put_checkpoints([row])
        return row.checkpoint_id

    bad_entry = forge("done", lambda raw: raw[:-1] + b',{"name":"x"}]')
    first_name = next(iter(json.loads(BlobReader(store).get(state["artifacts"]["pages"][-1]["digest"]))))
    dup_name = forge("artifacts", lambda raw: raw[:-1] + b"," + json.dumps(first_name).encode()
                     + b":" + json.dumps(json.loads(raw)[first_name], separators=(",", ":")).encode() + b"}")
    report = verify_store(store)
    found = {p.checkpoint_id: p.detail for p in report.problems}
    n = len(json.loads(BlobReader(store).get(state["done"]["pages"][-1]["digest"])))
    assert "done page" in found[bad_entry] and "SchemaError" in found[bad_entry]
    assert f": {n}.fn: field required" in found[bad_entry]  # the appended entry, at its place on the page
    assert "artifact page" in found[dup_name] and "SchemaError" in found[dup_name]
    assert "duplicate" in found[dup_name]


@pytest.mark.parametrize("raw", [
    b'{"a":1,"b":[1,2.5,"x",null,true,false,{"c":{}}],"d":-7}',
    b'[{"k":"v"},{"k":"w"}]',
    b'{"b":1,"a":2}',  # insertion order (dumps), not sorted
    b'"\\u00e9"', b'{"a":1,"a":2}', b'{"a": 1}', b'[0.00001]', b'[1e-05]', b'[1.5e-7]', b'[1e+16]',
    b'[123456789012345678901234567890]', b'["\x7f"]', '["\u00e9"]'.encode(), b'[NaN]', b'[1.0E+16]',
    b'{"a":"\\ud800"}', b'[1,]', b'[]', b'{}',
])
def test_fast_canonical_parse_accepts_exactly_what_the_strict_parse_accepts(raw):
    for sort_keys, encoder in ((False, dumps), (True, dumps_sorted)):
        try:
            strict = loads(raw)
            canonical = encoder(strict) == raw
        except Exception:
            strict, canonical = None, False
        fast = canonical_tree(raw, sort_keys=sort_keys)
        if canonical and fast is not None:  # it may decline (then the strict path decides)
            assert fast == strict and type(fast) is type(strict)
        elif not canonical:
            assert fast is None, (raw, sort_keys)


def test_verify_reads_each_page_of_a_long_history_once(tmp_path):
    """A done list of five pages (record format 3: the three middle ones named by a page list): verify
    reads every page and page list once over the whole history, not again at every checkpoint that
    still uses it."""
    path = tmp_path / "s.db"
    overnight.run(_task(4 * 64, 40), f"sqlite://{path}", handle_signals=False)
    store = open_url(f"sqlite://{path}")
    head, _ = load_head(store, "many")
    middle = head.done_pages.refs[1:-1]
    reads: dict[str, int] = {}
    get_objects = store.get_objects

    def counting(digests, *a, **kw):
        digests = list(digests)
        for d in digests:
            reads[d] = reads.get(d, 0) + 1
        return get_objects(digests, *a, **kw)

    store.get_objects = counting
    report = verify_store(store, ["many"])
    assert report.ok, report.problems
    assert len(middle) == 3  # 257 entries (the plan and 256 writes): five pages
    assert [reads.get(r.digest, 0) for r in middle] == [1, 1, 1]
    store.close()


@pytest.mark.parametrize("entries,new", [
    ([{"a": 1}, {"a": "x,y"}, {"a": [1, 2]}], b'[{"a":"x,y"},{"a":[1,2]}]'),  # first entry taken off
    ([{"a": 1}, {"a": "x,y"}, {"a": [1, 2]}], b'[{"a":[1,2]}]'),  # two taken off
    ([{"a": 'p","q'}, {"a": 2}], b'[{"a":2}]'),  # a comma and quotes inside a string
    ([{"a": [1, 2]}, {"a": 3}], b'[2]},{"a":3}]'),  # a cut inside an entry: not a trimmed page
    ([{"a": 1}, {"a": 2}], b'[{"a":2},{"a":3}]'),  # taken off and appended: parsed whole
])
def test_a_page_consumed_from_the_front_is_what_a_whole_parse_gives(entries, new):
    """A todo page whose first entries were taken off is recognised without parsing the entries
    left (they are the previous page's): only when the cut falls between two entries; the result
    is exactly the whole parse's, and anything else is left to the whole parse."""
    from pydantic import TypeAdapter

    from overnight.chain.integrity import Page, _extend

    adapter = TypeAdapter(list[dict])
    prev_raw = dumps(entries)
    prev = Page({"digest": digest.sha256(prev_raw), "size": len(prev_raw)}, entries, adapter.validate_python(entries))
    got = _extend(prev_raw, prev, new, adapter)
    whole = canonical_tree(new)
    if whole is None or new.endswith(b'{"a":3}]'):
        assert got is None
    else:
        assert got is not None and got[0] == whole and got[1] == adapter.validate_python(whole)


@pytest.mark.parametrize("medium", ["file", "postgres"])
def test_helper_processes_reopen_file_and_postgres_stores(tmp_path, medium, request):
    """A helper opens the store again from its URL: a file store and a PostgreSQL schema verify
    with helpers exactly as with threads, and a damaged artifact is still named."""
    if medium == "postgres":
        server, schema = request.getfixturevalue("pg_schema")
        url = f"{server}?schema={schema}"
    else:
        url = f"file://{tmp_path / 'store'}"
    overnight.run(_task(12, 30_000), url, handle_signals=False)
    store = open_url(url)
    try:
        from overnight.verify.content_proc import reopen_url

        assert reopen_url(store) is not None
        fields = ("ok", "checkpoints", "objects_checked", "dangling_objects", "bytes_verified", "heads")
        threads = verify_store(store, all_objects=True, processes=0)
        helpers = verify_store(store, all_objects=True, processes=1)
        assert threads.ok and {f: getattr(helpers, f) for f in fields} == {f: getattr(threads, f) for f in fields}
    finally:
        store.close()
