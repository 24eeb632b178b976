"""zstd compression of stored objects.

Objects are compressed with zstd (level 3, a frame with its content size) when that makes them
smaller; otherwise they are stored as they are (random data, chunk indexes of digests). The codec
used is recorded next to each object (``"zstd"`` or ``"none"``).
"""

from __future__ import annotations

import threading

import zstandard

from overnight.errors import DecodeError

LEVEL = 3
_local = threading.local()


def _cctx() -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True)
    return c


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


def compress(data: bytes) -> tuple[str, bytes]:
    """``(codec, stored_bytes)``: zstd when it saves space, else ``("none", data)``."""
    if len(data) >= 64:
        packed = _cctx().compress(data)
        if len(packed) < len(data):
            return "zstd", packed
    return "none", bytes(data)


def decompress(codec: str, data: bytes, size: int) -> bytes:
    """Inverse of :func:`compress`; ``size`` is the expected uncompressed size in bytes (a bound).

    Raises:
        DecodeError: unknown codec, corrupt frame, or a size other than ``size``.
    """
    if codec == "none":
        out = bytes(data)
    elif codec == "zstd":
        try:
            out = _dctx().decompress(data, max_output_size=max(size, 1))
        except zstandard.ZstdError as exc:
            raise DecodeError(f"corrupt zstd frame: {exc}") from exc
    else:
        raise DecodeError(f"unknown object codec {codec!r} (written by a newer overnight?)")
    if len(out) != size:
        raise DecodeError(f"object decompressed to {len(out)} bytes, expected {size}")
    return out
