"""User-supplied text on the dashboard's pages: bidirectional control characters shown, never applied.

A goal, branch name, step key, artifact name or state value is stored as given; a bidi control
character in it (U+202E RIGHT-TO-LEFT OVERRIDE, the isolates U+2066-U+2069, the marks U+200E/F...)
would reorder what follows it on the page. The templates show such text through the ``u`` filter
(:func:`user_text`: escaped, each control written out as ``\\u202e`` in a visible span, inside
``<bdi>``) or, in an attribute a person reads, ``ua`` (:func:`bidi_visible`); the SVG charts
use :func:`bidi_visible` for their labels. Every other ``{{ }}`` output is served with the control
characters as character references (``app._no_raw_bidi``): the same document, no raw bytes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from markupsafe import Markup, escape

BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""Bidirectional control characters (ALM, LRM, RLM, the embeddings and overrides LRE..RLO with PDF,
the isolates LRI..PDI): in stored text they could reorder what follows them on a page."""

BIDI = re.compile(f"[{BIDI_CONTROLS}]")
BIDI_REFS = {ord(c): f"&#x{ord(c):04x};" for c in BIDI_CONTROLS}


def bidi_visible(value: Any) -> str:
    """``value`` as text with each bidi control character written out as ``\\u202e`` (for an
    attribute a person reads, such as a tooltip or the page title)."""
    return BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", "" if value is None else str(value))


def user_text(value: Any) -> Markup:
    """User-supplied text (a goal, task id, branch name, step key, artifact name, state) for a
    page: HTML-escaped; each bidi control character shown as a visible ``\\u202e`` span, never raw;
    isolated in ``<bdi>`` when it has a control or a right-to-left letter (which then cannot reorder
    the rest of the row; plain left-to-right text is left as it is)."""
    text = "" if value is None else str(value)
    if not BIDI.search(text):  # left-to-right text looks the same without <bdi>: the markup stays plain
        return Markup(f"<bdi>{escape(text)}</bdi>") if _right_to_left(text) else escape(text)
    shown = "".join(f'<span class="bidi-ctl" title="bidi control character">\\u{ord(c):04x}</span>'
                    if BIDI.fullmatch(c) else str(escape(c)) for c in re.split(f"([{BIDI_CONTROLS}])", text))
    return Markup(f"<bdi>{shown}</bdi>")


def _right_to_left(text: str) -> bool:
    return any(c > "\u058f" and unicodedata.bidirectional(c) in ("R", "AL", "AN") for c in text)
