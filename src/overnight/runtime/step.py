"""A step's result, staged into the next state: the done entry, the plan, artifacts, user state.

The runner runs a step function with its :class:`~overnight.runtime.context.StepContext`; what the
step returned and staged (:class:`StepRun`) becomes the next state here, before anything is
written (encoding errors surface first), and the runner commits it. Pure functions over the session's
state (:class:`~overnight.runtime.state.SessionState`), apart from the artifact blobs put into the commit's blob writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overnight.codec import digest
from overnight.codec.canonical import dumps as canonical_dumps
from overnight.codec.canonical import to_tree
from overnight.chain.records import artifact_ref, done_entry
from overnight.runtime.context import Staged
from overnight.runtime.state import SessionState, TodoTree
from overnight.store.blobs import BlobWriter


@dataclass(frozen=True)
class StepRun:
    """One run of a step function, ready to stage.

    Attributes:
        entry: the todo entry it ran for; key: its step key; version: its function's version.
        output, data: the output and the user state after it, as JSON trees.
        staged: what it staged through its context; reads: what it read (declared and observed).
        started_at: RFC 3339 UTC; duration_ms: wall time of the function.
        tokens_in, tokens_out, replayed_tokens: its model usage (replayed: from the call journal).
    """

    entry: TodoTree
    key: str
    version: str
    output: Any
    data: Any
    staged: Staged
    reads: dict[str, Any]
    started_at: str
    duration_ms: float
    tokens_in: int
    tokens_out: int
    replayed_tokens: int


def encode_results(name: str, output: Any, state: Any) -> tuple[Any, Any]:
    """``(output tree, user-state tree)`` of step ``name``. Raises :class:`~overnight.errors.EncodeError`."""
    output_tree = to_tree(output, f"step[{name!r}].output")
    # ctx.state may have been replaced by the step: encode whatever it is now, as a plain dict
    state = dict(dict.items(state)) if isinstance(state, dict) else state
    return output_tree, to_tree(state, "state.data")


def state_after(state: SessionState, ran: StepRun, writer: BlobWriter, *, seq: int,
                session: int) -> tuple[SessionState, dict[str, Any]]:
    """The state once ``ran`` is committed as checkpoint ``seq`` of session ``session`` (its
    artifacts put into ``writer``), and what the step produced (``output``/``state``/``artifacts``
    digests, the input of a recompute pass). The context is left to the caller."""
    entry, staged = ran.entry, ran.staged
    artifacts = dict(state.artifacts)
    for name, (data, is_text) in staged.artifacts.items():
        artifacts[name] = artifact_ref(writer.put(data), len(data), text=is_text, step=entry["name"])
    reads = {**ran.reads, "state": sorted(staged.state_reads)}
    produced = {"output": digest.sha256(canonical_dumps(ran.output)),
                "state": _state_changes(state.data, ran.data),
                "artifacts": {n: artifacts[n]["digest"] for n in sorted(staged.artifacts)}}
    done = done_entry(
        name=entry["name"], fn=entry["fn"], key=ran.key, version=ran.version, args=entry["args"], output=ran.output,
        reads=reads, writes=sorted(staged.artifacts), added_by=entry["added_by"], produced=produced, seq=seq,
        session=session, started_at=ran.started_at, duration_ms=round(ran.duration_ms, 3), tokens_in=ran.tokens_in,
        tokens_out=ran.tokens_out, replayed_tokens=ran.replayed_tokens,
    )
    todo = _replan(state.todo[1:], entry["name"], staged.added_next, staged.planned) + staged.added_end
    return state.but(todo=todo, done=state.done + [done], artifacts=artifacts, data=ran.data), produced


def _replan(rest: list[dict[str, Any]], step: str, added: list[dict[str, Any]], planned: list[str]) -> list[dict[str, Any]]:
    """The todo list after ``step`` ran and added the sub-steps ``added`` (``planned``: every name it
    added, new or already there, in order); ``rest`` is the todo list after ``step``.

    New sub-steps go right after ``step``. In a recompute pass, the sub-steps ``step`` added last
    time are in ``rest`` again (with their ``previous`` run): they and the new ones are laid out in
    the order ``step`` adds them now, where the first of them stood, and one it no longer adds is
    dropped from the plan -- a planning step that runs again re-plans."""
    mine = [e for e in rest if e.get("previous") and e.get("added_by") == step]
    if not mine:
        return added + rest
    ours = {e["name"]: e for e in [*mine, *added]}
    first = next(i for i, e in enumerate(rest) if e is mine[0])  # everything before it is another's
    others = [e for e in rest if not (e.get("previous") and e.get("added_by") == step)]
    layout = [ours[n] for n in dict.fromkeys(planned) if n in ours]
    return others[:first] + layout + others[first:]


def _state_changes(before: Any, after: Any) -> dict[str, str]:
    """``key -> digest`` of each top-level user-state key a step added or changed (a removed key
    maps to ``"removed"``)."""
    if not isinstance(before, dict) or not isinstance(after, dict) or "$t" in before or "$t" in after:
        return {"*": digest.sha256(canonical_dumps(after))} if before != after else {}
    out = {}
    for k in set(before) | set(after):
        if k not in after:
            out[k] = "removed"
        elif before.get(k) != after[k] or k not in before:
            out[k] = digest.sha256(canonical_dumps(after[k]))
    return dict(sorted(out.items()))
