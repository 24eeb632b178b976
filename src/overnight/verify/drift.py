"""Drift: what changed in the world since a checkpoint, which steps it affects, what to do.

Detection compares a checkpoint's recorded fingerprint (:mod:`overnight.verify.fingerprint`) and
what each done step recorded it read (``DoneEntry.reads``) with the world now:

* a step is **directly affected** when something it read changed: an input file or directory
  tree, a directory listing, a registered source, a declared environment variable, a declared
  package's version -- or when its step function's ``version`` (or the task's code epoch) moved;
* its **dependents** follow: a later step that read its output (``ctx.outputs[...]``) or an
  artifact it wrote is affected too, transitively;
* drift that no step read (a lock file, the Python patch version, an undeclared package) is
  reported, with no step to recompute; an edited step function whose ``version`` did not move is
  a *warning* -- a cosmetic edit never strands or restarts a long task.

Policies, per component (:data:`POLICIES`; defaults in :data:`DEFAULT_POLICIES`, overridable per
task and per run): ``recompute`` rewinds the user state to just before the earliest affected step
and goes forward from there in the original order -- re-running each step that read what drifted
or what a re-run step now produces differently, and *replaying* every other one from its recorded
checkpoint (no execution, no model call) -- so exactly the affected steps and their dependents run
again, and a step that accumulates into the state (``total += x``) never counts twice; ``accept`` continues as is and makes what drifted the baseline (what
those steps read, their step ``version``: a later resume neither reports nor recomputes it), and
records the drift on every later checkpoint until each step computed without it has run again; ``rollback`` resumes from the newest checkpoint whose
fingerprint matches the world now; ``abort`` stops with the report (exit code 5).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from overnight.errors import ConfigError, SchemaError
from overnight.verify.input_paths import REFUSED, ProjectPaths
from overnight.verify.fingerprint import (
    COMPONENTS,
    MISSING,
    NOT_RECORDED,
    model_label,
    digest_path,
    installed,
    keyed,
    keyed_like,
    listing_digest,
    normalize,
    source_digest,
)

POLICIES = ("recompute", "accept", "rollback", "abort")
DEFAULT_POLICIES: dict[str, str] = {**{c: "recompute" for c in COMPONENTS}, "model": "accept"}
"""Recompute everywhere but ``model``: only steps that read what drifted run again, so this is also
the cheapest safe default; drift nothing read is recorded and otherwise ignored. A switched model
is accepted (reported, recorded on every later checkpoint): what an earlier model wrote stays, as a
resumed agent conversation keeps its history; ``--on-drift model=recompute`` runs again the steps
that called it."""


def parse_policies(text: str | dict[str, str] | None) -> dict[str, str]:
    """``"deps=recompute,env=accept"`` (or a dict) -> validated ``component -> policy``.

    Raises:
        ConfigError: unknown component or policy.
    """
    if not text:
        return {}
    pairs = text.items() if isinstance(text, dict) else (p.split("=", 1) for p in text.split(",") if p.strip())
    out: dict[str, str] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise ConfigError(f"--on-drift takes component=policy pairs, got {pair!r}",
                              hint="e.g. --on-drift deps=recompute,env=accept")
        component, policy = (x.strip() for x in pair)
        if component != "all" and component not in COMPONENTS:
            raise ConfigError(f"unknown drift component {component!r}; one of {', '.join(COMPONENTS)} or all")
        if policy not in POLICIES:
            raise ConfigError(f"unknown drift policy {policy!r}; one of {', '.join(POLICIES)}")
        for c in COMPONENTS if component == "all" else (component,):
            out[c] = policy
    return out


@dataclass
class DriftItem:
    """One thing that changed: ``component``, what (``key``), ``old -> new``, and the done
    steps that read it directly. ``warning``: reported, never acted on."""

    component: str
    key: str
    old: Any
    new: Any
    steps: list[str] = field(default_factory=list)
    warning: bool = False

    def describe(self) -> str:
        what = f"{self.component}: {self.key}: {short_value(self.old)} -> {short_value(self.new)}"
        if self.warning:
            return what + " (warning only)"
        verb = "written by" if self.component == "artifacts" else "read by"
        return what + (f" ({verb} {', '.join(self.steps[:5])}{' ...' if len(self.steps) > 5 else ''})"
                       if self.steps else " (no step read it)")


def short_value(value: Any) -> str:
    """A drift value as every report shows it: a keyed environment digest as ``env-hmac:<key id, 6
    hex>:<digest, 8 hex>``, a content digest as ``sha256:<12 hex>`` (``tree:``, ``listing:``,
    ``hmac-sha256:`` alike), anything else as it is."""
    text = str(value)
    if text.startswith("env-hmac:"):  # env-hmac:<key id>:<hex>: the key id and a prefix of the digest
        _, kid, tail = text.split(":", 2) if text.count(":") >= 2 else (text, "", "")
        return f"env-hmac:{kid[:6]}:{tail[:8]}"
    if text.startswith(("sha256:", "tree:", "hmac-sha256:", "listing:")):
        head, _, tail = text.partition(":")
        return f"{head}:{tail[:12]}"
    return text


@dataclass
class DriftReport:
    """The drift between a checkpoint and the world now."""

    checkpoint_id: str | None = None
    items: list[DriftItem] = field(default_factory=list)
    dependents: dict[str, str] = field(default_factory=dict)
    """``step -> the affected step whose output or artifact it read``."""

    @property
    def drifted(self) -> bool:
        return any(not i.warning for i in self.items)

    def components(self) -> list[str]:
        return sorted({i.component for i in self.items if not i.warning})

    def describe(self) -> str:
        if not self.items:
            return "no drift"
        lines = [i.describe() for i in self.items]
        if self.dependents:
            lines.append("dependents: " + ", ".join(f"{s} (reads {d})" for s, d in self.dependents.items()))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "drifted": self.drifted,
                "items": [asdict(i) for i in self.items], "dependents": self.dependents}


class WorldNow:
    """The world now, read lazily and once per ``(kind, key)``: ``get("inputs", path)``,
    ``get("listings", dir)``, ``get("env", name)`` (keyed digest), ``get("packages", name)``,
    ``get("sources", name)``, ``get("model", "model")`` (:func:`~overnight.verify.fingerprint.
    model_label` of ``model``, the identity of the model steps call now). A path (``inputs``,
    ``listings``) is read where ``paths`` resolves it (:meth:`~overnight.verify.input_paths.
    ProjectPaths.resolve`; default: the current project's): a relative one under the project root,
    one that would leave it never (:data:`~overnight.verify.input_paths.REFUSED`)."""

    @property
    def paths(self) -> ProjectPaths:
        if self._paths is None:
            self._paths = ProjectPaths.here()
        return self._paths

    def __init__(self, salt: bytes, sources: dict[str, Callable[[], Any]],
                 model: dict[str, Any] | None = None, paths: ProjectPaths | None = None) -> None:
        self.salt, self.sources, self.model = salt, sources, model
        self._paths = paths
        self._cache: dict[tuple[str, str], Any] = {}
        self._packages: dict[str, str] | None = None

    def get(self, kind: str, key: str, like: Any = None) -> Any:
        """The world's digest of ``key`` now; for ``env`` with ``like`` (the recorded digest), in
        the recorded digest's scheme (:func:`~overnight.verify.fingerprint.keyed_like`: possibly
        ``cannot compare``)."""
        if kind == "env" and like is not None:
            return keyed_like(like, self.salt, key, os.environ.get(key))
        k = (kind, key)
        if k not in self._cache:
            if kind in ("inputs", "listings"):
                path = self.paths.resolve(key)
                self._cache[k] = REFUSED if path is None else (digest_path if kind == "inputs" else listing_digest)(path)
            elif kind == "env":
                self._cache[k] = keyed(self.salt, key, os.environ.get(key))
            elif kind == "packages":
                if self._packages is None:
                    self._packages = installed()
                self._cache[k] = self._packages.get(normalize(key), MISSING)
            elif kind == "sources":
                fn = self.sources.get(key)
                self._cache[k] = source_digest(fn, key) if fn is not None else MISSING
            elif kind == "model":
                self._cache[k] = model_label(self.model)
            else:
                raise SchemaError(f"a done step's reads name an unknown kind {kind!r} (key {key!r})",
                                  hint="the record was not written by this overnight")
        return self._cache[k]


READ_COMPONENT = {"inputs": "inputs", "listings": "inputs", "sources": "inputs", "env": "env", "packages": "deps",
                  "model": "model"}


def _summary_differs(summary: dict[str, Any], recorded: dict[str, Any] | None, now: dict[str, Any],
                     step_versions: dict[str, tuple[str, str | None]], exports: dict[str, tuple[str, str]],
                     world: "WorldNow") -> bool:
    """Would :func:`detect` name a done step? True when the task's code epoch changed, a step
    function of the summary is gone or has another version, anything a step read differs from
    the world now, or an exported file was edited -- each a case whose report lists steps."""
    if recorded is not None and (recorded.get("code") or {}).get("task") != now["code"]["task"]:
        return True
    for fn, versions in summary["fns"].items():
        current = step_versions.get(fn)
        if current is None or any(v != current[0] for v in versions):
            return True
    for kind in READ_COMPONENT:
        for key, olds in summary["reads"].get(kind, {}).items():
            if any(world.get(kind, key, old) != old for old in olds):
                return True
    return any(digest_path(path) not in (MISSING, committed) for committed, path in exports.values())


def detect(
    *,
    checkpoint_id: str | None,
    recorded: dict[str, Any] | None,
    now: dict[str, Any],
    done: list[dict[str, Any]],
    step_versions: dict[str, tuple[str, str | None]],
    exports: dict[str, tuple[str, str]],
    salt: bytes,
    sources: dict[str, Callable[[], Any]],
    summary: dict[str, Any] | None = None,
    paths: ProjectPaths | None = None,
) -> DriftReport:
    """Compare a checkpoint with the world now.

    Args:
        recorded: the checkpoint's world fingerprint (None for one written without).
        now: :func:`~overnight.verify.fingerprint.world` of the world now.
        done: the checkpoint's done entries (trees), in order.
        step_versions: ``fn -> (version, source digest)`` of the task code now.
        exports: ``artifact -> (committed digest, file path)`` for exported artifacts.
        summary: the :class:`~overnight.chain.records.DoneSummary` tree of ``done`` (from the
            done pages' verified references, format 4), or None. With it, ``done`` is read only
            when the summary shows that something a step depends on differs (a step version or
            function, anything read, the task's code epoch, an exported file): otherwise no item
            can name a step, and the report is the same without reading one entry.
        paths: where recorded input paths are read now (:class:`~overnight.verify.input_paths.
            ProjectPaths`; default: the current project's, no recorded root). Items name a path as
            it would be recorded now (relative inside the project).
    """
    world = WorldNow(salt, sources, now.get("model"), paths)
    canonical: Callable[[str], str] = paths.canonical if paths is not None else str
    if summary is not None and not _summary_differs(summary, recorded, now, step_versions, exports, world):
        done = []  # nothing a done entry holds differs from the world: the report needs none of them
        read_packages: set[str] | None = set(summary["reads"].get("packages", {}))
    else:
        read_packages = None
    report = DriftReport(checkpoint_id)
    items: dict[tuple[str, str], DriftItem] = {}

    def item(component: str, key: str, old: Any, new: Any, *, warning: bool = False) -> DriftItem:
        it = items.get((component, key))
        if it is None:
            it = items[(component, key)] = DriftItem(component, key, old, new, warning=warning)
        return it

    # code: the task epoch, step versions (act), step sources (warn)
    rec_code = (recorded or {}).get("code", {})
    if recorded is not None and rec_code.get("task") != now["code"]["task"]:
        it = item("code", "task version", rec_code.get("task"), now["code"]["task"])
        it.steps = [d["name"] for d in done]
    for d in done:
        current = step_versions.get(d["fn"])
        if current is None:
            item("code", f"step {d['fn']}", d["version"], "removed", warning=True)
        elif current[0] != d["version"]:
            item("code", f"step {d['fn']} version", d["version"], current[0]).steps.append(d["name"])
    for fn, rec in rec_code.get("steps", {}).items():
        current = step_versions.get(fn)
        if current and current[0] == rec["version"] and rec["source"] and current[1] and current[1] != rec["source"]:
            item("code", f"step {fn} source (version {rec['version']} unchanged)", rec["source"], current[1],
                 warning=True)

    # world-level components: deps, env runtime and vars, declared inputs
    if recorded is not None:
        if read_packages is None:
            read_packages = {p for d in done for p in d["reads"].get("packages", {})}
        unread: list[tuple[str, str, str]] = []
        for name in sorted(set(recorded["deps"]["packages"]) | set(now["deps"]["packages"])):
            old, new = recorded["deps"]["packages"].get(name, MISSING), now["deps"]["packages"].get(name, MISSING)
            if old != new:
                if name in read_packages:
                    item("deps", name, old, new)
                else:
                    unread.append((name, old, new))
        if unread:  # one row for the distributions no step declared: reported, nothing to recompute
            added = sum(o == MISSING for _, o, _ in unread)
            removed = sum(v == MISSING for _, _, v in unread)
            counts = ", ".join(f"{n} {what}" for n, what in ((added, "added"), (removed, "removed"),
                                                          (len(unread) - added - removed, "changed")) if n)
            more = f", and {len(unread) - 3} more" if len(unread) > 3 else ""

            def version(name: str, v: str) -> str:
                return f"{name} not installed" if v == MISSING else f"{name} {v}"
            item("deps", f"{len(unread)} installed distribution(s) no step reads ({counts})",
                 ", ".join(version(n, o) for n, o, _ in unread[:3]) + more,
                 ", ".join(version(n, v) for n, _, v in unread[:3]) + more)
        for name in sorted(set(recorded["deps"]["locks"]) | set(now["deps"]["locks"])):
            old, new = recorded["deps"]["locks"].get(name, MISSING), now["deps"]["locks"].get(name, MISSING)
            if old != new:
                item("deps", f"lock file {name}", old, new)
        for key in ("python", "implementation", "platform"):
            if recorded["env"][key] != now["env"][key]:
                item("env", key, recorded["env"][key], now["env"][key])
        for name in sorted(set(recorded["env"]["vars"]) | set(now["env"]["vars"])):
            old, new = recorded["env"]["vars"].get(name, "undeclared"), now["env"]["vars"].get(name, "undeclared")
            if "undeclared" not in (old, new):
                new = keyed_like(old, salt, name, os.environ.get(name))
            if old != new:
                item("env", name, old, new)
        rec_inputs = {canonical(k): v for k, v in recorded["inputs"].items()}  # an old record's absolute
        for name in sorted(set(rec_inputs) | set(now["inputs"])):  # paths in the project: as recorded now
            old, new = rec_inputs.get(name, "undeclared"), now["inputs"].get(name, "undeclared")
            if old != new:
                item("inputs", name, old, new)
        # the model: a checkpoint from before world format 2 has none -- "not recorded", a warning
        old_model, new_model = model_label(recorded.get("model")), model_label(now.get("model"))
        if old_model != new_model:
            item("model", "model", old_model, new_model, warning=NOT_RECORDED in (old_model, new_model))

    # what each step read
    for d in done:
        for kind, component in READ_COMPONENT.items():
            for key, old in d["reads"].get(kind, {}).items():
                new = world.get(kind, key, old)
                if new != old:
                    shown = canonical(key) if kind in ("inputs", "listings") else key
                    label = shown if kind != "listings" else f"listing of {shown}"
                    if kind == "sources":
                        label = f"source:{key}"
                    it = item(component, label, old, new)
                    it.steps.append(d["name"])
                    it.warning = False  # a step that called another model: drift, whatever the world says

    # artifacts exported to files, edited or replaced on disk
    producers = {}
    for d in done:
        for name in d["writes"]:
            producers[name] = d["name"]
    for name, (committed, path) in sorted(exports.items()):
        on_disk = digest_path(path)
        if on_disk not in (MISSING, committed):
            it = item("artifacts", f"{name} ({path})", committed, on_disk)
            if name in producers:
                it.steps.append(producers[name])

    report.items = list(items.values())
    return report


def affected_steps(report: DriftReport, done: list[dict[str, Any]], components: set[str], *,
                   closure: bool = True) -> list[str]:
    """Steps that read what drifted in ``components`` (direct), and with ``closure`` every later
    step that read their output, a state key or an artifact they produced (fills
    ``report.dependents``). On resume only the direct ones are invalidated: each dependent is
    re-checked when the step it depends on has run again, and runs again only if what it read
    now differs (early cutoff); the closure is the upper bound ``status --drift`` shows."""
    direct = {s for i in report.items if not i.warning and i.component in components for s in i.steps}
    affected: list[str] = []
    dirty_steps: set[str] = set()
    dirty_state: dict[str, str] = {}
    dirty_artifacts: dict[str, str] = {}
    for d in done:
        name = d["name"]
        if name not in direct:
            if not closure:
                continue
            reads = d["reads"]
            upstream = [s for s in reads.get("steps", []) if s in dirty_steps]
            upstream += [dirty_state[k] for k in reads.get("state", []) if k in dirty_state]
            upstream += [dirty_artifacts[a] for a in reads.get("artifacts", {}) if a in dirty_artifacts]
            if not upstream:
                continue
            report.dependents[name] = upstream[0]
        affected.append(name)
        dirty_steps.add(name)
        for k in d["produced"].get("state", {}):
            dirty_state[k] = name
        for a in d["writes"]:
            dirty_artifacts[a] = name
    return affected


def world_reads_changed(reads: dict[str, Any], now_of: Callable[[str, str, Any], Any]) -> bool:
    """Has anything in the world that a step read (files, listings, sources, env, packages)
    changed? (``now_of(kind, key, recorded)``, e.g. :meth:`WorldNow.get`; an environment value
    that cannot be compared counts as changed here: the step runs again rather than be reused.)"""
    return any(now_of(kind, key, old) != old for kind in READ_COMPONENT for key, old in reads.get(kind, {}).items())


def reads_dirty(reads: dict[str, Any], dirty: dict[str, Any]) -> bool:
    """Did a step read an output, a state key or an artifact that a recompute pass changed?
    (``reads.state`` ``["*"]``: unknown -- a record upgraded from format 1 -- any change counts.)"""
    state = set(reads.get("state", []))
    return bool(set(reads.get("steps", [])) & set(dirty["dirty_steps"])
                or state & set(dirty["dirty_state"]) or (state and "*" in dirty["dirty_state"])
                or ("*" in state and bool(dirty["dirty_state"]))
                or set(reads.get("artifacts", {})) & set(dirty["dirty_artifacts"]))


def changed_products(previous: dict[str, Any], now: dict[str, Any]) -> dict[str, set[str]]:
    """What a re-run step now produces differently: ``{"output": {"*"} or empty, "state": keys,
    "artifacts": names}``."""
    def diff(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
        return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}

    return {"output": {"*"} if previous.get("output") != now.get("output") else set(),
            "state": diff(previous.get("state", {}), now.get("state", {})),
            "artifacts": diff(previous.get("artifacts", {}), now.get("artifacts", {}))}


def rebaseline(state: dict[str, Any], report: DriftReport, components: set[str],
               now_of: Callable[[str, str], Any], versions: dict[str, str] | None = None) -> dict[str, Any]:
    """A new state whose done steps record the *current* digests for what drifted in
    ``components`` -- and, for ``code``, the current ``version`` of their step function
    (``versions``: ``fn -> version`` of the task code now) -- so that an accepted drift becomes the
    baseline and is not reported (or recomputed) again on a later resume. The step's ``key`` stays:
    it names the run (its model calls), which did not change."""
    touched = {s for i in report.items if i.component in components and not i.warning for s in i.steps}
    done = []
    for d in state["done"]:
        if d["name"] in touched:
            reads = {kind: ({k: now_of(kind, k) for k in v} if isinstance(v, dict) and READ_COMPONENT.get(kind) in components
                            else v)
                     for kind, v in d["reads"].items()}
            d = {**d, "reads": reads}
            if "code" in components and versions and versions.get(d["fn"], d["version"]) != d["version"]:
                d = {**d, "version": versions[d["fn"]]}
        done.append(d)
    return {**state, "done": done}


def accepted_items(report: DriftReport, components: set[str]) -> list[dict[str, Any]]:
    """What accepting the drift of ``components`` records on the checkpoints (``{"component",
    "key", "old", "new", "steps"}``): the drift the done ``steps`` were computed without. Drift no
    done step read changes no result: reported, re-baselined, not carried."""
    return [{"component": i.component, "key": i.key, "old": i.old, "new": i.new, "steps": list(i.steps)}
            for i in report.items if i.component in components and not i.warning and i.steps]


def merge_accepted(carried: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``carried`` accepted drift plus ``new``: the same ``(component, key)`` accepted again keeps
    its first ``old`` (what the steps were computed with), takes the latest ``new``, and the union
    of the steps."""
    out = [dict(a) for a in carried]
    for a in new:
        same = next((o for o in out if (o.get("component"), o.get("key")) == (a["component"], a["key"])
                     and "steps" in o), None)
        if same is None:
            out.append(dict(a))
        else:
            same["new"] = a["new"]
            same["steps"] = list(dict.fromkeys([*same["steps"], *a["steps"]]))
    return out


def accepted_after_run(accepted: list[dict[str, Any]], step: str) -> list[dict[str, Any]]:
    """The accepted drift once ``step`` has run again (in the world now): it no longer holds a
    result computed without that drift; an item whose every step ran again is gone. (An item
    recorded before ``steps`` was: kept, as it was.)"""
    out = []
    for a in accepted:
        if "steps" in a and step in a["steps"]:
            steps = [s for s in a["steps"] if s != step]
            if not steps:
                continue
            a = {**a, "steps": steps}
        out.append(a)
    return out
