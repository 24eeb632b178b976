"""Tokenizers that load their vocabulary at the first count, not when they are made.

The runner needs a tokenizer's *name* at once -- it is part of the ``model`` component of the
world fingerprint a resume compares -- but its vocabulary only when a step calls the model or a
context is counted. Loading ``o200k_base`` costs 0.4-2 s (3.6 MB checked against its published
hash, 200,000 ranks parsed); a resumed task that never calls a model should not pay it.

:func:`lazy_tokenizer_for` gives, for an OpenAI encoding or a model name that maps to one, a
:class:`LazyTokenizer` whose ``name`` is the encoding (what :func:`~overnight.tokens.tokenizer_for`
would give) and which loads the real tokenizer through :func:`~overnight.tokens.tokenizer_for`
the first time it encodes, counts or decodes. Anything else (a ``tokenizer.json``, a ``.gguf``
file, an unknown name) is returned by :func:`~overnight.tokens.tokenizer_for` at once, as before:
those names depend on the file found.

A vocabulary that is missing or fails its hash is then reported at the first count (a
:class:`~overnight.errors.TokenizerError` from the model call or the context budget), not when the
runner is made.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from overnight.errors import ConfigError
from overnight.tokens import DEFAULT_ENCODING, ENCODINGS, Tokenizer, encoding_for_model, tokenizer_for

loads = 0
"""First uses of a :class:`LazyTokenizer` in this process (each loads, or reuses, the cached tokenizer)."""


class LazyTokenizer:
    """An exact OpenAI-encoding tokenizer (the :class:`~overnight.tokens.Tokenizer` protocol) that
    loads on first use.

    Attributes:
        name: the encoding (``"o200k_base"``).
        approximate: False.
        loaded: whether the vocabulary has been loaded.
    """

    approximate = False

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        if encoding not in ENCODINGS:
            raise ConfigError(f"not an OpenAI encoding: {encoding!r}")
        self.name = encoding
        self._tok: Tokenizer | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._tok is not None

    def _get(self) -> Tokenizer:
        if self._tok is None:
            with self._lock:
                if self._tok is None:
                    global loads
                    tok = tokenizer_for(self.name)
                    loads += 1
                    self._tok = tok
        return self._tok

    @property
    def backend(self) -> str:
        """The backend of the loaded tokenizer (loads it)."""
        return getattr(self._get(), "backend", "")

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (loads the vocabulary on first use)."""
        return self._get().encode(text)

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (0 for ``""`` without loading anything)."""
        return self._get().count(text) if text else 0

    def decode(self, ids: Sequence[int]) -> str:
        return self._get().decode(ids)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"LazyTokenizer({self.name!r}, loaded={self.loaded})"


def lazy_tokenizer_for(model_or_encoding: str | None = None) -> Tokenizer:
    """:func:`~overnight.tokens.tokenizer_for`, deferring the load of an OpenAI encoding to its
    first use (see the module docstring); other tokenizers are made at once.

    Raises:
        TokenizerError: as :func:`~overnight.tokens.tokenizer_for` for the tokenizers made at once.
    """
    key = DEFAULT_ENCODING if model_or_encoding is None else str(model_or_encoding)
    bare = key.split(":", 1)[1] if key.startswith("openai:") else key
    encoding = bare if bare in ENCODINGS else encoding_for_model(bare)
    return LazyTokenizer(encoding) if encoding is not None else tokenizer_for(key)


__all__ = ["LazyTokenizer", "lazy_tokenizer_for"]
