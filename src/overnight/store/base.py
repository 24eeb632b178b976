"""The ``Store`` protocol: the one narrow interface every storage backend implements.

A store keeps six kinds of things (spec: ``docs/FORMAT.md``):

* **objects** -- immutable, addressed by the SHA-256 of the content they stand for; written once,
  never modified (``INSERT`` ignores a digest already present). Each has a *stored time*, set
  when it is written and refreshed whenever a commit writes it again (see "Deletion" below);
* **checkpoints** -- immutable records; ``checkpoint_id`` is the SHA-256 of ``body``;
* **refs** -- ``(task_id, branch) -> checkpoint_id``, the only mutable pointers, moved by
  compare-and-swap in the same transaction as the checkpoint insert;
* **journal** -- one row per committed step (index over checkpoints, for ``show`` and stats);
* **leases** -- ``(task_id, branch) -> holder`` with expiry and a fencing token;
* **archives** -- the catalog of tiered storage: which checkpoints and objects of a task were
  moved to a cold store, and where (:class:`ArchiveRow`).

Backends never interpret object payloads or checkpoint bodies: encoding, chunking and
verification live above them. Every backend passes ``tests/test_store_conformance.py``.

Deletion
--------

Data is removed **only** by the ``delete_*`` methods, and only ``overnight gc``, ``overnight rm``
and ``overnight archive`` call them (restic's rule: only ``prune`` removes data). Nothing else --
no commit, no ref move, no fallback -- ever deletes or overwrites an object or a checkpoint.
Deletion is made safe against writers that run at the same time by three rules every backend
keeps:

1. a commit *writes or refreshes* every object it carries: an object already stored gets its
   stored time set to now (:meth:`Store.commit`);
2. :meth:`Store.delete_objects` with ``min_age_ms`` checks an object's age and deletes it as one
   step (a transaction, a row lock, or a rename), so an object a commit refreshed a moment ago
   is never removed;
3. a commit whose parent checkpoint is gone fails (:class:`~overnight.errors.ParentGone`), and
   :meth:`Store.delete_checkpoints` skips a checkpoint that a ref names or that a checkpoint
   outside the deleted set has as its parent. A parent is always a checkpoint of the same task
   (a commit naming another task's checkpoint fails, :func:`check_parent`), so the
   children of a checkpoint are found among its own task's checkpoints.

``overnight gc`` builds its safety rule on these (``overnight/ops/gc.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, TypeVar, Union, runtime_checkable

from overnight.errors import ParentGone, SchemaError, StaleHead, short_id


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


@dataclass(frozen=True, slots=True)
class ObjectStat:
    """What :meth:`Store.iter_object_stats` says about one stored object.

    Attributes:
        digest: the object's digest.
        stored_bytes: bytes it occupies as the store counts them: the length of ``data`` in
            SQLite and PostgreSQL, the whole record (header line + ``data``) in key-value stores.
            :meth:`Store.delete_objects` frees exactly this many bytes for it.
        age_ms: milliseconds since its stored time (written, or last refreshed by a commit),
            measured by the store's own clock (SQLite: the local clock; PostgreSQL: the server's;
            files: the file's modification time against the local clock; S3: ``LastModified``
            against the server's ``Date``). Never negative.
    """

    digest: str
    stored_bytes: int
    age_ms: int


@dataclass(frozen=True, slots=True)
class ArchiveRow:
    """One archive run of a task, in a store's archive catalog (spec: ``docs/FORMAT.md``, "Tiered storage").

    The same row is written twice: in the cold store that holds the pack, and in the hot store the
    checkpoints were moved out of, which uses it to find them again.

    Attributes:
        archive_id: ``sha256:<hex>`` of the uncompressed manifest (the archive is addressed by
            its content, like a checkpoint).
        task_id: the task whose checkpoints were archived.
        created_at: RFC 3339 UTC timestamp of the archive run.
        location: in the hot store, the URL of the cold store holding the pack; in the cold
            store, the URL of the hot store the data came from (informational).
        manifest: the manifest: canonical JSON, as one zstd frame.
    """

    archive_id: str
    task_id: str
    created_at: str
    location: str
    manifest: bytes


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
    damaged and is replaced (self-healing; the content behind a digest never changes). Either
    way its stored time is refreshed to the commit's time, so a concurrent ``gc`` keeps it.
    A writer must carry in ``objects`` every object the checkpoint references except those
    reachable from checkpoints already committed on its own branch (see ``overnight/ops/gc.py``).
    """

    checkpoint: CheckpointRow
    expected_head: str | None
    objects: list[ObjectRecord] = field(default_factory=list)
    journal: list[JournalRow] = field(default_factory=list)
    lease: Lease | None = None
    task: TaskRow | None = None


DEFAULT_GRACE_S = 3600.0
"""Objects younger than this (seconds) are never collected (``gc``, ``rm``, ``archive``): the longest
a commit may take between storing its objects and naming them."""

MinAge = Union[int, Callable[[], int]]
"""A minimum age in ms for :meth:`Store.delete_objects`: a number, or a callable that returns it
when the store asks (the age a caller keeps grows while it waits for the store's lock)."""


# Placeholders of damaged cells or entries: a value of the expected type (so listings, sorts and
# sums still work and one bad row does not hide the rest) carrying a ``damage`` attribute that names
# the cell or key. The SQLite store reads a cell of the wrong type as one; the keyed stores list an
# unreadable ref as a DamagedText. Verification refuses a record holding one.


class DamagedText(str):
    """Placeholder of a text cell of the wrong type or an unreadable keyed-store ref; :attr:`damage`
    says which cell or key held what."""

    damage: str


class DamagedInt(int):
    """Placeholder of an integer cell of the wrong type; :attr:`damage` says which cell held what."""

    damage: str


class DamagedBytes(bytes):
    """Placeholder of a blob cell of the wrong type; :attr:`damage` says which cell held what."""

    damage: str


def age_limit(min_age_ms: MinAge | None) -> int | None:
    """``min_age_ms`` as a number of ms, calling it if it is a callable; None stays None."""
    return min_age_ms() if callable(min_age_ms) else min_age_ms


_C = TypeVar("_C", bound="Closing")


class Closing:
    """``with x:`` closes ``x`` on the way out: the context-manager half of every store, store
    wrapper and adapter (each defines ``close``)."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The store protocol, by concern. A backend implements them all (:class:`Store`); code that needs
# one concern names that one (gc's object sweep an ObjectStore, the chain a ChainStore, ...).
# All methods are synchronous and safe to call from several threads. Errors: lookups raise
# :class:`~overnight.errors.NotFound` subclasses; a lock held by another process for longer than
# the backend's wait raises :class:`~overnight.errors.StoreBusy`; a store whose schema is newer
# than this code raises :class:`~overnight.errors.StoreVersionError` on open.


@runtime_checkable
class ObjectStore(Protocol):
    """Content-addressed objects: write once, read by digest, delete only by ``gc``."""

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

    def iter_object_stats(self) -> Iterator[ObjectStat]:
        """Every stored object with its size and age (for ``gc``), in no particular order."""
        ...

    def delete_objects(self, digests: Iterable[str], *, min_age_ms: MinAge | None = None) -> int:
        """Delete objects; returns the bytes freed (their :attr:`ObjectStat.stored_bytes`).

        Digests that are not stored are ignored. With ``min_age_ms``, an object whose stored time
        is less than ``min_age_ms`` milliseconds ago (by the store's clock) is kept; the age is
        checked and the object deleted as one step, so a commit that refreshes the object at the
        same moment either comes first (and the object stays) or finds it gone and writes it anew.
        ``min_age_ms`` may be a callable returning the figure: the store calls it as late as it
        can -- once it holds its write lock, or just before each object's age test -- so that a
        wait for the lock does not shorten the age kept (:func:`age_limit`; ``overnight gc``).
        Callers make sure no remaining checkpoint references what they delete (``overnight gc``).
        """
        ...



@runtime_checkable
class ChainStore(Protocol):
    """Checkpoint records, branch refs (the only mutable thing), tasks and their step journal."""

    def commit(self, commit: Commit) -> int:
        """Insert objects, the checkpoint and journal rows, and CAS the branch ref, atomically.

        Durable when it returns. Returns the bytes it added (objects not already stored, plus
        the body), which it also records as the checkpoint's ``stored_bytes``. Objects already
        stored get their stored time refreshed. Raises :class:`~overnight.errors.StaleHead` when
        the branch head is not ``commit.expected_head``, :class:`~overnight.errors.LeaseLost`
        when ``commit.lease`` is no longer held, and :class:`~overnight.errors.ParentGone` when
        the checkpoint's parent is not stored (deleted meanwhile); nothing is written in any case.
        """
        ...

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        """Raises :class:`~overnight.errors.CheckpointNotFound`."""
        ...

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        """Every checkpoint of the task, all branches, ordered by ``seq`` then ``created_at``."""
        ...

    def checkpoints_after(self, task_id: str, branch: str, seq: int) -> list[CheckpointRow]:
        """The task's checkpoints recorded on ``branch`` (their ``branch`` column) with a ``seq``
        above ``seq``, ordered as :meth:`list_checkpoints` orders them: what the rollback check
        looks for (a newer record of the branch) without listing the task's whole history. The
        SQL stores answer from their ``(task_id, seq)`` index (cost: the rows returned); the
        key-value stores filter the task's index (their keys carry no ``seq``)."""
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

    def put_checkpoints(self, rows: Iterable[CheckpointRow], journal: Iterable[JournalRow] = ()) -> None:
        """Insert checkpoint records and their journal rows without moving any ref (``restore``
        brings archived history back this way). An id already stored is left as it is; each row's
        ``stored_bytes`` is kept as given. The task must exist."""
        ...

    def delete_checkpoints(self, checkpoint_ids: Iterable[str], *, orphans: bool = False) -> int:
        """Delete checkpoints and their journal rows; returns the bytes freed (their bodies).

        Ids that are not stored are ignored. A checkpoint that a ref names is never deleted (a
        branch head stays). Unless ``orphans`` is True, a checkpoint that is the parent of a
        checkpoint not being deleted is skipped as well -- a ``fork`` from a checkpoint that
        ``gc`` is collecting wins over ``gc`` -- checked and deleted as one step where the
        backend has transactions. ``archive`` passes ``orphans=True``: the older history it
        removes has been copied to the cold store first.
        """
        ...

    def delete_task(self, task_id: str) -> None:
        """Delete a task: its registration, refs, leases, checkpoints, journal rows, model calls and archive
        catalog rows. Objects stay (another task may share them); ``gc`` collects those no
        remaining checkpoint references. Deleting a task that does not exist does nothing."""
        ...

    # tasks and journal
    def get_task(self, task_id: str) -> TaskRow:
        """Raises :class:`~overnight.errors.TaskNotFound`."""
        ...

    def list_tasks(self) -> list[TaskRow]:
        """Every task, oldest first."""
        ...

    def journal(self, task_id: str) -> list[JournalRow]:
        """Committed step rows of the task, by ``seq``."""
        ...



@runtime_checkable
class CallJournal(Protocol):
    """Side table: model calls, so a resumed step replays a call instead of paying for it again."""

    def record_call(self, call: CallRecord) -> None:
        """Record a model call; durable when it returns. A call already recorded under the same
        ``(task_id, step_key, seq, request_digest)`` is kept (first write wins)."""
        ...

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        """Recorded calls of a task (of one step, with ``step_key``), oldest first."""
        ...



@runtime_checkable
class ArchiveCatalog(Protocol):
    """Side table: archive runs (tiered storage) -- which cold store holds which pack of a task."""

    def put_archive(self, row: ArchiveRow) -> None:
        """Record an archive run (an ``archive_id`` already recorded for the task is left as is)."""
        ...

    def list_archives(self, task_id: str | None = None) -> list[ArchiveRow]:
        """Archive rows of one task (or of every task), oldest first."""
        ...

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        """Forget an archive run (after ``restore``); the cold store is not touched."""
        ...



@runtime_checkable
class LeaseStore(Protocol):
    """Leases: one live holder per ``(task, branch)``, fencing the commits of a lost holder."""

    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        """Take the lease, or raise :class:`~overnight.errors.TaskBusy` naming the live holder.

        An expired lease, or one whose holder is a dead process on this host, is taken over.
        """
        ...

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        """Extend a held lease; raises :class:`~overnight.errors.LeaseLost` if it was taken over."""
        ...

    def read_lease(self, task_id: str, branch: str) -> Lease | None:
        """The lease row of ``(task_id, branch)`` as stored -- held, expired or released
        (``holder_id == ""``) -- or None when it was never held. For ``overnight ls`` and the
        dashboard (running, stalled or interrupted); it takes nothing."""
        ...

    def release_lease(self, lease: Lease, outcome: str | None = None) -> None:
        """Give the lease up (no error if it was already taken over). ``outcome``: why its holder
        ended, kept in the released row for ``overnight ls`` and the dashboard (``failed: REASON``
        for a plain run whose step failed: :func:`~overnight.store.leases.ended`); None: it ended
        normally (complete, interrupted, stopped)."""
        ...

    def clock_ms(self) -> int:
        """Now, in Unix milliseconds, by the clock this store judges leases and queue claims by --
        the one every ``expires_at_ms``, ``claim_expires_ms`` and ``not_before_ms`` it keeps is
        set and compared with. PostgreSQL: the server's clock (one query), so workers whose own
        clocks disagree never take a live holder's lease or claim early, nor lose their own to a
        clock running behind. The others: this machine's clock (an SQLite or ``file://`` store
        is written from one host; on S3 each writer's clock, which must be kept in sync)."""
        ...



@runtime_checkable
class Store(ObjectStore, ChainStore, LeaseStore, CallJournal, ArchiveCatalog, Protocol):
    """A storage backend: every concern above, plus its URL and housekeeping."""

    url: str

    def stored_bytes(self) -> int:
        """Bytes the store occupies on its medium (database file(s), objects and records)."""
        ...

    def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...


def check_parent(cp: "CheckpointRow", parent_task: str | None) -> None:
    """What every store checks before a commit of ``cp`` writes anything: its parent checkpoint is
    stored (``parent_task`` is that checkpoint's task, None when it is not stored) and belongs to
    the same task -- a checkpoint builds on its own task's chain, and deletion looks for a
    checkpoint's children in its own task only.

    Raises:
        ParentGone: the parent is not stored (deleted by gc, rm or archive meanwhile).
        SchemaError: the parent is a checkpoint of another task.
    """
    if cp.parent_id is None:
        return
    if parent_task is None:
        raise ParentGone(f"parent {short_id(cp.parent_id)} of the new checkpoint is not in the store "
                         "(deleted by gc, rm or archive meanwhile?)", task_id=cp.task_id, checkpoint_id=cp.parent_id,
                         hint="reload and retry; to build on an archived checkpoint, restore it first")
    if parent_task != cp.task_id:
        raise SchemaError(f"the new checkpoint of task {cp.task_id!r} names parent {short_id(cp.parent_id)}, "
                          f"a checkpoint of task {parent_task!r}", task_id=cp.task_id, checkpoint_id=cp.parent_id,
                          hint="build on a checkpoint of the same task (to continue another task's state, fork it)")


def stale_head(task_id: str, branch: str, expected: str | None, current: str | None) -> StaleHead:
    """The error every store raises when a ref compare-and-swap finds ``current`` where the caller
    expected ``expected`` (checkpoint ids, None for no ref): another writer moved the branch."""
    return StaleHead(f"branch {branch!r} moved: expected head {expected}, found {current}", task_id=task_id,
                     hint="another writer advanced this branch; reload the head and retry")
