"""The checkpoint record and the task state document, as pydantic schemas (record format 4).

Every field is required: a record missing ``todo``, ``done``, an artifact reference or anything
else is invalid -- never "resumed with defaults". Unknown fields are refused too. The prose spec,
with the invariants and the change log, is ``docs/FORMAT.md``; ``tests/test_format_spec.py``
checks its record tables against these models, so the two cannot drift apart.

Records are validated on write as well as on read: writers build entries and documents with the
builders below (:func:`todo_entry`, :func:`done_entry`, :func:`artifact_ref`, :func:`event`,
:func:`context_info`, :func:`recompute_info`, :func:`initial_state`), each of which validates
through its model and returns the JSON tree that is stored, and
:meth:`overnight.chain.write.ChainWriter.commit` validates the record, the state document and
every page it encodes before anything is written. Records of format 1 are upgraded on load by
:mod:`overnight.chain.migrate`.

Values that come from user code (step arguments, outputs, user data) appear here as *JSON trees*
of :mod:`overnight.codec.canonical` (``Any``); they are decoded to Python objects only when a
step reads them.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from overnight.errors import RecordInvalid

FORMAT_VERSION = 4
"""Format of checkpoint records and state documents written by this code (formats 1 to 3 are read
and upgraded, :mod:`overnight.chain.migrate`)."""

VALUE_INLINE_MAX = 2 * 1024
"""Bytes: a top-level value of the user state (``ctx.state[key]``) whose canonical JSON is longer
than this is stored as its own blob and named in the state document's ``values`` (format 3), so an
unchanged large value costs one reference per checkpoint, not a re-stored part of the document."""

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


def rollback_kind(ev: Event) -> str | None:
    """What a ``rollback`` event was, from its detail (written by the runner and ``overnight
    rollback``): ``automatic fallback`` (a resume went back past damage), ``accepted rollback``
    (``resume --allow-rollback``) or ``rollback`` (``overnight rollback``); None for other events."""
    if ev.kind != "rollback":
        return None
    return next((k for k in ("automatic fallback", "accepted rollback") if (ev.detail or "").startswith(k)), "rollback")


def event(kind: str, *, step: str | None = None, key: str | None = None, ref: str | None = None,
          detail: str | None = None) -> dict[str, Any]:
    """An :class:`Event` as stored (every member present), validated.

    Raises:
        RecordInvalid: ``kind`` is not an event kind, or a member is mistyped.
    """
    return _tree(Event, {"kind": kind, "step": step, "key": key, "ref": ref, "detail": detail})


class Fingerprint(_Strict):
    """What a resume depends on, recorded in every checkpoint.

    Attributes:
        world: blob of the world fingerprint (:class:`WorldDoc`), the same blob for every
            checkpoint of a session, so it costs nothing per step.
        exports: ``artifact -> digest`` committed for artifacts the task exports to files.
        accepted: drift accepted so far (``{"component", "key", "old", "new", "steps"}``),
            carried forward on every later checkpoint; ``steps``: the done steps computed without it
            (``old`` is what they were computed with) -- a step that runs again leaves the list, an
            item whose steps all ran again is dropped. (``steps`` is absent from an item an older
            overnight wrote: kept as it is.)
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
    """A collection stored as page blobs: ``count`` entries in the pages ``pages[:1] + <the refs
    listed by middle> + pages[1:]`` (just ``pages`` when ``middle`` is None).

    ``done``: each page a canonical JSON list of :class:`DoneEntry`, :data:`DONE_PAGE` per page,
    all full but the last. ``todo``: each page a canonical JSON list of :class:`TodoEntry`, split
    as :data:`PAGE_FANOUT` says. ``artifacts``: each page a canonical JSON object ``name ->``
    :class:`ArtifactRef`, names sorted across pages, split as :data:`PAGE_FANOUT` says.

    ``middle`` (format 3): with three pages or more, ``pages`` holds only the first and the last
    page and ``middle`` is a blob holding the canonical JSON list of the other pages' references
    (``[{"digest", "size"}, ...]``, in order, at least one). A collection that changes at its ends
    -- the done list grows at the end, the todo list is consumed from the front -- then leaves the
    ``middle`` blob unchanged and the state document keeps a fixed size however many pages there are.
    """

    count: int = Field(ge=0)
    pages: list[BlobRef]
    middle: BlobRef | None


class DoneSummary(_Strict):
    """What the drift check needs of a done page's entries, aggregated (format 4).

    Attributes:
        fns: ``step function -> [code version, ...]`` of the page's entries (distinct, in order
            of first appearance).
        reads: ``kind -> key -> [recorded digest, ...]`` over the entries' ``reads`` of the kinds
            the drift check compares with the world (:data:`SUMMARY_READS`; distinct values, in
            order of first appearance). A kind no entry read is absent.
    """

    fns: dict[str, list[str]]
    reads: dict[str, dict[str, list[Any]]]


class DoneRef(BlobRef):
    """The reference of a done page (format 4): the blob, plus an index of its entries checked
    against them whenever the page is read (so ``verify`` checks every one).

    Attributes:
        names: for each entry, in order, the first 8 hex digits of the SHA-256 of its ``name``
            (UTF-8, surrogates kept), concatenated: a look-up of a step by name (or by key: a
            step's key covers its name) reads only the pages whose tags match.
        summary: :class:`DoneSummary` of the page's entries: the drift check compares these with
            the world and reads the entries only when something differs.

    Both are null only in a document upgraded from format 3 (a stored format-4 document without
    them fails to load): the page is then read for any look-up, as format 3 did.
    """

    names: str | None
    summary: DoneSummary | None


class DonePageSet(Pages):
    """The done collection's :class:`Pages`, whose page references are :class:`DoneRef`."""

    pages: list[DoneRef]


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
    ``artifacts`` as page references, so its size does not grow with the plan or the history).

    ``values``: top-level members of ``data`` stored as their own blobs (each the canonical JSON
    of the value; those longer than :data:`VALUE_INLINE_MAX` bytes): ``key -> blob``. Such a key
    keeps its place in ``data`` with the placeholder ``null``, which the blob's value replaces on
    load. Empty unless ``data`` is a JSON object."""

    format: int
    task: TaskInfo
    todo: Pages
    done: DonePageSet
    artifacts: Pages
    data: Any
    context: ContextInfo
    recompute: Recompute | None
    values: dict[str, BlobRef]


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


PAGE_LIST = TypeAdapter(list[BlobRef])
"""Schema of a :attr:`Pages.middle` blob (page references)."""
DONE_PAGE_LIST = TypeAdapter(list[DoneRef])
"""Schema of the done collection's :attr:`Pages.middle` blob (format 4: :class:`DoneRef`)."""

SUMMARY_READS = ("inputs", "listings", "sources", "env", "packages", "model")
"""The kinds of ``reads`` a :class:`DoneSummary` aggregates: those the drift check compares with
the world (:data:`overnight.verify.drift.READ_COMPONENT`)."""


def name_tag(name: str) -> str:
    """The 8 hex digits :attr:`DoneRef.names` holds for an entry named ``name``."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def done_summary(entries: Any) -> dict[str, Any]:
    """The :class:`DoneSummary` tree of done entries (trees), in order."""
    fns: dict[str, list[str]] = {}
    reads: dict[str, dict[str, list[Any]]] = {}
    for d in entries:
        versions = fns.setdefault(d["fn"], [])
        if d["version"] not in versions:
            versions.append(d["version"])
        got = d["reads"]
        for kind in SUMMARY_READS:
            keyed = got.get(kind)
            if not keyed:
                continue
            into = reads.setdefault(kind, {})
            for key, old in keyed.items():
                olds = into.setdefault(key, [])
                if old not in olds:
                    olds.append(old)
    return {"fns": fns, "reads": {k: reads[k] for k in SUMMARY_READS if k in reads}}


def merge_summaries(summaries: Any) -> dict[str, Any]:
    """One :class:`DoneSummary` tree for several (pages in order): the same as
    :func:`done_summary` of all their entries."""
    fns: dict[str, list[str]] = {}
    reads: dict[str, dict[str, list[Any]]] = {}
    for s in summaries:
        for fn, versions in s["fns"].items():
            into = fns.setdefault(fn, [])
            into.extend(v for v in versions if v not in into)
        for kind, keyed in s["reads"].items():
            by_key = reads.setdefault(kind, {})
            for key, olds in keyed.items():
                into = by_key.setdefault(key, [])
                into.extend(o for o in olds if o not in into)
    return {"fns": fns, "reads": {k: reads[k] for k in SUMMARY_READS if k in reads}}


def done_index(entries: Any) -> dict[str, Any]:
    """``{"names", "summary"}`` of a done page's entries (trees): what its :class:`DoneRef`
    adds to ``{"digest", "size"}``."""
    return {"names": "".join(name_tag(d["name"]) for d in entries), "summary": done_summary(entries)}
TODO_PAGE = TypeAdapter(list[TodoEntry])
"""Schema of a todo page blob."""
DONE_PAGE_SCHEMA = TypeAdapter(list[DoneEntry])
"""Schema of a done page blob."""
ARTIFACT_PAGE = TypeAdapter(dict[str, ArtifactRef])
"""Schema of an artifact page blob."""
WORLD = TypeAdapter(WorldDoc)
"""Schema of a world fingerprint blob."""


# --- builders: every record a writer stores is built (and validated) here -------------------------


def validation_summary(exc: ValidationError) -> str:
    """The first five problems of a pydantic validation error, ``loc: message; ...``."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg'].lower()}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def validated(model: type[BaseModel], tree: Any, what: str, *, task_id: str | None = None,
              checkpoint_id: str | None = None) -> BaseModel:
    """``model.model_validate(tree)``, raising :class:`~overnight.errors.RecordInvalid` (naming
    ``what``, the task and the checkpoint written on) instead of pydantic's error."""
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        raise RecordInvalid(f"{what} does not match record format {FORMAT_VERSION}: {validation_summary(exc)}; "
                            "nothing was written", task_id=task_id, checkpoint_id=checkpoint_id,
                            hint="this is a bug in the code that built the record") from exc


def _tree(model: type[BaseModel], tree: dict[str, Any]) -> dict[str, Any]:
    """Validate ``tree`` as ``model`` and return it as stored: a plain dict of the validated
    members (values kept as given -- JSON trees are not copied)."""
    validated(model, tree, model.__name__)
    return tree


def todo_entry(name: str, fn: str, args: Any, *, added_by: str | None = None,
               previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """A :class:`TodoEntry` tree (``args`` a canonical-JSON tree)."""
    return _tree(TodoEntry, {"name": name, "fn": fn, "args": args, "added_by": added_by, "previous": previous})


def done_entry(*, name: str, fn: str, key: str, version: str, args: Any, output: Any, reads: dict[str, Any],
               writes: list[str], added_by: str | None, produced: dict[str, Any], seq: int, session: int,
               started_at: str, duration_ms: float, tokens_in: int = 0, tokens_out: int = 0,
               replayed_tokens: int = 0) -> dict[str, Any]:
    """A :class:`DoneEntry` tree."""
    return _tree(DoneEntry, {
        "name": name, "fn": fn, "key": key, "version": version, "args": args, "output": output, "reads": reads,
        "writes": writes, "added_by": added_by, "produced": produced, "seq": seq, "session": session,
        "started_at": started_at, "duration_ms": duration_ms, "tokens_in": tokens_in, "tokens_out": tokens_out,
        "replayed_tokens": replayed_tokens})


def artifact_ref(digest: str, size: int, *, text: bool, step: str | None) -> dict[str, Any]:
    """An :class:`ArtifactRef` tree."""
    return _tree(ArtifactRef, {"digest": digest, "size": size, "text": text, "step": step})


def context_info(summary: str | None = None, compactions: int = 0, messages: list | None = None,
                 tokens: int = 0) -> dict[str, Any]:
    """A :class:`ContextInfo` tree (the empty context by default)."""
    return _tree(ContextInfo, {"summary": summary, "compactions": compactions,
                               "messages": [] if messages is None else messages, "tokens": tokens})


def recompute_info(dirty_steps: list[str] = (), dirty_state: list[str] = (),  # type: ignore[assignment]
                   dirty_artifacts: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """A :class:`Recompute` tree."""
    return _tree(Recompute, {"dirty_steps": list(dirty_steps), "dirty_state": list(dirty_state),
                             "dirty_artifacts": list(dirty_artifacts)})


def initial_state(task_id: str, goal: str, spec: dict[str, Any], *, todo: list[dict[str, Any]] = (),  # type: ignore[assignment]
                  data: Any = None, artifacts: dict[str, dict[str, Any]] | None = None,
                  context: dict[str, Any] | None = None) -> dict[str, Any]:
    """A task's first state (:class:`TaskState` tree): nothing done, the empty context, no
    recompute pass. The entries are validated again, with the rest, when committed."""
    return {"format": FORMAT_VERSION, "task": _tree(TaskInfo, {"id": task_id, "goal": goal, "spec": spec}),
            "todo": list(todo), "done": [], "artifacts": dict(artifacts or {}), "data": data,
            "context": context if context is not None else context_info(), "recompute": None}
