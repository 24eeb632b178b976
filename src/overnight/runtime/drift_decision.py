"""Resume consistency: compare the checkpoint with the world now and apply the drift policies.

Called by the runner after the head is loaded and verified, before any step runs (and by
``overnight status --drift``, which only reports). See :mod:`overnight.verify.drift` for what
counts as drift and what each policy does.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.errors import ConfigError, DriftAbort
from overnight.runtime.task_code import entry_path, project_root
from overnight.runtime.task import Task
from overnight.store.base import Store
from overnight.verify.drift import (
    DEFAULT_POLICIES,
    DriftReport,
    WorldNow,
    accepted_items,
    affected_steps,
    detect,
    rebaseline,
)
from overnight.verify.fingerprint import COMPONENTS, WorldSpec, world
from overnight.verify.input_paths import ProjectPaths, infer_root, safe_relative
from overnight.chain.integrity import LoadedCheckpoint, done_summary_of, load_checkpoint
from overnight.chain.records import recompute_info, todo_entry


def world_spec(task: Task, salt: bytes, model: dict[str, Any] | None = None,
               paths: ProjectPaths | None = None) -> WorldSpec:
    """What ``task`` declares about its world, for :func:`~overnight.verify.fingerprint.world`;
    ``model``: the :func:`~overnight.verify.fingerprint.model_identity` of the model its steps
    call in this run; ``paths``: what its ``inputs`` are recorded relative to (default: the
    current project root, :func:`~overnight.runtime.task_code.project_root`)."""
    path = entry_path(task.entry)
    root = path.parent if path is not None else Path.cwd()
    return WorldSpec(
        version=task.version,
        steps={n: (s.version, s.source_digest) for n, s in task.steps.items()},
        deps=task.deps, env=list(task.env), inputs=[str(p) for p in task.inputs], sources=dict(task.sources),
        exports=dict(task.exports), root=root, salt=salt, model=model,
        paths=paths or ProjectPaths(str(project_root())),
    )


def _code_file(spec: dict[str, Any]) -> str | None:
    """The task's code file relative to its project (the spec's ``entry`` ``PATH.py[:NAME]``), or
    None for a module entry, an absolute path or one that would leave the project."""
    entry = spec.get("entry")
    if not isinstance(entry, str):
        return None
    head, sep, tail = entry.rpartition(":")
    target = head if sep and head and tail.isidentifier() else entry
    return safe_relative(target) if target.endswith(".py") else None


def input_paths_for(state: dict[str, Any], recorded_world: dict[str, Any] | None,
                    root: Path | None = None) -> ProjectPaths:
    """Where the input paths a checkpoint (``state``, its world fingerprint ``recorded_world``)
    records are read now (:mod:`overnight.verify.input_paths`): a relative one under the current
    project root (``root``, default :func:`~overnight.runtime.task_code.project_root`); an absolute
    one inside the project root the task's spec records (``project``, where it last ran) -- or, for
    a task whose spec records none or whose paths lie in another folder, the one
    :func:`~overnight.verify.input_paths.infer_root` finds from them (an old record's) -- at the
    same place under the current root; any other absolute one where it says.
    ``moved_from`` is the recorded root when it is not the current one (for a spec without
    ``project``, the inferred one)."""
    here = os.path.normpath(str(root or project_root()))
    spec = state["task"]["spec"]
    raw = spec.get("project") if isinstance(spec, dict) else None
    recorded = os.path.normpath(raw) if isinstance(raw, str) and os.path.isabs(raw) and "\0" not in raw else None
    known = ProjectPaths(here, (recorded,) if recorded and recorded != here else ())
    keys: list[str] = [k for k in (recorded_world or {}).get("inputs", {})]
    summary = done_summary_of(state["done"])
    if summary is not None:
        keys += [k for kind in ("inputs", "listings") for k in summary["reads"].get(kind, {})]
    else:
        keys += [k for d in state["done"] for kind in ("inputs", "listings") for k in d["reads"].get(kind, {})]
    unmapped = [k for k in keys if os.path.isabs(k) and known.canonical(k) == k]
    inferred = infer_root(unmapped, here, _code_file(spec) if isinstance(spec, dict) else None) if unmapped else None
    roots = tuple(dict.fromkeys(r for r in (*known.recorded, inferred) if r and r != here))
    moved = (recorded if recorded != here else None) if recorded is not None else inferred
    return ProjectPaths(here, roots, moved)


def check_project(task_id: str, state: dict[str, Any], paths: ProjectPaths, code: Path | None) -> None:
    """Refuse to resume a task from outside its project while that project is still where the task
    last ran: the task's spec records a project root (``paths.moved_from``) that still holds the
    task's code file, the current root does not, and the code running now (``code``, the file of
    its entry; ``resume --file``) is that very file. A step's relative paths (its inputs, files it
    writes) are relative to the current directory, so such a resume would find every input
    ``missing`` and recompute the done steps -- a complete task made to pay for its model calls
    again. A project copied or moved elsewhere has its code file under the new root and resumes
    there; other code (a task definition that moved, ``code_moved``) runs as before; a task
    whose code is a module or lies outside its project is not checked.

    Raises:
        ConfigError: naming the task, its project and the folder to resume it from (exit 2).
    """
    rel = _code_file(state["task"]["spec"]) if isinstance(state["task"]["spec"], dict) else None
    old = paths.moved_from
    if old is None or rel is None or code is None or not os.path.isdir(old):
        return
    recorded = os.path.join(old, rel)
    if os.path.isfile(recorded) and os.path.realpath(code) == os.path.realpath(recorded) \
            and not os.path.isfile(os.path.join(paths.root, rel)):
        raise ConfigError(
            f"task {task_id!r} belongs to the project at {old} (its code {rel} is there), not to this "
            f"directory's project {paths.root}", task_id=task_id,
            hint=f"resume it from its project: `cd {old} && overnight resume {task_id}` (a step's relative "
                 "paths are read from the current directory); nothing was changed")


def salt_of(state: dict[str, Any]) -> bytes:
    """The task's salt for keyed environment digests, from its stored spec."""
    return bytes.fromhex(state["task"]["spec"].get("salt", ""))


def policies_for(task: Task, override: dict[str, str] | None) -> dict[str, str]:
    """Defaults, then the task's ``on_drift``, then the run's override."""
    return {**DEFAULT_POLICIES, **task.on_drift, **(override or {})}


def report_for(loaded: LoadedCheckpoint, state: dict[str, Any], task: Task, now: dict[str, Any],
               salt: bytes, paths: ProjectPaths | None = None) -> DriftReport:
    """Drift between ``loaded`` (with ``state``) and the world ``now``; input paths read where
    ``paths`` says (default :func:`input_paths_for` of ``state``)."""
    artifacts = state["artifacts"]
    exports = {n: (artifacts[n]["digest"], p) for n, p in task.exports.items() if n in artifacts}
    return detect(
        checkpoint_id=loaded.id, recorded=loaded.world, now=now, done=state["done"],
        step_versions={n: (s.version, s.source_digest) for n, s in task.steps.items()},
        exports=exports, salt=salt, sources=dict(task.sources), summary=done_summary_of(state["done"]),
        paths=paths or input_paths_for(state, loaded.world),
    )


@dataclass
class Decision:
    """What the policies decided for one resume.

    Attributes:
        report: the drift against the checkpoint finally continued from.
        found: the drift found against the head (differs from ``report`` after a rollback).
        state: the state to continue from.
        rollback_to: the older checkpoint rolled back to (policy ``rollback``), if any.
        recomputed: steps that read what drifted: they run again; the steps after the first of
            them are re-checked in order, and run again or are replayed.
        accepted: drift items accepted, with the done steps computed without them (recorded on
            every later checkpoint, each until those steps have run again).
    """

    report: DriftReport
    state: dict[str, Any]
    found: DriftReport | None = None
    rollback_to: LoadedCheckpoint | None = None
    recomputed: list[str] = field(default_factory=list)
    accepted: list[dict[str, Any]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.rollback_to or self.recomputed or self.accepted)

    def describe(self) -> str:
        parts = []
        if self.rollback_to is not None:
            parts.append(f"rolled back to checkpoint {self.rollback_to.id[7:19]} (seq {self.rollback_to.record.seq}), "
                         "the newest made in a world like this one")
        if self.recomputed:
            parts.append(f"recompute {len(self.recomputed)} step(s) that read what changed: "
                         f"{', '.join(self.recomputed[:8])}" + (" ..." if len(self.recomputed) > 8 else "")
                         + " (then the steps that read their output)")
        if self.accepted:
            parts.append(f"accepted {len(self.accepted)} drift(s)")
        return "; ".join(parts) or "no step to recompute"


def decide(store: Store, loaded: LoadedCheckpoint, task: Task, now: dict[str, Any], policies: dict[str, str],
           *, key: bytes | None) -> Decision:
    """Apply ``policies`` to the drift between ``loaded`` and the world ``now``.

    Raises:
        DriftAbort: a component with policy ``abort`` drifted, or ``rollback`` found no checkpoint
            matching the world now.
    """
    state = loaded.state_tree
    salt = salt_of(state)
    paths = input_paths_for(state, loaded.world)
    report = report_for(loaded, state, task, now, salt, paths)
    drifted = set(report.components())
    abort = sorted(c for c in drifted if policies[c] == "abort")
    if abort:
        raise DriftAbort(f"task {task.id!r} drifted in {', '.join(abort)} (policy abort):\n{report.describe()}",
                         task_id=task.id, checkpoint_id=loaded.id, report=report,
                         hint=abort_hint(task.id, report, abort))
    decision = Decision(report, state)
    decision.found = report
    rollback = {c for c in drifted if policies[c] == "rollback"}
    if rollback:
        target = _newest_matching(store, loaded, task, now, rollback, key=key)
        if target is None:
            raise DriftAbort(f"task {task.id!r} drifted in {', '.join(sorted(rollback))} and no earlier checkpoint "
                             f"matches the world now (policy rollback):\n{report.describe()}",
                             task_id=task.id, checkpoint_id=loaded.id, report=report,
                             hint=f"resume with --on-drift {','.join(f'{c}=recompute' for c in sorted(rollback))}, "
                             "or " + "; or ".join(_undo(c, task.id, report) for c in sorted(rollback)))
        decision.rollback_to = target
        state = target.state_tree
        report = report_for(target, state, task, now, salt)
        decision.report = report
        drifted = set(report.components())
    recompute = {c for c in drifted if policies[c] == "recompute"}
    if recompute:
        decision.recomputed = affected_steps(report, state["done"], recompute, closure=False)
        if decision.recomputed:
            state = begin_recompute(store, decision.rollback_to or loaded, state, set(decision.recomputed), key=key)
    accept = {c for c in drifted if policies[c] == "accept"}
    if accept:
        decision.accepted = accepted_items(report, accept)
        state = rebaseline(state, report, accept, WorldNow(salt, dict(task.sources), now.get("model"), paths).get,
                           versions={n: s.version for n, s in task.steps.items()})
    decision.state = state
    return decision


def _undo(component: str, task_id: str, report: DriftReport) -> str:
    """How to undo the drift of ``component`` (for an abort's hint)."""
    keys = [i.key for i in report.items if i.component == component and not i.warning]
    if component == "code":
        steps = [k[len("step "):-len(" version")] for k in keys if k.startswith("step ") and k.endswith(" version")]
        what = (f"set the version= of step(s) {', '.join(steps[:5])} back" if steps else "")
        if "task version" in keys:
            what += (" and " if what else "") + "set the task's version= back"
        return (what or "revert the code") + " to what the checkpoint was computed with"
    if component == "env":
        return f"restore the Python and environment variables it ran with (`overnight env export {task_id}` lists them)"
    if component == "deps":
        return (f"reinstall the recorded versions (`overnight env export {task_id} -o req.txt`, "
                "then `pip install -r req.txt`)")
    if component == "inputs":
        return f"restore {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''} as the steps read it"
    if component == "model":
        return "resume with the model the steps called (--model)"
    return "undo the edit of the exported file"


def abort_hint(task_id: str, report: DriftReport, components: list[str]) -> str:
    """The hint of a ``DriftAbort`` for ``components`` (policy abort): how to undo each drift, or
    which policy to resume with instead -- naming the component that drifted."""
    undo = "; ".join(_undo(c, task_id, report) for c in components)
    recompute, accept = (",".join(f"{c}={p}" for c in components) for p in ("recompute", "accept"))
    return (f"{undo}; or resume with --on-drift {recompute} (run again the steps that read it) "
            f"or --on-drift {accept} (keep their results)")


def _commits(store: Store, head: LoadedCheckpoint) -> dict[str, str]:
    """``step name -> checkpoint id`` of the newest commit of each step on ``head``'s lineage."""
    rows = {r.checkpoint_id: r for r in store.list_checkpoints(head.record.task_id)}
    out: dict[str, str] = {}
    cid: str | None = head.id
    while cid is not None and cid in rows:
        row = rows[cid]
        if row.event == "step" and row.step and row.step not in out:
            out[row.step] = cid
        cid = row.parent_id
    return out


def begin_recompute(store: Store, head: LoadedCheckpoint, state: dict[str, Any], direct: set[str], *,
                    key: bytes | None) -> dict[str, Any]:
    """Start a recompute pass (:class:`~overnight.chain.records.Recompute`): rewind the user
    state and the artifacts to just before the earliest step in ``direct``, and put that step and
    every later one back in the todo list, in order, each with its ``previous`` run."""
    done = state["done"]
    i0 = next(i for i, d in enumerate(done) if d["name"] in direct)
    commits = _commits(store, head)
    data, artifacts = state["data"], state["artifacts"]
    first = commits.get(done[i0]["name"])
    if first is not None:
        parent = store.get_checkpoint(first).parent_id
        if parent is not None:
            before = load_checkpoint(store, parent, key=key, deep=False).state_tree
            data, artifacts = before["data"], before["artifacts"]
    again = [todo_entry(d["name"], d["fn"], d["args"], added_by=d["added_by"],
                        previous={**d["produced"], "reads": d["reads"], "version": d["version"], "seq": d["seq"],
                                  "checkpoint": commits.get(d["name"]), "direct": d["name"] in direct})
             for d in done[i0:]]
    names = {e["name"] for e in again}
    return {**state, "done": done[:i0], "todo": again + [e for e in state["todo"] if e["name"] not in names],
            "data": data, "artifacts": artifacts,
            "recompute": recompute_info()}


def _newest_matching(store: Store, loaded: LoadedCheckpoint, task: Task, now: dict[str, Any], components: set[str],
                     *, key: bytes | None) -> LoadedCheckpoint | None:
    """The newest ancestor whose fingerprint matches the world now in ``components`` -- a
    checkpoint a session made while working, not one a drift recompute wrote (that one matches only
    because it took the drifted steps off its done list)."""
    cid = loaded.record.parent_id
    while cid is not None:
        candidate = load_checkpoint(store, cid, key=key, deep=False)
        if candidate.record.event.kind not in ("drift", "rollback"):
            report = report_for(candidate, candidate.state_tree, task, now, salt_of(candidate.state_tree))
            if not set(report.components()) & components:
                return load_checkpoint(store, cid, key=key, deep=True)
        cid = candidate.record.parent_id
    return None


def write_export(path: str | os.PathLike, data: bytes) -> None:
    """Write an exported artifact atomically (temp file in the same directory, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # like any file the user writes (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


__all__ = ["COMPONENTS", "Decision", "decide", "policies_for", "report_for", "salt_of", "world", "world_spec",
           "write_export"]
