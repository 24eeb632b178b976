"""SHA-256 digests and HMAC-SHA256 signatures, in the ``sha256:<64 hex>`` form used everywhere."""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "sha256:"
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def sha256(data: bytes | bytearray | memoryview) -> str:
    """``sha256:<hex>`` of ``data`` (the address of a blob, chunk or checkpoint)."""
    return PREFIX + hashlib.sha256(data).hexdigest()


def is_digest(text: object) -> bool:
    """True when ``text`` is a well-formed ``sha256:<64 lowercase hex>`` string."""
    return isinstance(text, str) and _DIGEST_RE.match(text) is not None


def raw(digest: str) -> bytes:
    """The 32 raw bytes of a ``sha256:<hex>`` digest."""
    return bytes.fromhex(digest[len(PREFIX):])


def from_raw(data: bytes) -> str:
    """``sha256:<hex>`` from 32 raw bytes."""
    return PREFIX + data.hex()


def sign(key: bytes, data: bytes) -> str:
    """HMAC-SHA256 of ``data`` under ``key``, as ``hmac-sha256:<hex>``."""
    return "hmac-sha256:" + hmac.new(key, data, hashlib.sha256).hexdigest()


def verify_signature(key: bytes, data: bytes, signature: str) -> bool:
    """Constant-time check of a :func:`sign` result."""
    return hmac.compare_digest(sign(key, data), signature)
