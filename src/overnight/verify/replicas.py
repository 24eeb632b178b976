"""Replicas: a task kept on several storage media at once, and repair from a healthy copy.

:class:`ReplicatedStore` is a :class:`~overnight.store.base.Store` over several media (the first
is the primary). A commit returns only when every medium has it: the primary first (lease
fencing and the ref compare-and-swap happen there; it is the coordinator), then each replica with
the same objects, record and ref move. Reads come from the primary.

:func:`repair_task` makes the media agree again after a medium was lost, emptied, corrupted or
left behind: for each branch it finds the medium whose head is the newest that verifies, and
copies what the others lack -- the task record, the checkpoints on that head's lineage, every
object missing or damaged -- then moves their refs. The runner calls it before every resume of a
replicated task, so resume reads from the first healthy copy and heals the others;
``overnight repair`` runs it on demand and reports what it found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from overnight.errors import (
    CheckpointNotFound,
    ConcurrencyError,
    IntegrityError,
    NoValidCheckpoint,
    NotFound,
    OvernightError,
    ReplicaUnavailable,
    short_id,
)
from overnight.store.base import (
    ArchiveRow,
    CallRecord,
    CheckpointRow,
    Commit,
    JournalRow,
    Lease,
    ObjectRecord,
    ObjectStat,
    Store,
    TaskRow,
)
from overnight.verify.chain import load_head
from overnight.verify.reachability import first_parent_chain


class ReplicatedStore:
    """A :class:`~overnight.store.base.Store` writing to every medium, reading from the first.

    Args:
        media: the stores, primary first.
        names: their names for reports (``local``, ``database``, ``cloud``, or URLs).
    """

    def __init__(self, media: list[Store], names: list[str] | None = None) -> None:
        if not media:
            raise ValueError("a replicated store needs at least one medium")
        self.media = list(media)
        self.names = names or [m.url for m in media]
        self.primary = self.media[0]
        self.url = "replicated:" + " + ".join(m.url for m in self.media)

    # reads: the primary
    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        return self.primary.missing_objects(digests)

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        return self.primary.get_objects(digests)

    def iter_object_digests(self) -> Iterator[str]:
        return self.primary.iter_object_digests()

    def iter_object_stats(self) -> Iterator[ObjectStat]:
        return self.primary.iter_object_stats()

    def list_archives(self, task_id: str | None = None) -> list[ArchiveRow]:
        return self.primary.list_archives(task_id)

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        return self.primary.get_checkpoint(checkpoint_id)

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        return self.primary.list_checkpoints(task_id)

    def get_ref(self, task_id: str, branch: str) -> str | None:
        return self.primary.get_ref(task_id, branch)

    def list_refs(self, task_id: str) -> dict[str, str]:
        return self.primary.list_refs(task_id)

    def get_task(self, task_id: str) -> TaskRow:
        return self.primary.get_task(task_id)

    def list_tasks(self) -> list[TaskRow]:
        return self.primary.list_tasks()

    def journal(self, task_id: str) -> list[JournalRow]:
        return self.primary.journal(task_id)

    # writes: every medium, the primary first. A replica that cannot take a write the primary
    # already has stops the caller with ReplicaUnavailable (or the ConcurrencyError of a replica
    # that is behind or diverged): a write returns only when every medium has it.
    def _replicas(self, what: str, write: Callable[[Store], object], task_id: str | None = None) -> None:
        for name, m in zip(self.names[1:], self.media[1:]):
            try:
                write(m)
            except ConcurrencyError as exc:
                exc.message = (f"replica {name} is behind or diverged ({exc.message}); the primary has the {what} "
                               "-- `overnight repair` (or the next resume) brings the replica up to date")
                raise
            except Exception as exc:  # noqa: BLE001 - a driver error of a medium that went away: typed
                detail = exc.message if isinstance(exc, OvernightError) else f"{type(exc).__name__}: {exc}"
                raise ReplicaUnavailable(
                    f"replica {name} could not take the {what} ({detail}); the primary {self.names[0]} has it",
                    medium=name, task_id=task_id,
                    hint=f"bring {name} back, then `overnight repair {task_id or 'TASK_ID'}` (or resume, which "
                    "repairs first) copies what it lacks") from exc

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
    def delete_objects(self, digests: Iterable[str], *, min_age_ms: int | None = None) -> int:
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

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        return self.primary.calls(task_id, step_key)

    # leases: the primary coordinates
    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        return self.primary.acquire_lease(task_id, branch, holder_id, holder, ttl_ms)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        return self.primary.renew_lease(lease, ttl_ms)

    def release_lease(self, lease: Lease) -> None:
        self.primary.release_lease(lease)

    def stored_bytes(self) -> int:
        return sum(m.stored_bytes() for m in self.media)

    def close(self) -> None:
        for m in self.media:
            m.close()

    def __enter__(self) -> "ReplicatedStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplicatedStore({self.names})"


@dataclass
class MediumRepair:
    """What :func:`repair_task` found and did on one medium."""

    name: str
    status: str = "ok"  # ok | repaired | unavailable | failed
    heads: dict[str, str] = field(default_factory=dict)  # branch -> state before: ok / missing / invalid / behind
    checkpoints_copied: int = 0
    objects_copied: int = 0
    detail: str | None = None


@dataclass
class RepairReport:
    """Per medium, for one task: the source of each branch and what was copied where."""

    task_id: str
    sources: dict[str, str] = field(default_factory=dict)  # branch -> medium name
    media: list[MediumRepair] = field(default_factory=list)

    @property
    def repaired(self) -> bool:
        return any(m.status == "repaired" for m in self.media)

    def describe(self) -> str:
        parts = []
        for m in self.media:
            if m.status == "repaired":
                parts.append(f"{m.name}: copied {m.checkpoints_copied} checkpoint(s) and {m.objects_copied} object(s) "
                             f"from {', '.join(sorted(set(self.sources.values())))}")
            elif m.status != "ok":
                parts.append(f"{m.name}: {m.status}" + (f" ({m.detail})" if m.detail else ""))
        return "; ".join(parts) or "all media agree"


def _lineage(src: Store, task_id: str, head: str) -> list[CheckpointRow]:
    """The head and its first parents on ``src``, oldest first."""
    return list(reversed(first_parent_chain({r.checkpoint_id: r for r in src.list_checkpoints(task_id)}, head)))


def _copy_objects(src: Store, dst: Store, digests: Iterable[str]) -> int:
    digests = list(dict.fromkeys(digests))
    copied = 0
    for i in range(0, len(digests), 256):
        batch = src.get_objects(digests[i : i + 256])
        if batch:
            dst.put_objects(batch.values())
            copied += len(batch)
    return copied


def repair_task(media: list[Store], names: list[str], task_id: str, *, key: bytes | None,
                max_rounds: int = 8) -> RepairReport:
    """Make every medium hold the newest verifiable head of each branch of ``task_id``.

    Raises:
        NoValidCheckpoint: no medium has a verifiable head for some branch.
        TaskNotFound: no medium knows the task.
    """
    report = RepairReport(task_id)
    status = {n: MediumRepair(n) for n in names}
    report.media = list(status.values())
    live: list[tuple[str, Store]] = []
    branches: set[str] = set()
    for name, m in zip(names, media):
        try:
            branches |= set(m.list_refs(task_id))
            live.append((name, m))
        except OvernightError as exc:
            status[name].status, status[name].detail = "unavailable", exc.message
        except Exception as exc:  # noqa: BLE001 - a medium that cannot even answer: report, do not crash
            status[name].status, status[name].detail = "unavailable", f"{type(exc).__name__}: {exc}"
    if not branches:
        for _, m in live:
            m.get_task(task_id)  # raises TaskNotFound when no medium has the task
        return report
    for branch in sorted(branches):
        heads = {}
        for name, m in live:
            try:
                loaded, fallback = load_head(m, task_id, branch, key=key, deep=True)
                heads[name] = (loaded, fallback)
                status[name].heads[branch] = "ok" if fallback is None else "invalid"
            except NotFound:
                status[name].heads[branch] = "missing"
            except IntegrityError:
                status[name].heads[branch] = "invalid"
        if not heads:
            raise NoValidCheckpoint(f"no medium has a verifiable head of task {task_id!r} branch {branch!r}",
                                    task_id=task_id, hint="`overnight verify` on each medium shows what is wrong")
        source_name, (best, _) = max(heads.items(), key=lambda kv: (kv[1][1] is None, kv[1][0].record.seq))
        report.sources[branch] = source_name
        src = dict(live)[source_name]
        lineage = _lineage(src, task_id, best.id)
        task_row = src.get_task(task_id)
        for name, dst in live:
            if name == source_name:
                continue
            current = heads.get(name)
            if current is not None and current[1] is None and current[0].id == best.id:
                continue
            if status[name].heads[branch] == "ok":
                status[name].heads[branch] = "behind"
            _repair_medium(src, dst, task_row, lineage, best.id, branch, key, status[name], max_rounds)
    return report


def _repair_medium(src: Store, dst: Store, task_row: TaskRow, lineage: list[CheckpointRow], head: str, branch: str,
                   key: bytes | None, st: MediumRepair, max_rounds: int) -> None:
    try:
        # every object the source has that the destination lacks (content-addressed: safe to copy)
        missing = dst.missing_objects(src.iter_object_digests())
        st.objects_copied += _copy_objects(src, dst, missing)
        for call in src.calls(task_row.task_id):  # the call journal: replays need it on every medium
            dst.record_call(call)
        # the head's lineage, root first, each committed with the ref's current value as expected
        # head: a missing record is added, a damaged one is rewritten (the store replaces a body
        # that does not hash to its id), an intact one is left as it is; the ref ends on the head
        for row in lineage:
            try:
                had = dst.get_checkpoint(row.checkpoint_id).body == row.body
            except CheckpointNotFound:
                had = False
            journal = [j for j in src.journal(row.task_id) if j.checkpoint_id == row.checkpoint_id]
            dst.commit(Commit(row, dst.get_ref(row.task_id, branch), [], journal, None, task_row))
            st.checkpoints_copied += 0 if had else 1
        # heal what is damaged: rewrite each object the destination fails on, until its head verifies
        for _ in range(max_rounds):
            loaded, fallback = load_head(dst, task_row.task_id, branch, key=key, deep=True)
            if fallback is None:
                break
            bad = [s.object_digest for s in fallback.skipped if s.object_digest]
            if not bad:
                raise IntegrityError(f"checkpoint(s) {', '.join(short_id(s.checkpoint_id) for s in fallback.skipped)} "
                                     "still fail verification on this medium after being rewritten")
            st.objects_copied += _copy_objects(src, dst, bad)
        else:
            raise IntegrityError(f"head {short_id(head)} still does not verify after {max_rounds} repair rounds")
        if st.checkpoints_copied or st.objects_copied or st.heads.get(branch) != "ok":
            st.status = "repaired"
    except OvernightError as exc:
        st.status, st.detail = "failed", exc.message
