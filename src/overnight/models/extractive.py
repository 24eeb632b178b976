"""``extractive``: the deterministic offline "model" -- **not a language model**.

It needs nothing installed and no network, and the same messages always give the same bytes,
which is what the demo, the tests and a resumed run's byte-identical report rely on. It does not
understand the prompt; it recognises two kinds of request:

* a **section prompt** built by :func:`section_messages` (the API-report demo's "write the
  section for this module" request, which carries the extracted API as a JSON block): the reply
  is :class:`ExtractiveWriter`'s section, byte for byte;
* **anything else**: an extractive digest of the last user message -- the first sentence of each
  paragraph, in order -- e.g. for a compaction summary.

Either reply is cut at ``max_tokens`` (o200k_base tokens), as a real model's would be.
``temperature`` is accepted and ignored.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any

from overnight.errors import ModelCallFailed
from overnight.models.base import Completion, Message, check_limits, check_messages
from overnight.tokens import DEFAULT_ENCODING, count_messages
from overnight.tokens_lazy import lazy_tokenizer_for

SECTION_MARKER = "overnight-section-api"
"""Info string of the fenced JSON block that carries a module's extracted API in a section prompt."""

SECTION_SYSTEM = (
    "You write one section of a Markdown API reference for a Python package. Use only the facts in the "
    "extracted API you are given: keep every signature exactly as written, summarise each docstring "
    "faithfully, invent nothing. Start with a level-2 heading naming the module."
)


def section_messages(api: dict[str, Any]) -> list[dict[str, str]]:
    """The chat request "write the Markdown section for this module" for any :class:`Model`.

    Args:
        api: one module's extracted API, the shape of
            :func:`overnight.demo.api_report.extract_module` (``module``, ``doc``, ``classes``,
            ``functions``).

    Returns:
        ``[system, user]`` messages; the user message holds ``api`` as JSON in a block fenced
        ```` ```json overnight-section-api ````, which :class:`ExtractiveModel` reads back.
    """
    body = json.dumps(api, ensure_ascii=False, indent=1, sort_keys=True)
    user = (f"Write the Markdown section for the module `{api['module']}` from its extracted public API "
            f"(JSON):\n\n```json {SECTION_MARKER}\n{body}\n```\n")
    return [{"role": "system", "content": SECTION_SYSTEM}, {"role": "user", "content": user}]


_FENCE = re.compile(r"```json " + re.escape(SECTION_MARKER) + r"[ \t]*\r?\n")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s")


def _section_api(text: str) -> dict[str, Any] | None:
    m = _FENCE.search(text)
    if m is None:
        return None
    try:
        api, _ = json.JSONDecoder().raw_decode(text, m.end())
    except json.JSONDecodeError as exc:
        raise ModelCallFailed(f"the section prompt's API block is not valid JSON: {exc}", model="extractive",
                              hint="build the prompt with overnight.models.extractive.section_messages(api)") from exc
    missing = [k for k in ("module", "doc", "classes", "functions") if not isinstance(api, dict) or k not in api]
    if missing:
        raise ModelCallFailed(f"the section prompt's API block lacks {missing}", model="extractive",
                              hint="pass the dict returned by overnight.demo.api_report.extract_module")
    return api


def _digest(text: str) -> str:
    """First sentence of every paragraph of ``text``, one per line."""
    lines = []
    for para in re.split(r"\n\s*\n", text.strip()):
        para = " ".join(para.split())
        if para:
            lines.append(_SENTENCE_END.split(para, 1)[0])
    return "\n".join(lines)


class ExtractiveModel:
    """Deterministic offline stand-in for a model; **not an LLM** (see the module docstring).

    Args:
        latency_ms: sleep this long per call (ms), to stand in for a model's latency.

    ``complete`` counts ``tokens_in`` with :func:`~overnight.tokens.count_messages` and
    ``tokens_out`` with ``o200k_base``: real counts of the text, though no model reads it.
    """

    name = "extractive"

    def __init__(self, latency_ms: float = 0.0) -> None:
        self.latency_ms = latency_ms
        self._tok = lazy_tokenizer_for(DEFAULT_ENCODING)  # loaded at the first call, not on resume

    def complete(self, messages: Sequence[Message], *, max_tokens: int = 512,
                 temperature: float = 0.0) -> Completion:
        """The section for a :func:`section_messages` prompt, else a digest of the last user message.

        Raises:
            ModelError: malformed messages or limits.
            ModelCallFailed: a section prompt whose API block is malformed.
        """
        t0 = time.perf_counter()
        msgs = check_messages(messages, self.name)
        check_limits(max_tokens, temperature, self.name)
        last_user = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), msgs[-1]["content"])
        api = _section_api(last_user)
        if api is not None:
            text = ExtractiveWriter().write_section(api)
        else:
            text = _digest(last_user)
        finish = "stop"
        ids = self._tok.encode(text)
        if len(ids) > max_tokens:
            finish, keep = "length", max_tokens
            while True:  # re-encoding a cut text can merge differently: keep it within max_tokens
                cut = self._tok.decode(ids[:keep]).rstrip("\ufffd")  # drop a cut multi-byte char
                cut_ids = self._tok.encode(cut)
                if len(cut_ids) <= max_tokens:
                    text, ids = cut, cut_ids
                    break
                keep -= 1
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000)
        return Completion(
            text=text,
            tokens_in=count_messages(msgs, self._tok),
            tokens_out=len(ids),
            model=self.name,
            latency_ms=(time.perf_counter() - t0) * 1000,
            finish_reason=finish,
        )

    def __repr__(self) -> str:
        return f"ExtractiveModel(latency_ms={self.latency_ms})"


# --- the extractive writer (the demo's sections come from here) ---------------------------


def code(text: str) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds (a fence one longer than
    its longest run of backticks, padded when it starts or ends with one)."""
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or run else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def prose(doc: str) -> str:
    """A docstring as Markdown text that shows what pydoc shows: characters Markdown would take as
    markup (backticks of stdlib-style `` `quote' `` pairs, ``*args``, ``_private``, ``<tags>``) are
    escaped; lines indented 4 or more (examples, already code in Markdown) are left as they are, and
    a line that would read as a heading or a quote is escaped at its start."""
    out = []
    for line in doc.splitlines():
        if line.startswith("    ") or not line.strip():
            out.append(line)
            continue
        line = _MD_SPECIAL.sub(r"\\\1", line)
        if re.match(r"\s*(#|>|[-+=]{3,}\s*$)", line):
            line = "\\" + line
        out.append(line)
    return "\n".join(out)


class ExtractiveWriter:
    """Deterministic offline section writer (extractive: not an LLM).

    It lays out every public signature with its docstring, and opens each class with its
    docstring's first paragraph as a summary; the same input always gives the same bytes, so a
    resumed run's report is byte-identical to an uninterrupted one.

    Args:
        latency_ms: sleep this long per section, to stand in for a model call's latency.
    """

    name = "extractive"

    def __init__(self, latency_ms: float = 0.0) -> None:
        self.latency_ms = latency_ms

    @staticmethod
    def _para(doc: str) -> str:
        return doc.split("\n\n", 1)[0].strip() if doc else ""

    def write_section(self, api: dict[str, Any]) -> str:
        """Markdown section for one module's extracted API (``extract_module`` shape): every
        public name pydoc lists -- classes with their own and inherited members, functions, data,
        and a package's submodules -- with signatures as code and docstrings as escaped text."""
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000)
        lines = [f"## `{api['module']}`", ""]
        if api["doc"]:
            lines += [prose(api["doc"]), ""]
        data = api.get("data", [])
        lines += [f"*{len(api['classes'])} classes, {len(api['functions'])} functions"
                  + (f", {len(data)} data" if data else "") + ".*", ""]
        if api.get("submodules"):
            lines += ["Package contents: " + ", ".join(code(m) for m in api["submodules"]), ""]
        for cls in api["classes"]:
            bases = f"({', '.join(cls['bases'])})" if cls["bases"] else ""
            lines += [f"### class {code(cls['name'] + bases)}", ""]
            if cls["doc"]:
                summary = self._para(cls["doc"])
                lines += [f"> {prose(summary).replace(chr(10), ' ')}", ""]
                rest = cls["doc"][len(summary):].strip()
                if rest:
                    lines += [prose(rest), ""]
            for m in cls["methods"]:
                lines += [f"#### {code(cls['name'] + '.' + m['signature'])}", ""]
                lines += [prose(m["doc"]) if m["doc"] else "*(no docstring)*", ""]
            if cls.get("attributes"):
                lines += ["Attributes: " + ", ".join(code(a) for a in cls["attributes"]), ""]
            for inh in cls.get("inherited", []):
                names = [*inh["methods"], *inh["attributes"]]
                lines += [f"Inherited from {code(inh['from'])}: " + ", ".join(code(n) for n in names), ""]
        if api["functions"]:
            lines += ["### Functions", ""]
            for f in api["functions"]:
                lines += [f"#### {code(f['signature'])}", ""]
                if f["doc"]:
                    lines += [prose(f["doc"]), ""]
        if data:
            lines += ["### Data", ""]
            lines += [f"- {code(d['name'])}" + (f" = {code(d['value'])}" if d["value"] else "") for d in data]
            lines += [""]
        return "\n".join(lines).rstrip() + "\n"
