"""Reading the chain: load the newest checkpoint of a branch that verifies, falling back past bad ones.

(The write side, :class:`~overnight.chain.write.ChainWriter`, is :mod:`overnight.chain.write`.)
When a branch head fails verification, its parents are tried in turn (following the parent
pointer the store indexed for it) until one passes; the bad records are left in place for
inspection, never deleted or overwritten. :class:`Fallback` says which checkpoints were skipped,
which check failed on each, and which steps they had committed (now to be redone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any, Iterable

from overnight.errors import (
    BranchNotFound,
    CheckpointNotFound,
    FormatTooNew,
    IntegrityError,
    NoValidCheckpoint,
    OvernightError,
    SchemaError,
    short_id,
)
from overnight.store.base import CheckpointRow, Store
from overnight.chain.ditto import HealingReader
from overnight.chain.integrity import (
    LoadedCheckpoint,
    load_checkpoint,
    parse_record,
)


@dataclass(frozen=True)
class Skipped:
    """A checkpoint passed over on resume: its id, seq (None if unreadable), step and why
    (``object_digest``: the damaged or missing object, when that was the cause)."""

    checkpoint_id: str
    seq: int | None
    step: str | None
    error: str
    reason: str
    object_digest: str | None = None


@dataclass
class Fallback:
    """What resuming from an older checkpoint than the branch head cost."""

    head_id: str
    used_id: str | None = None
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def redo_steps(self) -> list[str]:
        """Steps committed by the skipped checkpoints, which will run again."""
        return [s.step for s in reversed(self.skipped) if s.step]

    def describe(self) -> str:
        if self.used_id:
            lines = [f"branch head {short_id(self.head_id)} failed verification; continuing from the newest "
                     f"valid checkpoint {short_id(self.used_id)}"]
        else:
            lines = [f"branch head {short_id(self.head_id)} failed verification, and so did every checkpoint "
                     "before it: there is nothing safe to continue from"]
        for s in self.skipped:
            where = ", ".join(x for x in (f"seq {s.seq}" if s.seq is not None else "", f"step {s.step}" if s.step else "") if x)
            lines.append(f"  skipped {short_id(s.checkpoint_id)}" + (f" ({where})" if where else "") + f": {s.error}: {s.reason}")
        if self.redo_steps and self.used_id:
            lines.append(f"  steps to redo: {', '.join(self.redo_steps)}")
        return "\n".join(lines)


def load_head(
    store: Store, task_id: str, branch: str = "main", *, key: bytes | None = None, deep: bool = True,
    verified: set[str] | None = None, lazy_done: bool = False,
) -> tuple[LoadedCheckpoint, Fallback | None]:
    """Load the newest verifiable checkpoint of ``task_id``/``branch``.

    Tries the branch head, then its parents: a failed checkpoint's parent pointer is followed only
    when its record passes every record check -- digest, canonical form, schema, and with ``key``
    the signature -- so the failure lies deeper (e.g. a damaged state blob); the store's index
    columns are not covered by the digest and are never trusted. When the chain is broken -- a
    record is missing or fails a record check (forged, unsigned, damaged) -- it continues with the
    newest (by verified ``seq``) record of the branch that passes the record checks; records that
    do not are reported as skipped and contribute nothing. Returns ``(checkpoint, fallback)``;
    ``fallback`` is None when the head verified. ``verified`` collects the digest of every object
    of the returned checkpoint found intact (not those of the records skipped on the way).
    ``lazy_done``: the done pages are read and verified as they are used
    (:func:`~overnight.chain.integrity.load_checkpoint`), so the load costs the same at any chain
    length -- and a damaged done page is not a reason to fall back: it raises when it is used.

    Raises:
        TaskNotFound: no such task.
        BranchNotFound: the task has no such branch.
        FormatTooNew: a checkpoint on the way was written by a newer overnight (never skipped).
        NoValidCheckpoint: no checkpoint on the branch verifies.
    """
    head = store.get_ref(task_id, branch)
    if head is None:
        store.get_task(task_id)  # raises TaskNotFound
        raise BranchNotFound(f"task {task_id!r} has no branch {branch!r}", task_id=task_id,
                             hint="`overnight log TASK_ID` lists the branches")
    fallback: Fallback | None = None
    tried: set[str] = set()
    candidates: list[CheckpointRow] | None = None
    cid: str | None = head
    broken = False
    while True:
        if cid is None or cid in tried:
            if not broken:
                break
            if candidates is None:
                fallback = fallback or Fallback(head_id=head)
                candidates = _verified_records(store, task_id, branch, key, tried, fallback)
            rest = [r for r in candidates if r.checkpoint_id not in tried]
            if not rest:
                break
            cid = rest[0].checkpoint_id
        tried.add(cid)
        # a fresh set per attempt: only the objects of the checkpoint that loads reach ``verified``
        # (a writer trusts those as reachable from its branch; a skipped record's are not)
        seen: set[str] = set()
        foreign = False
        try:
            loaded = load_checkpoint(store, cid, key=key, deep=deep, reader=HealingReader(store, seen),
                                     lazy_done=lazy_done)
            if loaded.record.task_id != task_id:  # a ref moved onto another task's checkpoint
                foreign = True
                raise SchemaError(f"branch {branch!r} of task {task_id!r} names checkpoint {short_id(cid)}, a "
                                  f"checkpoint of task {loaded.record.task_id!r}", task_id=task_id, checkpoint_id=cid)
        except FormatTooNew:
            # intact, but written by a newer overnight: falling back past it would let this run
            # commit over (and orphan) the newer work
            raise
        except (IntegrityError, CheckpointNotFound) as exc:
            try:
                row = store.get_checkpoint(cid)
                # another task's record: neither its parent pointer nor its seq says anything of this task
                parent, seq, step = (_UNKNOWN, None, None) if foreign else _trusted_parent(row, key)
                if parent is _UNKNOWN:  # the record itself failed: its parent pointer (and seq) count for
                    # nothing; the index's seq and step serve only as labels in the report
                    parent, seq, step, broken = None, row.seq, row.step, True
            except CheckpointNotFound:
                parent, seq, step = None, None, None
                broken = True
            fallback = fallback or Fallback(head_id=head)
            fallback.skipped.append(Skipped(cid, seq, step, type(exc).__name__, exc.message,
                                            getattr(exc, "object_digest", None)))
            cid = parent
            continue
        if verified is not None:
            verified.update(seen)
        if fallback is not None:
            fallback.used_id = loaded.id
        return loaded, fallback
    assert fallback is not None
    exc = NoValidCheckpoint(
        f"no checkpoint of task {task_id!r} on branch {branch!r} passes verification\n{fallback.describe()}",
        task_id=task_id,
        checkpoint_id=head,
        hint="run `overnight verify TASK_ID` for the full report",
    )
    exc.fallback = fallback
    raise exc


def head_problems(store: Store, task_id: str, branches: Iterable[str], *, key: bytes | None = None) -> dict[str, str]:
    """``checkpoint_id -> "ErrorKind: reason"`` of every checkpoint a resume of one of ``branches``
    would skip: each head loaded as a resume loads it (:func:`load_head`, artifact content hashed),
    and what its fallback skipped -- damage :func:`~overnight.chain.integrity.record_problems` does
    not look for, such as an artifact whose bytes no longer hash to their digest. A branch with
    nothing that verifies contributes the checkpoints it tried; one that cannot be read
    (``TaskNotFound``, ``FormatTooNew``, a store error) contributes nothing: the caller reports it.
    Costs one head load per branch, its artifacts read and hashed."""
    out: dict[str, str] = {}
    for branch in branches:
        try:
            _, fallback = load_head(store, task_id, branch, key=key)
        except NoValidCheckpoint as exc:
            fallback = exc.fallback
        except OvernightError:
            continue
        for s in fallback.skipped if fallback is not None else ():
            out.setdefault(s.checkpoint_id, f"{s.error}: {s.reason}")
    return out


_UNKNOWN: Any = object()


def _trusted_parent(row: CheckpointRow, key: bytes | None) -> tuple[Any, int | None, str | None]:
    """``(parent, seq, step)`` of a checkpoint that failed verification, from its record when the
    record itself passes every record check (digest, canonical form, schema, index columns, and
    the signature with a key) -- the failure lies deeper, e.g. a damaged state blob -- else
    ``_UNKNOWN`` parent: a record that fails any check contributes nothing, not its parent pointer
    and not its seq, and the caller searches the branch's verified records instead."""
    try:
        record = parse_record(row, key=key)
    except IntegrityError:
        return _UNKNOWN, None, None
    return record.parent_id, record.seq, record.event.step


def _verified_records(store: Store, task_id: str, branch: str, key: bytes | None, tried: set[str],
                      fallback: Fallback) -> list[CheckpointRow]:
    """The task's records committed to ``branch`` that pass every record check, newest first by
    their *verified* ``seq`` (the index columns are only a filter). Those that fail are reported
    in ``fallback`` as skipped; none of them is a candidate, and nothing of them is followed."""
    good: list[tuple[int, str, CheckpointRow]] = []
    for row in store.list_checkpoints(task_id):
        if row.branch != branch or row.checkpoint_id in tried:
            continue
        try:
            record = parse_record(row, key=key)
        except FormatTooNew:
            raise
        except IntegrityError as exc:
            tried.add(row.checkpoint_id)
            fallback.skipped.append(Skipped(row.checkpoint_id, row.seq, row.step, type(exc).__name__, exc.message))
            continue
        if record.branch == branch:
            good.append((record.seq, record.created_at, row))
    good.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [r for _, _, r in good]


def served_by_copy(s: Store, rows: Iterable[CheckpointRow], key: bytes | None) -> dict[str, tuple[str, Any]]:
    """``checkpoint id -> (what is damaged, verified record)`` for each of ``rows`` (checkpoints
    found damaged by a plain read) that loads when damaged originals are read from their verified
    ditto copies -- as a resume and ``verify`` read them (nothing is written). Its artifacts must
    be present too; the others stay damaged. ``ls``, ``show``, ``log`` and the dashboard count such a
    checkpoint as ``verify`` does: not invalid. Raises nothing of its own (a row that cannot be
    read stays damaged)."""
    out: dict[str, tuple[str, Any]] = {}
    for row in rows:
        reader = HealingReader(s, write_back=False)
        try:
            loaded = load_checkpoint(s, row.checkpoint_id, key=key, deep=False, reader=reader, row=row)
        except OvernightError:
            continue
        if reader.healed:
            out[row.checkpoint_id] = ("; ".join(f"{h.what} {short_id(h.digest)} is damaged ({h.reason})"
                                                for h in reader.healed), loaded.record)
    return out
