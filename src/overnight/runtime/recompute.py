"""Recompute passes: which steps of a pass may stand, what a replayed step's effect is, what is dirty.

After drift, the steps that read what changed run again (a *recompute pass*,
``SessionState.recompute``, set by :mod:`overnight.runtime.drift_decision`); a later step of the pass whose
recorded reads are all clean is *replayed* -- its recorded effect applied from the checkpoint that
committed it, nothing run, no model called -- and what a re-run step produced differently becomes
dirty for the steps after it. Pure functions over the session's state
(:class:`~overnight.runtime.state.SessionState`); the runner commits the results.
"""

from __future__ import annotations

from typing import Any, Callable

from overnight.runtime.state import Recompute, SessionState, TodoTree
from overnight.verify.drift import changed_products, reads_dirty, world_reads_changed


def can_replay(state: SessionState, entry: TodoTree, version: str,
               now_of: Callable[[str, str, Any], Any]) -> bool:
    """In a recompute pass: may the step of todo ``entry`` (its function at ``version``) stand as
    its last run did -- not directly affected, same version, nothing it read dirty or changed in
    the world (``now_of``: :meth:`overnight.verify.drift.WorldNow.get`)?"""
    prev = entry["previous"]
    dirty = state.recompute
    return bool(dirty is not None and not prev.get("direct") and prev.get("checkpoint")
                and prev.get("version") == version and not reads_dirty(prev["reads"], dirty.tree())
                and not world_reads_changed(prev["reads"], now_of))


def replayed(state: SessionState, entry: TodoTree, old_tree: dict[str, Any], seq: int) -> SessionState:
    """The state after replaying the step of todo ``entry``: its done entry (at ``seq``), the state
    keys and the artifacts it wrote, from ``old_tree`` -- the state of the checkpoint that
    committed it. The pass ends (``recompute`` None) with its last re-checked step."""
    done = next(d for d in reversed(old_tree["done"]) if d["name"] == entry["name"])
    prev = entry["previous"]
    # what it read and its version as the state knew them: a drift accepted since that checkpoint
    # re-baselined them (verify.drift.rebaseline), and must not come back with the replay
    done = {**done, "reads": prev.get("reads", done["reads"]), "version": prev.get("version", done["version"])}
    data = state.data
    writes = done["produced"]["state"]
    if "*" in writes:
        data = old_tree["data"]
    elif writes:
        data = dict(data)
        for k in writes:
            if k in old_tree["data"]:
                data[k] = old_tree["data"][k]
            else:
                data.pop(k, None)
    artifacts = dict(state.artifacts)
    for name in done["writes"]:
        if name in old_tree["artifacts"]:
            artifacts[name] = old_tree["artifacts"][name]
    state = state.but(todo=state.todo[1:], done=[*state.done, {**done, "seq": seq}], data=data, artifacts=artifacts)
    return state if state.in_recompute_pass else state.but(recompute=None)


def dirtied(state: SessionState, entry: TodoTree, produced: dict[str, Any]) -> Recompute | None:
    """The recompute pass after the step of ``entry`` ran in it: what it produced differently is
    dirty (all of it, for a step that had not run before); the pass ends with its last re-checked
    step (None)."""
    prev = entry.get("previous")
    changed = changed_products(prev, produced) if prev else {
        "output": {"*"}, "state": set(produced["state"]), "artifacts": set(produced["artifacts"])}
    dirty = state.recompute
    if dirty is None or not state.in_recompute_pass:
        return None
    return Recompute(dirty.dirty_steps | ({entry["name"]} if changed["output"] else set()),
                     dirty.dirty_state | changed["state"], dirty.dirty_artifacts | changed["artifacts"])
