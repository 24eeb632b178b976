"""A replicated store: one task kept on several storage media at once.

:class:`ReplicatedStore` is a :class:`~overnight.store.base.Store` over several media (the first
is the primary). A commit returns only when every medium has it: the primary first (lease
fencing and the ref compare-and-swap happen there; it is the coordinator), then each replica with
the same objects, record and ref move. A replica that cannot take it raises
:class:`~overnight.errors.ReplicaUnavailable` (the primary keeps the commit; a repair copies it
later). Reads come from the primary. Making the media agree again is
:func:`overnight.ops.repair.repair_task`. Stored names: ``docs/FORMAT.md``, "Replicas".
"""

from __future__ import annotations

from typing import Callable, Iterable

from overnight.errors import ConcurrencyError, ConfigError, OvernightError, ReplicaUnavailable, StoreBusy, short_id
from overnight.store.compose.delegate import forwarding
from overnight.store.base import (
    MinAge,
    Closing,
    ArchiveRow,
    CallRecord,
    CheckpointRow,
    Commit,
    JournalRow,
    ObjectRecord,
    Store,
)


@forwarding("primary")
class ReplicatedStore(Closing):
    """A :class:`~overnight.store.base.Store` writing to every medium, reading from the first.

    Args:
        media: the stores, primary first.
        names: their names for reports (``local``, ``database``, ``cloud``, or URLs).
    """

    def __init__(self, media: list[Store], names: list[str] | None = None) -> None:
        if not media:
            raise ConfigError("a replicated store needs at least one medium")
        self.media = list(media)
        self.names = names or [m.url for m in media]
        self.url = "replicated:" + " + ".join(m.url for m in self.media)

    @property
    def primary(self) -> Store:
        """The first medium (a damaged one set aside by a repair is replaced in :attr:`media`)."""
        return self.media[0]

    # reads (not written here): the primary, forwarded by @forwarding
    # writes: every medium, the primary first. A replica that cannot take a write the primary
    # already has stops the caller with ReplicaUnavailable (or the ConcurrencyError of a replica
    # that is behind or diverged): a write returns only when every medium has it.
    def _replicas(self, what: str, write: Callable[[Store], object], task_id: str | None = None) -> None:
        for name, m in zip(self.names[1:], self.media[1:]):
            try:
                write(m)
            except ConcurrencyError as exc:
                if isinstance(exc, StoreBusy):  # not retried: the primary already has the write
                    raise self._unavailable(name, what, exc.message, task_id) from exc
                exc.message = (f"replica {name} is behind or diverged ({exc.message}); the primary has the {what} "
                               "-- `overnight repair` (or the next resume) brings the replica up to date")
                raise
            except Exception as exc:  # noqa: BLE001 - a driver error of a medium that went away: typed
                detail = exc.message if isinstance(exc, OvernightError) else f"{type(exc).__name__}: {exc}"
                raise self._unavailable(name, what, detail, task_id) from exc

    def _unavailable(self, name: str, what: str, detail: str, task_id: str | None) -> ReplicaUnavailable:
        return ReplicaUnavailable(
            f"replica {name} could not take the {what} ({detail}); the primary {self.names[0]} has it",
            medium=name, task_id=task_id,
            hint=f"bring {name} back, then `overnight repair {task_id or 'TASK_ID'}` (or resume, which "
            "repairs first) copies what it lacks")

    def put_objects(self, objects: Iterable[ObjectRecord]) -> None:
        objects = list(objects)
        self.primary.put_objects(objects)
        self._replicas("objects", lambda m: m.put_objects(objects))

    def commit(self, commit: Commit) -> int:
        added = self.primary.commit(commit)
        row = commit.checkpoint
        self._replicas(f"commit of checkpoint {short_id(row.checkpoint_id)}",
                       lambda m: m.commit(Commit(row, commit.expected_head, commit.objects, commit.journal, None,
                                                 commit.task)), row.task_id)
        return added

    def set_ref(self, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        self.primary.set_ref(task_id, branch, new, expected)
        self._replicas(f"move of branch {branch!r}", lambda m: m.set_ref(task_id, branch, new, expected), task_id)

    def record_call(self, call: CallRecord) -> None:
        self.primary.record_call(call)
        self._replicas("model call record", lambda m: m.record_call(call), call.task_id)

    def put_checkpoints(self, rows: Iterable[CheckpointRow], journal: Iterable[JournalRow] = ()) -> None:
        rows, journal = list(rows), list(journal)
        self.primary.put_checkpoints(rows, journal)
        self._replicas("checkpoints", lambda m: m.put_checkpoints(rows, journal))

    def put_archive(self, row: ArchiveRow) -> None:
        self.primary.put_archive(row)
        self._replicas("archive record", lambda m: m.put_archive(row), row.task_id)

    # deletions (gc, rm, archive) apply to every medium; the primary's count is returned, since
    # gc decided on what the primary holds
    def delete_objects(self, digests: Iterable[str], *, min_age_ms: MinAge | None = None) -> int:
        digests = list(digests)
        freed = self.primary.delete_objects(digests, min_age_ms=min_age_ms)
        for m in self.media[1:]:
            m.delete_objects(digests, min_age_ms=min_age_ms)
        return freed

    def delete_checkpoints(self, checkpoint_ids: Iterable[str], *, orphans: bool = False) -> int:
        ids = list(checkpoint_ids)
        freed = self.primary.delete_checkpoints(ids, orphans=orphans)
        for m in self.media[1:]:
            m.delete_checkpoints(ids, orphans=orphans)
        return freed

    def delete_task(self, task_id: str) -> None:
        for m in self.media:
            m.delete_task(task_id)

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        for m in self.media:
            m.delete_archive(task_id, archive_id)

    # leases (forwarded): the primary coordinates
    def stored_bytes(self) -> int:
        return sum(m.stored_bytes() for m in self.media)

    def close(self) -> None:
        for m in self.media:
            m.close()

    def __repr__(self) -> str:
        return f"ReplicatedStore({self.names})"


def replicated_under(store: object) -> ReplicatedStore | None:
    """The replicated store under ``store`` (a tiered wrapper's hot store), if it is one."""
    inner = getattr(store, "hot", store)
    return inner if isinstance(inner, ReplicatedStore) else None
