"""Incremental content-defined chunking: a writer that cuts a blob again after an append or an
edit reuses its earlier cut, and must produce exactly the chunks, chunk digests and blob digest a
full cut of the new bytes gives -- otherwise deduplication against stored chunks (and against
other writers, which cut from scratch) would silently stop working, or a digest would be wrong."""

from __future__ import annotations

import hashlib
import random

from hypothesis import given, settings, strategies as st
from pyfastcdc import FastCDC

from overnight.codec import chunking


def _full(data: bytes, index: bool = False) -> tuple[tuple[int, ...], tuple[str, ...], str]:
    """Reference: pyfastcdc over the whole buffer, hashed with hashlib (no overnight code)."""
    params = chunking.INDEX_PARAMS if index else chunking.DATA_PARAMS
    ends, digests = [], []
    for c in FastCDC(**params, normalized_chunking=1, seed=0).cut_buf(data):
        ends.append(c.offset + c.length)
        digests.append("sha256:" + hashlib.sha256(data[c.offset : c.offset + c.length]).hexdigest())
    return tuple(ends), tuple(digests), "sha256:" + hashlib.sha256(data).hexdigest()


def _check(cutter: chunking.Cutter, data: bytes, index: bool = False) -> chunking.Cut:
    cut = cutter.cut(data, index=index)
    assert (cut.ends, cut.chunk_digests, cut.digest) == _full(data, index)
    assert b"".join(cut.chunks()) == data
    return cut


def _text(rng: random.Random, n: int) -> bytes:
    """Low-entropy bytes like a transcript (words, JSON punctuation), with runs of zeros now and
    then (no content cut: the chunk ends at the maximum size)."""
    words = [b"the", b"agent", b'{"role":"assistant","content":"', b"tool", b"\\n", b"0123456789", b'"},']
    out = bytearray()
    while len(out) < n:
        out += b"\0" * 40000 if rng.random() < 0.01 else rng.choice(words) + b" "
    return bytes(out[:n])


def _edit(rng: random.Random, data: bytes) -> bytes:
    """One random change: an append (most often), an insert, an overwrite, a delete or a truncation."""
    op = rng.choice(["append", "append", "append", "insert", "overwrite", "delete", "truncate"])
    pos = rng.randrange(len(data) + 1)
    new = _text(rng, rng.randrange(1, 6000)) if rng.random() < 0.5 else rng.randbytes(rng.randrange(1, 6000))
    if op == "append":
        return data + new
    if op == "insert":
        return data[:pos] + new + data[pos:]
    if op == "overwrite":
        return data[:pos] + new + data[pos + len(new):]
    if op == "delete":
        return data[:pos] + data[pos + rng.randrange(1, 5000):]
    return data[:pos]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(0, 200_000), edits=st.integers(1, 12))
def test_incremental_cut_equals_full_cut_after_random_edits(seed: int, size: int, edits: int) -> None:
    rng = random.Random(seed)
    data = _text(rng, size) if seed % 2 else rng.randbytes(size)
    cutter = chunking.Cutter()
    _check(cutter, data)
    for _ in range(edits):
        data = _edit(rng, data)
        _check(cutter, data)


def test_edits_next_to_every_chunk_boundary_give_the_full_cut() -> None:
    """The byte right after a chunk decides its cut: changing it (or the bytes either side of
    it) must re-cut that chunk."""
    rng = random.Random(3)
    base = _text(rng, 120_000)
    for end in _full(base)[0][:-1]:
        for pos in (end - 1, end, end + 1):
            cutter = chunking.Cutter()
            _check(cutter, base)
            flipped = bytes([base[pos] ^ 0x55])
            _check(cutter, base[:pos] + flipped + base[pos + 1:])
            _check(cutter, base[:pos])  # and a truncation there


def test_a_cutter_keeps_several_blobs_apart() -> None:
    """Several growing blobs cut in turn (a chain's artifacts, the state document) each keep
    their own earlier cut; chunk indexes are cut with their own parameters."""
    rng = random.Random(5)
    blobs = [rng.randbytes(50_000), _text(rng, 80_000), _text(rng, 30_000)]
    cutter = chunking.Cutter()
    for _ in range(8):
        for i, b in enumerate(blobs):
            blobs[i] = b + rng.randbytes(rng.randrange(100, 3000))
            _check(cutter, blobs[i])
        _check(cutter, rng.randbytes(20_000), index=True)


def test_an_append_cuts_and_hashes_only_the_tail() -> None:
    """The point of the cutter: after an append, every chunk before the old last one -- its
    boundary, digest and hash state -- is taken over from the earlier cut, not computed again."""
    rng = random.Random(9)
    data = rng.randbytes(750_000)
    cutter = chunking.Cutter()
    before = cutter.cut(data)
    after = _check(cutter, data + rng.randbytes(2000))
    kept = len(before.ends) - 1
    assert kept > 100
    assert after.ends[:kept] == before.ends[:kept]
    assert all(a is b for a, b in zip(after.states[: kept + 1], before.states[: kept + 1]))
