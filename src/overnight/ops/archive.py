"""Tiered storage operations: ``overnight archive`` and ``overnight restore`` (spec:
``docs/FORMAT.md``, "Tiered storage"; the read side is :mod:`overnight.store.compose.tiered`).

**archive** moves a task's older history to a cold store. For each branch it keeps the head and
the newest checkpoints of its first-parent chain (``keep_last=N``) or those younger than
``older_than``; every other checkpoint on a live lineage is *archived*. Dangling checkpoints are
left to ``gc``. Then, holding the leases of every branch of the task (no run of it can commit
meanwhile):

1. pack every object the archived checkpoints need that no earlier archive of the task in the
   same cold store holds already, into one pack (:mod:`overnight.store.compose.pack`), and write it to
   the cold store with the run's manifest (an archive row there too);
2. read the pack back from the cold store and check every entry is byte-for-byte the hot copy;
3. record the run in the hot store's catalog -- from now on a
   :class:`~overnight.store.compose.tiered.TieredStore` finds the archived data in the cold store;
4. check the task did not change (no branch moved or appeared), then delete the archived
   checkpoints from hot, and the objects no remaining hot checkpoint of any task needs, under
   the same grace-period rule as ``gc`` (:mod:`overnight.ops.gc`).

Nothing a kept checkpoint needs to load leaves the hot store, so resuming never reads cold data.

**restore** brings a task's archives back into hot (objects, then records) and drops their catalog
rows; the cold store is left as it is. :func:`ensure_hot` brings back a single archived checkpoint
before something builds on it (``fork --at``, ``rollback --to``, a resume that falls back to it).
Restored data is verified when read, like everything else.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

from overnight.errors import ConfigError, DigestMismatch, TaskChanged, short_id
from overnight.store.base import DEFAULT_GRACE_S, ArchiveRow, CheckpointRow, Lease, ObjectRecord, Store
from overnight.store.blobs import BlobReader
from overnight.store.leases import Holder
from overnight.store.compose.pack import Manifest, archive_row, build_pack, manifest_of, read_entry
from overnight.store.compose.tiered import TieredStore, absolute_url, shown, tiered
from overnight.chain.write import utc_now
from overnight.ops.gc import _delete_objects, pack_roots
from overnight.chain.reachability import Reach, Unreadable, first_parent_chain, lineage


LEASE_TTL_MS = 10 * 60_000
"""How long archive's leases last without renewal (ms); renewed between its phases."""


@dataclass
class ArchiveReport:
    """Result of :func:`archive`.

    Attributes:
        cold: the cold store's URL (made absolute), with any password in it masked (``***``).
        archive_id: the run's archive id (None when nothing new was packed).
        archived: ids of the checkpoints moved out of hot.
        kept: checkpoints of the task that stay in hot.
        objects_packed, pack_bytes: objects written to the pack, and its size in bytes.
        checkpoint_bytes: body bytes of the archived records removed from hot.
        objects_deleted, object_bytes: objects removed from hot, and their bytes.
        objects_young: objects only the archived checkpoints need but stored less than ``grace``
            ago: kept in hot for now (``gc`` removes them later; they are in the pack).
    """

    task_id: str
    cold: str
    archive_id: str | None = None
    archived: list[str] = field(default_factory=list)
    kept: int = 0
    objects_packed: int = 0
    pack_bytes: int = 0
    checkpoint_bytes: int = 0
    objects_deleted: int = 0
    object_bytes: int = 0
    objects_young: int = 0
    unreadable: list[Unreadable] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class RestoreReport:
    """Result of :func:`restore`: archive runs read, checkpoints and objects written back to hot."""

    task_id: str
    archives: list[str] = field(default_factory=list)
    checkpoints: int = 0
    objects: int = 0
    bytes: int = 0
    seconds: float = 0.0


class _Leases:
    """Hold the lease of every branch of a task (``TaskBusy`` if a live run holds one)."""

    def __init__(self, store: Store, task_id: str, branches: list[str]) -> None:
        self.store, self.task_id, self.branches = store, task_id, branches
        self.held: list[Lease] = []

    def __enter__(self) -> "_Leases":
        holder = Holder.current()
        try:
            for b in self.branches:
                self.held.append(self.store.acquire_lease(self.task_id, b, holder.id, holder.to_json(),
                                                          LEASE_TTL_MS))
        except BaseException:
            self.__exit__()
            raise
        return self

    def renew(self) -> None:
        """Extend every held lease (``LeaseLost`` if one was taken over)."""
        self.held = [self.store.renew_lease(lease, LEASE_TTL_MS) for lease in self.held]

    def __exit__(self, *exc: object) -> None:
        for lease in self.held:
            try:
                self.store.release_lease(lease)
            except Exception:  # noqa: BLE001 - best effort: an expired lease frees itself
                pass
        self.held = []


def _kept(rows: dict[str, CheckpointRow], heads: list[str], keep_last: int | None,
          older_than_s: float | None) -> set[str]:
    kept: set[str] = set(heads)
    cutoff = None
    if older_than_s is not None:
        cutoff = (datetime.now(timezone.utc) - timedelta(seconds=older_than_s)).isoformat(timespec="microseconds")
    for head in heads:
        chain = first_parent_chain(rows, head)
        if keep_last is not None:
            kept.update(r.checkpoint_id for r in chain[:keep_last])
        if cutoff is not None:
            kept.update(r.checkpoint_id for r in chain if r.created_at >= cutoff)
    return kept


def archive(store: TieredStore, task_id: str, *, cold: str, keep_last: int | None = None,
            older_than_s: float | None = None, grace_s: float = DEFAULT_GRACE_S,
            on_progress: Callable[[int, int], None] | None = None) -> ArchiveReport:
    """Move the task's history beyond the policy to the cold store ``cold`` (see the module docstring).

    Raises:
        ConfigError: not exactly one of ``keep_last`` / ``older_than_s``, ``keep_last`` < 1,
            ``cold`` is the hot store, or the run's manifest would exceed
            :data:`~overnight.store.compose.pack.MAX_MANIFEST_SIZE` (nothing was written).
        TaskNotFound: no such task. TaskBusy: a live run holds one of its branches.
        TaskChanged: a branch moved or appeared meanwhile (nothing was removed from hot).
        DigestMismatch: the pack read back from the cold store differs (nothing was removed).
    """
    if (keep_last is None) == (older_than_s is None):
        raise ConfigError("archive needs exactly one of --keep-last N or --older-than DURATION", task_id=task_id)
    if keep_last is not None and keep_last < 1:
        raise ConfigError(f"--keep-last must be at least 1 (got {keep_last}): branch heads always stay",
                          task_id=task_id)
    if older_than_s is not None and older_than_s < 0:
        raise ConfigError(f"--older-than must not be negative (got {older_than_s})", task_id=task_id)
    t0 = time.monotonic()
    store = tiered(store, own=False)
    hot = store.hot
    location = absolute_url(cold)
    if location == absolute_url(hot.url):
        raise ConfigError(f"the cold store {shown(cold)!r} is the hot store", task_id=task_id,
                          hint="archive to another store (s3://BUCKET/PREFIX, file://DIR)")
    hot.get_task(task_id)
    report = ArchiveReport(task_id, shown(location))  # a report is printed and logged: no password in it
    refs = hot.list_refs(task_id)
    with _Leases(hot, task_id, sorted(refs)) as leases:
        refs = hot.list_refs(task_id)  # as they are now that no run holds a branch
        hot_rows = {r.checkpoint_id: r for r in hot.list_checkpoints(task_id)}
        all_rows = {**{r.checkpoint_id: r for r in store.archived_rows(task_id)}, **hot_rows}
        live = lineage(all_rows.values(), refs.values())
        kept = _kept(all_rows, list(refs.values()), keep_last, older_than_s)
        moved = [hot_rows[c] for c in sorted(live - kept) if c in hot_rows]
        moved.sort(key=lambda r: (r.seq, r.created_at))
        report.kept = len(hot_rows) - len(moved)
        if not moved:
            report.seconds = time.monotonic() - t0
            return report
        earlier = [(row, m) for row, m in store.archives(task_id)]
        already = {c.checkpoint_id for _, m in earlier for c in m.checkpoints}
        new = [r for r in moved if r.checkpoint_id not in already]
        reach = Reach(store)
        needs = reach.checkpoints(moved, on_progress)
        if new:
            policy = {"keep_last": keep_last} if keep_last is not None else {"older_than_s": older_than_s}
            _pack(store, report, new, reach, [(r, m) for r, m in earlier if r.location == location], location,
                  policy)
        leases.renew()
        if hot.list_refs(task_id) != refs or set(c.checkpoint_id for c in hot.list_checkpoints(task_id)) != set(hot_rows):
            raise TaskChanged(f"task {task_id!r} changed while it was being archived; nothing was removed from "
                              "the hot store", task_id=task_id,
                              hint="run archive again (what was packed is reused)")
        report.checkpoint_bytes = hot.delete_checkpoints([r.checkpoint_id for r in moved], orphans=True)
        report.archived = [r.checkpoint_id for r in moved]
        # objects: what only the archived checkpoints needed, unless something else in hot needs it
        remaining = [r for t in hot.list_tasks() for r in hot.list_checkpoints(t.task_id)]
        marked = Reach(hot).checkpoints(remaining) | pack_roots(hot)
        stats = {s.digest: s for s in hot.iter_object_stats()}
        candidates = {d: stats[d] for d in needs if d in stats and d not in marked}
        gone = _delete_objects(hot, candidates, int(grace_s * 1000 + (time.monotonic() - t0) * 1000))
        report.objects_deleted, report.object_bytes = len(gone), sum(gone.values())
        report.objects_young = len(candidates) - len(gone)
    report.unreadable = reach.unreadable
    report.seconds = time.monotonic() - t0
    return report


def _pack(store: TieredStore, report: ArchiveReport, new: list[CheckpointRow], reach: Reach,
          earlier: list, location: str, policy: dict) -> None:
    """Steps 1-3 of :func:`archive` for the checkpoints not archived before."""
    hot = store.hot
    task_id = report.task_id
    in_earlier = {e.digest for _, m in earlier for e in m.objects}
    needs = reach.checkpoints(new)
    wanted = sorted(d for d in needs if d not in in_earlier)
    objects: list[ObjectRecord] = []
    for i in range(0, len(wanted), 500):
        found = hot.get_objects(wanted[i : i + 500])
        objects.extend(found[d] for d in wanted[i : i + 500] if d in found)
    pack, entries = build_pack(objects)
    pack_record = ObjectRecord(_sha(pack), "blob", len(pack), "none", pack) if entries else None
    pack_ref = {"digest": pack_record.digest, "size": len(pack)} if pack_record is not None else None
    ids = {r.checkpoint_id for r in new}
    manifest = Manifest(task_id=task_id, created_at=utc_now(), source=absolute_url(hot.url), pack=pack_ref,
                        policy=policy, checkpoints=new, journal=[j for j in hot.journal(task_id) if j.checkpoint_id in ids],
                        objects=entries, previous=[r.archive_id for r, _ in earlier])
    cold_row = archive_row(manifest, absolute_url(hot.url))  # a manifest too large to read back: refused here
    cold_store = store.cold(location, create=True)
    if pack_record is not None:
        cold_store.put_objects([pack_record])
    cold_store.put_archive(cold_row)
    # read it all back from the cold store before anything leaves hot
    if entries:
        back = BlobReader(cold_store).get(pack_ref["digest"], f"new pack for task {task_id!r}")
        by_digest = {o.digest: o for o in objects}
        for e in entries:
            if read_entry(back, e) != by_digest[e.digest]:
                raise DigestMismatch(f"object {e.digest} read back from the cold store {shown(location)} differs from "
                                     "the hot copy; nothing was removed from the hot store", task_id=task_id,
                                     object_digest=e.digest)
    hot_row = archive_row(manifest, location)
    store.put_archive(hot_row)  # through the tiered store: its catalog is re-read
    report.archive_id = hot_row.archive_id
    report.objects_packed = len(entries)
    report.pack_bytes = len(pack)


def _sha(data: bytes) -> str:
    from overnight.codec import digest

    return digest.sha256(data)


def restore(store: TieredStore, task_id: str, *, cold: str | None = None,
            on_progress: Callable[[int, int], None] | None = None) -> RestoreReport:
    """Bring every archived checkpoint of the task back into the hot store, with the objects it
    needs, and drop the task's catalog rows (the cold store is not changed).

    ``cold``: read the packs from this store instead of where the catalog says, and also restore
    archive runs that store holds for the task but the hot catalog does not list (a lost catalog).

    Raises:
        TaskNotFound: no such task.
        MissingObject / DigestMismatch: a pack is missing or damaged (what was restored stays).
    """
    t0 = time.monotonic()
    store = tiered(store, own=False)
    hot = store.hot
    hot.get_task(task_id)
    rep = RestoreReport(task_id)
    runs: dict[str, tuple[ArchiveRow, Manifest, bool]] = {}
    for row, m in store.archives(task_id):
        runs[row.archive_id] = (row, m, True)
    if cold is not None:
        cold_store = store.use_cold(absolute_url(cold))  # every pack is read from there now
        for row in cold_store.list_archives(task_id):
            if row.archive_id not in runs:
                runs[row.archive_id] = (row, manifest_of(row), False)
    have = {r.checkpoint_id for r in hot.list_checkpoints(task_id)}
    ordered = sorted(runs.values(), key=lambda x: (x[1].created_at, x[0].archive_id))
    for i, (row, m, in_hot) in enumerate(ordered, start=1):
        if m.pack is not None:
            pack = store.pack(row, m)
            objects = [read_entry(pack, e) for e in m.objects]
            for j in range(0, len(objects), 500):
                hot.put_objects(objects[j : j + 500])
            rep.objects += len(objects)
            rep.bytes += sum(len(o.data) for o in objects)
        fresh = [c for c in m.checkpoints if c.checkpoint_id not in have]
        hot.put_checkpoints(m.checkpoints, m.journal)
        rep.checkpoints += len(fresh)
        have.update(c.checkpoint_id for c in fresh)
        if in_hot:
            hot.delete_archive(task_id, row.archive_id)
        rep.archives.append(row.archive_id)
        if on_progress is not None:
            on_progress(i, len(ordered))
    rep.seconds = time.monotonic() - t0
    return rep


def ensure_hot(store: Store, task_id: str, checkpoint_id: str) -> bool:
    """Bring one archived checkpoint back into hot (its record and every object it needs) so a
    new checkpoint can build on it; True if it had to. A no-op for a checkpoint in hot, or for a
    store that is not a :class:`~overnight.store.compose.tiered.TieredStore`."""
    if not isinstance(store, TieredStore):
        return False
    try:
        store.hot.get_checkpoint(checkpoint_id)
        return False
    except Exception:  # noqa: BLE001 - CheckpointNotFound: look in the catalog
        pass
    hit = store.archived(checkpoint_id)
    if hit is None:
        return False
    _, _, row = hit
    if row.task_id != task_id:
        raise ConfigError(f"checkpoint {short_id(checkpoint_id)} belongs to task {row.task_id!r}", task_id=task_id,
                          checkpoint_id=checkpoint_id)
    needs = sorted(Reach(store).checkpoint(row))
    for i in range(0, len(needs), 500):
        found = store.get_objects(needs[i : i + 500])
        store.hot.put_objects(found.values())
    store.hot.put_checkpoints([row], store.journal_of(checkpoint_id))
    return True
