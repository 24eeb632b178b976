"""The artifact map cut into pages at the cost of what changed (issue 14, target 3).

``ChainWriter`` no longer walks every artifact at every commit: :class:`ArtifactPager` recuts the
pages from the first changed name on and tells the commit which digests it names anew. What a user
relies on: the pages are exactly those of a full cut, whatever the sequence of changes (appends,
pops, replaced or removed entries anywhere, an equal entry that is another object, a commit that
failed); each checkpoint loads, verified, with exactly the map committed; and every artifact two
checkpoints share has its ditto copy, as with a full walk.
"""

from __future__ import annotations

import random

import pytest

from overnight.chain.ditto import ditto_key
from overnight.chain.integrity import load_checkpoint
from overnight.chain.pages import ArtifactPager, artifact_pages
from overnight.chain.records import artifact_ref, event, initial_state
from overnight.chain.write import ChainWriter
from overnight.errors import StaleHead
from overnight.store import open_store
from overnight.store.base import TaskRow


def _ref(rng: random.Random) -> dict:
    return artifact_ref(f"sha256:{rng.randrange(40):064x}", rng.randrange(1000), text=True, step=None)


def _change(rng: random.Random, current: dict, serial: list[int]) -> dict:
    """The next map: as an adapter or a runner builds it (a new dict; untouched entries the same objects)."""
    new = dict(current)
    op = rng.randrange(7)
    if op <= 1 or not new:  # append one or a few, names after the others
        for _ in range(rng.randrange(1, 4)):
            serial[0] += 1
            new[f"items/{serial[0]:012d}"] = _ref(rng)
    elif op == 2:  # pop the newest
        new.pop(next(reversed(new)))
    elif op == 3:  # remove anywhere (the oldest few: a compaction)
        for name in rng.sample(list(new), min(len(new), rng.randrange(1, 5))):
            del new[name]
    elif op == 4:  # replace an entry, or put an equal one that is another object
        name = rng.choice(list(new))
        new[name] = dict(new[name]) if rng.random() < 0.5 else _ref(rng)
    elif op == 5:  # a name that sorts between the others
        new[f"a/{rng.randrange(10**6)}"] = _ref(rng)
    else:  # nothing changed
        pass
    if rng.random() < 0.2:  # insertion order that is not sorted order
        new = dict(rng.sample(list(new.items()), len(new)))
    return new


@pytest.mark.parametrize("seed", range(8))
def test_incremental_pages_equal_a_full_cut_whatever_changes(seed):
    rng = random.Random(seed)
    pager = ArtifactPager()
    current: dict = {}
    accepted: dict = {}
    serial = [0]
    for _ in range(400):
        current = _change(rng, accepted, serial)
        pages, fresh = pager.cut(current)
        expected = artifact_pages(current)
        assert [list(p) for p in pages] == [list(p) for p in expected]
        assert all(a is b for p, q in zip(pages, expected) for a, b in zip(p.values(), q.values()))
        if fresh is not None:  # the digests of the entries added or given another object
            changed = [n for n, a in current.items() if accepted.get(n) is not a]
            assert sorted(fresh) == sorted(current[n]["digest"] for n in changed)
        for d in {a["digest"] for a in (*current.values(), *accepted.values())}:
            assert pager.referenced(d) == any(a["digest"] == d for a in current.values())
        if rng.random() < 0.1:
            continue  # the commit failed: the next one is compared with the last accepted map
        pager.accept()
        accepted = current
        if rng.random() < 0.03:
            pager.reset()  # a load: the next cut is a full one


def test_a_chain_of_changing_maps_loads_verified_with_every_shared_artifact_copied(tmp_path):
    rng = random.Random(5)
    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    try:
        chain = ChainWriter(store, "t", "main", key=None, session_id="s", session_n=1)
        state = initial_state("t", "pages", {})
        committed: list[tuple[str, dict]] = []
        serial = [0]
        for i in range(120):
            writer = chain.blob_writer()
            artifacts = dict(state["artifacts"])
            for name in list(_change(rng, artifacts, serial)):
                if name not in artifacts:  # a new item, stored as a blob
                    raw = f"item {name} {rng.random()}".encode()
                    artifacts[name] = artifact_ref(writer.put(raw), len(raw), text=True, step=None)
            for name in rng.sample(list(artifacts), min(len(artifacts), rng.randrange(0, 2))) if i % 5 == 0 else ():
                del artifacts[name]
            state = {**state, "artifacts": artifacts}
            task_row = TaskRow("t", "2026-01-01T00:00:00+00:00", "pages", None, b"{}") if i == 0 else None
            if i % 17 == 3:  # a commit that loses the compare-and-swap leaves the writer as it was
                saved = chain.ref_head
                chain.ref_head = "sha256:" + "f" * 64
                with pytest.raises(StaleHead):
                    chain.commit(state, event("step", step="w"), writer=writer, task_row=task_row)
                chain.ref_head = saved  # and the same staged objects are committed next
            cid = chain.commit(state, event("step", step="w"), writer=writer, task_row=task_row)
            committed.append((cid, dict(artifacts)))
            if i % 40 == 39:  # a new session continues from the verified head
                loaded = load_checkpoint(store, cid, key=None)
                chain = ChainWriter(store, "t", "main", key=None, session_id=f"s{i}", session_n=1)
                chain.start_from(loaded, None)
                state = loaded.state_tree
        uses: dict[str, int] = {}
        for cid, artifacts in committed:
            loaded = load_checkpoint(store, cid, key=None)
            assert loaded.state_tree["artifacts"] == artifacts
            for a in artifacts.values():
                uses[a["digest"]] = uses.get(a["digest"], 0) + 1
        shared = [d for d, n in uses.items() if n >= 2]
        assert len(shared) > 50
        assert not store.missing_objects(ditto_key(d) for d in shared)
    finally:
        store.close()


def _page_writer_case(seed: int, store) -> None:
    """Random edits of a dict (artifact) and a list (done) collection: every page reference is
    the digest and size of the page's whole canonical encoding."""
    from overnight.chain.integrity import encode_state
    from overnight.chain.pages import PageWriter, done_pages
    from overnight.chain.records import ARTIFACT_PAGE
    from overnight.codec import digest
    from overnight.store.blobs import BlobWriter

    rng = random.Random(seed)
    pager, art_writer, list_writer = ArtifactPager(), PageWriter(), PageWriter()
    current: dict = {}
    done: list = []
    serial = [0]
    for _ in range(300):
        current = _change(rng, current, serial)
        if rng.random() < 0.6:
            done = [*done, {"n": rng.randrange(10**6), "s": "x" * rng.randrange(40)}]
        elif done and rng.random() < 0.5:
            done = done[:-1]
        writer = BlobWriter(store)
        pages, _ = pager.cut(current)
        got = art_writer.refs(pages, writer, ARTIFACT_PAGE, "artifact page", kept=pager.kept)
        for page, ref in zip(pages, got["pages"]):
            raw = encode_state(page)
            assert ref == {"digest": digest.sha256(raw), "size": len(raw)}
        lpages = done_pages(done)
        got = list_writer.refs(lpages, writer)
        for page, ref in zip(lpages, got["pages"]):
            raw = encode_state(page)
            assert ref == {"digest": digest.sha256(raw), "size": len(raw)}
        if rng.random() < 0.9:
            for w in (pager, art_writer, list_writer):
                w.accept()


@pytest.mark.parametrize("seed", range(4))
def test_pages_encoded_from_their_previous_version_are_their_whole_encoding(seed, tmp_path):
    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    try:
        _page_writer_case(seed, store)
    finally:
        store.close()


def test_a_bad_entry_added_to_a_page_is_refused_before_anything_is_written(tmp_path):
    from overnight.chain.pages import PageWriter
    from overnight.chain.records import ARTIFACT_PAGE
    from overnight.errors import RecordInvalid
    from overnight.store.blobs import BlobWriter

    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    try:
        rng = random.Random(1)
        pager, pages_writer = ArtifactPager(), PageWriter()
        arts = {f"items/{i:012d}": _ref(rng) for i in range(10)}
        pages_writer.refs(pager.cut(arts)[0], BlobWriter(store), ARTIFACT_PAGE, "artifact page")
        pager.accept()
        pages_writer.accept()
        bad = {**arts, "items/999999999999": {"digest": "not a digest", "size": -1, "text": True, "step": None}}
        with pytest.raises(RecordInvalid, match="artifact page"):
            pages_writer.refs(pager.cut(bad)[0], BlobWriter(store), ARTIFACT_PAGE, "artifact page")
    finally:
        store.close()
