"""The main job: a Markdown API reference of an installed Python package, one step per module.

Steps (each one a checkpoint):

1. ``discover`` -- find the package's source files (no import of the package), add one
   ``section`` step per public module and an ``assemble`` step after them (its directory
   listing is recorded: a module added or removed re-plans);
2. ``section`` -- parse one module with :mod:`ast` (public classes, functions, signatures,
   docstrings) and have the writer turn it into that module's section (artifact
   ``sections/<module>.md``); the source is read through ``ctx.read_input`` so an edited module
   is recomputed on resume (drift), and only that one;
3. ``assemble`` -- join the sections under a title and a table of contents (artifact ``report.md``).

The writer is :class:`ExtractiveWriter`: deterministic and offline, it *arranges* what was extracted
(signatures, first paragraphs of docstrings); it is not a language model. For the standard
library's ``email`` package the report is about 90 KB -- far more than an 8,000-token context.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import platform
import re
import time
from pathlib import Path
from typing import Any

from overnight.errors import ConfigError
from overnight.models.extractive import section_messages
from overnight.orchestrate.context import StepContext
from overnight.orchestrate.task import Task

DEFAULT_PACKAGE = "email"


# --- extraction --------------------------------------------------------------------------------


def _doc(node: ast.AST) -> str:
    return (ast.get_docstring(node, clean=True) or "").strip()  # type: ignore[arg-type]


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = ast.unparse(fn.args)
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    prefix = "async " if isinstance(fn, ast.AsyncFunctionDef) else ""
    return f"{prefix}{fn.name}({args}){ret}"


def extract_module(source: str, module: str) -> dict[str, Any]:
    """Public API of one module from its source: docstring, classes (with methods) and functions.

    Shape: ``{"module", "doc", "classes": [{"name", "bases", "doc", "methods": [{"signature",
    "doc"}]}], "functions": [{"signature", "doc"}]}``; names listed in ``__all__`` (when the
    module defines it) or not starting with ``_``.
    """
    tree = ast.parse(source)
    exported: set[str] | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                exported = set(ast.literal_eval(node.value))
            except ValueError:
                exported = None

    def visible(name: str) -> bool:
        return name in exported if exported is not None else not name.startswith("_")

    classes, functions = [], []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and visible(node.name):
            methods = [
                {"signature": _signature(m), "doc": _doc(m)}
                for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(m.name)
            ]
            classes.append({"name": node.name, "bases": [ast.unparse(b) for b in node.bases], "doc": _doc(node),
                            "methods": methods})
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and visible(node.name):
            functions.append({"signature": _signature(node), "doc": _doc(node)})
    return {"module": module, "doc": _doc(tree), "classes": classes, "functions": functions}


# --- the writer --------------------------------------------------------------------------------


def _anchor(module: str) -> str:
    return re.sub(r"[^a-z0-9-]", "", module.lower().replace(".", "-").replace(" ", "-"))


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
        """Markdown section for one module's extracted API (``extract_module`` shape)."""
        if self.latency_ms:
            time.sleep(self.latency_ms / 1000)
        lines = [f"## `{api['module']}`", ""]
        if api["doc"]:
            lines += [api["doc"], ""]
        lines += [f"*{len(api['classes'])} classes, {len(api['functions'])} functions.*", ""]
        for cls in api["classes"]:
            bases = f"({', '.join(cls['bases'])})" if cls["bases"] else ""
            lines += [f"### class `{cls['name']}{bases}`", ""]
            if cls["doc"]:
                summary = self._para(cls["doc"])
                lines += [f"> {summary.replace(chr(10), ' ')}", ""]
                rest = cls["doc"][len(summary):].strip()
                if rest:
                    lines += [rest, ""]
            for m in cls["methods"]:
                lines += [f"#### `{cls['name']}.{m['signature']}`", ""]
                if m["doc"]:
                    lines += [m["doc"], ""]
                else:
                    lines += ["*(no docstring)*", ""]
        if api["functions"]:
            lines += ["### Functions", ""]
            for f in api["functions"]:
                lines += [f"#### `{f['signature']}`", ""]
                if f["doc"]:
                    lines += [f["doc"], ""]
        return "\n".join(lines).rstrip() + "\n"


# --- the task ----------------------------------------------------------------------------------


def find_package(package: str) -> tuple[Path, list[tuple[str, str]]]:
    """Source root of ``package`` and its public modules as ``(module, path relative to root)``.

    Raises:
        ConfigError: not installed, or not a package of Python source files.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"cannot find package {package!r}: {exc}") from exc
    if spec is None:
        raise ConfigError(f"package {package!r} is not installed", hint="pip install it, or pass another --package")
    if spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    elif spec.origin and spec.origin.endswith(".py"):
        root, files = Path(spec.origin).parent, [Path(spec.origin)]
    else:
        raise ConfigError(f"{package!r} has no Python source to document (compiled or namespace package)")
    modules = []
    for path in files:
        rel = path.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") or p in ("test", "tests") for p in parts):
            continue
        name = ".".join([package, *parts]) if spec.submodule_search_locations else package
        modules.append((name, rel.as_posix()))
    if not modules:
        raise ConfigError(f"package {package!r} has no public modules")
    return root, modules


def _package_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return f"Python {platform.python_version()} standard library"


def section_parts(api: dict[str, Any]) -> list[dict[str, Any]]:
    """A module's API cut into parts that can be written one model call each: the module's
    docstring with its functions, then each class on its own."""
    head = {**api, "classes": []}
    return [head] + [{**api, "doc": "", "functions": [], "classes": [c]} for c in api["classes"]]


MIN_REPLY_TOKENS = 256


def _fitting(ctx: StepContext, part: dict[str, Any], max_tokens: int) -> list[dict[str, Any]]:
    """``part`` as parts that each leave room for their reply -- as long as the API listing it
    restates (at least :data:`MIN_REPLY_TOKENS`, at most ``max_tokens``): a class too large for one
    call is cut between its methods (the later pieces marked ``continued``)."""
    messages = section_messages(part)
    listing = len(ctx.model.tokenizer.encode(messages[-1]["content"]))
    if ctx.model.room(messages) >= min(max_tokens, max(MIN_REPLY_TOKENS, listing)):
        return [part]
    classes = part["classes"]
    if len(classes) == 1 and len(classes[0]["methods"]) > 1:
        cls, methods = classes[0], classes[0]["methods"]
        half = len(methods) // 2
        first = {**part, "classes": [{**cls, "methods": methods[:half]}]}
        rest = {**part, "continued": True, "classes": [{**cls, "doc": "", "methods": methods[half:]}]}
        return _fitting(ctx, first, max_tokens) + _fitting(ctx, rest, max_tokens)
    raise ConfigError(f"the API of {part['module']} (part) does not fit in a {MIN_REPLY_TOKENS}-token reply "
                      "within the context window", hint="raise --max-context-tokens")


def _write(ctx: StepContext, api: dict[str, Any], max_tokens: int) -> str:
    messages = section_messages(api)
    return ctx.model.complete(messages, max_tokens=min(max_tokens, ctx.model.room(messages))).text


def write_section(ctx: StepContext, api: dict[str, Any], max_tokens: int) -> str:
    """The module's section, by the task's model: one call when the module's API and a reply of
    up to ``max_tokens`` fit in the context window, else one call per part (:func:`section_parts`;
    a class too large for one call cut between its methods), stitched under one heading. A reply never asks for more tokens than the window has left."""
    if ctx.model.fits(section_messages(api), max_tokens):
        return ctx.model.complete(section_messages(api), max_tokens=max_tokens).text
    parts = [piece for part in section_parts(api) for piece in _fitting(ctx, part, max_tokens)]
    texts = [_write(ctx, part, max_tokens) for part in parts]
    counts = f"*{len(api['classes'])} classes, {len(api['functions'])} functions.*"
    texts[0] = re.sub(r"^\*\d+ classes, \d+ functions\.\*$", counts, texts[0], count=1, flags=re.M)
    rest = []
    for part, text in zip(parts[1:], texts[1:]):  # each part repeats the module heading (a class
        # continued, its class heading too): keep what follows it
        lines = text.splitlines()
        mark = "#### " if part.get("continued") else "### "
        start = next((i for i, line in enumerate(lines) if line.startswith(mark)), len(lines))
        rest.append("\n".join(lines[start:]))
    return "\n\n".join([texts[0].rstrip(), *(r.strip() for r in rest)]).rstrip() + "\n"


def make_task(task_id: str | None = None, package: str = DEFAULT_PACKAGE, latency_ms: float = 0.0,
              out: str | None = "report.md", model: str | None = None, max_context_tokens: int = 8_000,
              section_tokens: int | None = None) -> Task:
    """The API-report task for ``package`` (id ``api-report-<package>`` unless given).

    Args:
        out: the file the finished ``report.md`` is exported to (default ``report.md`` in the
            current directory, also when the task is resumed with ``overnight resume`` or run
            from ``examples/api_report.py``); None: keep it in the store only
            (``overnight cat TASK report.md``).
        model: the model writing the sections (``extractive``, ``local``, ``openai:NAME``; default
            extractive), recorded in the task's data so a resume uses the same one.
        latency_ms: with the extractive writer, sleep this long per section (a model's latency).
        max_context_tokens: the session's context window (compaction at 80 % of it).
        section_tokens: most tokens per section reply (default 4,096 for the extractive writer,
            whose sections are long, 400 for a language model).
    """
    task = Task(
        task_id or f"api-report-{package.replace('_', '-')}",
        goal=f"Write a Markdown API reference of the Python package {package!r}",
        expected_span="2d",  # written across days: durable (fingerprints and drift checks on resume)
        criticality="normal",
        done_when="report.md has one section per public module and a table of contents",
        data={"package": package, "model": model or "extractive", "latency_ms": latency_ms,
              "section_tokens": section_tokens},
        entry="overnight.demo.api_report:make_task",
        exports={"report.md": out} if out else {},
        model=model or "extractive",
        max_context_tokens=max_context_tokens,
    )

    @task.step
    def discover(ctx: StepContext) -> dict[str, Any]:
        pkg = ctx.state["package"]
        root, modules = find_package(pkg)
        ctx.track_listing(root)  # a module added or removed re-plans; an edited one does not
        ctx.state.update(root=str(root), version=_package_version(pkg))
        for module, rel in modules:
            ctx.add_step("section", name=f"section:{module}", module=module, file=rel)
        ctx.add_step("assemble")
        ctx.log.info("%d modules in %s", len(modules), root)
        return {"modules": [m for m, _ in modules], "root": str(root)}

    @task.step(planned=False)
    def section(ctx: StepContext, module: str, file: str) -> dict[str, int]:
        source = ctx.read_input_text(Path(ctx.state["root"]) / file)  # recorded: an edit recomputes this section
        api = extract_module(source, module)
        limit = ctx.state.get("section_tokens") or (4096 if ctx.model.name == "extractive" else 400)
        if ctx.model.name == "extractive" and ctx.state.get("latency_ms"):
            time.sleep(ctx.state["latency_ms"] / 1000)
        text = write_section(ctx, api, limit)
        heading = f"## `{module}`"
        if not text.lstrip().startswith(heading):  # a model's reply without the heading: the report keeps its shape
            text = f"{heading}\n\n{text.strip()}\n"
        ctx.write_text(f"sections/{module}.md", text)
        return {"classes": len(api["classes"]), "functions": len(api["functions"]), "bytes": len(text)}

    @task.step(planned=False)
    def assemble(ctx: StepContext) -> dict[str, int]:
        pkg, modules = ctx.state["package"], ctx.outputs["discover"]["modules"]
        sections = [ctx.read_text(f"sections/{m}.md") for m in modules]
        toc = [f"- [`{m}`](#{_anchor(m)})" for m in modules]
        writer = ("overnight's extractive writer (not a language model)" if ctx.state["model"] == "extractive"
                  else f"the model {ctx.state['model']}")
        head = [f"# API reference: `{pkg}`", "",
                f"{len(modules)} public modules of `{pkg}` ({ctx.state['version']}). Written section by section "
                f"by {writer} from the package source.", "", "## Contents", "", *toc, ""]
        report = "\n".join(head) + "\n" + "\n".join(sections)
        ctx.write_text("report.md", report)
        return {"modules": len(modules), "bytes": len(report.encode("utf-8"))}

    return task


task = make_task()
