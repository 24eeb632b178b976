"""Content-defined chunking (FastCDC 2020, via ``pyfastcdc``) for blobs that grow or change in place.

A blob larger than :data:`INLINE_MAX` bytes is cut into chunks whose boundaries depend on the
content, so an append or a mid-file edit changes only the chunks around the edit and every other
chunk is already in the store (restic and borg do the same). Parameters are part of the format
(``docs/FORMAT.md``): changing them would not break reading, only deduplication against older data.

* data chunks: FastCDC, min 2 KiB, average 4 KiB (+min, as the paper's cut-point skipping gives),
  max 32 KiB, normalized chunking 1, gear seed 0;
* chunk indexes (the list of 32-byte chunk digests) are blobs too and are chunked with min 256 B,
  average 1 KiB, max 8 KiB once larger than :data:`INDEX_INLINE_MAX`, so an appending artifact
  stores a new index tail, not a whole new index.

Cutting is incremental (:class:`Cutter`): FastCDC starts every chunk afresh at the previous
boundary and decides each cut from the bytes up to and including the one after it, so the chunks of
a blob that end before its first byte that differs from an earlier blob are that blob's chunks.
A writer that cuts a growing transcript again keeps the previous cut (boundaries, chunk digests,
SHA-256 states at the boundaries) and cuts and hashes only from the last boundary before the
change -- the same chunks and digests as a full cut, byte for byte (tests/test_chunking.py).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from pyfastcdc import FastCDC

from overnight.codec import digest

INLINE_MAX = 16 * 1024  # bytes: blobs up to this size are one object
INDEX_INLINE_MAX = 2 * 1024  # bytes: chunk indexes up to this size are one object

DATA_PARAMS = {"avg_size": 4096, "min_size": 2048, "max_size": 32768}
INDEX_PARAMS = {"avg_size": 1024, "min_size": 256, "max_size": 8192}

_local = threading.local()


def _chunker(index: bool) -> FastCDC:
    attr = "index" if index else "data"
    c = getattr(_local, attr, None)
    if c is None:
        c = FastCDC(**(INDEX_PARAMS if index else DATA_PARAMS), normalized_chunking=1, seed=0)
        setattr(_local, attr, c)
    return c


def inline_limit(index: bool) -> int:
    """Largest blob (bytes) stored whole rather than chunked."""
    return INDEX_INLINE_MAX if index else INLINE_MAX


@dataclass(frozen=True)
class Cut:
    """A blob cut into data chunks and hashed: what :meth:`Cutter.cut` returns and remembers.

    Attributes:
        data: the blob's bytes.
        digest: ``sha256:<hex>`` of ``data``.
        ends: the end offset (bytes) of every chunk, in order; the last is ``len(data)``.
        chunk_digests: ``sha256:<hex>`` of every chunk.
        states: SHA-256 state after the bytes before each chunk (``states[i]`` has hashed
            ``data[:start of chunk i]``), to hash a blob sharing those bytes from there on.
    """

    data: bytes
    digest: str
    ends: tuple[int, ...]
    chunk_digests: tuple[str, ...]
    states: tuple["hashlib._Hash", ...]

    def chunks(self) -> list[memoryview]:
        """The chunks (views into :attr:`data`, in order, covering it exactly)."""
        view = memoryview(self.data)
        return [view[a:b] for a, b in zip((0, *self.ends), self.ends)]


def _shared_chunks(old: Cut, data: bytes) -> int:
    """How many leading chunks of ``old`` are chunks of ``data`` too: those whose bytes *and* the
    byte after them (which decided the cut) are the same in both. Compares with ``memcmp``."""
    if len(data) > len(old.data) and data.startswith(old.data):  # an append
        return len(old.ends) - 1
    start, n, was = 0, 0, memoryview(old.data)  # (a view: each chunk compared in place, not copied)
    for end in old.ends[:-1]:
        if end >= len(data) or not data.startswith(was[start : end + 1], start):
            break
        start, n = end + 1, n + 1
    return n


class Cutter:
    """Cuts blobs into content-defined chunks and hashes them, reusing what it cut before.

    Keeps the last :data:`KEEP` cuts of each kind (data, chunk index). A blob whose leading chunks
    are those of a kept one (an append, an edit past its start) is cut and hashed only from the
    last chunk boundary before its first changed byte; the result is the same as cutting it whole.
    Not thread-safe: one per writer (a chain's commits share one).
    """

    KEEP = 4

    def __init__(self) -> None:
        self._kept: dict[bool, list[Cut]] = {False: [], True: []}

    def cut(self, data: bytes, *, index: bool = False) -> Cut:
        """The chunks and digests of ``data`` (see :class:`Cut`), cut with the data chunk
        parameters, or the chunk index ones when ``index``."""
        kept = self._kept[index]
        best, shared = None, 0
        for old in kept:
            n = _shared_chunks(old, data)
            if n > shared:
                best, shared = old, n
        if best is None:
            ends: list[int] = []
            digests: list[str] = []
            states = [hashlib.sha256()]
            start = 0
        else:
            ends, digests = list(best.ends[:shared]), list(best.chunk_digests[:shared])
            states = list(best.states[: shared + 1])
            start = ends[-1]
        view = memoryview(data)
        hasher = states[-1].copy()
        for c in _chunker(index).cut_buf(view[start:]):
            chunk = view[start + c.offset : start + c.offset + c.length]
            ends.append(start + c.offset + c.length)
            digests.append(digest.sha256(chunk))
            hasher.update(chunk)
            states.append(hasher.copy())
        states.pop()  # the state after the last chunk is the blob's digest, not a chunk start
        out = Cut(data, digest.PREFIX + hasher.hexdigest(), tuple(ends), tuple(digests), tuple(states))
        if ends:
            self._kept[index] = [out, *(k for k in kept if k is not best)][: self.KEEP]
        return out
