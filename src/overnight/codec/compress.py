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
MAX_SIZE = 64 * 1024 * 1024
"""The largest payload (bytes) a ``zstd`` object may claim. What overnight compresses is a chunk
or a small blob (at most 32 KiB, :mod:`overnight.codec.chunking`), a tree payload, or a checkpoint
record (a ditto copy's): this is thousands of times more, and it bounds the memory a decompression
can take whatever a damaged or forged ``size`` (or frame header) says."""
_STREAM_READ = 1024 * 1024  # bytes per read of a frame that does not say its content size
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
    """Inverse of :func:`compress`: the ``size`` bytes of payload that ``data`` encodes.

    ``size`` is the stored object's claim, so it is a bound, never trusted as an allocation: a
    claim above :data:`MAX_SIZE` is refused before anything is decompressed, a frame whose header
    states another content size is refused before its output is allocated, and a frame without
    one is decompressed a bounded piece at a time, stopping one byte past ``size``.

    Raises:
        DecodeError: unknown codec, a ``size`` that is not a non-negative integer (or above
            :data:`MAX_SIZE` for ``zstd``), data that is not bytes, a corrupt frame, or a payload
            of another size than ``size``.
    """
    if type(size) is not int or size < 0:
        raise DecodeError(f"object size {size!r} is not a byte count")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"object data is a {type(data).__name__}, not bytes")
    if codec == "none":
        if len(data) != size:
            raise DecodeError(f"object holds {len(data)} bytes, expected {size}")
        return bytes(data)
    if codec != "zstd":
        raise DecodeError(f"unknown object codec {codec!r} (written by a newer overnight?)")
    if size > MAX_SIZE:
        raise DecodeError(f"object claims {size} bytes, more than any object overnight writes ({MAX_SIZE})")
    try:
        declared = zstandard.frame_content_size(data)
        if declared >= 0:  # the frame says its size (overnight's frames do): checked before allocating
            if declared != size:
                raise DecodeError(f"zstd frame holds {declared} bytes, expected {size}")
            out = _dctx().decompress(data, max_output_size=max(size, 1))
        else:
            out = _bounded(data, size + 1)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"corrupt zstd frame: {exc}") from exc
    if len(out) != size:
        raise DecodeError(f"object decompressed to {len(out)} bytes, expected {size}")
    return out


def decompress_frame(data: bytes, limit: int, what: str = "the data") -> bytes:
    """The payload of the zstd frame ``data``, whose size is stored nowhere else (an archive
    manifest), bounded by ``limit`` bytes as :func:`decompress` bounds an object by its ``size``:
    a frame whose header states more than ``limit`` is refused before its output is allocated,
    and one that does not state its size is decompressed a bounded piece at a time, stopping one
    byte past ``limit`` -- memory follows ``limit``, never what the frame claims or expands to.

    Raises:
        DecodeError: data that is not bytes, a corrupt frame, or a payload larger than ``limit``
            (the message names ``what``).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"{what} is a {type(data).__name__}, not bytes")
    try:
        declared = zstandard.frame_content_size(data)
        if declared > limit:
            raise DecodeError(f"{what} claims {declared} bytes, more than the {limit} it may hold")
        if declared >= 0:
            return _dctx().decompress(data, max_output_size=max(declared, 1))
        parts: list[bytes] = []
        got = 0
        with _dctx().stream_reader(data) as reader:
            while part := reader.read(_STREAM_READ):
                got += len(part)
                if got > limit:  # refused before the pieces are joined: at most ``limit`` bytes held
                    raise DecodeError(f"{what} expands to more than the {limit} bytes it may hold")
                parts.append(part)
        return b"".join(parts)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"{what} is not a valid zstd frame ({exc})") from exc


def _bounded(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    """The output of the zstd frame ``data`` up to ``limit`` bytes (no more is produced), read
    :data:`_STREAM_READ` bytes at a time: memory follows what the frame really holds."""
    parts: list[bytes] = []
    got = 0
    with _dctx().stream_reader(data) as reader:
        while got < limit:
            part = reader.read(min(_STREAM_READ, limit - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
    return b"".join(parts)
