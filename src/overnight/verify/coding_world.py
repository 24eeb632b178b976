"""The world of a coding task, and what changed in it, in words an agent can act on.

A coding agent's task depends on the repository it edits, not on installed Python packages. Its
world fingerprint is the ordinary :class:`~overnight.chain.records.WorldDoc` (so ``overnight
verify`` and ``status`` read it like any other), filled from the project:

=========== =====================================================================================
component   what is recorded
=========== =====================================================================================
code        ``git``: HEAD commit, current branch, the heads of ``main``/``master``/``trunk``, and the
            SHA-256 of every tracked file with uncommitted changes (``git status``; untracked files
            are not read). ``None`` outside a git work tree.
deps        lock files in the project root (:data:`LOCK_FILES`: Python's, npm/yarn/pnpm/bun,
            Cargo, Go, Bundler, Composer, Nix ...) by SHA-256; no installed packages (a coding
            agent's project is not the Python that runs overnight)
env         Python/platform of the server, and declared environment variables as keyed digests
            (:func:`overnight.verify.fingerprint.keyed`: never their values)
inputs      declared input files or directories, project-relative, by digest
=========== =====================================================================================

:func:`drift` compares a recorded world with the world now: the generic comparison
(:func:`overnight.verify.drift.detect`) for lock files, env and inputs, plus git -- how many commits
a branch moved, which files those commits and the working tree changed -- and which todo items
mention a changed file. Everything here runs ``git`` as a subprocess (never the network) and
hashes local files only.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from overnight.errors import ConfigError, SchemaError
from overnight.verify.fingerprint import LOCK_FILES as PY_LOCK_FILES
from overnight.verify.fingerprint import LOCK_GLOBS, MISSING, digest_path, keyed, runtime

LOCK_FILES = (*PY_LOCK_FILES, "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml",
              "bun.lockb", "bun.lock", "deno.lock", "Cargo.lock", "go.sum", "Gemfile.lock", "composer.lock",
              "flake.lock", "mix.lock", "Package.resolved", "packages.lock.json", "gradle.lockfile")
"""Lock files recorded (in the project root, not recursively), besides ``requirements*.txt``."""

TRUNKS = ("main", "master", "trunk")
"""Branches whose heads are recorded even when the agent works on another one ("main moved 3 commits")."""

GIT_TIMEOUT_S = 10.0


KIND = "coding-agent-task"
"""``spec["kind"]`` of a task written by the MCP server or the hooks (:mod:`overnight.mcp.tasks`)."""

MAX_ENTRIES = 1000
"""At most this many distinct ``inputs`` and at most this many ``env`` names in a coding task's spec
(``task_start`` refuses more, :func:`world_args` refuses a stored spec with more). Every checkpoint
-- each tool call, each hook, within the hooks' 45 s deadline -- hashes every input again, and the
agent writes the lists out in one ``task_start`` call (~10 tokens a path: 1,000 entries are ~10,000
tokens of arguments). A task that depends on more files declares their folder: one input covers a
whole tree. No process environment holds a thousand variables a task could depend on."""

MAX_ENTRY_BYTES = 4096
"""Longest ``inputs`` path and ``env`` name, in bytes (the file system encoding, UTF-8): PATH_MAX
on Linux (``<linux/limits.h>``; macOS and the BSDs allow 1,024) -- the kernel refuses a longer
path (ENAMETOOLONG), so no input longer than that can be hashed. POSIX sets no limit on a
variable's name; the same bound keeps a forged one from filling the agent's context."""

MAX_NAME_BYTES = 255
"""Longest component of an ``inputs`` path, in bytes: NAME_MAX of Linux, macOS and the BSDs (ext4,
APFS, XFS, btrfs; NTFS allows 255 UTF-16 units) -- a longer file name cannot exist."""


def _git(root: Path, *args: str) -> str | None:
    """``git -C root ARGS`` stdout, or None when git is missing, fails or ``root`` is no work tree."""
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                             env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.decode("utf-8", "surrogateescape")


def project_root(start: str | os.PathLike) -> Path:
    """The git work tree's top level containing ``start``, else ``start`` itself (absolute, resolved)."""
    top = _git(Path(start), "rev-parse", "--show-toplevel")
    return Path(top.strip()).resolve() if top and top.strip() else Path(start).resolve()


def git_state(root: Path) -> dict[str, Any] | None:
    """``{"head", "branch", "trunks": {name: sha}, "dirty": {path: digest}}`` of the work tree at
    ``root`` (``head`` None before the first commit, ``branch`` None when detached), or None when
    ``root`` is not in a git work tree. Two ``git`` processes; dirty files hashed from disk (a
    deleted one is ``"missing"``)."""
    status = _git(root, "status", "--porcelain=v2", "--branch", "-z", "--untracked-files=no")
    if status is None:
        return None
    head = branch = None
    dirty: dict[str, str] = {}
    fields = status.split("\0")
    i = 0
    while i < len(fields):
        f = fields[i]
        i += 1
        if f.startswith("# branch.oid "):
            oid = f[len("# branch.oid "):]
            head = None if oid == "(initial)" else oid
        elif f.startswith("# branch.head "):
            name = f[len("# branch.head "):]
            branch = None if name == "(detached)" else name
        elif f[:2] in ("1 ", "u "):
            path = f.split(" ", 8 if f[0] == "1" else 10)[-1]
            dirty[path] = digest_path(root / path)
        elif f[:2] == "2 ":
            path = f.split(" ", 9)[-1]
            dirty[path] = digest_path(root / path)
            i += 1  # the rename's original path
    return {"head": head, "branch": branch, "trunks": _trunks(root), "dirty": dict(sorted(dirty.items()))}


def _common_dir(root: Path) -> Path | None:
    """The repository's common git directory (where ``refs/`` and ``packed-refs`` live), found
    without running git: ``.git`` itself, or for a linked work tree the ``gitdir:`` it names and
    that one's ``commondir``."""
    dot = root / ".git"
    try:
        if dot.is_file():
            text = dot.read_text("utf-8").strip()
            if not text.startswith("gitdir:"):
                return None
            gitdir = (root / text[len("gitdir:"):].strip()).resolve()
        else:
            gitdir = dot
        common = gitdir / "commondir"
        return (gitdir / common.read_text("utf-8").strip()).resolve() if common.is_file() else gitdir
    except OSError:
        return None


def _trunks(root: Path) -> dict[str, str]:
    """``name -> sha`` of the :data:`TRUNKS` branches that exist. Read from the loose ref files and
    ``packed-refs`` (one ``git`` process less per checkpoint); through ``git for-each-ref`` when the
    layout is not the files backend (reftable) or cannot be read."""
    common = _common_dir(root)
    if common is not None and not (common / "reftable").exists():
        found: dict[str, str] = {}
        try:
            for t in TRUNKS:
                loose = common / "refs" / "heads" / t
                if loose.is_file():
                    found[t] = loose.read_text("ascii").strip()
            packed = common / "packed-refs"
            if packed.is_file() and len(found) < len(TRUNKS):
                for line in packed.read_text("utf-8", "replace").splitlines():
                    sha, _, ref = line.partition(" ")
                    if ref.startswith("refs/heads/") and ref[11:] in TRUNKS:
                        found.setdefault(ref[11:], sha)
            if all(re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", v) for v in found.values()):
                return dict(sorted(found.items()))
        except OSError:
            pass
    trunks: dict[str, str] = {}
    refs = _git(root, "for-each-ref", "--format=%(refname:short) %(objectname)", *(f"refs/heads/{t}" for t in TRUNKS))
    for line in (refs or "").splitlines():
        name, _, sha = line.partition(" ")
        if name and sha:
            trunks[name] = sha
    return trunks


def lock_files(root: Path) -> dict[str, str]:
    """``name -> digest`` of the lock files in ``root``."""
    found = {n: digest_path(root / n) for n in LOCK_FILES if (root / n).is_file()}
    for pattern in LOCK_GLOBS:
        found.update({p.name: digest_path(p) for p in sorted(root.glob(pattern)) if p.is_file()})
    return dict(sorted(found.items()))


def printable(value: Any, limit: int = 300) -> str:
    """One line of printable text for a stored value shown to an agent or a person: lone
    surrogates, control characters and line breaks escaped (as ``overnight log`` does with
    :func:`overnight.cli.render.safe`, which this layer -- and the hooks -- must not import), at
    most ``limit`` characters."""
    text = "" if value is None else str(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "[...]"


def encodable(path: str) -> bool:
    """Can ``path`` be a file name here (``os.fsencode`` takes it)?"""
    try:
        os.fsencode(path)
    except UnicodeError:
        return False
    return True


def utf8_safe(value: Any) -> Any:
    """``value`` with every lone surrogate (``"\\udc80"``) of its strings escaped as text
    (``\\udc80``), so it encodes as UTF-8: a str, or the dicts, lists and tuples of a JSON-like tree
    (keys included), rebuilt; any other value unchanged. Everything else -- line breaks included --
    is kept (:func:`printable` makes one line). For what goes out to an agent: the MCP SDK does not
    survive a lone surrogate in a result, and a hook's stdout is strict UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(utf8_safe(v) for v in value)
    return value


def input_problem(path: str) -> str | None:
    """Why ``path`` cannot be a declared input -- a project-relative path inside the project, as
    ``task_start`` records one -- or None. Checks the text only (nothing is read): not empty, no
    NUL, a file name here (:func:`encodable`), not absolute, no ``..``, at most
    :data:`MAX_ENTRY_BYTES` bytes with components of at most :data:`MAX_NAME_BYTES`."""
    if not path or "\0" in path or not encodable(path) or PurePosixPath(path).is_absolute() \
            or Path(path).is_absolute() or ".." in PurePosixPath(path).parts:
        return "is not a path inside the project"
    if len(os.fsencode(path)) > MAX_ENTRY_BYTES:
        return f"is longer than {MAX_ENTRY_BYTES} bytes (PATH_MAX), so it is no file's path"
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in PurePosixPath(path).parts):
        return f"has a component longer than {MAX_NAME_BYTES} bytes (NAME_MAX), so it is no file's path"
    return None


def env_problem(name: str) -> str | None:
    """Why ``name`` cannot be a declared environment variable name, or None: it must be non-empty
    printable text (no control character, line break, NUL or lone surrogate: ``str.isprintable``)
    of at most :data:`MAX_ENTRY_BYTES` bytes of UTF-8."""
    if not name:
        return "is empty"
    if not name.isprintable():
        return "has a control character or a lone surrogate"
    if len(name.encode("utf-8")) > MAX_ENTRY_BYTES:
        return f"is longer than {MAX_ENTRY_BYTES} bytes"
    return None


def unique_inputs(paths: list[str]) -> list[str]:
    """``paths`` without repeats, first spelling kept, in order: ``a``, ``./a``, ``a/`` and
    ``a//.`` name one path (compared as ``PurePosixPath``)."""
    seen: set[PurePosixPath] = set()
    out = []
    for p in dict.fromkeys(paths):
        key = PurePosixPath(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def world_args(spec: dict[str, Any], root: Path, task_id: str | None) -> tuple[list[str], list[str], bytes]:
    """``(inputs, env, salt)`` of a coding task's stored spec for :func:`world` in the project ``root``, checked.

    They are stored data: each input must be a project-relative path that stays inside the
    project (:func:`input_problem`: no absolute path, no ``..``, no path longer than PATH_MAX; and
    no parent folder that is a symlink leading out -- ``task_start`` never records one), each env
    entry a printable name (:func:`env_problem`), the salt hex. Repeated entries count once
    (:func:`unique_inputs`; the order is kept); more than :data:`MAX_ENTRIES` distinct ones is an
    error. Compared as strings first; only this project's own folders are resolved.

    Raises:
        SchemaError: a field is not what ``task_start`` writes (the store was changed); the message
            names the task and the field, the value escaped (:func:`printable`).
        ConfigError: an input's folder in the project is now a symlink leading outside it.
    """
    def bad(what: str) -> SchemaError:
        return SchemaError(f"task {task_id!r}: its stored spec {what}; task_start never records that, so the "
                           "store was changed by someone else: nothing was read or written",
                           task_id=task_id, hint="check the store (task_verify, `overnight verify`) and start a "
                           "new task with task_start")

    inputs, env, salt = spec.get("inputs", []), spec.get("env", []), spec.get("salt", "")
    if not isinstance(inputs, list) or not all(isinstance(p, str) for p in inputs):
        raise bad("'inputs' is not a list of paths")
    if not isinstance(env, list) or not all(isinstance(n, str) for n in env):
        raise bad("'env' is not a list of variable names")
    if not isinstance(salt, str):
        raise bad("'salt' is not a string")
    try:
        salt_bytes = bytes.fromhex(salt)
    except ValueError:
        raise bad(f"'salt' {printable(salt, 40)!r} is not hex") from None
    env = list(dict.fromkeys(env))
    if len(env) > MAX_ENTRIES:
        raise bad(f"'env' names {len(env)} variables, more than {MAX_ENTRIES}")
    for n in env:
        problem = env_problem(n)
        if problem:
            raise bad(f"'env' has the variable name {printable(n, 120)!r}, which {problem}")
    inputs = list(dict.fromkeys(inputs))
    if len(inputs) > MAX_ENTRIES:
        raise bad(f"'inputs' declares {len(inputs)} paths, more than {MAX_ENTRIES}")
    inputs = unique_inputs(inputs)
    for p in inputs:
        problem = input_problem(p)
        if problem:
            raise bad(f"'inputs' declares the input {printable(p, 120)!r}, which {problem}")
        full = root / p
        if full == root:
            continue
        try:
            parent = full.parent.resolve()
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"the folder of input {printable(p, 120)!r} cannot be resolved: {printable(exc)}",
                              task_id=task_id) from None
        if parent != root and root not in parent.parents:
            raise ConfigError(f"input {printable(p, 120)!r} is outside the project {printable(root, 1000)}: a folder "
                              "on its way is a symlink leading out of it", task_id=task_id,
                              hint="replace the symlink with the folder, or start a new task")
    return inputs, env, salt_bytes


def world(root: Path, *, inputs: list[str] = (), env: list[str] = (), salt: bytes = b"",  # type: ignore[assignment]
          task_id: str | None = None) -> dict[str, Any]:
    """The world fingerprint of a coding task now: a :class:`~overnight.chain.records.WorldDoc` tree
    (module docstring). ``inputs`` are project-relative paths, ``env`` variable names (both as
    :func:`world_args` returns them).

    Raises:
        ConfigError: a declared input exists but cannot be read (permissions, an I/O error); the
            message names the input and ``task_id``.
    """
    hashed = {}
    for p in sorted(inputs):
        try:
            hashed[p] = digest_path(root / p)
        except OSError as exc:
            raise ConfigError(f"task {task_id!r}: its declared input {printable(p, 120)!r} cannot be "
                              f"read: {printable(exc.strerror or exc)}", task_id=task_id,
                              hint="make the file readable, or start a new task without it") from None
    return {
        "format": 1,
        "code": {"task": "1", "steps": {}, "git": git_state(root)},
        "deps": {"packages": {}, "locks": lock_files(root)},
        "env": {**runtime(), "vars": {n: keyed(salt, n, os.environ.get(n)) for n in sorted(env)}},
        "inputs": hashed,
    }


@dataclass
class CodingDrift:
    """What changed since a checkpoint, for a coding agent.

    Attributes:
        lines: the report in words, most important first ("main moved 3 commits (...)", "uv.lock
            changed", "todo items 2 and 5 mention files that changed: ...").
        items: one ``{"component", "key", "old", "new"}`` per change (as ``overnight status --drift``).
        changed_files: project-relative paths that changed (commits, working tree, lock files,
            declared inputs), sorted.
        todo: ``{"index" (1-based), "item", "files"}`` for each todo item that mentions one of them.
    """

    checkpoint_id: str | None
    lines: list[str] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)
    changed_files: list[str] = field(default_factory=list)
    todo: list[dict[str, Any]] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        return bool(self.items)

    def describe(self) -> str:
        return "\n".join(self.lines) if self.lines else "no drift: the project is as the checkpoint recorded it"

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "drifted": self.drifted, "lines": self.lines,
                "items": self.items, "changed_files": self.changed_files, "todo": self.todo}


def _short(sha: str | None) -> str:
    return sha[:7] if sha else "none"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _some(names: list[str], limit: int = 6) -> str:
    """The first ``limit`` of ``names`` (file paths from git or a spec), escaped (:func:`printable`)."""
    return ", ".join(printable(n, 200) for n in names[:limit]) + (f" (+{len(names) - limit} more)"
                                                                  if len(names) > limit else "")


def _commits(root: Path, old: str, new: str) -> tuple[str, list[str]]:
    """How ``old`` relates to ``new`` in words, and the files that differ between them."""
    if _git(root, "cat-file", "-e", f"{old}^{{commit}}") is None:
        return f"{_short(old)} -> {_short(new)} (the old commit is no longer in the repository)", []
    files = [f for f in (_git(root, "diff", "--name-only", "-z", old, new) or "").split("\0") if f]
    if _git(root, "merge-base", "--is-ancestor", old, new) is not None:
        n = int((_git(root, "rev-list", "--count", f"{old}..{new}") or "0").strip() or 0)
        return f"moved {_plural(n, 'commit')} ({_short(old)} -> {_short(new)})", files
    if _git(root, "merge-base", "--is-ancestor", new, old) is not None:
        n = int((_git(root, "rev-list", "--count", f"{new}..{old}") or "0").strip() or 0)
        return f"moved back {_plural(n, 'commit')} ({_short(old)} -> {_short(new)}: a reset)", files
    return (f"moved to {_short(new)}, which does not contain {_short(old)} (a rebase, a reset or another "
            f"branch)"), files


def _mentions(text: str, path: str) -> bool:
    """Does a todo item's text name ``path`` (the path itself, or its file name when that has an
    extension and 4+ characters)?"""
    if path in text:
        return True
    name = path.rsplit("/", 1)[-1]
    return "." in name and len(name) >= 4 and re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text) is not None


def drift(root: Path, recorded: dict[str, Any] | None, now: dict[str, Any], *, checkpoint_id: str | None,
          todo: list[str], salt: bytes = b"") -> CodingDrift:
    """Compare the world recorded with a checkpoint (None: none was recorded) with ``now``
    (:func:`world`); ``todo`` is the checkpoint's todo list, in order."""
    from overnight.verify.drift import detect

    out = CodingDrift(checkpoint_id)
    if recorded is None:
        out.lines.append("this checkpoint recorded no world fingerprint: drift cannot be checked")
        return out
    changed: set[str] = set()
    rg, ng = recorded["code"].get("git"), now["code"].get("git")
    if rg is not None and ng is None:
        out.lines.append("the project is no longer a git work tree")
        out.items.append({"component": "code", "key": "git", "old": rg.get("head"), "new": None})
    elif rg is not None and ng is not None:
        if rg["branch"] != ng["branch"]:
            out.lines.append(f"branch changed: {printable(rg['branch'] or '(detached)', 200)} -> "
                             f"{printable(ng['branch'] or '(detached)', 200)}")
            out.items.append({"component": "code", "key": "git branch", "old": rg["branch"], "new": ng["branch"]})
        if rg["head"] != ng["head"] and ng["head"] and rg["head"]:
            how, files = _commits(root, rg["head"], ng["head"])
            on = f" ({printable(ng['branch'], 200)})" if ng["branch"] else ""
            out.lines.append(f"HEAD{on} {how}"
                             + (f", changing {_plural(len(files), 'file')}: {_some(files)}" if files else ""))
            out.items.append({"component": "code", "key": "git HEAD", "old": rg["head"], "new": ng["head"]})
            changed.update(files)
        for name, old in sorted(rg.get("trunks", {}).items()):
            new = ng.get("trunks", {}).get(name)
            if new != old and name != ng["branch"]:
                how = _commits(root, old, new)[0] if new else "was deleted"
                out.lines.append(f"{name} {how}")
                out.items.append({"component": "code", "key": f"git {name}", "old": old, "new": new})
        dirty = [p for p in sorted(set(rg["dirty"]) | set(ng["dirty"]))
                 if rg["dirty"].get(p) != ng["dirty"].get(p) and not (p in changed and p not in ng["dirty"])]
        if dirty:
            out.lines.append(f"working tree: {_plural(len(dirty), 'file')} changed since the checkpoint "
                             f"(uncommitted edits made, changed or dropped): {_some(dirty)}")
            for p in dirty:
                out.items.append({"component": "code", "key": f"file {p}", "old": rg["dirty"].get(p, "committed"),
                                  "new": ng["dirty"].get(p, "committed")})
            changed.update(dirty)
    report = detect(checkpoint_id=checkpoint_id, recorded=recorded, now=now, done=[], step_versions={}, exports={},
                    salt=salt, sources={})
    locks, inputs, env = [], [], []
    for it in report.items:
        if it.warning:
            continue
        out.items.append({"component": it.component, "key": it.key, "old": it.old, "new": it.new})
        if it.key.startswith("lock file "):
            name = it.key[len("lock file "):]
            state = "appeared" if it.old == MISSING else "was removed" if it.new == MISSING else "changed"
            locks.append(f"{printable(name, 200)} {state}")
            changed.add(name)
        elif it.component == "inputs":
            state = "was removed" if it.new == MISSING else "changed"
            inputs.append(f"{printable(it.key, 200)} {state}")
            changed.add(it.key)
        elif it.component == "env":
            key = printable(it.key, 200)
            env.append(f"{key} {it.old} -> {it.new}" if it.key in ("python", "implementation", "platform")
                       else f"{key} changed" if "unset" not in (it.old, it.new)
                       else f"{key} {'was unset' if it.new == 'unset' else 'was set'}")
    if locks:
        out.lines.append("; ".join(locks) + " (dependencies may differ: reinstall before running tests)")
    if inputs:
        out.lines.append("declared inputs: " + "; ".join(inputs))
    if env:
        out.lines.append("environment: " + "; ".join(env))
    out.changed_files = sorted(changed)
    for i, text in enumerate(todo, 1):
        files = [f for f in out.changed_files if _mentions(text, f)]
        if files:
            out.todo.append({"index": i, "item": text, "files": files})
    if out.todo:
        idx = [str(t["index"]) for t in out.todo]
        which = idx[0] if len(idx) == 1 else ", ".join(idx[:-1]) + " and " + idx[-1]
        files = sorted({f for t in out.todo for f in t["files"]})
        out.lines.append(f"todo item{'s' if len(idx) > 1 else ''} {which} mention{'' if len(idx) > 1 else 's'} "
                         f"files that changed: {_some(files)} -- re-read them before continuing")
    return out
