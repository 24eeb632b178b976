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
from typing import Any, Callable

from overnight.errors import ConfigError
from overnight.models.extractive import ExtractiveWriter, code, prose, section_messages  # noqa: F401 (re-exported)
from overnight.runtime.context import StepContext
from overnight.runtime.task import Task

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


def _clip(text: str, limit: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Module:
    """One parsed module: what it defines at top level, what it imports by name, and ``__all__``."""

    def __init__(self, source: str, name: str, is_package: bool) -> None:
        self.name, self.tree = name, ast.parse(source)
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name there)
        self.modules: dict[str, str] = {}  # local name -> module (import x.y, import x as y)
        self.all: list[str] | None = None
        for node in self.tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name):
                        self.defs[t.id] = node
                        if t.id == "__all__":
                            try:
                                self.all = [str(n) for n in ast.literal_eval(node.value)]
                            except ValueError:
                                self.all = None
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.modules[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    if alias.name != "*":
                        self.imports[alias.asname or alias.name] = (base, alias.name)


class _Resolver:
    """Finds a name's definition across the modules of the package (by parsing their source,
    never importing them), and the public members of builtin classes (``Exception``, ``str``)."""

    def __init__(self, read: Callable[[str], tuple[str, bool] | None] | None) -> None:
        self.read = read
        self.cache: dict[str, _Module | None] = {}

    def module(self, name: str) -> _Module | None:
        if name not in self.cache:
            found = self.read(name) if self.read else None
            self.cache[name] = _Module(found[0], name, found[1]) if found else None
        return self.cache[name]

    def find(self, mod: _Module, name: str, depth: int = 0) -> tuple[_Module, ast.AST] | None:
        """``(module, node)`` defining ``name`` as seen from ``mod`` (following ``from x import``;
        a dotted name through a module imported by ``import`` or ``from package import module``)."""
        if "." in name:
            head, *middle, last = name.split(".")
            if head in mod.imports:
                target = ".".join(p for p in mod.imports[head] if p)
            else:
                target = mod.modules.get(head, head)
            other = self.module(".".join([target, *middle]))
            return self.find(other, last, depth + 1) if other is not None and depth < 8 else None
        if name in mod.defs:
            return mod, mod.defs[name]
        if name in mod.imports and depth < 8:
            where, orig = mod.imports[name]
            other = self.module(where)
            if other is not None:
                return self.find(other, orig, depth + 1)
        return None


def _members(node: ast.ClassDef) -> tuple[list[ast.AST], list[str]]:
    """Public methods and class attributes defined in a class body."""
    methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(m.name)]
    attrs = []
    for m in node.body:
        targets = m.targets if isinstance(m, ast.Assign) else [m.target] if isinstance(m, ast.AnnAssign) else []
        attrs += [t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
        if isinstance(m, ast.ImportFrom):  # class Message: from email.iterators import walk
            attrs += [a.asname or a.name for a in m.names if not (a.asname or a.name).startswith("_")]
    return methods, attrs


def _inherited(res: _Resolver, mod: _Module, node: ast.ClassDef, own: set[str]) -> list[dict[str, Any]]:
    """What a class inherits, base by base in (left-first, depth-first) method resolution order,
    as pydoc's "Methods inherited from ..." lists it: ``[{"from", "methods", "attributes"}]``,
    each name once (the nearest definition wins)."""
    import builtins

    seen_names, seen_classes, out = set(own), set(), []

    def walk(m: _Module, cls: ast.ClassDef) -> None:
        for base in cls.bases:
            text = ast.unparse(base)
            found = res.find(m, text) if isinstance(base, (ast.Name, ast.Attribute)) else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                bm, bnode = found
                qual = f"{bm.name}.{bnode.name}"
                if qual in seen_classes:
                    continue
                seen_classes.add(qual)
                methods, attrs = _members(bnode)
                entry = {"from": qual, "methods": [_signature(f) for f in methods if f.name not in seen_names],
                         "attributes": [a for a in attrs if a not in seen_names]}
                seen_names.update(f.name for f in methods)
                seen_names.update(attrs)
                if entry["methods"] or entry["attributes"]:
                    out.append(entry)
                walk(bm, bnode)
            elif isinstance(base, ast.Name) and isinstance(getattr(builtins, text, None), type) and text != "object":
                qual = f"builtins.{text}"
                if qual in seen_classes:
                    continue
                seen_classes.add(qual)
                names = [n for n in dir(getattr(builtins, text)) if not n.startswith("_") and n not in seen_names]
                seen_names.update(names)
                if names:
                    out.append({"from": qual, "methods": [], "attributes": names})

    walk(mod, node)
    return out


def _data(node: ast.AST, name: str) -> dict[str, str]:
    value = getattr(node, "value", None)
    return {"name": name, "value": _clip(ast.unparse(value)) if value is not None else ""}


def extract_module(source: str, module: str, read: Callable[[str], tuple[str, bool] | None] | None = None,
                   *, is_package: bool = False) -> dict[str, Any]:
    """Public API of one module from its source, as ``pydoc`` lists it: docstring, classes (with
    their methods, class attributes and what they inherit), functions and data.

    Shape: ``{"module", "doc", "classes": [{"name", "bases", "doc", "methods": [{"signature",
    "doc"}], "attributes": [name], "inherited": [{"from", "methods": [signature], "attributes":
    [name]}]}], "functions": [{"signature", "doc"}], "data": [{"name", "value"}]}``. Names listed in
    ``__all__`` when the module defines it -- also those it imports from another module of the
    package -- else the public names it defines.

    Args:
        read: ``module name -> (source, is a package)`` for the other modules of the package (or
            None), to follow imports and base classes; nothing is imported.
        is_package: ``source`` is a package's ``__init__.py`` (for relative imports).
    """
    res = _Resolver(read)
    mod = _Module(source, module, is_package)
    res.cache[module] = mod
    if mod.all is not None:
        names = [n for n in dict.fromkeys(mod.all)]
    else:
        names = [n for n in mod.defs if not n.startswith("_")]
    classes, functions, data = [], [], []
    for name in names:
        found = res.find(mod, name)
        if found is None:
            if name in mod.imports or name in mod.defs:
                data.append({"name": name, "value": ""})
            continue
        where, node = found
        if isinstance(node, ast.ClassDef):
            methods, attrs = _members(node)
            classes.append({"name": name, "bases": [ast.unparse(b) for b in node.bases], "doc": _doc(node),
                            "methods": [{"signature": _signature(m), "doc": _doc(m)} for m in methods],
                            "attributes": attrs,
                            "inherited": _inherited(res, where, node, {m.name for m in methods} | set(attrs))})
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sig = _signature(node)
            if node.name != name:  # imported under another name
                sig = name + sig[len(node.name):]
            functions.append({"signature": sig, "doc": _doc(node)})
        elif name != "__all__":
            data.append(_data(node, name))
    return {"module": module, "doc": _doc(mod.tree), "classes": classes, "functions": functions, "data": data}


# --- the writer --------------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (before de-duplication): the rendered text,
    lower-cased, with everything but letters, digits, ``-``, ``_`` and spaces removed and spaces
    turned into ``-`` -- so ``## `email.message` `` is ``#emailmessage``."""
    text = heading.lstrip("#").strip().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(markdown: str) -> dict[str, str]:
    """``heading line -> anchor`` for every ATX heading of a document, de-duplicated as GitHub
    does (a repeated anchor gets ``-1``, ``-2``, ... in document order); fenced code is skipped."""
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = github_anchor(line)
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        out.setdefault(line, slug if n == 0 else f"{slug}-{n}")
    return out


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


OVERVIEW_SYSTEM = ("You are a technical writer. Answer in plain English with 2 to 4 short sentences. "
                   "No code, no lists, no headings. Do not repeat yourself.")


def overview_messages(api: dict[str, Any]) -> list[dict[str, str]]:
    """The request a *small* language model can answer well: a few facts about one module (its
    docstring's first paragraph, its class and function names) and one short question -- not the
    whole API to rewrite, which a 135M model loops on."""
    doc = ExtractiveWriter._para(api["doc"]) or "(none)"
    classes = ", ".join(c["name"] for c in api["classes"][:12]) or "none"
    functions = ", ".join(f["signature"].split("(", 1)[0] for f in api["functions"][:12]) or "none"
    user = (f"Python module: {api['module']}\nWhat its documentation says: {_clip(doc, 600)}\n"
            f"Classes: {classes}\nFunctions: {functions}\n\n"
            f"In 2 to 4 sentences, what is the module {api['module']} for, and when would you use it?")
    return [{"role": "system", "content": OVERVIEW_SYSTEM}, {"role": "user", "content": user}]


def unique_prose(text: str) -> str:
    """A model's reply with every paragraph and sentence said once (a small model that starts over
    repeats itself word for word); blank paragraphs dropped."""
    seen: set[str] = set()
    paragraphs = []
    for para in re.split(r"\n\s*\n", text.strip()):
        sentences = []
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(para.split())):
            key = re.sub(r"\W+", " ", sentence.lower()).strip()
            if key and key not in seen:
                seen.add(key)
                sentences.append(sentence)
        if sentences:
            paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def model_section(ctx: StepContext, api: dict[str, Any], max_tokens: int) -> str:
    """A module's section by a language model: the model writes a short overview (capped at
    ``max_tokens`` and what the window has room for), said once (:func:`unique_prose`); the facts --
    every signature and docstring, as :class:`ExtractiveWriter` lays them out -- follow verbatim,
    so the section is a usable reference however weak the model's prose."""
    messages = overview_messages(api)
    cap = max(16, min(max_tokens, ctx.model.room(messages)))
    reply = unique_prose(ctx.model.complete(messages, max_tokens=cap).text)
    facts = ExtractiveWriter().write_section(api).split("\n", 2)[2]  # without its heading
    overview = f"*Overview by {ctx.model.name}:* {prose(reply)}\n\n" if reply else ""  # its <tags> stay text
    return f"## `{api['module']}`\n\n{overview}{facts}"


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
        root, pkg = Path(ctx.state["root"]), ctx.state["package"]
        source = ctx.read_input_text(root / file)  # recorded: an edit recomputes this section
        is_package = file.endswith("__init__.py")

        def read(name: str) -> tuple[str, bool] | None:
            """Another module of the package, to follow an import or a base class (recorded too:
            an edit of a base class's module recomputes this section)."""
            if name != pkg and not name.startswith(pkg + "."):
                return None
            parts = name.split(".")[1:]
            for path, init in ((root.joinpath(*parts, "__init__.py"), True),
                               (root.joinpath(*parts[:-1], f"{parts[-1]}.py") if parts else None, False)):
                if path is not None and path.is_file():
                    return ctx.read_input_text(path), init
            return None

        api = extract_module(source, module, read, is_package=is_package)
        if is_package:  # pydoc's "package contents"
            folder = (root / file).parent
            api["submodules"] = sorted(f"{module}.{p.stem if p.is_file() else p.name}" for p in folder.iterdir()
                                       if not p.name.startswith("_") and p.name not in ("test", "tests") and (
                                           p.suffix == ".py" or (p / "__init__.py").is_file()))
        limit = ctx.state.get("section_tokens") or (4096 if ctx.model.name == "extractive" else 400)
        if ctx.model.name == "extractive" and ctx.state.get("latency_ms"):
            time.sleep(ctx.state["latency_ms"] / 1000)
        text = write_section(ctx, api, limit) if ctx.model.name == "extractive" else model_section(ctx, api, limit)
        heading = f"## `{module}`"
        if not text.lstrip().startswith(heading):  # a model's reply without the heading: the report keeps its shape
            text = f"{heading}\n\n{text.strip()}\n"
        ctx.write_text(f"sections/{module}.md", text)
        return {"classes": len(api["classes"]), "functions": len(api["functions"]), "bytes": len(text)}

    @task.step(planned=False)
    def assemble(ctx: StepContext) -> dict[str, int]:
        pkg, modules = ctx.state["package"], ctx.outputs["discover"]["modules"]
        sections = [ctx.read_text(f"sections/{m}.md") for m in modules]
        heads = [next((ln for ln in text.splitlines() if ln.startswith("## ")), f"## `{m}`")
                 for m, text in zip(modules, sections)]
        writer = ("overnight's extractive writer (not a language model)" if ctx.state["model"] == "extractive"
                  else f"the model {ctx.state['model']}")
        head = [f"# API reference: `{pkg}`", "",
                f"{len(modules)} public modules of `{pkg}` ({ctx.state['version']}). Written section by section "
                f"by {writer} from the package source.", "", "## Contents", ""]
        body = "\n".join(sections)
        # each link is the anchor GitHub gives that section's heading in the whole report (a
        # heading met twice gets -1, -2, ...): computed on the report as it is assembled
        draft = "\n".join(head) + "\n" + "\n".join(f"- [`{m}`](#)" for m in modules) + "\n\n" + body
        where = anchors(draft)
        toc = [f"- [`{m}`](#{where.get(h, github_anchor(h))})" for m, h in zip(modules, heads)]
        report = "\n".join([*head, *toc, ""]) + "\n" + body
        ctx.write_text("report.md", report)
        return {"modules": len(modules), "bytes": len(report.encode("utf-8"))}

    return task


task = make_task()
