"""The checkpoint record and the task state document, as pydantic schemas (format version 1).

Every field is required: a record missing ``todo``, ``done``, an artifact reference or anything
else is invalid -- never "resumed with defaults". Unknown fields are refused too. The prose spec,
with the invariants and the change log, is ``docs/FORMAT.md``.

Values that come from user code (step arguments, outputs, user data) appear here as *JSON trees*
of :mod:`overnight.codec.canonical` (``Any``); they are decoded to Python objects only when a
step reads them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

FORMAT_VERSION = 1
"""Format of checkpoint records and state documents written by this code."""

WORLD_FORMAT = 2
"""World fingerprint format: 1 without ``model``, 2 with it (docs/FORMAT.md, Changes)."""

DONE_PAGE = 64
"""Done entries per page blob. Pages are immutable once full, so a checkpoint stores one new
(last) page, not the whole history: commit cost and verification stay flat as a task grows."""

PAGE_FANOUT = 32
"""Average entries per todo or artifact page. A page ends after an entry whose name's SHA-256
(of its UTF-8, surrogates kept), read as a big-endian uint32, is divisible by this: boundaries
depend on the entries alone, so adding, removing or changing one entry rewrites one page,
whatever the length of the list (todo: in list order; artifacts: in sorted name order)."""

Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class BlobRef(_Strict):
    """A reference to a blob: its digest and its size in bytes."""

    digest: Digest
    size: int = Field(ge=0)


class ArtifactRef(BlobRef):
    """A named output stored as a blob. ``text``: written with ``write_text`` (UTF-8)."""

    text: bool
    step: str | None


class SessionRef(_Strict):
    """The session that wrote a checkpoint: ``id`` (unique per run) and ``n`` (1, 2, ... per task)."""

    id: str
    n: int = Field(ge=0)


class Event(_Strict):
    """Why the checkpoint exists.

    ``kind``: ``init`` (task created), ``step`` (a step committed), ``compaction`` (the context
    was summarised at a session boundary), ``fork`` (a branch was created), ``merge``,
    ``rollback``, ``drift`` (steps invalidated or drift accepted on resume). ``step`` and ``key`` name the step for ``step`` events; ``ref`` is the other
    checkpoint involved: the fork point, the rollback target, or the merged branch head.
    """

    kind: Literal["init", "step", "compaction", "fork", "merge", "rollback", "drift"]
    step: str | None
    key: str | None
    ref: str | None
    detail: str | None


def event(kind: str, *, step: str | None = None, key: str | None = None, ref: str | None = None,
          detail: str | None = None) -> dict[str, Any]:
    """An :class:`Event` as stored (every member present)."""
    return {"kind": kind, "step": step, "key": key, "ref": ref, "detail": detail}


class Fingerprint(_Strict):
    """What a resume depends on, recorded in every checkpoint.

    Attributes:
        world: blob of the world fingerprint (:class:`WorldDoc`), the same blob for every
            checkpoint of a session, so it costs nothing per step.
        exports: ``artifact -> digest`` committed for artifacts the task exports to files.
        accepted: drift accepted so far (``{"component", "key", "old", "new"}``), carried
            forward on every later checkpoint.
    """

    world: BlobRef
    exports: dict[str, str]
    accepted: list[dict[str, Any]]


class WorldDoc(_Strict):
    """The world fingerprint blob (:func:`overnight.verify.fingerprint.world`).

    ``format`` 1 has no ``model``; format 2 adds it (``{"spec", "name", "base_url", "tokenizer"}``
    or null). A larger format is refused (``FormatTooNew``)."""

    format: int = Field(ge=1)
    code: dict[str, Any]
    deps: dict[str, Any]
    env: dict[str, Any]
    inputs: dict[str, str]
    model: dict[str, Any] | None = None


class CheckpointRecord(_Strict):
    """The checkpoint body. ``checkpoint_id = sha256(canonical sorted JSON of this record)``.

    Attributes:
        format: record format version (:data:`FORMAT_VERSION`); checked before anything else.
        task_id: the task.
        parent_id: previous checkpoint on the chain (None for a task's first checkpoint).
        branch: branch this checkpoint was committed to.
        seq: depth in the chain: 0 for the first checkpoint, parent's seq + 1 after.
        session: the session that wrote it.
        created_at: RFC 3339 UTC timestamp with microseconds.
        event: why it exists.
        state: the state document blob (:class:`TaskState`).
        fingerprint: what a resume depends on (:class:`Fingerprint`); None when not recorded.
    """

    format: int
    task_id: str = Field(min_length=1)
    parent_id: str | None
    branch: str = Field(min_length=1)
    seq: int = Field(ge=0)
    session: SessionRef
    created_at: str
    event: Event
    state: BlobRef
    fingerprint: Fingerprint | None


class TaskInfo(_Strict):
    """The task itself: id, goal and spec (expected span in seconds, criticality, plan, ...)."""

    id: str
    goal: str
    spec: dict[str, Any]


class TodoEntry(_Strict):
    """A step still to run: unique ``name``, the step function ``fn``, its ``args`` (JSON tree).

    ``previous``: for a step taken off the done list by a drift recompute, its last run:
    ``produced`` digests (:attr:`DoneEntry.produced`), ``reads``, ``version``, ``seq``,
    ``checkpoint`` (the checkpoint that committed it, None if unknown) and ``direct`` (it read
    what drifted). When it comes up, it runs again if ``direct``, if its version changed, or if
    anything it read has changed since (the world, or what steps run again in this pass
    produced); otherwise it is *replayed*: its recorded effect is applied from ``checkpoint``
    without running it (see :class:`Recompute`).
    """

    name: str
    fn: str
    args: Any
    added_by: str | None
    previous: dict[str, Any] | None


class DoneEntry(_Strict):
    """A committed step.

    Attributes:
        key: call key ``sha256(fn, version, name, args)``; a todo step whose key is here is not
            run again -- as long as what it read (``reads``) has not drifted.
        reads: what the step read, with the digest at the time: ``inputs`` (path -> digest of the
            file or tree), ``listings`` (directory -> listing digest), ``sources`` (name ->
            digest), ``env`` (name -> keyed digest), ``packages`` (name -> version),
            ``steps`` (names of steps whose output it read), ``artifacts`` (name -> digest),
            ``state`` (top-level ``ctx.state`` keys it read).
        writes: names of the artifacts it wrote.
        added_by: the step that added it (None for a planned step).
        produced: digests of what it produced: ``output``, ``state`` (key -> digest of each
            top-level ``ctx.state`` key it changed), ``artifacts`` (name -> digest).
        output: the step's return value (JSON tree).
        seq: seq of the checkpoint that committed it.
        duration_ms: wall time of the step function (ms).
        tokens_in, tokens_out: model tokens of the calls the step made (0 without model calls).
        replayed_tokens: tokens of calls replayed from the call journal instead of made again.
    """

    name: str
    fn: str
    key: str
    version: str
    args: Any
    output: Any
    reads: dict[str, Any]
    writes: list[str]
    added_by: str | None
    produced: dict[str, Any]
    seq: int
    session: int
    started_at: str
    duration_ms: float
    tokens_in: int
    tokens_out: int
    replayed_tokens: int


class Pages(_Strict):
    """A collection stored as page blobs: ``count`` entries in ``pages``.

    ``done``: each page a canonical JSON list of :class:`DoneEntry`, :data:`DONE_PAGE` per page,
    all full but the last. ``todo``: each page a canonical JSON list of :class:`TodoEntry`, split
    as :data:`PAGE_FANOUT` says. ``artifacts``: each page a canonical JSON object ``name ->``
    :class:`ArtifactRef`, names sorted across pages, split as :data:`PAGE_FANOUT` says.
    """

    count: int = Field(ge=0)
    pages: list[BlobRef]


class ContextInfo(_Strict):
    """The context window carried across steps and sessions.

    Attributes:
        summary: the latest compaction summary (None before the first compaction).
        compactions: how many compactions there were.
        messages: this session's model exchanges so far, each a list of ``{"role", "content"}``
            messages ending with the reply; emptied by a compaction.
        tokens: tokens of ``messages`` (the budget that triggers compaction).
    """

    summary: str | None
    compactions: int
    messages: list[list[dict[str, str]]]
    tokens: int


class Recompute(_Strict):
    """A drift recompute in progress: what steps run again so far produced differently.

    The user state was rewound to just before the earliest affected step; every step after it
    is in the todo list with its ``previous`` run, and runs again only if something it read is
    named here (or in the world) -- otherwise it is replayed. Cleared when the pass is done.
    """

    dirty_steps: list[str]
    dirty_state: list[str]
    dirty_artifacts: list[str]


class StateDoc(_Strict):
    """The state document a checkpoint's ``state`` blob holds (``todo``, ``done`` and
    ``artifacts`` as page references, so its size does not grow with the plan or the history)."""

    format: int
    task: TaskInfo
    todo: Pages
    done: Pages
    artifacts: Pages
    data: Any
    context: ContextInfo
    recompute: Recompute | None


class TaskState(_Strict):
    """A checkpoint's state with the done list read from its pages (what steps and tools use)."""

    format: int
    task: TaskInfo
    todo: list[TodoEntry]
    done: list[DoneEntry]
    artifacts: dict[str, ArtifactRef]
    data: Any
    context: ContextInfo
    recompute: Recompute | None
