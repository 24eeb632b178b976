"""The session's state: a typed view over a checkpoint's state document.

The chain stores a task's state as a JSON tree (:class:`~overnight.chain.records.TaskState`,
record format 2, validated when committed); the session loop, step staging, recompute passes,
the model gateway and a step's context read it through :class:`SessionState`'s fields instead of
string keys. The view is immutable: a step's result is a new view (:meth:`SessionState.but`), and
:meth:`SessionState.tree` is the document the chain writer commits. Entries of the lists (todo,
done), artifact references and the user data stay the JSON trees of the record format
(:class:`~overnight.chain.records.TodoEntry`, :class:`~overnight.chain.records.DoneEntry`,
:class:`~overnight.chain.records.ArtifactRef`): they are stored as they are, so the view neither
copies nor converts them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from overnight.chain.records import context_info, recompute_info
from overnight.chain.integrity import done_named

TodoTree = dict[str, Any]
"""A todo entry as stored (:class:`~overnight.chain.records.TodoEntry`)."""
DoneTree = dict[str, Any]
"""A done entry as stored (:class:`~overnight.chain.records.DoneEntry`)."""
ArtifactTree = dict[str, Any]
"""An artifact reference as stored (:class:`~overnight.chain.records.ArtifactRef`): digest, size, text, step."""


@dataclass(frozen=True)
class TaskInfo:
    """The task a state belongs to (:class:`~overnight.chain.records.TaskInfo`): its id, its goal
    and its spec as recorded at creation (route, salt, expected span ...)."""

    id: str
    goal: str
    spec: dict[str, Any]

    def tree(self) -> dict[str, Any]:
        return {"id": self.id, "goal": self.goal, "spec": self.spec}


@dataclass(frozen=True)
class Context:
    """The session's context window (:class:`~overnight.chain.records.ContextInfo`).

    Attributes:
        summary: the summary the last compaction wrote (None before the first).
        compactions: compactions so far.
        messages: this session's exchanges, each a list of ``{"role", "content"}`` messages.
        tokens: tokens the exchanges hold (the model's tokenizer).
    """

    summary: str | None = None
    compactions: int = 0
    messages: tuple[list[dict[str, str]], ...] = ()
    tokens: int = 0

    @classmethod
    def of(cls, tree: dict[str, Any]) -> "Context":
        return cls(tree["summary"], tree["compactions"], tuple(tree["messages"]), tree["tokens"])

    def tree(self) -> dict[str, Any]:
        return context_info(self.summary, self.compactions, list(self.messages), self.tokens)


@dataclass(frozen=True)
class Recompute:
    """A recompute pass under way (:class:`~overnight.chain.records.Recompute`): the step names,
    user-state keys and artifact names whose values changed in it."""

    dirty_steps: frozenset[str] = frozenset()
    dirty_state: frozenset[str] = frozenset()
    dirty_artifacts: frozenset[str] = frozenset()

    @classmethod
    def of(cls, tree: dict[str, Any] | None) -> "Recompute | None":
        if tree is None:
            return None
        return cls(frozenset(tree["dirty_steps"]), frozenset(tree["dirty_state"]), frozenset(tree["dirty_artifacts"]))

    def tree(self) -> dict[str, Any]:
        return recompute_info(sorted(self.dirty_steps), sorted(self.dirty_state), sorted(self.dirty_artifacts))


@dataclass(frozen=True)
class SessionState:
    """A task's state at a step boundary, as the session loop reads it.

    Attributes:
        format: the state document's format (:data:`~overnight.chain.records.FORMAT_VERSION`).
        task: the task's id, goal and spec.
        todo: the steps still to run, first next.
        done: the committed steps, oldest first.
        artifacts: ``name -> artifact reference``.
        data: the user state (``ctx.state``) as a canonical-JSON tree.
        context: the context window.
        recompute: the recompute pass under way, or None.
    """

    format: int
    task: TaskInfo
    todo: list[TodoTree]
    done: list[DoneTree]
    artifacts: dict[str, ArtifactTree]
    data: Any
    context: Context
    recompute: Recompute | None

    @classmethod
    def of(cls, tree: dict[str, Any]) -> "SessionState":
        """The view of a :class:`~overnight.chain.records.TaskState` tree (a loaded checkpoint's
        ``state_tree``, or :func:`~overnight.chain.records.initial_state`)."""
        task = tree["task"]
        return cls(tree["format"], TaskInfo(task["id"], task["goal"], task["spec"]), tree["todo"], tree["done"], tree["artifacts"], tree["data"],
                   Context.of(tree["context"]), Recompute.of(tree["recompute"]))

    def tree(self) -> dict[str, Any]:
        """The state document as committed (:class:`~overnight.chain.records.TaskState` tree)."""
        return {"format": self.format, "task": self.task.tree(), "todo": self.todo, "done": self.done,
                "artifacts": self.artifacts, "data": self.data, "context": self.context.tree(),
                "recompute": self.recompute.tree() if self.recompute is not None else None}

    def but(self, **changes: Any) -> "SessionState":
        """This state with ``changes`` (field name -> new value)."""
        return replace(self, **changes)

    @property
    def salt(self) -> bytes:
        """The task's environment salt (keyed digests of env values), from its spec."""
        return bytes.fromhex(self.task.spec.get("salt", ""))

    def entry(self, name: str) -> TodoTree | DoneTree | None:
        """The todo or done entry named ``name``, if any (the done list through its pages' index:
        only a page that may hold it is read, :func:`~overnight.chain.integrity.done_named`)."""
        hit = next((e for e in self.todo if e["name"] == name), None)
        return hit if hit is not None else done_named(self.done, name)

    def done_with_key(self, key: str, name: str | None = None) -> DoneTree | None:
        """The done entry of step key ``key``, if that step ran. ``name``: the step's name (which
        its key covers), so the pages' index finds it reading one page, not every one."""
        if name is not None:
            return done_named(self.done, name, key)
        return next((d for d in self.done if d["key"] == key), None)

    @property
    def progress(self) -> tuple[int, int]:
        """``(done, total)`` steps of the whole task."""
        return len(self.done), len(self.done) + len(self.todo)

    @property
    def in_recompute_pass(self) -> bool:
        """A recompute pass is under way and some step still planned ran before (has ``previous``)."""
        return any(e.get("previous") for e in self.todo)
