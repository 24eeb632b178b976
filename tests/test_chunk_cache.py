"""A ChunkCache lets readers skip re-reading chunks they verified, and holds nothing unverified."""

from __future__ import annotations

import random
import sqlite3

import pytest

from overnight.errors import DigestMismatch
from overnight.store import open_url
from overnight.store.blobs import BlobReader, BlobWriter, ChunkCache


class _Counting:
    """The real SQLite store, counting the object digests each read asks for."""

    def __init__(self, store):
        self._store, self.asked = store, []

    def get_objects(self, digests):
        digests = list(digests)
        self.asked.extend(digests)
        return self._store.get_objects(digests)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _text(n: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghij klmnop\n") for _ in range(n)).encode()


def _damage(path, d: str) -> None:
    with sqlite3.connect(path) as db:
        data = db.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()[0]
        db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes([data[0] ^ 1]) + data[1:], d))


def _shared_chunk(store, a: str, b: str) -> str:
    """A data chunk both blobs are made of (from the middle: not a tree or an index)."""
    reader = BlobReader(store)
    in_b = set(reader.reachable(b))
    shared = [d for d in reader.reachable(a) if d in in_b]
    return shared[len(shared) // 2]


def _two_versions(tmp_path):
    """A store holding a ~400 KB blob and the same blob with 2 KB appended (they share chunks)."""
    store = open_url(f"sqlite://{tmp_path / 's.db'}")
    writer = BlobWriter(store)
    first = _text(400_000)
    second = first + _text(2_000, seed=2)
    a, b = writer.put(first), writer.put(second)
    store.put_objects(writer.commit_objects())
    return store, (a, first), (b, second)


def test_a_second_read_of_a_grown_blob_reads_only_its_new_chunks(tmp_path):
    store, (a, first), (b, second) = _two_versions(tmp_path)
    counting = _Counting(store)
    cache = ChunkCache()
    assert BlobReader(counting, chunks=cache).get(a) == first
    chunks_of_a = len(cache)
    assert chunks_of_a > 20
    counting.asked.clear()
    assert BlobReader(counting, chunks=cache).get(b) == second  # a fresh reader, sharing the cache
    # the tree, its index and the chunks the append changed: not the ~60 chunks the two share
    assert 2 <= len(counting.asked) <= 8, counting.asked
    counting.asked.clear()
    assert BlobReader(counting).get(b) == second  # without the cache: every chunk again
    assert len(counting.asked) > chunks_of_a
    assert BlobReader(counting, chunks=cache).verify(b, "a test") == len(second)


def test_a_chunk_damaged_in_the_store_is_refused_and_never_cached(tmp_path):
    store, (a, first), (b, second) = _two_versions(tmp_path)
    chunk = _shared_chunk(store, a, b)
    _damage(tmp_path / "s.db", chunk)
    cache = ChunkCache()
    with pytest.raises(DigestMismatch, match=chunk):
        BlobReader(store, chunks=cache).get(a)
    assert chunk not in cache.get_many([chunk])
    with pytest.raises(DigestMismatch, match=chunk):
        BlobReader(store, chunks=cache).get(b)
    with pytest.raises(DigestMismatch):
        BlobReader(store, chunks=cache).verify(b, "a test")


def test_a_cached_chunk_serves_its_verified_bytes_after_the_stored_copy_is_damaged(tmp_path):
    """What the cache holds was hashed against its digest: a later read returns those bytes (a
    reader without the cache, as `overnight verify` uses, still finds the damage)."""
    store, (a, first), (b, second) = _two_versions(tmp_path)
    cache = ChunkCache()
    assert BlobReader(store, chunks=cache).get(a) == first
    chunk = _shared_chunk(store, a, b)
    _damage(tmp_path / "s.db", chunk)
    assert BlobReader(store, chunks=cache).get(b) == second
    with pytest.raises(DigestMismatch, match=chunk):
        BlobReader(store).get(b)


def test_the_cache_keeps_at_most_its_bytes_dropping_the_least_recently_used():
    cache = ChunkCache(max_bytes=1000)
    for i in range(10):
        cache.put(f"sha256:{i}", bytes(200))
    assert len(cache) == 5 and set(cache.get_many(f"sha256:{i}" for i in range(10))) == {f"sha256:{i}" for i in range(5, 10)}
    cache.get_many(["sha256:5"])  # just used: the next put drops sha256:6 instead
    cache.put("sha256:new", bytes(200))
    assert set(cache.get_many(["sha256:5", "sha256:6"])) == {"sha256:5"}
    cache.put("sha256:big", bytes(300))  # over a quarter of max_bytes: not kept
    assert cache.get_many(["sha256:big"]) == {}


def test_what_came_from_the_cache_is_not_reported_as_stored_intact(tmp_path):
    """A writer takes a reader's ``verified`` set as ``known`` and trusts it instead of writing
    those objects again: a chunk (and a blob) served from memory must not be in it."""
    store, (a, first), (b, second) = _two_versions(tmp_path)
    cache = ChunkCache()
    BlobReader(store, chunks=cache).get(a)
    chunk = _shared_chunk(store, a, b)
    fresh = BlobReader(store, set(), chunks=cache)
    assert fresh.get(b) == second
    assert chunk not in fresh.verified and b not in fresh.verified
    assert fresh.verify(b, "a test") == len(second) and b not in fresh.verified
    cold = BlobReader(store, set())  # every object read from the store: all of them known intact
    assert cold.get(b) == second and {b, chunk} <= cold.verified


def test_a_writer_continuing_from_a_cached_read_heals_a_chunk_damaged_meanwhile(tmp_path):
    store, (a, first), (b, second) = _two_versions(tmp_path)
    cache = ChunkCache()
    BlobReader(store, chunks=cache).get(a)
    chunk = _shared_chunk(store, a, b)
    _damage(tmp_path / "s.db", chunk)
    seen: set[str] = set()
    assert BlobReader(store, seen, chunks=cache).get(a) == first  # served from memory
    writer = BlobWriter(store, known=seen)
    grown = second + _text(3_000, seed=3)
    c = writer.put(grown)
    store.put_objects(writer.commit_objects())
    assert BlobReader(store).get(c) == grown  # the damaged copy was written again
    assert BlobReader(store).get(a) == first
