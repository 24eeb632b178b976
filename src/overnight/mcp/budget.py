"""A token-budgeted slice of an artifact, for ``artifact_read``.

An agent's context is the scarce resource: a tool result that pastes a 200 KB artifact costs more
than the work it informs. :func:`read_part` returns the longest prefix of the bytes from
``offset`` that fits a token budget (counted with the caller's tokenizer), cut at a line end when
one is near, and the byte offset where the next call continues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["CONTINUATION_TOKENS", "Part", "read_part"]

CONTINUATION_TOKENS = 60
"""Tokens kept free for the line naming the next call."""


@dataclass
class Part:
    """``text`` (the content, or a note for binary content); ``returned``: bytes of the artifact
    it covers; ``next_offset``: the byte offset of the rest, None when nothing is left."""

    text: str
    returned: int
    next_offset: int | None
    binary: bool = False


def _decode(part: bytes) -> tuple[str, int] | None:
    """``(text, bytes used)``: ``part`` as UTF-8, without a character cut at its end; None when it
    is not UTF-8 (binary content, or ``part`` starts inside a character)."""
    try:
        return part.decode("utf-8"), len(part)
    except UnicodeDecodeError as exc:
        if exc.start >= len(part) - 3 and exc.reason == "unexpected end of data":
            try:
                return part[:exc.start].decode("utf-8"), exc.start
            except UnicodeDecodeError:
                return None
        return None


def _prefix(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The longest prefix of ``text`` of at most ``budget`` tokens (binary search on its length),
    cut after a newline when one lies in the last quarter of it."""
    if count(text) <= budget:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    cut = text.rfind("\n", 0, lo)
    if cut >= 0 and cut + 1 > lo * 3 // 4:
        lo = cut + 1
    return text[:lo]


def read_part(data: bytes, offset: int, max_bytes: int, *, budget_tokens: int,
              count: Callable[[str], int]) -> Part:
    """At most ``max_bytes`` bytes and ``budget_tokens`` tokens of ``data`` from byte ``offset``.

    Binary content (not UTF-8) is described, not returned: ``returned`` is then the bytes the note
    covers. An ``offset`` inside a UTF-8 character starts at the next character (``returned``
    counts the skipped bytes). An ``offset`` past the end returns an empty text and no ``next_offset``.
    """
    if offset >= len(data):
        return Part("", 0, None)
    skip = 0  # an offset inside a UTF-8 character: start at the next one
    while skip < 3 and offset + skip < len(data) and data[offset + skip] & 0xC0 == 0x80:
        skip += 1
    chunk = data[offset + skip:offset + skip + max_bytes]
    decoded = _decode(chunk) if skip < 3 else None
    if decoded is None:
        end = offset + skip + len(chunk)
        return Part(f"({len(chunk)} bytes of binary content)", skip + len(chunk), end if end < len(data) else None,
                    True)
    text, _ = decoded
    text = _prefix(text, budget_tokens, count)
    used = len(text.encode("utf-8"))
    if used == 0 and chunk:  # one character over the whole budget: return it anyway, never loop forever
        text = next(iter(decoded[0]), "")
        used = len(text.encode("utf-8"))
    end = offset + skip + used
    return Part(text, skip + used, end if end < len(data) else None)
