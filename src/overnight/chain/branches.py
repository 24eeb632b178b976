"""Chain operations: fork, rollback, merge, and the history graph for ``overnight log``.

Each operation writes a new checkpoint (event ``fork`` / ``rollback`` / ``merge``, with ``ref``
naming the other checkpoint involved); none rewrites or deletes one:

* **fork** -- a new branch whose first checkpoint has the fork point as parent and the same
  state. Both branches continue independently; neither sees the other's later checkpoints.
* **rollback** -- the branch gets a checkpoint whose state is an earlier checkpoint's and whose
  parent is the current head, so the rolled-back checkpoints stay in the history (and are never
  garbage), and the steps after the target run again on the next resume.
* **merge** -- the union of two branches' done steps, artifacts and user state, three-way against
  their common ancestor; the same step, artifact or state key changed differently on both sides
  is a conflict, reported with both sides, unless ``prefer`` picks one.

Rollback and merge take the target branch's lease, so they never race a run of that branch.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from overnight.codec.canonical import dumps, from_tree
from overnight.errors import BranchExists, ConfigError, MergeConflict, OvernightError, short_id
from overnight.store.base import CheckpointRow, Store
from overnight.store.leases import DEFAULT_TTL_MS, Holder
from overnight.chain.write import ChainWriter
from overnight.chain.read import head_problems, load_head, served_by_copy
from overnight.chain.integrity import LoadedCheckpoint, load_checkpoint, parse_record, record_problems
from overnight.chain.reachability import lineage
from overnight.chain.records import event, rollback_kind


def _writer(store: Store, base: LoadedCheckpoint, branch: str, key: bytes | None, ref_head: str | None) -> ChainWriter:
    chain = ChainWriter(store, base.record.task_id, branch, key=key, session_id="op-" + uuid.uuid4().hex,
                        session_n=base.record.session.n)
    chain.start_from(base, None)
    chain.ref_head = ref_head
    return chain


class _Leased:
    """Hold ``(task, branch)``'s lease for the duration of an operation; its commit passes the
    lease, so an operation that outlives it (a stall past the TTL while another run took the
    branch over) fails with ``LeaseLost`` instead of committing over that run's work."""

    def __init__(self, store: Store, task_id: str, branch: str) -> None:
        self.store, self.task_id, self.branch = store, task_id, branch

    def __enter__(self):
        holder = Holder.current()
        self.lease = self.store.acquire_lease(self.task_id, self.branch, holder.id, holder.to_json(), DEFAULT_TTL_MS)
        return self.lease

    def __exit__(self, *exc: object) -> None:
        self.store.release_lease(self.lease)


MAX_BRANCH_NAME = 200
"""Characters in a branch name."""


def check_branch_name(branch: Any, task_id: str | None = None) -> str:
    """Return ``branch`` if it can name a branch: a non-empty ``str`` of at most
    :data:`MAX_BRANCH_NAME` characters, without control characters (U+0000-U+001F, U+007F-U+009F),
    lone surrogates or leading/trailing whitespace -- names a user must be able to type back.

    Raises:
        ConfigError: naming the problem.
    """
    problem = None
    if not isinstance(branch, str) or not branch:
        problem = "must be a non-empty string"
    elif len(branch) > MAX_BRANCH_NAME:
        problem = f"is longer than {MAX_BRANCH_NAME} characters"
    elif branch != branch.strip():
        problem = "starts or ends with whitespace"
    elif any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in branch):
        problem = "contains a control character or a lone surrogate"
    if problem:
        raise ConfigError(f"branch name {branch!r} {problem}", task_id=task_id,
                          hint="use a short printable name such as `experiment-2`")
    return branch


def fork(store: Store, task_id: str, at: str, branch: str, *, key: bytes | None = None) -> str:
    """Create ``branch`` from checkpoint ``at``; returns the fork checkpoint's id.

    Raises:
        ConfigError: ``branch`` is not a valid name (:func:`check_branch_name`).
        BranchExists: ``branch`` already exists.
        IntegrityError: ``at`` does not verify (a branch never starts from a bad state).
    """
    check_branch_name(branch, task_id)
    if store.get_ref(task_id, branch) is not None:
        raise BranchExists(f"task {task_id!r} already has a branch {branch!r}", task_id=task_id,
                           hint="pick another --branch name")
    base = load_checkpoint(store, at, key=key, deep=True)
    if base.record.task_id != task_id:
        raise ConfigError(f"checkpoint {short_id(at)} belongs to task {base.record.task_id!r}", task_id=task_id)
    chain = _writer(store, base, branch, key, None)
    return chain.commit(base.state_tree, event("fork", ref=base.id,
                                               detail=f"from {base.record.branch} at seq {base.record.seq}"),
                        fingerprint=_dump(base.record.fingerprint))


def ancestors(store: Store, task_id: str, cid: str) -> list[str]:
    """``cid`` and all its ancestors (through merges too), newest (highest ``seq``) first."""
    rows = {r.checkpoint_id: r for r in store.list_checkpoints(task_id)}
    found = lineage(rows.values(), [cid]) & rows.keys()
    return sorted(found, key=lambda c: (rows[c].seq, rows[c].created_at), reverse=True)


def rollback(store: Store, task_id: str, to: str, *, branch: str = "main", key: bytes | None = None) -> str:
    """Give ``branch`` a new head with the state of its ancestor ``to``; returns its id.

    Raises:
        ConfigError: ``to`` is not an ancestor of the branch head (use ``fork`` instead).
        TaskBusy: a run holds the branch.
    """
    with _Leased(store, task_id, branch) as lease:
        ref = store.get_ref(task_id, branch)  # the compare-and-swap below expects exactly this
        head, _ = load_head(store, task_id, branch, key=key, deep=False)
        if to not in ancestors(store, task_id, head.id):
            raise ConfigError(f"checkpoint {short_id(to)} is not an ancestor of branch {branch!r}", task_id=task_id,
                              hint="to continue from another branch's checkpoint, fork it: overnight fork --at")
        target = load_checkpoint(store, to, key=key, deep=True)
        dropped = head.doc.done.count - target.doc.done.count
        chain = _writer(store, head, branch, key, ref)
        ev = event("rollback", ref=target.id, detail=f"to seq {target.record.seq}; {max(dropped, 0)} step(s) "
                   "will run again")
        return chain.commit(target.state_tree, ev, lease=lease, fingerprint=_dump(target.record.fingerprint))


@dataclass
class Conflict:
    """One merge conflict: what (``step``/``artifact``/``data``), its name, and both sides."""

    kind: str
    name: str
    ours: Any
    theirs: Any


@dataclass
class MergeResult:
    """What :func:`merge` did."""

    checkpoint_id: str | None
    added_steps: list[str] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    up_to_date: bool = False


def _three_way(kind: str, base: dict, ours: dict, theirs: dict, conflicts: list[Conflict]) -> dict:
    out = dict(ours)
    for name in list(dict.fromkeys([*ours, *theirs])):
        o, t, b = ours.get(name, _MISSING), theirs.get(name, _MISSING), base.get(name, _MISSING)
        if _same(o, t) or _same(t, b):
            continue
        if _same(o, b):
            if t is _MISSING:
                out.pop(name, None)
            else:
                out[name] = t
            continue
        conflicts.append(Conflict(kind, name, None if o is _MISSING else o, None if t is _MISSING else t))
    return out


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    return dumps(a) == dumps(b)


def merge(store: Store, task_id: str, source: str, *, into: str = "main", prefer: str | None = None,
          key: bytes | None = None) -> MergeResult:
    """Merge branch ``source`` into ``into``; see the module docstring.

    Args:
        prefer: ``"ours"`` (keep ``into``'s side) or ``"theirs"`` (take ``source``'s) for
            conflicts; None refuses to merge when there are any.

    Raises:
        MergeConflict: conflicts and no ``prefer``; ``.conflicts`` lists each with both sides.
        TaskBusy: a run holds ``into``.
    """
    if prefer not in (None, "ours", "theirs"):
        raise ConfigError(f"prefer must be 'ours' or 'theirs', got {prefer!r}", task_id=task_id)
    with _Leased(store, task_id, into) as lease:
        ref = store.get_ref(task_id, into)  # the compare-and-swap below expects exactly this
        ours, _ = load_head(store, task_id, into, key=key, deep=True)
        theirs, _ = load_head(store, task_id, source, key=key, deep=True)
        our_line = set(ancestors(store, task_id, ours.id))
        if theirs.id in our_line:
            return MergeResult(None, up_to_date=True)
        common = next((c for c in ancestors(store, task_id, theirs.id) if c in our_line), None)
        base_state: dict[str, Any] = (load_checkpoint(store, common, key=key, deep=False).state_tree
                                      if common else {"done": [], "artifacts": {}, "data": {}})
        o, t = ours.state_tree, theirs.state_tree
        conflicts: list[Conflict] = []

        done = list(o["done"])
        by_name = {d["name"]: d for d in done}
        added = []
        for d in t["done"]:
            mine = by_name.get(d["name"])
            if mine is None:
                done.append(d)
                by_name[d["name"]] = d
                added.append(d["name"])
            elif mine["key"] != d["key"] or not _same(mine["output"], d["output"]):
                conflicts.append(Conflict("step", d["name"], {"key": mine["key"], "output": mine["output"]},
                                          {"key": d["key"], "output": d["output"]}))
        artifacts = _three_way("artifact", base_state["artifacts"], o["artifacts"], t["artifacts"], conflicts)
        if all(isinstance(x, dict) and "$t" not in x for x in (o["data"], t["data"], base_state["data"])):
            data = _three_way("data", base_state["data"], o["data"], t["data"], conflicts)
        else:
            merged = _three_way("data", {"": base_state["data"]}, {"": o["data"]}, {"": t["data"]}, conflicts)
            data = merged[""]

        if conflicts and prefer is None:
            lines = [f"  {c.kind} {c.name!r}: ours {_side(c.kind, c.ours)} / theirs {_side(c.kind, c.theirs)}"
                     for c in conflicts[:10]]
            raise MergeConflict(
                f"merging {source!r} into {into!r} conflicts on {len(conflicts)} item(s):\n" + "\n".join(lines),
                task_id=task_id, conflicts=conflicts, hint="choose a side with --prefer ours|theirs",
            )
        for c in conflicts if prefer == "theirs" else []:
            if c.kind == "step":
                i = next(i for i, d in enumerate(done) if d["name"] == c.name)
                done[i] = next(d for d in t["done"] if d["name"] == c.name)
            elif c.kind == "artifact":
                if c.theirs is None:
                    artifacts.pop(c.name, None)
                else:
                    artifacts[c.name] = c.theirs
            elif c.name == "" and not isinstance(data, dict):
                data = c.theirs
            elif c.theirs is None:
                data.pop(c.name, None)
            else:
                data[c.name] = c.theirs
        done_names = {d["name"] for d in done}
        todo = [e for e in o["todo"] if e["name"] not in done_names]
        todo += [e for e in t["todo"] if e["name"] not in done_names and e["name"] not in {x["name"] for x in todo}]
        state = {**o, "todo": todo, "done": done, "artifacts": artifacts, "data": data}
        chain = _writer(store, ours, into, key, ref)
        detail = f"from {source} ({len(added)} step(s) added"
        detail += f", {len(conflicts)} conflict(s) resolved preferring {prefer})" if conflicts else ")"
        cid = chain.commit(state, event("merge", ref=theirs.id, detail=detail), lease=lease,
                           fingerprint=_dump(ours.record.fingerprint))
        return MergeResult(cid, added, conflicts)


def _dump(fingerprint: Any) -> dict[str, Any] | None:
    return None if fingerprint is None else fingerprint.model_dump()


def _side(kind: str, value: Any) -> str:
    """One side of a conflict, short but telling the sides apart."""
    if value is None:
        return "(absent)"
    if kind == "step":
        return f"key {value['key'][7:19]}, output {_brief(value['output'], 40)}"
    if kind == "artifact":
        return f"{value['digest'][7:19]} ({value['size']} bytes, written by {value.get('step')})"
    return _brief(value, 50)


def _brief(value: Any, limit: int = 60) -> str:
    """A stored value as the Python ``repr`` of what it decodes to (``{'n': 2}``, ``(1, 2)``), not
    its canonical-JSON encoding; cut at ``limit`` characters. A value that does not decode here (a
    class this process has not imported) falls back to its stored encoding."""
    try:
        text = repr(from_tree(value, "merge conflict"))
    except OvernightError:
        text = dumps(value).decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- history graph -------------------------------------------------------------------------------


@dataclass
class LogEntry:
    """One checkpoint in ``overnight log``: row data, parents (merges have two), heads, validity."""

    row: CheckpointRow
    parents: list[str]
    heads: list[str]
    valid: bool
    problem: str | None
    graph: str = ""
    healed: str | None = None
    """What the load before this checkpoint read from ditto copies (``self-healed: ...``), if anything."""
    why: str | None = None
    """A ``rollback`` record's kind (:func:`~overnight.chain.records.rollback_kind`), else None."""


def history(store: Store, task_id: str, *, key: bytes | None = None) -> list[LogEntry]:
    """Every checkpoint of the task, newest first (children before parents), with a text graph
    column like ``git log --graph --all`` in :attr:`LogEntry.graph`."""
    rows = store.list_checkpoints(task_id)
    heads: dict[str, list[str]] = {}
    for b, cid in sorted(store.list_refs(task_id).items()):
        heads.setdefault(cid, []).append(b)
    entries: dict[str, LogEntry] = {}
    damaged = record_problems(store, rows, key=key)  # the record and the objects a load reads
    # a damaged original its verified ditto copy serves loads: not INVALID, as `verify` counts it
    served = served_by_copy(store, [r for r in rows if r.checkpoint_id in damaged], key) if damaged else {}
    for cid in served:
        del damaged[cid]
    for cid, problem in head_problems(store, task_id, store.list_refs(task_id), key=key).items():
        damaged.setdefault(cid, problem)  # what a resume of a branch would skip (artifact content hashed)
    for r in rows:
        parents = [r.parent_id] if r.parent_id else []
        problem = damaged.get(r.checkpoint_id)
        healed = why = None
        try:
            rec = served[r.checkpoint_id][1] if r.checkpoint_id in served else parse_record(r, key=key)
            if rec.event.kind == "merge" and rec.event.ref:
                parents.append(rec.event.ref)
            detail = rec.event.detail or ""
            healed = detail[detail.index("self-healed:"):] if "self-healed:" in detail else None
            if r.checkpoint_id in served:  # read from its copy now (`overnight verify --repair` rewrites it)
                healed = f"served by its ditto copy: {served[r.checkpoint_id][0]}"
            why = rollback_kind(rec.event)
        except OvernightError:
            pass  # in damaged already
        entries[r.checkpoint_id] = LogEntry(r, parents, heads.get(r.checkpoint_id, []), problem is None, problem,
                                            healed=healed, why=why)
    order = _topo_newest_first(entries)
    _draw(order)
    return order


def _topo_newest_first(entries: dict[str, LogEntry]) -> list[LogEntry]:
    children: dict[str, int] = {cid: 0 for cid in entries}
    for e in entries.values():
        for p in e.parents:
            if p in children:
                children[p] += 1
    ready = [e for cid, e in entries.items() if children[cid] == 0]
    out: list[LogEntry] = []
    while ready:
        ready.sort(key=lambda e: (e.row.created_at, e.row.seq))
        e = ready.pop()
        out.append(e)
        for p in e.parents:
            if p in children:
                children[p] -= 1
                if children[p] == 0:
                    ready.append(entries[p])
    return out


def _draw(order: list[LogEntry]) -> None:
    """Fill :attr:`LogEntry.graph`: one column per open line of descent (``*`` marks the entry;
    a line ``|/`` before it shows where another line of descent joins it, as at a fork point)."""
    lanes: list[str | None] = []
    for e in order:
        cid = e.row.checkpoint_id
        cols = [i for i, lane in enumerate(lanes) if lane == cid]
        if not cols:
            free = next((i for i, lane in enumerate(lanes) if lane is None), None)
            if free is None:
                lanes.append(cid)
                free = len(lanes) - 1
            else:
                lanes[free] = cid
            cols = [free]
        col = cols[0]
        joins = ""
        if len(cols) > 1:
            cells = ["/" if i in cols[1:] else ("|" if lane is not None else " ") for i, lane in enumerate(lanes)]
            joins = _row(cells).replace(" /", "/")
            for i in cols[1:]:
                lanes[i] = None
        line = _row(["*" if i == col else ("|" if lane is not None else " ") for i, lane in enumerate(lanes)])
        e.graph = (joins + "\n" if joins else "") + line
        lanes[col] = e.parents[0] if e.parents else None
        for p in e.parents[1:]:
            if p not in lanes:
                free = next((i for i, lane in enumerate(lanes) if lane is None), None)
                if free is None:
                    lanes.append(p)
                else:
                    lanes[free] = p
        while lanes and lanes[-1] is None:
            lanes.pop()


def _row(cells: list[str]) -> str:
    return " ".join(cells).rstrip()
