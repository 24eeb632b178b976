"""The ``Store`` protocol: the one narrow interface every storage backend implements.

A store keeps five kinds of things (spec: ``docs/FORMAT.md``):

* **objects** -- immutable, addressed by the SHA-256 of the content they stand for; written once,
  never modified (``INSERT`` ignores a digest already present);
* **checkpoints** -- immutable records; ``checkpoint_id`` is the SHA-256 of ``body``;
* **refs** -- ``(task_id, branch) -> checkpoint_id``, the only mutable pointers, moved by
  compare-and-swap in the same transaction as the checkpoint insert;
* **journal** -- one row per committed step (index over checkpoints, for ``show`` and stats);
* **leases** -- ``(task_id, branch) -> holder`` with expiry and a fencing token.

Backends never interpret object payloads or checkpoint bodies: encoding, chunking and
verification live above them. Every backend passes ``tests/test_store_conformance.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """One stored object.

    Attributes:
        digest: ``sha256:<hex>`` of the content the object stands for (for a ``tree``, the whole
            reassembled blob, not the payload).
        kind: ``"blob"`` (payload is the content) or ``"tree"`` (payload is canonical JSON
            ``{"chunks": n, "index": digest, "size": bytes}`` of a chunked blob).
        size: length of the uncompressed payload in bytes.
        codec: ``"zstd"`` or ``"none"``: how ``data`` encodes the payload.
        data: the stored bytes.
    """

    digest: str
    kind: str
    size: int
    codec: str
    data: bytes


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """A checkpoint as stored: the canonical ``body`` plus index columns copied from it.

    Attributes:
        checkpoint_id: ``sha256:<hex>`` of ``body`` (the checkpoint is addressed by its content).
        task_id, parent_id, branch, seq, created_at, session, event, step: copies of body fields,
            for listing without decoding (verification checks they agree with the body).
        body: canonical JSON bytes of the checkpoint record (sorted keys, ASCII).
        signature: ``hmac-sha256:<hex>`` over ``body`` when a signing key is configured, else None.
        stored_bytes: bytes this commit added to the store (objects it inserted that were not
            there yet, plus the body), computed by the store at commit; ignored on input.
    """

    checkpoint_id: str
    task_id: str
    parent_id: str | None
    branch: str
    seq: int
    created_at: str
    session: str
    event: str
    step: str | None
    body: bytes
    signature: str | None
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task's registration: written once with its first checkpoint.

    Attributes:
        task_id: the task's id (unique in the store).
        created_at: RFC 3339 UTC timestamp.
        goal: the task's goal in one line (for ``ls``).
        entry: where its code lives, ``"path/to/file.py:task"`` or ``"package.module:task"``, so
            ``overnight resume TASK_ID`` can load it; None for tasks built in code only.
        spec: canonical JSON bytes of the task spec (span, criticality, plan, router decision).
    """

    task_id: str
    created_at: str
    goal: str
    entry: str | None
    spec: bytes


@dataclass(frozen=True, slots=True)
class JournalRow:
    """One committed step execution (an index over checkpoints; the checkpoint is the truth).

    Attributes:
        duration_ms: wall time of the step function in milliseconds.
        tokens_in, tokens_out: model tokens the step used (0 when it made no model call).
    """

    task_id: str
    checkpoint_id: str
    seq: int
    step_key: str
    step_name: str
    session: str
    started_at: str
    duration_ms: float
    tokens_in: int = 0
    tokens_out: int = 0


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One model call made inside a step, recorded *before* the step commits (the call journal):
    a step that runs again after a crash replays it instead of calling (and paying) again.

    Attributes:
        step_key: key of the step that made the call.
        seq: position of the call within that step's execution (0, 1, ...).
        request_digest: ``sha256`` of the canonical request (model, messages, parameters).
        model: which model answered.
        response: canonical JSON bytes of the completion (text, finish reason).
        tokens_in, tokens_out: tokens of the prompt and the reply.
        latency_ms: wall time of the call (ms).
        created_at: RFC 3339 UTC.
    """

    task_id: str
    step_key: str
    seq: int
    request_digest: str
    model: str
    response: bytes
    tokens_in: int
    tokens_out: int
    latency_ms: float
    created_at: str


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease on ``(task_id, branch)``.

    Attributes:
        holder: JSON text describing the holder (id, host, pid, process start time, command).
        holder_id: unique id of the holding process/run.
        token: fencing token; grows by one on every acquisition of this lease.
        expires_at_ms: Unix time in milliseconds after which another process may take the lease.
    """

    task_id: str
    branch: str
    holder_id: str
    holder: str
    token: int
    expires_at_ms: int


@dataclass(slots=True)
class Commit:
    """Everything one checkpoint commit writes, in one transaction.

    Attributes:
        checkpoint: the new checkpoint.
        expected_head: the branch head this writer read (None: the branch must not exist yet).
        objects: objects to insert (already present digests are ignored).
        journal: step rows to insert.
        lease: the writer's lease; the commit fails with ``LeaseLost`` if it no longer holds it.
        task: the task registration, for the first commit of a new task.

    An object whose digest is already stored is not written again -- unless the stored bytes
    differ from the given ones, which hash to the digest by construction: the stored copy is then
    damaged and is replaced (self-healing; the content behind a digest never changes).
    """

    checkpoint: CheckpointRow
    expected_head: str | None
    objects: list[ObjectRecord] = field(default_factory=list)
    journal: list[JournalRow] = field(default_factory=list)
    lease: Lease | None = None
    task: TaskRow | None = None


@runtime_checkable
class Store(Protocol):
    """Storage backend. All methods are synchronous and safe to call from several threads.

    Errors: lookups raise :class:`~overnight.errors.NotFound` subclasses; a lock held by another
    process for longer than the backend's wait raises :class:`~overnight.errors.StoreBusy`; a
    store whose schema is newer than this code raises
    :class:`~overnight.errors.StoreVersionError` on open.
    """

    url: str

    # objects ---------------------------------------------------------------------------------
    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        """The subset of ``digests`` not stored."""
        ...

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        """Stored objects by digest; absent digests are simply not in the result."""
        ...

    def put_objects(self, objects: Iterable[ObjectRecord]) -> None:
        """Insert objects outside a commit (already present digests are ignored)."""
        ...

    def iter_object_digests(self) -> Iterator[str]:
        """Every stored object's digest, in no particular order (for ``verify --all`` and gc)."""
        ...

    # checkpoints and refs --------------------------------------------------------------------
    def commit(self, commit: Commit) -> int:
        """Insert objects, the checkpoint and journal rows, and CAS the branch ref, atomically.

        Durable when it returns. Returns the bytes it added (objects not already stored, plus
        the body), which it also records as the checkpoint's ``stored_bytes``. Raises :class:`~overnight.errors.StaleHead` when the branch head
        is not ``commit.expected_head`` and :class:`~overnight.errors.LeaseLost` when
        ``commit.lease`` is no longer held; nothing is written in either case.
        """
        ...

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        """Raises :class:`~overnight.errors.CheckpointNotFound`."""
        ...

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        """Every checkpoint of the task, all branches, ordered by ``seq`` then ``created_at``."""
        ...

    def get_ref(self, task_id: str, branch: str) -> str | None:
        """The branch head's checkpoint id, or None when the branch does not exist."""
        ...

    def list_refs(self, task_id: str) -> dict[str, str]:
        """``branch -> checkpoint_id`` for every branch of the task."""
        ...

    def set_ref(self, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        """CAS a ref without a new checkpoint (fork, rollback); ``new=None`` deletes it.

        Raises :class:`~overnight.errors.StaleHead` when the current value is not ``expected``.
        """
        ...

    # tasks and journal -----------------------------------------------------------------------
    def get_task(self, task_id: str) -> TaskRow:
        """Raises :class:`~overnight.errors.TaskNotFound`."""
        ...

    def list_tasks(self) -> list[TaskRow]:
        """Every task, oldest first."""
        ...

    def journal(self, task_id: str) -> list[JournalRow]:
        """Committed step rows of the task, by ``seq``."""
        ...

    # call journal ----------------------------------------------------------------------------
    def record_call(self, call: CallRecord) -> None:
        """Record a model call; durable when it returns. A call already recorded under the same
        ``(task_id, step_key, seq, request_digest)`` is kept (first write wins)."""
        ...

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        """Recorded calls of a task (of one step, with ``step_key``), oldest first."""
        ...

    # leases ----------------------------------------------------------------------------------
    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        """Take the lease, or raise :class:`~overnight.errors.TaskBusy` naming the live holder.

        An expired lease, or one whose holder is a dead process on this host, is taken over.
        """
        ...

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        """Extend a held lease; raises :class:`~overnight.errors.LeaseLost` if it was taken over."""
        ...

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up (no error if it was already taken over)."""
        ...

    # housekeeping ----------------------------------------------------------------------------
    def stored_bytes(self) -> int:
        """Bytes the store occupies on its medium (database file(s), objects and records)."""
        ...

    def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...
