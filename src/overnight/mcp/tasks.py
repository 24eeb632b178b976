# Over 600 lines: the MCP tool set for coding-agent tasks, one function per tool (split by tool group once the parallel MCP work lands).
"""Coding-agent tasks as ordinary overnight checkpoints: the engine behind ``overnight mcp`` and the hooks.

A coding agent (Claude Code, Codex, opencode) does not run overnight's runner: it calls tools
(:mod:`overnight.mcp.server`) and its hooks run commands (:mod:`overnight.hooks`). Each call that
changes the task commits one ordinary checkpoint through the same write path as every other
writer (:class:`~overnight.chain.write.ChainWriter`, as the LangGraph and Agents SDK adapters do),
so ``overnight show/log/verify/fork/gc`` work on it unchanged. How the control point maps onto the
checkpoint format (``docs/FORMAT.md``):

=====================  ==========================================================================
control point          checkpoint
=====================  ==========================================================================
task id, goal          ``state.task`` (spec ``{"kind": "coding-agent-task", "project", "plan",
                       "expected_span_s", "criticality", "inputs", "env", "salt", "route"}``)
todo items             ``state.todo``: one entry per item, ``name`` = the item's text, ``fn`` = ``agent``
done items             ``state.done``: one entry per item (``fn`` = ``agent``, ``seq`` = the checkpoint
                       that recorded it)
decisions              ``state.data.decisions`` (appended, never rewritten)
notes (last summary)   ``state.context.summary``; ``context.compactions`` counts compactions
artifacts              ``state.artifacts``: text by name, project files as ``files/<path>``,
                       transcripts as ``transcripts/<session>.jsonl`` -- content-addressed blobs
                       (an appended transcript stores only its new chunks)
the world              ``fingerprint.world`` (:mod:`overnight.verify.coding_world`): git, lock files, env, inputs
why                    ``event``: ``init`` (task_start), ``step`` (task_checkpoint, a stop hook),
                       ``compaction`` (a pre-compact hook: the session count moves on)
=====================  ==========================================================================

Every commit moves the branch by compare-and-swap; when another process (a hook beside the server)
moved it first, the change is applied again to the new head, so no acknowledged update is lost.
A commit is durable when the call returns.

**The project root is this process's, never the store's.** Every file operation -- reading an
artifact's file, hashing the world (git, lock files, declared inputs), writing the project's
current-task pointer -- happens in :attr:`CodingTasks.project`, the folder the agent works in. The
``project`` recorded in the spec is informational: a store is data, and whoever can write it (a
shared PostgreSQL schema, an S3 bucket, a copied SQLite file) must not choose which folder is
read or written. The same holds for a project moved or copied: the task follows the folder it is
resumed in, and the control point says ``project moved: recorded at OLD, now NEW`` until the next
checkpoint made there records the new folder. The other
stored spec fields the world uses are checked before use (:meth:`CodingTasks._world_args`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import unicodedata
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from overnight.codec.canonical import dumps_sorted, from_tree, loads, to_tree
from overnight.config import mask_password
from overnight.errors import (
    BranchNotFound,
    ConfigError,
    StaleHead,
    StoreUnavailable,
    TaskNotFound,
    short_id,
)
from overnight.verify.coding_world import (
    KIND,
    MAX_ENTRIES,
    CodingDrift,
    drift,
    env_problem,
    input_problem,
    printable,
    project_root,
    unique_inputs,
    world,
    world_args,
)
from overnight.verify.coding_world import encodable as _encodable
from overnight.runtime.task import CRITICALITY, parse_span, step_key, todo_entry
from overnight.store import Store, default_store_url, open_store
from overnight.store import exists as store_exists
from overnight.store.base import TaskRow
from overnight.store.blobs import BlobWriter
from overnight.chain.write import ChainWriter, utc_now
from overnight.chain.read import Fallback, load_head
from overnight.chain.rollback import refuse_rollback
from overnight.chain.integrity import encode_state, signing_key_from_env
from overnight.chain.records import artifact_ref, context_info, done_entry, event, initial_state

__all__ = ["KIND", "POINTER", "ArtifactIn", "CheckpointResult", "CodingTasks", "ControlPoint", "Resumed",
           "confirm_pointer", "pointer_confirmed", "pointer_store", "read_pointer", "render_control_point",
           "write_pointer"]


AGENT_FN = "agent"
"""``fn`` of the todo and done entries of a coding-agent task (no step function runs them)."""

POINTER = Path(".overnight") / "current-task"
"""The project's current task, relative to the project root: JSON ``{"task_id", "branch", "store",
"root"}``, written by ``task_start`` and ``task_resume`` (:func:`write_pointer`: a store in the
project recorded relative to it), read by the hooks (module :mod:`overnight.hooks`;
:func:`pointer_store` resolves the store)."""

COMMIT_ATTEMPTS = 20
_SLUG = re.compile(r"[^a-z0-9]+")


def _slug(goal: str) -> str:
    """The readable part of a new coding task's id: the goal's words in ASCII (accents dropped,
    ``"Réécrire l'API"`` -> ``reecrire-l-api``; a task id is ASCII), joined by ``-``, at most 40
    characters, cut at a word boundary when one is in the second half; ``task`` when nothing is left."""
    ascii_goal = unicodedata.normalize("NFKD", goal).encode("ascii", "ignore").decode("ascii")
    slug = _SLUG.sub("-", ascii_goal.lower()).strip("-")
    if len(slug) > 40:
        cut = slug[:41].rfind("-")
        slug = slug[:cut] if cut >= 20 else slug[:40]
    return slug.strip("-") or "task"


@dataclass
class ArtifactIn:
    """An artifact to store: ``text`` under ``name``, or the bytes of the project file ``path``
    (stored as ``name``, default ``files/<project-relative path>``). Exactly one of the two."""

    name: str | None = None
    text: str | None = None
    path: str | None = None


@dataclass
class ControlPoint:
    """What an agent needs to continue a task: the state of one checkpoint, in plain values."""

    task_id: str
    branch: str
    checkpoint_id: str
    seq: int
    created_at: str
    goal: str
    project: str
    """The project root every file operation uses: this process's (:attr:`CodingTasks.project`)."""
    plan: list[str]
    done: list[str]
    todo: list[str]
    decisions: list[str]
    summary: str | None
    artifacts: dict[str, int]
    """``name -> size`` in bytes."""
    compactions: int
    session: int
    recorded_project: str | None = None
    """The project the task's spec records (where it was started), as printable text (control
    characters escaped); None when the spec records none, or not as a string. Informational only."""
    project_moved: bool = False
    """The recorded project differs from :attr:`project`: the folder was moved or copied, or the
    task was started in another project."""

    def moved_line(self) -> str | None:
        """``project moved: recorded at OLD, now NEW`` when :attr:`project_moved`, else None."""
        if not self.project_moved:
            return None
        return f"project moved: recorded at {self.recorded_project}, now {printable(self.project, 1000)}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckpointResult:
    """A committed (or, when nothing changed, the existing) checkpoint."""

    task_id: str
    branch: str
    checkpoint_id: str
    seq: int
    done: int
    todo: int
    artifacts_added: list[str]
    unchanged: bool = False
    fallback: str | None = None
    """Set when the branch head failed verification and the commit continued from an older one."""

    def describe(self) -> str:
        if self.unchanged:
            return (f"nothing changed since checkpoint {short_id(self.checkpoint_id)} (seq {self.seq}) of "
                    f"{self.task_id}/{self.branch}: no new checkpoint")
        text = (f"checkpoint {short_id(self.checkpoint_id)} (seq {self.seq}) committed to {self.task_id}/{self.branch}: "
                f"{self.done} done, {self.todo} todo")
        if self.artifacts_added:
            text += f", stored {', '.join(self.artifacts_added)}"
        if self.fallback:
            text += f"\nwarning: {self.fallback}"
        return text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Resumed:
    """``task_resume``: the control point, the drift since it, and a fallback if the head was damaged."""

    control: ControlPoint
    drift: CodingDrift
    fallback: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"control": self.control.to_json(), "drift": self.drift.to_json(), "fallback": self.fallback}


def approx_tokens(text: str) -> int:
    """``ceil(UTF-8 bytes / 4)``: the token estimate hooks use (loading a vocabulary costs more than
    a hook's whole budget); the server counts with the real tokenizer."""
    return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4


def _fmt_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render_control_point(cp: ControlPoint, *, drift_report: CodingDrift | None = None, fallback: str | None = None,
                         budget_tokens: int = 1500, count: Callable[[str], int] = approx_tokens) -> str:
    """The control point as compact text within ``budget_tokens`` (as ``count`` counts them).

    Kept whole: the header, goal, project-moved, drift and fallback lines. Then, as the budget allows: the todo
    list (first items first), the last summary, decisions and done items (newest first), artifacts;
    whatever does not fit is replaced by a line saying how many were left out and which tool shows them.
    """
    head = [f"Task {cp.task_id} (branch {cp.branch}; checkpoint {short_id(cp.checkpoint_id)}, seq {cp.seq}, "
            f"{cp.created_at[:16].replace('T', ' ')} UTC; project {printable(cp.project, 1000)})",
            f"Goal: {cp.goal}"]
    moved = cp.moved_line()
    if moved:
        head.append(f"NOTE: {moved} (files are read and drift is checked here)")
    if fallback:
        head.append(f"WARNING: {fallback}")
    if drift_report is not None:
        head.append("Since this checkpoint:" + (" no drift" if not drift_report.lines else ""))
        head += [f"- {line}" for line in drift_report.lines]
    sections: list[tuple[str, list[str], str, bool]] = [
        (f"Todo ({len(cp.todo)}):", [f"{i}. {t}" for i, t in enumerate(cp.todo, 1)], "task_status", False),
        ("Last summary:", [cp.summary] if cp.summary else [], "task_resume", False),
        (f"Decisions ({len(cp.decisions)}, newest first):", [f"- {d}" for d in reversed(cp.decisions)], "task_resume", True),
        (f"Done ({len(cp.done)}, newest first):", [f"- {d}" for d in reversed(cp.done)], "task_log", True),
        (f"Artifacts ({len(cp.artifacts)}; artifact_read NAME):",
         [f"- {n} ({_fmt_size(s)})" for n, s in sorted(cp.artifacts.items())], "artifact_read", False),
    ]
    lines = list(head)
    used = count("\n".join(lines))
    for title, items, tool, _newest in sections:
        if not items:
            continue
        cost = count(title) + 1
        if used + cost > budget_tokens:
            lines.append(f"({title.rstrip(':')} left out: over the {budget_tokens}-token budget)")
            continue
        kept = [title]
        used += cost
        for k, item in enumerate(items):
            c = count(item) + 1
            if used + c > budget_tokens:
                if k == 0 and c > 40:  # a long single item (a summary): keep its start
                    room = max(0, (budget_tokens - used - 12) * 4)
                    if room > 80:
                        kept.append(item[:room] + " [...]")
                        used = budget_tokens
                        k += 1
                if len(items) - k > 0:
                    kept.append(f"  (+{len(items) - k} more: {tool})")
                break
            kept.append(item)
            used += c
        lines += kept
    return "\n".join(lines)


def read_pointer(start: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """``(project root, {"task_id", "branch", "store", "root"})`` from the nearest :data:`POINTER`
    at or above ``start`` (as git finds ``.git``), or None when there is none. ``store`` is as
    written (relative for a store in the project): :func:`pointer_store` resolves it.

    The file is data (a copied or edited project carries whatever it says): a value of the wrong
    type is a ConfigError, never used."""
    p = Path(start).resolve()
    for d in (p, *p.parents):
        f = d / POINTER
        try:
            data = json.loads(f.read_text("utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{f} is not a readable overnight task pointer: {exc}",
                              hint="call task_start or task_resume again to rewrite it") from exc
        if not isinstance(data, dict) or not isinstance(data.get("task_id"), str):
            raise ConfigError(f"{f} does not name a task", hint="call task_start or task_resume again to rewrite it")
        for field in ("branch", "store", "root"):
            if not isinstance(data.get(field, ""), str) or data.get(field) == "":
                raise ConfigError(f"{f}: {field} is not a non-empty string",
                                  hint="call task_start or task_resume again to rewrite it", task_id=data["task_id"])
        return d, data
    return None


def _local_store(url: str) -> tuple[str, Path] | None:
    """``(prefix, path)`` of a store URL naming a local path (``sqlite://PATH``, ``file://PATH`` or
    a bare path; prefix ``sqlite://``, ``file://`` or ``""``); None for a server or a bucket."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", Path(url)
    if scheme.lower() in ("sqlite", "file") and rest:
        return f"{scheme}://", Path(rest)
    return None


def write_pointer(root: Path, task_id: str, branch: str, store_url: str) -> None:
    """Make ``task_id``/``branch`` the project's current task: ``<root>/.overnight/current-task``
    replaced atomically and durably (:func:`overnight.keys.write_file_atomic`: a temporary file of
    this writer's own, fsynced, renamed over it, the folder fsynced), so concurrent writers never
    clobber one another's temporary file and a reader sees one whole pointer.

    A store inside the project (the default ``.overnight/overnight.db``) is recorded relative to
    ``root`` (``sqlite://.overnight/overnight.db``), so the pointer stays right when the project
    folder is moved or copied (the store goes with it); a store outside it (or a server) as given.
    ``root`` is recorded too: it marks this format (:func:`pointer_store`).

    A store outside the project (another folder, a server, a bucket) is also *confirmed*: the
    ``(project root, task id, store URL)`` triple is recorded in this user's state folder
    (:func:`confirm_pointer`), because the pointer file itself is data any repository can carry
    and :func:`pointer_store` uses such a store only when this machine wrote it."""
    root = Path(root).resolve()
    confirm = store_url = _canonical_store(store_url)  # relative to the cwd, and through symlinks (a copy
    local = _local_store(store_url)  # must not keep a link to the original's store)
    if local is not None:
        path = Path(local[1])
        if path != root and path.is_relative_to(root):
            store_url = local[0] + path.relative_to(root).as_posix()
    d = root / POINTER.parent
    d.mkdir(parents=True, exist_ok=True)
    ignore = d / ".gitignore"
    if not ignore.exists():  # the store and the pointer are not the project's source
        ignore.write_text("*\n", "utf-8")
    from overnight.keys import write_file_atomic

    doc = {"task_id": task_id, "branch": branch, "store": store_url, "root": str(root)}
    # a temporary file of this writer's own (two threads or processes pointing at once each rename a
    # whole file), fsynced, the folder fsynced after the rename; mode 0666 less the umask, as before
    write_file_atomic(root / POINTER, (json.dumps(doc) + "\n").encode("utf-8"), mode=0o666)
    if not _inside(confirm, root):
        confirm_pointer(root, task_id, confirm)


CONFIRMED_FILE = "confirmed-pointers.json"
"""The per-user file (in :func:`~overnight.keys.state_dir`) of the current-task pointers this user's
own ``task_start``/``task_resume`` wrote with a store outside the project: JSON ``{"version": 1,
"entries": [{"key", "root", "task_id", "store"}]}``, ``key`` the SHA-256 of the exact triple (the
``store`` shown has its password masked), mode 0600. Updated only under an exclusive ``flock`` on
the sibling ``confirmed-pointers.json.lock`` and replaced whole by a rename, so concurrent
confirmations (two hooks, a hook and the MCP server) never lose one another's entries and a reader
never sees a partly written file."""
CONFIRMED_MAX = 200
"""Entries kept in :data:`CONFIRMED_FILE` (the newest; an older pointer needs ``task_resume`` again)."""


def _canonical_store(url: str) -> str:
    """``url`` as compared in :data:`CONFIRMED_FILE`: a local store as its absolute, resolved path
    (symbolic links followed), anything else as written."""
    local = _local_store(url)
    if local is None:
        return url
    return local[0] + str(Path(os.path.abspath(local[1])).resolve())


def _inside(url: str, root: Path) -> bool:
    """Whether ``url`` (canonical, :func:`_canonical_store`) is a local store inside ``root``."""
    local = _local_store(url)
    return local is not None and Path(local[1]).resolve().is_relative_to(Path(root).resolve())


def _confirm_key(root: str | os.PathLike, task_id: str, url: str) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([str(Path(os.path.normpath(root))), task_id, url]).encode("utf-8")).hexdigest()


CONFIRMED_MAX_BYTES = 1 << 20
"""A :data:`CONFIRMED_FILE` larger than this is damaged (200 entries take about 100 KB)."""
CONFIRMED_LOCK_S = 10.0
"""How long a confirmation waits for another process's lock on :data:`CONFIRMED_FILE` (s) before it
gives up (the pointer then needs ``task_resume`` again, as when the folder cannot be written)."""


def _confirmed_entries(path: Path) -> list[dict[str, Any]]:
    from overnight.keys import read_cache_file

    # missing, damaged or not a regular file (a FIFO is opened without blocking): nothing confirmed
    data = read_cache_file(path, CONFIRMED_MAX_BYTES)
    entries = data.get("entries") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("key"), str)] if isinstance(entries, list) else []


def confirm_pointer(root: Path, task_id: str, store_url: str) -> None:
    """Record that this user pointed the project ``root`` at ``task_id`` in ``store_url`` (a store
    outside the project) in :data:`CONFIRMED_FILE`, the newest :data:`CONFIRMED_MAX` entries kept:
    read, changed and written back under an exclusive lock (:func:`~overnight.keys.state_file_lock`), so a
    confirmation made at the same time by another process (a hook, the MCP server) is kept too;
    written atomically (a temporary file in the same folder, mode 0600, fsynced, then renamed over
    the file, the folder fsynced). A damaged file counts as empty and is replaced. A state folder
    that cannot be written is not an error here: the hooks then refuse that store and say how to
    fix it."""
    from overnight.keys import state_dir, state_file_lock, write_file_atomic

    url = _canonical_store(store_url)
    key = _confirm_key(Path(root).resolve(), task_id, url)
    path = state_dir() / CONFIRMED_FILE

    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with state_file_lock(path, CONFIRMED_LOCK_S) as held:
            if not held:
                return
            entries = [e for e in _confirmed_entries(path) if e["key"] != key]
            entries.append({"key": key, "root": str(Path(root).resolve()), "task_id": task_id,
                            "store": mask_password(url)})
            doc = json.dumps({"version": 1, "entries": entries[-CONFIRMED_MAX:]}) + "\n"
            write_file_atomic(path, doc.encode("utf-8"))  # removes its temporary file when it fails
    except OSError:
        pass


def pointer_confirmed(roots: Iterable[str | os.PathLike], task_id: str, store_url: str) -> bool:
    """Whether :func:`confirm_pointer` recorded ``task_id`` in ``store_url`` for one of ``roots``."""
    from overnight.keys import state_dir

    url = _canonical_store(store_url)
    keys = {_confirm_key(r, task_id, url) for r in roots}
    return any(e["key"] in keys for e in _confirmed_entries(state_dir() / CONFIRMED_FILE))


def _trusted(root: Path, pointer: dict[str, Any], url: str) -> str:
    """``url`` when :func:`pointer_store` may use it for ``pointer`` (found in ``root``): a local
    store inside ``root`` (resolved: neither ``..`` nor a symbolic link leads out), or a triple this
    user confirmed (:func:`pointer_confirmed`) for ``root`` or for the root the pointer records (a
    project moved since); else ConfigError -- nothing is read from or written to that store."""
    canonical = _canonical_store(url)
    if _inside(canonical, root):
        return url
    task_id = pointer.get("task_id")
    roots = [root] + ([pointer["root"]] if os.path.isabs(pointer.get("root") or "") else [])
    if isinstance(task_id, str) and pointer_confirmed(roots, task_id, canonical):
        return url
    shown = repr(task_id)[:80]
    raise ConfigError(
        f"the current-task pointer {root / POINTER} names the store {mask_password(canonical)} outside the project "
        f"at {root}, which this machine never pointed it at (the pointer may come from the repository: a file "
        f"committed to it or edited by hand): not used for task {shown}, nothing was read from or written to it",
        hint=f"if that is your task's store, call task_resume(task_id={shown}) with the MCP server run in this "
             "project (which confirms it for this machine), or pass --store / set OVERNIGHT_STORE to the store "
             "the task lives in")


def _owner_pointer(path: Path, root: Path, task_id: str) -> Path | None:
    """The :data:`POINTER` of another project, above ``path``, that names ``task_id`` too: ``path``
    is that project's store (``root`` is a copy of it), or None."""
    for d in path.parents:
        f = d / POINTER
        if d != root and f.is_file():
            try:
                data = json.loads(f.read_text("utf-8"))
            except (OSError, ValueError):
                return None
            return f if isinstance(data, dict) and data.get("task_id") == task_id else None
    return None


def pointer_store(root: Path, pointer: dict[str, Any]) -> str | None:
    """The store URL of a pointer :func:`read_pointer` found in the project root ``root``: absolute,
    naming a store that exists; None when the pointer names none (the default store then).

    The rule, for a local store (``sqlite://``, ``file://``, a bare path; a server URL is used as
    written):

    1. a relative path (what :func:`write_pointer` writes for a store in the project) is taken
       against ``root``, wherever the project has been moved or copied to;
    2. an absolute path inside ``root`` is used as written;
    3. an absolute path outside ``root`` in a pointer that records its ``root`` (this format) is
       a store outside the project, shared by design: used as written -- unless it lies inside
       the recorded root (a hand-made pointer), then it is taken as rule 1 with its path relative
       to that root;
    4. an absolute path outside ``root`` in an old pointer (no ``root``: every path absolute) was
       most likely written in the project's old folder (moved or copied since): if the current
       project has a store at the same path relative to some folder above the recorded one (the
       longest such tail first: ``.../old/app/.overnight/overnight.db`` -> ``.overnight/overnight.db``),
       that one is used -- the project's own store, moved or copied with it, so a copy's
       checkpoints go to the copy's store, never to the original's. Else the recorded path,
       unless a project above it has its own pointer naming the same task (the recorded store
       is that project's, of which this one is a copy without its store): StoreUnavailable.

    A store that does not exist is never created from a pointer (a stale one would leave an empty
    store at the old path): StoreUnavailable naming the pointer file and the missing store. Nor is
    a path that exists but holds no store (:func:`_is_store`: an empty file or folder, which
    opening would initialise): StoreUnavailable too, once the store is trusted (below), nothing
    created or changed there.

    **Trust.** The pointer is a file in the project, so a repository can carry one (committed past
    ``.overnight/.gitignore``) naming its author's store -- a hook would then send the user's
    transcripts there and put its goal text into the agent's context. So the store chosen above is
    used only when it is (a) a local store inside ``root`` (its resolved path: a ``..`` or a
    symbolic link leading out does not count), or (b) confirmed by this user on this machine:
    :func:`write_pointer` (``task_start``/``task_resume``) recorded the ``(root, task id, store)``
    triple in :data:`CONFIRMED_FILE`, for ``root`` or for the ``root`` the pointer records (a
    project moved since). Else ConfigError, the password in the URL masked, the hint naming
    ``task_resume``, ``--store`` and ``$OVERNIGHT_STORE`` (the user's own choices, always trusted:
    the caller uses them instead). A pointer naming no store stands for the default store, which
    an ``overnight.toml`` in the project may name: checked the same way unless ``$OVERNIGHT_STORE``
    is set.
    """
    url = pointer.get("store")
    task_id = pointer.get("task_id")
    f = root / POINTER
    hint = (f"call task_resume(task_id={task_id!r}) with the server run in this project to point it at the task's "
            "store, or set OVERNIGHT_STORE (or pass --store) to the store the task lives in")
    if url is None:  # a hand-made pointer: the default store, which an overnight.toml may name
        if not os.environ.get("OVERNIGHT_STORE"):
            default = _trusted(root, pointer, resolve_store_url(None, root))
            local = _local_store(default)
            if local is not None and local[1].exists():  # a missing one is a TaskNotFound when opened
                _refuse_non_store(local[0], local[1], f, task_id, hint)
        return None
    local = _local_store(url)
    if local is None:
        return _trusted(root, pointer, url)
    prefix, path = local
    written = pointer.get("root")
    if not path.is_absolute():
        chosen = root / path
    else:
        path = Path(os.path.normpath(path))
        chosen = path  # rule 2, and rule 3 for a store outside the project
        if path.is_relative_to(root):
            pass
        elif written is not None:
            old = Path(os.path.normpath(written))
            if old.is_absolute() and path.is_relative_to(old):
                chosen = root / path.relative_to(old)
        else:  # rule 4
            for above in reversed(path.parents[:-1]):  # longest tail first; never the file system root
                if (root / path.relative_to(above)).exists():
                    chosen = root / path.relative_to(above)
                    break
            else:
                owner = _owner_pointer(path, root, task_id) if path.exists() else None
                if owner is not None:
                    raise StoreUnavailable(
                        f"the current-task pointer {f} names the store {path}, which belongs to the project at "
                        f"{owner.parent.parent} (its pointer names the same task; this project at {root} looks like "
                        "a copy of it made without its store): not used, so this project's checkpoints do not land "
                        "in the other project's store",
                        location=str(path), task_id=task_id, hint=hint)
    chosen = Path(os.path.normpath(chosen))
    if not chosen.exists():
        raise StoreUnavailable(f"the current-task pointer {f} names the store {prefix}{chosen}, which does not "
                               "exist (the project moved or was copied without it?); nothing was created",
                               location=str(chosen), task_id=task_id, hint=hint)
    trusted = _trusted(root, pointer, f"{prefix}{chosen}")
    _refuse_non_store(prefix, chosen, f, task_id, hint)
    return trusted


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (https://sqlite.org/fileformat.html, 1.3)."""


def _is_store(prefix: str, path: Path) -> bool:
    """Whether the local ``path`` holds an overnight store already, judged without creating or
    changing anything: for ``file://`` a folder with the layout marker
    (:data:`overnight.store.layout.META_KEY`, written when the store is made); for ``sqlite://``
    or a bare path a regular file that starts with :data:`SQLITE_HEADER` (a new store's file has it
    before its first commit). An empty file or folder -- which opening would make a store of -- is not."""
    from overnight.store.layout import META_KEY

    try:
        if prefix.lower().startswith("file"):
            return path.is_dir() and (path / META_KEY).is_file()
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device is never opened
            return False
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _refuse_non_store(prefix: str, path: Path, pointer_file: Path, task_id: Any, hint: str) -> None:
    """StoreUnavailable when the local store ``path`` a pointer names exists but is no store
    (:func:`_is_store`): a pointer only ever opens a store that exists, so nothing is created there."""
    if not _is_store(prefix, path):
        what = "folder" if path.is_dir() else "file"
        raise StoreUnavailable(f"the current-task pointer {pointer_file} names the store {prefix}{path}, which is "
                               f"a {what} but not an overnight store (empty, or something else): not opened, nothing "
                               "was created or changed there", location=str(path), task_id=task_id, hint=hint)


def resolve_store_url(store: str | None, root: Path) -> str:
    """``store``, else the default (``$OVERNIGHT_STORE``, ``overnight.toml``, else
    ``sqlite://.overnight/overnight.db``), a relative ``sqlite://``/``file://`` path made absolute
    against the project root (hooks and the server may run in another directory)."""
    url = store or default_store_url()
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("sqlite", "file") and rest and not Path(rest).is_absolute():
        return f"{scheme}://{(root / rest).resolve()}"
    if not sep and not Path(url).is_absolute():
        return str((root / url).resolve())
    return url


@dataclass
class _Tip:
    """The head of one branch as this process last read or wrote it."""

    chain: ChainWriter
    state: dict[str, Any]
    world: dict[str, Any] | None
    created_at: str
    fallback: Fallback | None = None


def _unique(items: Iterable[str], taken: set[str]) -> list[str]:
    """Item texts made unique names (``"run tests"``, ``"run tests (2)"``), skipping names in ``taken``."""
    out = []
    for text in items:
        name, n = text, 2
        while name in taken:
            name, n = f"{text} ({n})", n + 1
        taken.add(name)
        out.append(name)
    return out


def _clean(items: list[str] | None, what: str, task_id: str | None) -> list[str] | None:
    if items is None:
        return None
    if isinstance(items, str) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{what} must be a list of strings", task_id=task_id)
    out = [i.strip() for i in items]
    if any(not i for i in out):
        raise ConfigError(f"{what} has an empty item", task_id=task_id, hint=f"drop it from {what}")
    return out


def _todo_entry(name: str) -> dict[str, Any]:
    return todo_entry(name, AGENT_FN, {}, None)


def _done_entry(name: str, seq: int, session: int, now: str) -> dict[str, Any]:
    return done_entry(name=name, fn=AGENT_FN, key=step_key(AGENT_FN, "1", name, {}), version="1", args={}, output=None,
                      reads={}, writes=[], added_by=None, produced={}, seq=seq, session=session, started_at=now,
                      duration_ms=0.0)


class CodingTasks:
    """Coding-agent tasks in one store, for one project (the tools of ``overnight mcp`` call these).

    Args:
        store: store URL (or a :class:`~overnight.store.Store`); None: the default store, its
            relative path taken against the project root.
        project: a directory in the project (default: the current directory); the project root is
            its git top level, else the directory itself. It is the root of every file operation
            on every task -- artifact files, the world fingerprint, the current-task pointer --
            whatever project a task's stored spec names: a store is data, and must not choose
            which folder is read or written (module docstring).
        key: HMAC signing key (default ``$OVERNIGHT_SIGNING_KEY``).
        session_id: stamped on every checkpoint (default: a fresh id per process).
        exact_root: ``project`` is the project root already (the hooks know it from the pointer):
            no ``git`` process to find it.

    Raises (from the methods): :class:`~overnight.errors.TaskNotFound`, ``BranchNotFound``,
    ``CheckpointNotFound``, ``ArtifactNotFound``, ``ConfigError`` (bad argument, a path outside the
    project, a task that is not a coding-agent task), ``IntegrityError`` (nothing verifies;
    ``SchemaError``: the stored spec's ``inputs``, ``env`` or ``salt`` is not what ``task_start``
    writes -- e.g. an input outside the project -- so the store was changed by someone else),
    ``StoreBusy``, ``StaleHead`` (the branch kept moving under :data:`COMMIT_ATTEMPTS` tries).
    """

    def __init__(self, store: Store | str | None = None, *, project: str | os.PathLike | None = None,
                 key: bytes | None = None, session_id: str | None = None, exact_root: bool = False) -> None:
        start = project if project is not None else Path.cwd()
        self.project = Path(start).resolve() if exact_root else project_root(start)
        self._own = not hasattr(store, "commit")
        self._store: Store | None = None if self._own else store  # type: ignore[assignment]
        self.url = resolve_store_url(store, self.project) if self._own else store.url  # type: ignore[union-attr]
        self.key = signing_key_from_env() if key is None else (key or None)
        self.session_id = session_id or uuid.uuid4().hex
        self._tips: dict[tuple[str, str], _Tip] = {}

    # -- store ----------------------------------------------------------------------------------

    def store(self, *, create: bool = False) -> Store:
        """The store, opened on first use. Without ``create`` a store that does not exist yet is a
        TaskNotFound (no task can be in it), never created."""
        if self._store is None:
            if not create and not store_exists(self.url):
                raise TaskNotFound(f"no store at {self.url}: no task has been started there",
                                   hint="call task_start first (or pass the store the task lives in)")
            self._store = open_store(self.url)
        return self._store

    def close(self) -> None:
        if self._own and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> "CodingTasks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------------

    def _spec(self, state: dict[str, Any]) -> dict[str, Any]:
        return state["task"]["spec"]

    def _recorded_project(self, spec: dict[str, Any]) -> tuple[str | None, bool]:
        """``(the spec's project as printable text or None, whether it differs from ours)``.

        Only compared as a string, never opened or resolved: it is stored data (module docstring);
        a value that is not a string is unknown."""
        raw = spec.get("project")
        if not isinstance(raw, str) or not raw:
            return None, False
        return printable(raw), raw != str(self.project)

    def _world_args(self, spec: dict[str, Any], task_id: str | None) -> tuple[list[str], list[str], bytes]:
        """:func:`~overnight.verify.coding_world.world_args` of ``spec`` in this process's project."""
        return world_args(spec, self.project, task_id)

    def _tip(self, task_id: str, branch: str, *, deep: bool = False) -> _Tip:
        s = self.store()
        ref = s.get_ref(task_id, branch)
        if ref is None:
            s.get_task(task_id)  # TaskNotFound
            raise BranchNotFound(f"task {task_id!r} has no branch {branch!r}", task_id=task_id,
                                 hint="task_log lists its branches")
        tip = self._tips.get((task_id, branch))
        if tip is not None and tip.chain.ref_head == ref and not deep:
            return tip
        seen: set[str] = set()
        loaded, fallback = load_head(s, task_id, branch, key=self.key, deep=deep, verified=seen)
        refuse_rollback(s, loaded, key=self.key, branch=branch, named=fallback.head_id if fallback else loaded.id,
                        skipped={k.checkpoint_id for k in fallback.skipped} if fallback else set())
        spec = loaded.doc.task.spec
        if spec.get("kind") != KIND:
            raise ConfigError(f"task {task_id!r} is not a coding-agent task (kind {spec.get('kind')!r})",
                              task_id=task_id, hint="the task_* tools work on tasks made by task_start; use the "
                              "overnight CLI for others")
        self._world_args(spec, task_id)  # refuse a forged spec before anything is read or written
        chain = ChainWriter(s, task_id, branch, key=self.key, session_id=self.session_id,
                            session_n=loaded.record.session.n)
        chain.start_from(loaded, fallback)
        chain.known = seen
        tip = self._tips[(task_id, branch)] = _Tip(chain, loaded.state_tree, loaded.world, loaded.record.created_at,
                                                    fallback)
        return tip

    def control_point(self, tip: _Tip, task_id: str, branch: str) -> ControlPoint:
        """The control point of ``tip``; ``project`` is this process's root, ``recorded_project``
        the spec's (informational)."""
        st = tip.state
        spec = self._spec(st)
        data = from_tree(st["data"], "state.data") if st["data"] is not None else {}
        plan = spec.get("plan")
        recorded, moved = self._recorded_project(spec)
        return ControlPoint(
            task_id=task_id, branch=branch, checkpoint_id=tip.chain.head or "", seq=tip.chain.seq,
            created_at=tip.created_at, goal=st["task"]["goal"], project=str(self.project),
            plan=[p for p in plan if isinstance(p, str)] if isinstance(plan, list) else [],
            done=[d["name"] for d in st["done"]], todo=[t["name"] for t in st["todo"]],
            decisions=list(data.get("decisions", [])), summary=st["context"]["summary"],
            artifacts={n: a["size"] for n, a in st["artifacts"].items()}, compactions=st["context"]["compactions"],
            session=tip.chain.session_n, recorded_project=recorded, project_moved=moved)

    def _world(self, spec: dict[str, Any], task_id: str | None) -> dict[str, Any]:
        """The world now, of this process's project (never the spec's recorded one)."""
        inputs, env, salt = self._world_args(spec, task_id)
        return world(self.project, inputs=inputs, env=env, salt=salt, task_id=task_id)

    # -- task_start -----------------------------------------------------------------------------

    def start(self, goal: str, *, plan: list[str] | None = None, expected_span: str | float | None = None,
              criticality: str = "normal", inputs: list[str] | None = None, env: list[str] | None = None,
              task_id: str | None = None, make_current: bool = True) -> ControlPoint:
        """Create a task and commit its first checkpoint (event ``init``); the plan becomes the todo
        list. ``inputs``: project files whose changes count as drift; ``env``: variable names
        recorded as keyed digests (at most :data:`~overnight.verify.coding_world.MAX_ENTRIES` of
        each; repeats count once). Makes it the project's current task (:data:`POINTER`).

        Raises ConfigError for a bad argument: an empty goal, an input outside the project or longer
        than PATH_MAX, an env name that is not printable text (what the stored spec is later held to:
        :func:`~overnight.verify.coding_world.world_args`)."""
        if not isinstance(goal, str) or not goal.strip():
            raise ConfigError("goal must be a non-empty string", hint="one sentence saying what the task is for",
                              task_id=task_id)
        plan = _clean(plan, "plan", task_id) or []
        if criticality not in CRITICALITY:
            raise ConfigError(f"criticality must be one of {', '.join(CRITICALITY)}, not {criticality!r}", task_id=task_id)
        span = None
        if expected_span is not None:
            span = parse_span(expected_span)
        rel_inputs, env = self._declared(inputs, env, task_id)
        slug = _slug(goal)
        task_id = task_id or f"code.{slug}.{secrets.token_hex(3)}"
        s = self.store(create=True)
        spec = {"kind": KIND, "project": str(self.project), "plan": plan, "expected_span_s": span,
                "criticality": criticality, "inputs": rel_inputs, "env": sorted(env), "salt": secrets.token_hex(16),
                "route": {"level": "durable", "media": [], "urls": [s.url],
                          "reasons": ["a coding-agent task (overnight mcp / hooks): a checkpoint per tool call or "
                                      "hook, each with the project's world fingerprint"]}}
        state = initial_state(task_id, goal.strip(), spec, todo=[_todo_entry(n) for n in _unique(plan, set())],
                              data=to_tree({"decisions": []}, "state.data"))
        chain = ChainWriter(s, task_id, "main", key=self.key, session_id=self.session_id, session_n=1)
        writer = chain.blob_writer()
        fp, now_world = self._fingerprint(writer, spec, task_id)
        row = TaskRow(task_id, utc_now(), goal.strip(), None, dumps_sorted(spec))
        chain.commit(state, event("init", detail=f"task_start: {len(plan)} planned items"), writer=writer,
                     task_row=row, fingerprint=fp)
        tip = self._tips[(task_id, "main")] = _Tip(chain, state, now_world, utc_now())
        if make_current:
            write_pointer(self.project, task_id, "main", s.url)
        return self.control_point(tip, task_id, "main")

    def _declared(self, inputs: list[str] | None, env: list[str] | None,
                  task_id: str | None) -> tuple[list[str], list[str]]:
        """``(inputs, env)`` of ``task_start`` as the spec records them: inputs project-relative
        (:meth:`_relative`), repeats dropped (first kept), each held to the rules
        :func:`~overnight.verify.coding_world.world_args` checks the stored spec with.

        Raises ConfigError naming the entry and the field."""
        if inputs is not None and (isinstance(inputs, str) or not all(isinstance(p, str) for p in inputs)):
            raise ConfigError("inputs must be a list of paths", task_id=task_id)
        env = list(dict.fromkeys(_clean(env, "env", task_id) or []))
        for field, n in (("inputs", len(set(inputs or []))), ("env", len(env))):
            if n > MAX_ENTRIES:
                raise ConfigError(f"{field} has {n} entries, more than {MAX_ENTRIES}", task_id=task_id,
                                  hint="declare the folder that holds the files (one input covers its whole tree)"
                                  if field == "inputs" else "declare only the variables the task depends on")
        for n in env:
            problem = env_problem(n)
            if problem:
                raise ConfigError(f"env: the variable name {printable(n, 120)!r} {problem}", task_id=task_id)
        rel = []
        for p in dict.fromkeys(inputs or []):
            r = self._relative(p)[0]
            problem = input_problem(r)
            if problem:
                raise ConfigError(f"inputs: the path {printable(p, 120)!r} {problem}", task_id=task_id)
            rel.append(r)
        return unique_inputs(rel), env

    def _fingerprint(self, writer: BlobWriter, spec: dict[str, Any],
                     task_id: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        now = self._world(spec, task_id)
        raw = encode_state(now)
        return {"world": {"digest": writer.put(raw), "size": len(raw)}, "exports": {}, "accepted": []}, now

    # -- task_checkpoint ------------------------------------------------------------------------

    def _relative(self, path: str) -> tuple[str, Path]:
        """``(project-relative posix path, resolved path)`` of a file inside the project -- this
        process's root (:attr:`project`), never a root read from the store.

        Raises ConfigError for a path outside the project (symlinks resolved) or not a file."""
        root = self.project.resolve()
        if not isinstance(path, str) or not path:
            raise ConfigError("a path must be a non-empty string")
        if "\0" in path or not _encodable(path):
            raise ConfigError(f"path {printable(path, 120)!r} is not a file name (a NUL or an unpaired surrogate)")
        p = Path(path)
        full = (p if p.is_absolute() else root / p).resolve()
        if full != root and root not in full.parents:
            raise ConfigError(f"path {path!r} is outside the project {root}",
                              hint="artifacts and inputs are files inside the project (relative paths are relative "
                              "to it); store other content as text")
        return full.relative_to(root).as_posix(), full

    def checkpoint(
        self,
        task_id: str,
        *,
        branch: str = "main",
        done: list[str] | None = None,
        todo: list[str] | None = None,
        notes: str | None = None,
        decisions: list[str] | None = None,
        artifacts: list[ArtifactIn] | None = None,
        blobs: dict[str, bytes] | None = None,
        skip_known_done: bool = False,
        step: str = "task_checkpoint",
        compaction: bool = False,
        session_id: str | None = None,
        detail: str | None = None,
    ) -> CheckpointResult:
        """Commit the task's control point updated with what the agent reports.

        Args:
            done: items finished since the last checkpoint (appended to the done list; each one
                also leaves the todo list if it is there).
            todo: the todo list now, replacing the stored one (None: keep it, minus ``done``).
            notes: where the work stands, in the agent's words: the "last summary" a resume shows.
            decisions: decisions taken (appended).
            artifacts: text or project files to store (content-addressed; an unchanged one costs nothing).
            blobs: more artifacts as ``name -> bytes`` (the hooks' transcripts).
            step, detail: the event's step name and detail (``overnight log`` shows them).
            skip_known_done: leave out ``done`` items already on the done list (a hook mirroring an
                agent's whole todo list, finished items included, at every turn), and ``todo`` items
                that are done and no longer on the stored todo list (the agent's list lags an
                explicit ``done``; a repeated item of the same name is added with ``todo`` by the agent).
            compaction: a ``compaction`` event: the context was summarised; the session count moves on.
            session_id: the agent session stamped on the checkpoint (default: this process's).

        A checkpoint whose state and world would equal the head's is not written; the result says
        ``unchanged``. Returns once the checkpoint is durable.
        """
        done = _clean(done, "done", task_id)
        todo = _clean(todo, "todo", task_id)
        decisions = _clean(decisions, "decisions", task_id)
        if notes is not None and not isinstance(notes, str):
            raise ConfigError("notes must be a string", task_id=task_id)
        for _ in range(COMMIT_ATTEMPTS):
            tip = self._tip(task_id, branch)
            old = tip.state
            spec = self._spec(old)
            chain = tip.chain
            writer = chain.blob_writer()
            arts = dict(old["artifacts"])
            added = []
            for a in artifacts or []:
                name, data, text = self._artifact(a, task_id)
                ref = artifact_ref(writer.put(data), len(data), text=text, step=None)
                if arts.get(name) != ref:
                    added.append(name)
                arts[name] = ref
            for name, data in (blobs or {}).items():
                ref = artifact_ref(writer.put(data), len(data), text=True, step=None)
                if arts.get(name) != ref:
                    added.append(name)
                arts[name] = ref
            session_n = chain.session_n + (1 if compaction else 0)
            now = utc_now()
            done_list = list(old["done"])
            finished = set(done or [])
            known = {d["name"] for d in done_list}
            names = _unique([d for d in done or [] if not (skip_known_done and d in known)], known)
            done_list += [_done_entry(n, chain.seq + 1, session_n, now) for n in names]
            if todo is not None:
                if skip_known_done:  # a mirrored list may lag an explicit task_checkpoint(done=[...]): an item
                    stored = {t["name"] for t in old["todo"]}  # done and off the todo list stays done
                    finished |= {t for t in todo if t in known and t not in stored}
                todo_list = [_todo_entry(n) for n in _unique([t for t in todo if t not in finished], set())]
            else:
                todo_list = [t for t in old["todo"] if t["name"] not in finished]
            data = from_tree(old["data"], "state.data") if old["data"] is not None else {}
            if decisions:
                data = {**data, "decisions": [*data.get("decisions", []), *decisions]}
            old_ctx = old["context"]
            ctx = context_info(old_ctx["summary"] if notes is None else notes.strip() or None,
                               old_ctx["compactions"] + (1 if compaction else 0), old_ctx["messages"], old_ctx["tokens"])
            state = {**old, "todo": todo_list, "done": done_list, "artifacts": dict(sorted(arts.items())),
                     "data": to_tree(data, "state.data"), "context": ctx}
            if spec.get("project") != str(self.project):  # moved or copied: the task now lives here, and
                state["task"] = {**old["task"], "spec": {**spec, "project": str(self.project)}}  # says so once
            fp, now_world = self._fingerprint(writer, spec, task_id)
            if state == old and now_world == tip.world and not compaction:
                return CheckpointResult(task_id, branch, chain.head or "", chain.seq, len(done_list), len(todo_list),
                                        [], unchanged=True)
            what = detail or ", ".join(x for x in (f"+{len(names)} done" if names else "",
                                                    f"{len(todo_list)} todo",
                                                    f"{len(decisions)} decisions" if decisions else "",
                                                    "notes" if notes is not None else "",
                                                    f"stored {', '.join(added)}" if added else "") if x)
            ev = event("compaction" if compaction else "step", step=step, key=AGENT_FN,
                       ref=chain.head if compaction else None, detail=what[:500])
            chain.session_n = session_n
            if session_id:
                chain.session_id = session_id
            try:
                cid = chain.commit(state, ev, writer=writer, fingerprint=fp)
            except StaleHead:
                self._tips.pop((task_id, branch), None)
                continue
            except BaseException:
                self._tips.pop((task_id, branch), None)
                raise
            fallback = tip.fallback.describe().splitlines()[0] if tip.fallback else None
            self._tips[(task_id, branch)] = _Tip(chain, state, now_world, now)
            return CheckpointResult(task_id, branch, cid, chain.seq, len(done_list), len(todo_list), added,
                                    fallback=fallback)
        raise StaleHead(f"task {task_id!r} branch {branch!r} kept moving under {COMMIT_ATTEMPTS} attempts to commit",
                        task_id=task_id, hint="another process writes this task at a high rate; retry")

    def _artifact(self, a: ArtifactIn | dict[str, Any], task_id: str) -> tuple[str, bytes, bool]:
        if isinstance(a, dict):
            a = ArtifactIn(**a)
        if (a.text is None) == (a.path is None):
            raise ConfigError("an artifact needs exactly one of text and path", task_id=task_id,
                              hint='e.g. {"name": "plan.md", "text": "..."} or {"path": "src/parser.py"}')
        if a.path is not None:
            rel, full = self._relative(a.path)
            if not full.is_file():
                raise ConfigError(f"artifact path {a.path!r} is not a file in the project", task_id=task_id)
            data = full.read_bytes()
            try:
                data.decode("utf-8")
                text = True
            except UnicodeDecodeError:
                text = False
            name = a.name or f"files/{rel}"
        else:
            if not a.name:
                raise ConfigError("a text artifact needs a name", task_id=task_id, hint='e.g. "notes/design.md"')
            data, text, name = a.text.encode("utf-8", "surrogatepass"), True, a.name  # type: ignore[union-attr]
        if name.startswith("/") or len(name) > 512:
            raise ConfigError(f"artifact name {name[:60]!r} must be relative and at most 512 characters", task_id=task_id)
        return name, data, text

    # -- task_resume / task_status ----------------------------------------------------------------

    def resume(self, task_id: str, *, branch: str = "main", make_current: bool = True) -> Resumed:
        """The control point of the branch head -- verified deeply (every artifact blob hashed); a
        damaged head falls back to the newest checkpoint that verifies -- and the drift of the
        project since it. Makes it the project's current task.

        The project is this process's (:attr:`project`): drift is measured there and the pointer
        written there, whatever folder the task records (a moved project, or a task started in
        another one: ``control.project_moved`` says so)."""
        tip = self._tip(task_id, branch, deep=True)
        return self._resumed(tip, task_id, branch, make_current=make_current)

    def _resumed(self, tip: _Tip, task_id: str, branch: str, *, make_current: bool) -> Resumed:
        cp = self.control_point(tip, task_id, branch)
        inputs, env, salt = self._world_args(self._spec(tip.state), task_id)
        now = world(self.project, inputs=inputs, env=env, salt=salt, task_id=task_id)
        d = drift(self.project, tip.world, now, checkpoint_id=cp.checkpoint_id, todo=cp.todo, salt=salt)
        if make_current:
            write_pointer(self.project, task_id, branch, self.store().url)
        return Resumed(cp, d, tip.fallback.describe() if tip.fallback else None)

    def status(self, task_id: str, *, branch: str = "main") -> Resumed:
        """As :meth:`resume` without the deep artifact check and without changing the current task."""
        return self._resumed(self._tip(task_id, branch), task_id, branch, make_current=False)

    # -- task_list --------------------------------------------------------------------------------

    def list(self) -> list[dict[str, Any]]:
        """Coding-agent tasks in the store: ``{"task_id", "goal", "project", "created_at",
        "branches", "head", "updated_at", "current"}``, newest first."""
        try:
            s = self.store()
        except TaskNotFound:
            return []
        found = read_pointer(self.project)
        current = found[1]["task_id"] if found else None
        out = []
        for t in s.list_tasks():
            try:
                spec = loads(t.spec)
            except Exception:  # noqa: BLE001 - an unreadable spec is not ours to list
                continue
            if not isinstance(spec, dict) or spec.get("kind") != KIND:
                continue
            refs = s.list_refs(t.task_id)
            head = refs.get("main") or next(iter(refs.values()), None)
            updated = s.get_checkpoint(head).created_at if head else None
            out.append({"task_id": t.task_id, "goal": t.goal, "project": self._recorded_project(spec)[0],
                        "created_at": t.created_at, "branches": sorted(refs), "head": head, "updated_at": updated,
                        "current": t.task_id == current})
        return sorted(out, key=lambda r: r["updated_at"] or "", reverse=True)

    # -- log / fork / rollback / verify / artifact_read: overnight.api on this store ---------------

    def log(self, task_id: str) -> list[Any]:
        """``overnight log``: every checkpoint, newest first (``LogEntry``)."""
        from overnight import api

        return api.log(task_id, store=self.store())

    def fork(self, task_id: str, branch: str, *, at: str = "main") -> str:
        """``overnight fork``: a new branch at ``at`` (a branch, a checkpoint id or prefix)."""
        from overnight import api

        return api.fork(task_id, at, branch, store=self.store())

    def rollback(self, task_id: str, to: str, *, branch: str = "main") -> str:
        """``overnight rollback``: ``branch`` gets the state of its ancestor ``to`` (history kept)."""
        from overnight import api

        self._tips.pop((task_id, branch), None)
        return api.rollback(task_id, to, branch=branch, store=self.store())

    def verify(self, task_id: str) -> Any:
        """``overnight verify TASK_ID``: every checkpoint and object of the task (``VerifyReport``)."""
        from overnight import api

        self.store().get_task(task_id)
        return api.verify(task_id, store=self.store())

    def artifact(self, task_id: str, name: str, *, at: str | None = None, branch: str = "main") -> bytes:
        """``overnight cat``: an artifact's bytes, verified."""
        from overnight import api

        return api.cat(task_id, name, store=self.store(), at=at, branch=branch)
