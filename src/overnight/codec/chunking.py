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
"""

from __future__ import annotations

import threading

from pyfastcdc import FastCDC

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


def cut(data: bytes, *, index: bool = False) -> list[memoryview]:
    """Content-defined chunks of ``data`` (views into it, in order, covering it exactly)."""
    view = memoryview(data)
    return [view[c.offset : c.offset + c.length] for c in _chunker(index).cut_buf(view)]
