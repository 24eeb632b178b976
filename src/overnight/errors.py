"""Every exception overnight raises, grouped by cause.

All of them derive from :class:`OvernightError` and carry, where known, the ``task_id``, the
``checkpoint_id`` and a ``hint`` saying what to do next. ``str(err)`` renders all three, so a
log line or a CLI message is actionable on its own.

Groups (mirrors httpx's ``_exceptions.py``), each with the ``overnight`` CLI's exit code (the
first group that matches, in this order: store, drift, concurrency, integrity, lookup/config):

* store medium, exit 6 -- :class:`StoreError`: :class:`StoreFull`, :class:`StoreReadOnly`,
  :class:`StoreUnavailable` (the disk or server said no; a ``StepFailed`` whose cause is one of
  these exits 6 too)
* drift, exit 5 -- :class:`DriftError`: :class:`DriftAbort`
* concurrency, exit 4 -- :class:`ConcurrencyError`: :class:`TaskBusy`, :class:`StaleHead`,
  :class:`LeaseLost`, :class:`StoreBusy`, :class:`ParentGone`, :class:`TaskChanged`,
  :class:`MergeConflict`
* integrity, exit 3 -- :class:`IntegrityError`: :class:`DigestMismatch`, :class:`MissingObject`,
  :class:`SchemaError` (and :class:`RecordInvalid`, refused on write), :class:`FormatTooNew`,
  :class:`SignatureError`, :class:`EntryMismatch`, :class:`RollbackDetected`,
  :class:`CodeLocationRefused`, :class:`StoreCorrupt`, :class:`ReplicaUnavailable`,
  :class:`NoValidCheckpoint`, :class:`SessionCorrupt`, :class:`ThreadCorrupt`
* lookup, exit 2 -- :class:`NotFound`: :class:`TaskNotFound`, :class:`CheckpointNotFound`,
  :class:`ArtifactNotFound`, :class:`BranchNotFound`, :class:`ObjectNotFound`, :class:`NoStepOutput` (a
  ``KeyError``)
* config/spec, exit 2 -- :class:`ConfigError` (a ``ValueError``): :class:`SpecError`,
  :class:`BranchExists`, :class:`StoreVersionError` (and :class:`StoreSchemaMismatch`),
  :class:`OutputNotWritable`, :class:`ModelNotConfigured`
* codec, exit 1 -- :class:`CodecError`: :class:`EncodeError` (a ``TypeError``),
  :class:`DecodeError` (a ``ValueError``), :class:`UnknownTypeError`
* steps, exit 1 -- :class:`StepError`: :class:`StepFailed`, :class:`UnknownStep`
* tokens, exit 1 -- :class:`TokenizerError` (a ``ValueError``); :class:`ApproximateTokenCount`
  is a warning, not an error
* models, exit 1 -- :class:`ModelError`: :class:`ModelNotConfigured` (exit 2, a config error),
  :class:`ModelCallFailed`, :class:`ContextOverflow`
* benchmarks, exit 1 -- :class:`BenchFailed`

``tests/test_plumbing.py`` checks that this list names every class defined here.
"""

from __future__ import annotations

from typing import Any


class OvernightError(Exception):
    """Base class of every error overnight raises."""

    def __init__(
        self,
        message: str,
        *,
        task_id: str | None = None,
        checkpoint_id: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id
        self.checkpoint_id = checkpoint_id
        self.hint = hint

    def __str__(self) -> str:
        parts = [self.message]
        where = []
        named = False  # the message names the task already (an id cut short: as shown_task_id cuts it)
        if self.task_id is not None:
            shown = shown_task_id(self.task_id)
            where.append(f"task {shown}")
            named = f"task {self.task_id!r}" in self.message or self.message.startswith(shown)
        if self.checkpoint_id is not None:
            where.append(f"checkpoint {short_id(self.checkpoint_id)}")
        if where and not named and not any(w in self.message for w in where):
            parts.append(f"({', '.join(where)})")
        text = " ".join(parts)
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


SHOWN_ID_CHARS = 80
"""An id longer than this is cut to its first this many characters in messages (:func:`shown_task_id`)."""


def shown_task_id(task_id: str, limit: int = SHOWN_ID_CHARS) -> str:
    """``task_id`` as a message names it: its ``repr``, or for an id longer than ``limit``
    characters, the ``repr`` of its first ``limit`` with ``…`` and its length --
    ``'yyyy…' (3000 characters)``: an id of thousands of characters is not echoed whole."""
    if not isinstance(task_id, str) or len(task_id) <= limit:
        return repr(task_id)
    head = repr(task_id[:limit])
    return f"{head[:-1]}…{head[-1]} ({len(task_id)} characters)"


def short_id(checkpoint_id: str) -> str:
    """``sha256:0123456789abcdef…`` -> ``0123456789ab`` (12 hex digits, like ``git log --oneline``)."""
    return checkpoint_id.split(":", 1)[-1][:12]


# --- codec -------------------------------------------------------------------------------------


class CodecError(OvernightError):
    """A value could not be encoded to, or decoded from, overnight's canonical JSON."""

    def __init__(self, message: str, *, path: str | None = None, type_name: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.path = path
        self.type_name = type_name


class EncodeError(CodecError, TypeError):
    """A value has no codec; raised at write time, naming its path (``state.items[3].when``) and type."""


class DecodeError(CodecError, ValueError):
    """A stored value cannot be decoded exactly; the whole load fails (nothing is downgraded)."""


class UnknownTypeError(DecodeError):
    """Stored data names a class (enum, pydantic model, dataclass) that is not loaded in this process."""


# --- integrity ---------------------------------------------------------------------------------


class IntegrityError(OvernightError):
    """A stored record or object failed verification and must not be loaded.

    ``object_digest`` names the damaged or missing object, when the failure is an object's.
    """

    def __init__(self, message: str, *, object_digest: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.object_digest = object_digest


class DigestMismatch(IntegrityError):
    """The bytes of a checkpoint or object do not hash to the digest that addresses them."""


class MissingObject(IntegrityError):
    """A blob or chunk that a checkpoint references is not in the store."""


class SchemaError(IntegrityError):
    """A checkpoint record is incomplete or malformed (a required field is missing or mistyped)."""


class RecordInvalid(SchemaError):
    """A record this process was about to write does not match the record format (validated on
    write, like every record on read); nothing was written. A bug in the writer, not damage."""


class FormatTooNew(IntegrityError):
    """A record was written by a newer overnight (a format version this code does not know)."""


class SignatureError(IntegrityError):
    """A checkpoint's HMAC signature is missing, wrong, or cannot be checked without the key."""


class EntryMismatch(IntegrityError):
    """The code location in a task's store row differs from the one its verified checkpoints
    record: ``resume`` does not import code from a location nothing verifies."""


class RollbackDetected(IntegrityError):
    """A branch ref names a checkpoint older than one this machine or the store has already seen
    on that branch: a newer verified record of the branch descends from it, or (with a signing
    key) this machine's high-water mark records a newer signed head. Someone moved the ref back;
    loading it would silently re-run every later step. ``head`` is the checkpoint the ref names,
    ``newer`` the newer one (CLI exit 3). ``--allow-rollback`` (or ``overnight rollback``, a
    deliberate rollback) accepts it."""

    def __init__(self, message: str, *, head: str, newer: str, **kw) -> None:
        super().__init__(message, **kw)
        self.head = head
        self.newer = newer


class CodeLocationRefused(IntegrityError):
    """A task's code location, read from the store, lies outside the project (the folder holding
    ``overnight.toml``, else the current directory) and was not named on the command line:
    overnight imports code only from the project or from what the user names (``--file``).
    ``location`` is the refused location."""

    def __init__(self, message: str, *, location: str, **kw) -> None:
        super().__init__(message, **kw)
        self.location = location


class StoreCorrupt(IntegrityError):
    """The store's own files are damaged below the record level (SQLite reports a malformed
    database image): nothing read from it can be trusted until it is recovered or repaired."""


class ReplicaUnavailable(IntegrityError):
    """A replica of a replicated (e.g. ``critical``) task could not take a write the primary
    already has -- its database schema was dropped, its bucket went away, its server is down.
    A commit returns only when every medium has it, so the run stops here (CLI exit 3); the
    primary keeps the commit, and ``overnight repair`` (or the next resume, which repairs first)
    copies it to the replica once that is reachable again. ``medium`` names the replica; the
    cause is chained."""

    def __init__(self, message: str, *, medium: str, **kw) -> None:
        super().__init__(message, **kw)
        self.medium = medium


class NoValidCheckpoint(IntegrityError):
    """No checkpoint on the branch passed verification; there is nothing safe to resume from."""

    fallback: Any = None
    """The :class:`~overnight.chain.read.Fallback` of the load that gave up: every checkpoint it
    tried and why each failed (set by :func:`~overnight.chain.read.load_head`)."""


class SessionCorrupt(IntegrityError):
    """A stored agent session (``overnight.adapters``) failed verification: its history is not
    returned, in part or whole. ``session_id`` names the session; the cause is chained."""

    def __init__(self, message: str, *, session_id: str, **kw) -> None:
        super().__init__(message, **kw)
        self.session_id = session_id


class ThreadCorrupt(IntegrityError):
    """A stored LangGraph thread (``overnight.adapters.langgraph``) failed verification: a branch
    names a record that is missing, or a record or object of it is damaged. Nothing of the
    thread's damaged part is returned. ``thread_id`` names the thread; the cause is chained."""

    def __init__(self, message: str, *, thread_id: str, **kw) -> None:
        super().__init__(message, **kw)
        self.thread_id = thread_id


# --- concurrency -------------------------------------------------------------------------------


class ConcurrencyError(OvernightError):
    """Another writer holds or changed what this one expected."""


class TaskBusy(ConcurrencyError):
    """The task's lease is held by another live process (``held by`` names it)."""

    def __init__(self, message: str, *, holder: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.holder = holder


class StaleHead(ConcurrencyError):
    """Compare-and-swap on a branch ref failed: the head moved since this writer read it."""


class LeaseLost(ConcurrencyError):
    """This process's lease on the task expired or was taken over; it must stop writing."""


class StoreBusy(ConcurrencyError):
    """The store stayed locked by another process for longer than the configured wait."""


class ParentGone(ConcurrencyError):
    """A commit's parent checkpoint was deleted (``gc``, ``rm``, ``archive``) while the commit was
    being prepared; nothing was written."""


class TaskChanged(ConcurrencyError):
    """A task gained or moved a branch while ``archive`` was copying it; nothing was removed."""


class MergeConflict(ConcurrencyError):
    """Both branches changed the same step, artifact or state key; ``conflicts`` lists both sides."""

    def __init__(self, message: str, *, conflicts: list | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.conflicts = conflicts or []


# --- store medium -------------------------------------------------------------------------------


class StoreError(OvernightError):
    """The medium under a store said no: the disk is full, the file system or file is read-only or
    not writable by this user, a folder is missing, the server is unreachable. Nothing committed is
    lost (a write in flight was rolled back, or never started); fix the cause and run the command
    again (``overnight resume TASK_ID`` continues a run). CLI exit code 6.

    ``location`` is the path or URL (password masked) that refused; ``task_id`` is set where known.
    The OS or driver error is chained (``__cause__``).
    """

    def __init__(self, message: str, *, location: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.location = location


class StoreFull(StoreError):
    """The store ran out of space (disk full, quota) while writing; the write in flight was rolled
    back and everything committed before it is intact."""


class StoreReadOnly(StoreError):
    """The store cannot be written: a read-only file system or file, or permission denied to this
    user. Reading commands (``ls``, ``show``, ``log``, ``status``, ``verify``, ``cat``) still work."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or read: the server refused the connection or timed out, the
    endpoint is unreachable, a folder of it is missing, or reading it was denied."""


# --- lookup ------------------------------------------------------------------------------------


class NotFound(OvernightError, LookupError):
    """Something named by the caller does not exist in the store."""


class NoStepOutput(NotFound, KeyError):
    """``ctx.outputs[name]`` for a step that has not run on this branch: a ``KeyError``, as for any
    mapping's missing key (``name in ctx.outputs`` and ``ctx.outputs.get(name)`` rely on it)."""


class TaskNotFound(NotFound):
    """No task with this id in the store."""


class CheckpointNotFound(NotFound):
    """No checkpoint with this id (or unique id prefix) in the task."""


class ArtifactNotFound(NotFound):
    """The checkpoint has no artifact with this name."""


class BranchNotFound(NotFound):
    """The task has no branch with this name."""


class ObjectNotFound(NotFound):
    """No object and no checkpoint with this digest in the store (``overnight cat-object``)."""


# --- config / spec -----------------------------------------------------------------------------


class ConfigError(OvernightError, ValueError):
    """A store URL, option or config value is invalid."""


class SpecError(ConfigError):
    """A task specification is incomplete or inconsistent (``missing`` lists what)."""

    def __init__(self, message: str, *, missing: list[str] | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.missing = missing or []


class BranchExists(ConfigError):
    """A branch with that name already exists in the task."""


class StoreVersionError(ConfigError):
    """The store's schema was created by a newer overnight; refuse rather than misread it."""


class OutputNotWritable(ConfigError):
    """A folder of the user's cannot be written: the store's location (the current directory's
    ``.overnight/`` by default, ``--store``) or an export path (``--out``, ``Task(exports=...)``).
    ``path`` names it; ``reason`` is the system's (``Permission denied``, ``Read-only file system``,
    ``No such file or directory``)."""

    def __init__(self, message: str, *, path: str | None = None, reason: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.path = path
        self.reason = reason


class StoreSchemaMismatch(StoreVersionError):
    """The store's recorded schema version disagrees with its tables (a half-migrated or hand-edited
    PostgreSQL schema): ``missing`` lists tables/columns its version should have, ``unexpected``
    those of a later version it already has. Nothing is migrated or written until it is resolved."""

    def __init__(self, message: str, *, missing: list[str] | None = None, unexpected: list[str] | None = None,
                 **kw) -> None:
        super().__init__(message, **kw)
        self.missing = missing or []
        self.unexpected = unexpected or []


# --- drift -------------------------------------------------------------------------------------


class DriftError(OvernightError):
    """The world changed since the checkpoint in a way the task's drift policy does not absorb."""


class DriftAbort(DriftError):
    """Drift in a component whose policy is ``abort`` (or ``rollback`` found nothing to roll back
    to); ``report`` is the :class:`~overnight.verify.drift.DriftReport`."""

    def __init__(self, message: str, *, report: object = None, **kw) -> None:
        super().__init__(message, **kw)
        self.report = report


# --- steps -------------------------------------------------------------------------------------


class StepError(OvernightError):
    """A step could not run to completion."""

    def __init__(self, message: str, *, step: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.step = step


class StepFailed(StepError):
    """A step raised (after its retries); nothing it did was committed, the head is unchanged."""


class UnknownStep(StepError):
    """The todo list names a step function that the task does not define (renamed or removed?)."""


# --- tokens ------------------------------------------------------------------------------------


class TokenizerError(OvernightError, ValueError):
    """A tokenizer could not be loaded: unknown encoding, missing or corrupt vocabulary file."""


class ApproximateTokenCount(UserWarning):
    """Token counts for this model are estimated (bytes / 4), not exact: no tokenizer is known for it."""


# --- models ------------------------------------------------------------------------------------


class ModelError(OvernightError):
    """A language-model client could not be set up, or a call to it failed."""

    def __init__(self, message: str, *, model: str | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.model = model


class ModelNotConfigured(ModelError, ConfigError):
    """The model spec is unknown, or what it needs (package, weights, endpoint, key) is missing."""


class ModelCallFailed(ModelError):
    """A completion request failed (connection refused, timeout, HTTP error, bad response)."""


class ContextOverflow(ModelError):
    """A single model call does not fit in the session's context window, even with no history."""


# --- benchmarks -----------------------------------------------------------------------------------


class BenchFailed(OvernightError):
    """A benchmark's own check failed (a run did not commit, resume or load what it must), so
    its numbers would mean nothing; nothing is reported."""
