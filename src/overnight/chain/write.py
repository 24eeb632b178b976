"""Writing the chain: the commit path -- append one checkpoint to a branch.

:class:`ChainWriter` is the write path of DESIGN.md: encode the state into blobs (only new
digests are written), build the record, digest and sign it, then one transaction inserts the
objects and the checkpoint and moves the branch ref by compare-and-swap. (The read side, load
and fallback, is :mod:`overnight.chain.read`.)
"""

from __future__ import annotations

import time

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from overnight.codec import digest
from overnight.codec.chunking import Cutter
from overnight.errors import StoreBusy
from overnight.store.base import CheckpointRow, Commit, JournalRow, Lease, Store, TaskRow
from overnight.store.blobs import BlobWriter
from overnight.chain.integrity import LoadedCheckpoint, encode_record, encode_state
from overnight.keys import HighWater, Mark
from overnight.chain.pages import ArtifactPager, PageWriter, done_pages, page_list, todo_pages
from overnight.chain.ditto import CopyPolicy
from overnight.chain.records import (
    ARTIFACT_PAGE,
    DONE_PAGE_SCHEMA,
    done_index,
    FORMAT_VERSION,
    TODO_PAGE,
    VALUE_INLINE_MAX,
    CheckpointRecord,
    StateDoc,
    validated,
)
from overnight.chain.rollback import store_identity

if TYPE_CHECKING:
    from overnight.chain.read import Fallback


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


def split_values(data: Any, writer: BlobWriter) -> tuple[Any, dict[str, dict[str, Any]]]:
    """``(data, values)`` for a state document: each top-level value of ``data`` (a JSON object
    tree) whose canonical JSON is longer than :data:`VALUE_INLINE_MAX` bytes is staged in
    ``writer`` as its own blob, named in ``values`` (``key -> {"digest", "size"}``) and left in
    ``data`` as ``null``. An unchanged value is the same blob: it costs a reference, not bytes."""
    if not isinstance(data, dict) or "$t" in data:  # not a JSON object (a tagged value): kept whole
        return data, {}
    inline: dict[str, Any] = {}
    values: dict[str, dict[str, Any]] = {}
    for k, v in data.items():
        if isinstance(v, (dict, list, str)):
            raw = encode_state(v)
            if len(raw) > VALUE_INLINE_MAX:
                values[k] = {"digest": writer.put(raw), "size": len(raw)}
                inline[k] = None
                continue
        inline[k] = v
    return (inline if values else data), values


def utc_now() -> str:
    """RFC 3339 UTC timestamp with microseconds, e.g. ``2026-11-30T01:02:03.456789+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class ChainWriter:
    """Appends checkpoints to one branch of one task.

    A commit costs what changed since the writer's last stored commit: the artifact map is
    compared with that commit's (names, and entries by identity) and cut into pages again from the
    first change on (:class:`~overnight.chain.pages.ArtifactPager`); only the entries named anew
    are considered for ditto copies and added to :attr:`known`. The caller builds each new state
    from the previous one's entry objects and does not change an entry in place (a changed entry
    is a new object), as for page reuse (:class:`~overnight.chain.pages.PageWriter`).

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
        cutter: cuts and hashes the large blobs of its commits, reusing the previous commit's
            cuts (an appending artifact is cut and hashed from its last chunk boundary on).
    """

    def __init__(self, store: Store, task_id: str, branch: str, *, key: bytes | None,
                 session_id: str, session_n: int) -> None:
        self.store, self.task_id, self.branch, self.key = store, task_id, branch, key
        self.session_id, self.session_n = session_id, session_n
        self.head: str | None = None
        self.ref_head: str | None = None
        self.seq = -1
        self.known: set[str] = set()
        self.cutter = Cutter()
        self._todo = PageWriter()
        self._done = PageWriter()
        self._artifacts = PageWriter()
        self._pager = ArtifactPager()  # the artifact map's pages, recut from the first change on
        self._middles: dict[str, list] = {k: [[], None] for k in ("todo", "done", "artifacts")}  # see page_list
        self._unsettled: set[str] = set()  # artifact digests whose ditto copies may still be due
        self._ditto = CopyPolicy(store)

    def start_from(self, loaded: LoadedCheckpoint, fallback: Fallback | None) -> None:
        """Continue after ``loaded`` (the branch ref names ``fallback.head_id`` after a fallback)."""
        self.head = loaded.id
        self.ref_head = fallback.head_id if fallback else loaded.id
        self.seq = loaded.record.seq
        self._pager.reset()  # the next commit walks the loaded map once
        # a page upgraded from an older format is not reused: the next commit writes it anew
        for p in loaded.todo_pages:
            if not p.migrated:
                self._todo.seed(p.tree, p.ref)
        for p in loaded.done_pages.loaded():  # those of a lazy load not read yet stay as stored
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
        """A :class:`BlobWriter` for the next commit, sharing this chain's known-digest cache and cutter."""
        return BlobWriter(self.store, self.known, self.cutter)

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
        """Write one checkpoint of ``state`` (a :class:`~overnight.chain.records.TaskState` tree;
        its ``todo`` and ``done`` lists and ``artifacts`` map are stored as pages,
        :mod:`overnight.chain.pages`).

        Args:
            event: an :func:`~overnight.chain.records.event` dict.
            writer: blob writer holding objects staged for this commit (artifacts).
            journal: step rows (``step_key, step_name, started_at, duration_ms, tokens_in, tokens_out``).

        Returns the new checkpoint id. Durable when it returns.

        The record, the state document and every page encoded anew are validated against
        :mod:`overnight.chain.records` before anything is written.

        Raises:
            RecordInvalid: ``state``, ``event`` or ``fingerprint`` does not match the record format.
            StaleHead: the branch moved since this writer last read or wrote it.
            LeaseLost: ``lease`` was taken over.
        """
        writer = writer or self.blob_writer()
        ids = {"task_id": self.task_id, "checkpoint_id": self.head}
        artifacts = state["artifacts"]
        pages, fresh = self._pager.cut(artifacts)
        if fresh is None:  # the first commit of this writer (or after a load): every artifact
            fresh = [a["digest"] for a in artifacts.values()]
        all_refs = {
            "todo": self._todo.refs(todo_pages(state["todo"]), writer, TODO_PAGE, "todo page", **ids),
            "done": self._done.refs(done_pages(state["done"]), writer, DONE_PAGE_SCHEMA, "done page",
                                    index=done_index, **ids),
            "artifacts": self._artifacts.refs(pages, writer, ARTIFACT_PAGE, "artifact page", kept=self._pager.kept,
                                              **ids),
        }
        doc_refs = {k: page_list(v, writer, self._middles[k]) for k, v in all_refs.items()}
        # every page and page list: ditto-copied whole once shared, and reachable from this branch
        page_blobs = [*(r["digest"] for v in all_refs.values() for r in v["pages"]),
                      *(v["middle"]["digest"] for v in doc_refs.values() if v["middle"] is not None)]
        data, values = split_values(state["data"], writer)
        doc = {**state, **doc_refs, "data": data, "values": values}
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
        # the artifacts whose copies may be due: those named anew, and those not settled before
        # that the map still names (a settled one adds no copy; see CopyPolicy)
        due = list(dict.fromkeys([*fresh, *(d for d in self._unsettled if self._pager.referenced(d))]))
        objects = [*writer.commit_objects(), *self._ditto.copies(  # ditto copies (overnight/chain/ditto.py)
            writer, row, state=state_digest, artifacts=[*due, *(v["digest"] for v in values.values())],
            whole=[*page_blobs, *([fingerprint["world"]["digest"]] if fingerprint is not None else [])])]
        if sum(len(o.data) for o in objects) > PREWRITE_BYTES:
            objects = self._prewrite(objects)
        _retry_busy(lambda: self.store.commit(Commit(row, self.ref_head, objects, rows, lease, task_row)))
        for page_writer in (self._todo, self._done, self._artifacts, self._pager, self._ditto):
            page_writer.accept()
        self._unsettled = {d for d in due if not self._ditto.settled(d)}
        # what this commit staged and references (an artifact named before was made known then)
        roots = [state_digest, *page_blobs, *fresh, *(v["digest"] for v in values.values())]
        if fingerprint is not None:
            roots.append(fingerprint["world"]["digest"])
        self.known.update(writer.closure(roots))
        self.head = self.ref_head = cid
        self.seq = row.seq
        if self.key is not None:  # this machine wrote the new head: its high-water mark follows it
            spec = state["task"]["spec"]
            HighWater().raise_to(store_identity(self.store), self.task_id, self.branch,
                                 Mark(cid, row.seq, str(spec.get("salt", "")) if isinstance(spec, dict) else "",
                                      row.created_at),
                                 force=True)
        return cid
