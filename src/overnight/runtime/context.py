"""What a step function receives: inputs, artifacts, user state, outputs of earlier steps, a logger.

Everything a step does through its context is *staged*: artifact writes, state changes and added
steps become visible to later steps only when the step returns and its checkpoint commits. A
step that raises, or is killed, leaves no trace -- the next attempt starts from the same head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from overnight.chain.integrity import done_named
from overnight.codec.canonical import dumps_sorted, from_tree
from overnight.codec.digest import sha256
from overnight.errors import EncodeError, NoStepOutput, SpecError
from overnight.runtime.task import default_step_name, todo_entry
from overnight.verify.fingerprint import MISSING, digest_path, installed, keyed, listing_digest, normalize, source_digest

if TYPE_CHECKING:
    from overnight.runtime.session import ModelGateway
    from overnight.runtime.state import SessionState
    from overnight.verify.input_paths import ProjectPaths
    from overnight.runtime.task import Task


class StepHost(Protocol):
    """What a step's context needs of the session running it (the runner provides it): the task,
    the checkpointed state (read only: a step's changes are staged in the context), the session
    number, the environment salt, whether a stop was requested, and verified artifact reads."""

    task: "Task"
    state: "SessionState"
    session_n: int
    salt: bytes
    stop_requested: bool
    input_paths: "ProjectPaths"

    def read_artifact(self, name: str) -> bytes: ...


class Outputs(Mapping[str, Any]):
    """Read-only ``step name -> output`` of the committed steps, decoded on access. Reading one
    records a dependency: when that step is recomputed after drift, so is the reader."""

    def __init__(self, done: list[dict[str, Any]], reads: list[str]) -> None:
        self._done = done
        self._trees: dict[str, Any] | None = None  # every name, built when iterated
        self._cache: dict[str, Any] = {}
        self._reads = reads

    def _all(self) -> dict[str, Any]:
        if self._trees is None:
            self._trees = {d["name"]: d["output"] for d in self._done}
        return self._trees

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            if self._trees is not None:
                tree = self._trees[name]
            else:  # one look-up through the done pages' index, not the whole list
                found = done_named(self._done, name, last=True)
                if found is None:
                    raise NoStepOutput(f"no output of step {name!r}: it has not run on this branch",
                                       hint="`name in ctx.outputs` tells whether it has")
                tree = found["output"]
            self._cache[name] = from_tree(tree, f"step[{name!r}].output")
        if name not in self._reads:
            self._reads.append(name)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class StateDict(dict):  # type: ignore[type-arg]
    """``ctx.state``: a plain dict that notes which top-level keys the step reads, so that a
    later recompute of the step that wrote a key re-runs this step only if the value changed."""

    __slots__ = ("_reads",)

    def __init__(self, data: dict[str, Any], reads: set[str]) -> None:
        super().__init__(data)
        self._reads = reads

    def _all(self) -> None:
        self._reads.update(dict.keys(self))

    def __getitem__(self, key: str) -> Any:
        self._reads.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._reads.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._reads.add(key)  # type: ignore[arg-type]
        return super().__contains__(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._reads.add(key)
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self._reads.add(key)
        return super().pop(key, *default)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._all()
        return super().__iter__()

    def keys(self):  # type: ignore[no-untyped-def]
        self._all()
        return super().keys()

    def values(self):  # type: ignore[no-untyped-def]
        self._all()
        return super().values()

    def items(self):  # type: ignore[no-untyped-def]
        self._all()
        return super().items()

    def copy(self) -> dict[str, Any]:
        self._all()
        return dict(dict.items(self))


@dataclass(frozen=True)
class Staged:
    """What a step staged through its context, handed to the commit when the step returns.

    Attributes:
        artifacts: ``name -> (bytes, is_text)`` written by the step (later writes replace earlier).
        state_reads: user-state keys the step read.
        added_next: steps added with ``position="next"`` (todo entries), in order.
        added_end: steps added with ``position="end"``.
        planned: every step name ``add_step`` was called with (new or already there), in order.
    """

    artifacts: dict[str, tuple[bytes, bool]]
    state_reads: frozenset[str]
    added_next: list[dict[str, Any]]
    added_end: list[dict[str, Any]]
    planned: list[str]


class StepContext:
    """Passed as the first argument of every step function.

    Attributes:
        task_id: the task.
        goal: the task's goal.
        step: this step's unique name.
        args: this step's arguments (also passed as keyword arguments).
        state: the user state, a dict you may mutate; committed with the step.
        outputs: outputs of committed steps by step name (read-only mapping).
        session: the session number (1 for the first run, +1 per resume or compaction).
        attempt: 1 on the first try of this step in this run, 2+ on retries.
        log: a logger (``overnight.task.<task_id>``) that prefixes the step name.
        model: the task's model behind the session's context budget and the call journal:
            ``ctx.model.complete(messages, max_tokens=...)`` (see :mod:`overnight.runtime.session`).
    """

    def __init__(self, runner: StepHost, entry: dict[str, Any], args: dict[str, Any], attempt: int,
                 model: "ModelGateway") -> None:
        self._runner = runner
        self.task_id: str = runner.task.id
        self.goal: str = runner.task.goal
        self.step: str = entry["name"]
        self.args = args
        self.params: dict[str, Any] = dict(runner.task.params)  # the submission's parameters (``overnight submit``)
        self._state_reads: set[str] = set()
        self.state: dict[str, Any] = StateDict(from_tree(runner.state.data, "state.data"), self._state_reads)
        self.reads: dict[str, Any] = {"inputs": {}, "listings": {}, "sources": {}, "env": {}, "packages": {},
                                      "steps": [], "artifacts": {}, "state": []}
        self.outputs = Outputs(runner.state.done, self.reads["steps"])
        self.session: int = runner.session_n
        self.attempt = attempt
        self.model = model
        self.log = logging.LoggerAdapter(logging.getLogger(f"overnight.task.{self.task_id}"), {"step": self.step})
        self._artifacts: dict[str, tuple[bytes, bool]] = {}
        self._added: list[dict[str, Any]] = []
        self._added_end: list[dict[str, Any]] = []
        self._planned: list[str] = []  # every name add_step was called with, new or already there, in order

    def staged(self) -> Staged:
        """What this step staged (artifacts, state keys read, added steps): the commit's input."""
        return Staged(dict(self._artifacts), frozenset(k for k in self._state_reads if isinstance(k, str)),
                      list(self._added), list(self._added_end), list(self._planned))

    # -- artifacts ----------------------------------------------------------------------------

    def write_artifact(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Stage a binary artifact (replaces any earlier version of ``name``)."""
        if not isinstance(name, str) or not name:
            raise SpecError(f"artifact name must be a non-empty str, got {name!r}", task_id=self.task_id)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise EncodeError(f"write_artifact({name!r}) takes bytes, got {type(data).__name__}"
                              + ("; use write_text for str" if isinstance(data, str) else ""), path=name,
                              type_name=type(data).__name__, task_id=self.task_id)
        self._artifacts[name] = (bytes(data), False)

    def write_text(self, name: str, text: str) -> None:
        """Stage a text artifact, stored as UTF-8 (lone surrogates kept, so it reads back exactly)."""
        if not isinstance(text, str):
            raise EncodeError(f"write_text({name!r}) takes str, got {type(text).__name__} ({text!r:.60})"
                              + ("; use write_artifact for bytes" if isinstance(text, (bytes, bytearray)) else
                                 "; convert it first, e.g. str(value) or json.dumps(value)"), path=name,
                              type_name=type(text).__name__, task_id=self.task_id)
        self.write_artifact(name, text.encode("utf-8", "surrogatepass"))
        self._artifacts[name] = (self._artifacts[name][0], True)

    def read_artifact(self, name: str) -> bytes:
        """Bytes of an artifact: this step's staged version, else the committed one (verified;
        the read is recorded, so this step is recomputed when the artifact's writer is).

        Raises:
            ArtifactNotFound: no artifact of that name.
        """
        if name in self._artifacts:
            return self._artifacts[name][0]
        data = self._runner.read_artifact(name)
        self.reads["artifacts"][name] = self._runner.state.artifacts[name]["digest"]
        return data

    def read_text(self, name: str) -> str:
        """An artifact decoded from UTF-8 (the inverse of :meth:`write_text`)."""
        return self.read_artifact(name).decode("utf-8", "surrogatepass")

    def artifact_names(self) -> list[str]:
        """Names of committed and staged artifacts."""
        return sorted(set(self._runner.state.artifacts) | set(self._artifacts))

    def has_artifact(self, name: str) -> bool:
        return name in self._artifacts or name in self._runner.state.artifacts

    # -- the world outside (recorded, for drift detection) --------------------------------------

    def read_input(self, path: str | os.PathLike) -> bytes:
        """Bytes of an external file, recording its digest: if the file changes, this step is
        recomputed on the next resume (drift component ``inputs``). A file inside the project is
        recorded relative to the project root (``data/input.txt``), so a copied or moved project
        checks its own copy; one outside it absolute (:mod:`overnight.verify.input_paths`)."""
        p = os.path.abspath(path)
        with open(p, "rb") as fh:
            data = fh.read()
        self.reads["inputs"][self._runner.input_paths.key(p)] = sha256(data)
        return data

    def read_input_text(self, path: str | os.PathLike, encoding: str = "utf-8") -> str:
        """:meth:`read_input` decoded as text."""
        return self.read_input(path).decode(encoding)

    def track_input(self, path: str | os.PathLike) -> str:
        """Record the digest of a file or directory tree this step reads by other means (a
        library opening it); returns the digest (``"missing"`` if it does not exist). Recorded as
        :meth:`read_input` records a path."""
        p = os.path.abspath(path)
        self.reads["inputs"][self._runner.input_paths.key(p)] = d = digest_path(p)
        return d

    def track_listing(self, path: str | os.PathLike) -> str:
        """Record which files a directory holds (names, not contents): adding or removing a file
        recomputes this step, editing one does not. Returns the listing digest. Recorded as
        :meth:`read_input` records a path."""
        p = os.path.abspath(path)
        self.reads["listings"][self._runner.input_paths.key(p)] = d = listing_digest(p)
        return d

    def env(self, name: str, default: str | None = None) -> str | None:
        """An environment variable's value, recording its keyed digest (never the value)."""
        value = os.environ.get(name)
        self.reads["env"][name] = keyed(self._runner.salt, name, value)
        return default if value is None else value

    def source(self, name: str) -> Any:
        """Call the task's registered input source ``name`` and record the digest of its value.

        Raises:
            SpecError: no such source.
        """
        fn = self._runner.task.sources.get(name)
        if fn is None:
            raise SpecError(f"task {self.task_id!r} has no input source {name!r}", task_id=self.task_id,
                            hint="register it with @task.source(name)")
        value = fn()
        self.reads["sources"][name] = source_digest(lambda: value, name)
        return value

    def package_version(self, name: str) -> str | None:
        """Installed version of a distribution (None if not installed), recorded as a dependency."""
        version = installed([name])[normalize(name)]
        self.reads["packages"][normalize(name)] = version
        return None if version == MISSING else version

    # -- plan -----------------------------------------------------------------------------------

    def add_step(self, fn: "str | Callable[..., Any]", /, *, name: str | None = None, position: str = "next",
                 **args: Any) -> str:
        """Add a step to the todo list; returns its name. Adding a step that is already planned
        or done with the same function and arguments does nothing (a recomputed planning step
        re-adds its sub-steps, and only new ones are added). A planning step that runs again in
        a recompute pass re-plans: its sub-steps come in the order it adds them now, and a sub-step
        it no longer adds (a module that was removed, say) leaves the plan.

        Args:
            fn: a registered step function, or its name (positional: a step argument may be
                called ``fn`` too).
            name: unique step name (default ``fn[arg=value, ...]``).
            position: ``"next"`` -- after this step, in the order added (sub-steps), or ``"end"``.
            **args: the step's arguments (encodable values).

        Raises:
            SpecError: unknown ``fn``, a name taken by a different step, or bad position.
        """
        if callable(fn):  # the function itself: find the name it was registered under
            fn = next((n for n, s in self._runner.task.steps.items() if s.fn is fn), getattr(fn, "__name__", fn))
        if fn not in self._runner.task.steps:
            raise SpecError(f"add_step: task {self.task_id!r} has no step function {fn!r}", task_id=self.task_id,
                            hint=f"register it with @task.step (known: {', '.join(sorted(self._runner.task.steps))})")
        if position not in ("next", "end"):
            raise SpecError(f"add_step: position must be 'next' or 'end', got {position!r}", task_id=self.task_id)
        step_name = name or default_step_name(fn, args)
        entry = todo_entry(step_name, fn, args, self.step)
        existing = self._runner.state.entry(step_name) or next(
            (e for e in self._added + self._added_end if e["name"] == step_name), None)
        if existing is not None:
            if existing["fn"] == fn and dumps_sorted(existing["args"]) == dumps_sorted(entry["args"]):
                self._planned.append(step_name)
                return step_name  # already planned or done: adding it again is a no-op
            raise SpecError(f"add_step: task {self.task_id!r} already has a step {step_name!r} "
                            f"({existing['fn']} with other arguments)", task_id=self.task_id,
                            hint="pass a unique name=")
        (self._added if position == "next" else self._added_end).append(entry)
        self._planned.append(step_name)
        return step_name

    @property
    def should_stop(self) -> bool:
        """True once a stop was requested (SIGINT/SIGTERM): a long step may return early."""
        return self._runner.stop_requested
