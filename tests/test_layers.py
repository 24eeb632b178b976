"""The import graph of ``src/overnight`` against the layer table below: no cycle, no upward arrow.

The graph is built with :mod:`ast` from every ``import`` / ``from ... import`` in every module --
at module level, inside functions (lazy imports) and under ``if TYPE_CHECKING:`` alike, since each
stands for a real dependency. ``from overnight.store import open_store`` is an arrow to the
``overnight.store`` package module; ``from overnight.chain import records`` to the submodule.

Rules checked:

* **layers** -- a module may import only modules of its own layer or of lower ones (:data:`LAYERS`,
  lowest first); the packages of one layer may import each other, without a cycle;
* **no cycle** -- neither between modules nor between the packages and top-level modules of
  :data:`LAYERS` (the import graph folded to them);
* **leaves** -- nothing in the library imports ``bench``, ``demo`` or ``testing``; the CLI alone
  may import ``bench`` and ``demo``, and only inside a function (the ``bench`` and ``demo``
  commands), so ``import overnight.cli`` never loads them. The leaves themselves may import any
  layer, and ``bench`` may use ``testing`` (fault injection) and ``demo`` (a reference task).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

LAYERS: list[set[str]] = [
    {"errors"},
    {"codec", "units"},
    {"tokens", "tokens_lazy", "keys"},
    {"config"},
    {"models"},
    {"store"},  # bytes, records, refs, leases; store.compose wraps stores; interprets nothing
    {"chain"},  # the object model: records, pages, read (load + fallback), write, branches
    {"verify"},  # checks only: fsck, fingerprint, drift detection
    {"ops"},  # the only code that deletes or moves data: gc, archive, repair, salvage
    {"runtime"},  # session loop, step, context, gateway, drift decision, router decision, task, loader
    {"fleet"},  # workers: the queue, claims, child sessions
    {"api"},
    {"adapters", "cli", "hooks", "mcp", "web", "__main__", ""},  # interfaces; "" is overnight/__init__
]
"""Lowest first. A name is a top-level package or module of ``overnight``."""

LEAVES = {"bench", "demo", "testing"}
"""Imported by nothing in the library (the CLI may import bench and demo lazily)."""

LAZY_LEAF_IMPORTERS = {"cli"}


def _level(top: str) -> int:
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    if top in LEAVES:
        return len(LAYERS)
    raise AssertionError(f"overnight.{top} is in no layer of tests/test_layers.py: add it to LAYERS")


def _modules() -> dict[str, tuple[Path, bool]]:
    root = SRC / "overnight"
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (p, is_pkg)
    return out


class _Imports(ast.NodeVisitor):
    """Every import of a module, with whether it sits inside a function."""

    def __init__(self, module: str, is_pkg: bool, modules: set[str]) -> None:
        self.module, self.is_pkg, self.modules = module, is_pkg, modules
        self.found: list[tuple[str, bool, int]] = []
        self._depth = 0

    def _func(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _func

    def _add(self, name: str, line: int) -> None:
        if name == "overnight" or name.startswith("overnight."):
            self.found.append((name, self._depth > 0, line))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".") if self.is_pkg else self.module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            name = ".".join(base + ([node.module] if node.module else []))
        else:
            name = node.module or ""
        for alias in node.names:
            sub = f"{name}.{alias.name}"
            self._add(sub if sub in self.modules else name, node.lineno)


def _graph() -> dict[str, list[tuple[str, bool, int]]]:
    mods = _modules()
    graph = {}
    for name, (path, is_pkg) in mods.items():
        v = _Imports(name, is_pkg, set(mods))
        v.visit(ast.parse(path.read_text(), str(path)))
        # an import of a module not in the tree (a typo, a moved module) is an error too
        for target, _, line in v.found:
            assert target in mods, f"{path.relative_to(SRC)}:{line} imports {target}, which does not exist"
        graph[name] = v.found
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, bool, int]]]:
    return _graph()


def test_every_module_is_in_a_layer(graph):
    for module in graph:
        _level(_top(module))


def test_no_upward_import(graph):
    bad = []
    for src, targets in graph.items():
        s = _top(src)
        for dst, lazy, line in targets:
            d = _top(dst)
            if s == d or d == "":
                if d == "" and s not in LAYERS[-1] and s not in LEAVES:
                    bad.append(f"{src}:{line} -> {dst} (the public package, above everything)")
                continue
            if d in LEAVES:
                if s in LEAVES or (s in LAZY_LEAF_IMPORTERS and d in {"bench", "demo"} and lazy):
                    continue
                bad.append(f"{src}:{line} -> {dst} (a leaf" + (": import it inside the command"
                                                                  if s in LAZY_LEAF_IMPORTERS else "") + ")")
                continue
            if s in LEAVES:
                continue
            if _level(d) > _level(s):
                bad.append(f"{src}:{line} -> {dst} (layer {_level(s)} imports layer {_level(d)})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_module_cycle(graph):
    edges = {src: {dst for dst, _, _ in targets if dst != src} for src, targets in graph.items()}
    # a package's __init__ importing its own submodules and a submodule importing a sibling
    # through the package are one module each way: still a cycle, and reported
    cycles = _cycles(edges)
    assert not cycles, "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_package_cycle(graph):
    edges: dict[str, set[str]] = defaultdict(set)
    for src, targets in graph.items():
        for dst, _, _ in targets:
            s, d = _top(src), _top(dst)
            if s != d and d != "":
                edges[s].add(d)
    cycles = _cycles(edges)
    assert not cycles, "import cycles between packages:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_check_sees_lazy_and_type_checking_imports():
    """The visitor counts an import inside a function and under TYPE_CHECKING (so a cycle hidden
    in either is still found) -- checked on a made-up module, so the test can fail."""
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from overnight.runtime.runner import Runner\n"
            "def f():\n    from overnight.store import open_store\n")
    v = _Imports("overnight.chain.x", False, {"overnight.runtime.runner", "overnight.store"})
    v.visit(ast.parse(code))
    assert [(t, lazy) for t, lazy, _ in v.found] == [("overnight.runtime.runner", False), ("overnight.store", True)]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
