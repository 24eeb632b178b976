"""The chain: appending checkpoints to a branch, and loading the newest one that verifies.

:class:`ChainWriter` is the write path of DESIGN.md: encode the state into blobs (only new
digests are written), build the record, digest and sign it, then one transaction inserts the
objects and the checkpoint and moves the branch ref by compare-and-swap.

When a branch head fails verification, its parents are tried in turn (following the parent
pointer the store indexed for it) until one passes; the bad records are left in place for
inspection, never deleted or overwritten. :class:`Fallback` says which checkpoints were skipped,
which check failed on each, and which steps they had committed (now to be redone).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from datetime import datetime, timezone
from typing import Any

from overnight.codec import digest
from overnight.errors import (
    BranchNotFound,
    CheckpointNotFound,
    FormatTooNew,
    IntegrityError,
    NoValidCheckpoint,
    StoreBusy,
    short_id,
)
from overnight.store.base import CheckpointRow, Commit, JournalRow, Lease, Store, TaskRow
from overnight.store.blobs import BlobWriter
from overnight.verify.ditto import CopyPolicy, HealingReader
from overnight.verify.integrity import LoadedCheckpoint, encode_record, encode_state, load_checkpoint, parse_record
from overnight.verify.keys import HighWater, Mark
from overnight.verify.pages import PageWriter, artifact_pages, done_pages, todo_pages
from overnight.verify.records import (
    ARTIFACT_PAGE,
    DONE_PAGE_SCHEMA,
    FORMAT_VERSION,
    TODO_PAGE,
    CheckpointRecord,
    StateDoc,
    validated,
)
from overnight.verify.rollback import store_identity


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
    verified: set[str] | None = None,
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
        try:
            loaded = load_checkpoint(store, cid, key=key, deep=deep, reader=HealingReader(store, seen))
        except FormatTooNew:
            # intact, but written by a newer overnight: falling back past it would let this run
            # commit over (and orphan) the newer work
            raise
        except (IntegrityError, CheckpointNotFound) as exc:
            try:
                row = store.get_checkpoint(cid)
                parent, seq, step = _trusted_parent(row, key)
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
    raise NoValidCheckpoint(
        f"no checkpoint of task {task_id!r} on branch {branch!r} passes verification\n{fallback.describe()}",
        task_id=task_id,
        checkpoint_id=head,
        hint="run `overnight verify TASK_ID` for the full report",
    )


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


PREWRITE_BYTES = 16 * 1024 * 1024
"""A commit carrying more object bytes than this writes them first, in batches of about this
size, each in its own short transaction, so the commit itself holds the store's write lock only
briefly (another process's commit on the same SQLite file waits at most its busy timeout)."""

BUSY_RETRY_S = 60.0
"""How long a commit keeps retrying while the store reports ``StoreBusy`` (nothing was written by
a busy attempt) before giving up."""


def _retry_busy(write: Any) -> Any:
    """Run ``write``; on ``StoreBusy`` retry with backoff for up to :data:`BUSY_RETRY_S` seconds."""
    deadline = time.monotonic() + BUSY_RETRY_S
    delay = 0.05
    while True:
        try:
            return write()
        except StoreBusy:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def utc_now() -> str:
    """RFC 3339 UTC timestamp with microseconds, e.g. ``2026-11-30T01:02:03.456789+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class ChainWriter:
    """Appends checkpoints to one branch of one task.

    Args:
        store: the store.
        task_id, branch: where to append.
        key: HMAC-SHA256 signing key (None: unsigned).
        session_id, session_n: the session stamped on every checkpoint written.

    Attributes:
        head: parent of the next checkpoint (the newest *valid* one).
        ref_head: what the branch ref names, which the next commit's CAS expects; differs from
            ``head`` only after a fallback, when the ref still names a checkpoint that failed
            verification (the bad records stay in place, off the new chain).
        seq: ``seq`` of ``head`` (-1 before the first checkpoint).
        known: digests verified to be stored intact and reachable from this branch -- the objects
            of the checkpoint it continues from (pass it as ``verified`` to :func:`load_head`) and
            those its commits reference; deduplication trusts these and hashes anything else
            first. An object a commit staged but does not reference is not added: nothing keeps
            it from ``gc``, so it must be carried again if a later commit needs it.
    """

    def __init__(self, store: Store, task_id: str, branch: str, *, key: bytes | None,
                 session_id: str, session_n: int) -> None:
        self.store, self.task_id, self.branch, self.key = store, task_id, branch, key
        self.session_id, self.session_n = session_id, session_n
        self.head: str | None = None
        self.ref_head: str | None = None
        self.seq = -1
        self.known: set[str] = set()
        self._todo = PageWriter()
        self._done = PageWriter()
        self._artifacts = PageWriter()
        self._ditto = CopyPolicy(store)

    def start_from(self, loaded: LoadedCheckpoint, fallback: Fallback | None) -> None:
        """Continue after ``loaded`` (the branch ref names ``fallback.head_id`` after a fallback)."""
        self.head = loaded.id
        self.ref_head = fallback.head_id if fallback else loaded.id
        self.seq = loaded.record.seq
        # a page upgraded from an older format is not reused: the next commit writes it anew
        for p in loaded.todo_pages:
            if not p.migrated:
                self._todo.seed(p.tree, p.ref)
        for p in loaded.done_pages:
            if not p.migrated:
                self._done.seed(p.tree, p.ref)
        for p in loaded.artifact_pages:
            if not p.migrated:
                self._artifacts.seed(p.tree, p.ref)

    def _prewrite(self, objects: list[Any]) -> list[Any]:
        """Store a large commit's objects ahead of it, in batches of about :data:`PREWRITE_BYTES`;
        returns what the commit itself still carries (nothing). The writes refresh the objects'
        stored time, so ``gc``'s grace period protects them until the commit references them."""
        batch: list[Any] = []
        size = 0
        for o in objects:
            batch.append(o)
            size += len(o.data)
            if size >= PREWRITE_BYTES:
                _retry_busy(lambda b=batch: self.store.put_objects(b))
                batch, size = [], 0
        if batch:
            _retry_busy(lambda b=batch: self.store.put_objects(b))
        return []

    def blob_writer(self) -> BlobWriter:
        """A :class:`BlobWriter` for the next commit, sharing this chain's known-digest cache."""
        return BlobWriter(self.store, self.known)

    def commit(
        self,
        state: dict[str, Any],
        event: dict[str, Any],
        *,
        writer: BlobWriter | None = None,
        journal: list[dict[str, Any]] = (),  # type: ignore[assignment]
        lease: Lease | None = None,
        task_row: TaskRow | None = None,
        fingerprint: dict[str, Any] | None = None,
    ) -> str:
        """Write one checkpoint of ``state`` (a :class:`~overnight.verify.records.TaskState` tree;
        its ``todo`` and ``done`` lists and ``artifacts`` map are stored as pages,
        :mod:`overnight.verify.pages`).

        Args:
            event: an :func:`~overnight.verify.records.event` dict.
            writer: blob writer holding objects staged for this commit (artifacts).
            journal: step rows (``step_key, step_name, started_at, duration_ms, tokens_in, tokens_out``).

        Returns the new checkpoint id. Durable when it returns.

        The record, the state document and every page encoded anew are validated against
        :mod:`overnight.verify.records` before anything is written.

        Raises:
            RecordInvalid: ``state``, ``event`` or ``fingerprint`` does not match the record format.
            StaleHead: the branch moved since this writer last read or wrote it.
            LeaseLost: ``lease`` was taken over.
        """
        writer = writer or self.blob_writer()
        ids = {"task_id": self.task_id, "checkpoint_id": self.head}
        doc_refs = {
            "todo": self._todo.refs(todo_pages(state["todo"]), writer, TODO_PAGE, "todo page", **ids),
            "done": self._done.refs(done_pages(state["done"]), writer, DONE_PAGE_SCHEMA, "done page", **ids),
            "artifacts": self._artifacts.refs(artifact_pages(state["artifacts"]), writer, ARTIFACT_PAGE,
                                              "artifact page", **ids),
        }
        doc = {**state, **doc_refs}
        validated(StateDoc, doc, "state document", **ids)
        state_bytes = encode_state(doc)
        state_digest = writer.put(state_bytes)
        created_at = utc_now()
        record = {
            "format": FORMAT_VERSION,
            "task_id": self.task_id,
            "parent_id": self.head,
            "branch": self.branch,
            "seq": self.seq + 1,
            "session": {"id": self.session_id, "n": self.session_n},
            "created_at": created_at,
            "event": event,
            "state": {"digest": state_digest, "size": len(state_bytes)},
            "fingerprint": fingerprint,
        }
        validated(CheckpointRecord, record, "checkpoint record", **ids)
        body = encode_record(record)
        cid = digest.sha256(body)
        row = CheckpointRow(
            checkpoint_id=cid, task_id=self.task_id, parent_id=self.head, branch=self.branch, seq=self.seq + 1,
            created_at=created_at, session=self.session_id, event=event["kind"], step=event.get("step"), body=body,
            signature=digest.sign(self.key, body) if self.key else None, stored_bytes=0,
        )
        rows = [JournalRow(task_id=self.task_id, checkpoint_id=cid, seq=row.seq, session=self.session_id, **j)
                for j in journal]
        objects = [*writer.commit_objects(), *self._ditto.copies(  # ditto copies (overnight/verify/ditto.py)
            writer, row, state=state_digest, artifacts=[a["digest"] for a in state["artifacts"].values()],
            whole=[*(r["digest"] for k in ("todo", "done", "artifacts") for r in doc_refs[k]["pages"]),
                   *([fingerprint["world"]["digest"]] if fingerprint is not None else [])])]
        if sum(len(o.data) for o in objects) > PREWRITE_BYTES:
            objects = self._prewrite(objects)
        _retry_busy(lambda: self.store.commit(Commit(row, self.ref_head, objects, rows, lease, task_row)))
        for pages in (self._todo, self._done, self._artifacts):
            pages.accept()
        roots = [state_digest, *(r["digest"] for k in ("todo", "done", "artifacts") for r in doc_refs[k]["pages"]),
                 *(a["digest"] for a in state["artifacts"].values())]
        if fingerprint is not None:
            roots.append(fingerprint["world"]["digest"])
        self.known.update(writer.closure(roots))
        self.head = self.ref_head = cid
        self.seq = row.seq
        if self.key is not None:  # this machine wrote the new head: its high-water mark follows it
            spec = state["task"]["spec"]
            HighWater().raise_to(store_identity(self.store), self.task_id, self.branch,
                                 Mark(cid, row.seq, str(spec.get("salt", "")) if isinstance(spec, dict) else ""),
                                 force=True)
        return cid
