"""Garbage collection (``overnight gc``) and task deletion (``overnight rm``).

``gc`` removes

* **dangling checkpoints** -- those on the lineage of no live branch head of their task
  (:func:`~overnight.chain.reachability.lineage`): records a fallback skipped, the history of a
  deleted branch. ``keep_last`` keeps the N newest of each task, ``older_than`` keeps those
  younger than that (both by the checkpoint's ``created_at``); a kept one keeps its dangling
  ancestors too, so no chain is cut;
* **unreferenced objects** -- those no remaining checkpoint of any task needs
  (:class:`~overnight.chain.reachability.Reach`), nor any archive run recorded in the store (a
  cold store's packs).

It never removes a branch head, anything on a live branch's lineage, or anything a remaining
checkpoint needs to load. By default it only reports (``apply=False``).

The safety rule against writers running at the same time
---------------------------------------------------------

Objects have no owner, and a commit can reference an object no checkpoint references yet
(content-addressed deduplication), so "unreferenced" is only true of the moment gc looked. The
rule -- *mark, then sweep what is unreferenced and older than a grace period* -- with what every
store guarantees (``overnight/store/base.py``, "Deletion"):

1. **Mark.** At time ``T0`` gc lists every checkpoint and computes the set ``M`` of objects they
   need (plus the packs named by archive rows).
2. **Sweep.** It deletes an object only if it is not in ``M`` *and* its stored time is more than
   ``grace`` before ``T0``; the store checks the age and deletes in one step
   (``delete_objects(min_age_ms=grace + time since T0)``, the time since ``T0`` read once the
   store holds its lock: a sweep that waited for the lock keeps correspondingly more).
3. **Writers.** A commit writes, or refreshes the stored time of, every object its checkpoint
   references -- except objects reachable from checkpoints already committed on its own branch
   (its ``known`` set; ``overnight/store/blobs.py``).

Why nothing a checkpoint needs is lost: take a checkpoint ``C`` that gc did not see in step 1
(committed after ``T0``, or in flight). Each object ``C`` references is either (a) reachable from
a checkpoint on ``C``'s branch committed before ``T0`` -- that checkpoint is on a live lineage,
so gc saw it and marked the object; or (b) written or refreshed by ``C``'s commit (or by an
earlier commit gc did not see, by the same argument), at a time after ``T0 - grace`` as long as a
commit takes less than ``grace`` from writing its objects to moving its ref -- so gc keeps it.
Dangling checkpoints: a ``fork`` from one that gc is deleting either commits first (the store
then refuses to delete a parent of a surviving checkpoint, and gc marks what the survivor needs
before sweeping) or fails with :class:`~overnight.errors.ParentGone`. Checkpoint deletion needs no
grace period: a checkpoint is dangling because no ref leads to it, and nothing moves a ref to an
old checkpoint.

``grace`` (default 1 hour) must exceed the longest commit plus the clock difference between the
machines involved; ``grace=0`` is for a store no one is writing to.

Damage that hides references
----------------------------

Marking needs every live checkpoint. On ``file://`` and ``s3://`` a damaged ref, index entry or
task record hides some (the ref's head, the history the index records, every checkpoint of a task
no listing shows), and nothing says which objects those need; on ``sqlite://`` a ``refs``,
``tasks`` or ``checkpoints`` row whose key or link cell cannot be read (bytes that are not UTF-8,
say) does the same. So gc refuses (StoreCorrupt naming the entry or row, nothing deleted) until it
is restored or removed: :func:`_refuse_hidden_damage`, one rule fed by each store's
``damaged_entries``.

Damage that hides what a live checkpoint needs
-----------------------------------------------

Marking reads each remaining checkpoint as a load does: a record whose body does not hash to its
id, and a missing or damaged state document, page, tree or chunk index, is read from its verified
ditto copy (:class:`~overnight.chain.reachability.Reach`), so a damaged head that still loads
protects its objects as usual. When a part of a checkpoint on a live branch's lineage cannot be
read even so, the objects behind it are unknown -- any unreferenced object may be one of them, and
a damaged merge record hides which checkpoints its second parent keeps alive -- so gc refuses
(StoreCorrupt naming the task, branch, checkpoint and what could not be read; dry run included)
and deletes nothing, checkpoints included: :func:`_refuse_unreadable_live`. ``verify --repair``
rewrites what a copy still holds; the rest is restored from a backup or replica, or its branch
moved off it. ``rm`` deletes its task then but keeps every object, as for hidden damage.

An interrupted ``--apply`` leaks nothing, and the next run finishes its job: a store deletes a
checkpoint's record before the index entry by which gc finds it, newest first
(:meth:`overnight.store.keyed.KeyedStore.delete_checkpoints`), so the next run finds and deletes
every record the killed one left, and objects are found by listing. On ``file://`` and ``s3://``
gc also removes what no listing shows (:meth:`~overnight.store.keyed.KeyedStore.leftovers`; with
``task_id`` only that task's): index entries naming a record that is gone
(a gc or ``rm`` killed between the two), and checkpoint records no index entry or ref names -- a
commit killed before its ref swap, a delete by an older version killed midway -- once they are
older than ``grace`` (a commit in flight has written its record but not yet moved its ref; a
record that is the parent of one that stays is kept). A whole-store gc also removes the folder of a
task an ``rm`` killed midway left without refs or index (``leftover_tasks``): its ``task`` record
and released leases, older than ``grace``, and on ``file://`` the empty folders even a completed
``rm`` leaves (:meth:`~overnight.store.keyed.KeyedStore.abandoned_tasks`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

from overnight.errors import ConfigError, OvernightError, StoreCorrupt, short_id
from overnight.store.base import DEFAULT_GRACE_S, CheckpointRow, MinAge, Store
from overnight.store.compose.pack import manifest_of
from overnight.store.compose.tiered import TieredStore, tiered
from overnight.chain.ditto import with_copies
from overnight.chain.reachability import Reach, Unreadable, lineage

@dataclass
class TaskGc:
    """What gc found (and did) in one task.

    Attributes:
        checkpoints: checkpoints of the task in the store before gc.
        dangling: dangling checkpoint ids, newest first.
        kept: dangling ones kept by ``keep_last`` / ``older_than`` (or by the store, as the
            parent of a checkpoint committed meanwhile).
        deleted: dangling ones deleted (dry run: that would be deleted).
        bytes: bytes of the deleted records' bodies.
    """

    task_id: str
    checkpoints: int = 0
    dangling: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes: int = 0


@dataclass
class GcReport:
    """Result of :func:`collect`.

    Attributes:
        applied: False for a dry run (``deleted`` counts say what would go).
        grace_s: the grace period used (seconds).
        checkpoints_deleted, checkpoint_bytes: dangling checkpoints deleted, and their body bytes.
        objects: objects in the store; ``objects_referenced`` of them needed by what remains.
        objects_unreferenced: the others (in the tasks considered, with ``task_id``).
        objects_young, young_bytes: unreferenced but stored less than ``grace`` ago: kept.
        objects_deleted, object_bytes: unreferenced and older: deleted (or would be), and bytes.
        unreadable: parts of remaining checkpoints that could not be read (see
            :mod:`overnight.chain.reachability`).
        leftover_records, leftover_bytes: checkpoint records no listing shows (``file://`` and
            ``s3://``: a commit killed before its ref swap, a delete from an older version killed
            midway) stored longer than ``grace``: deleted (or would be), and their bytes; 0 for a
            store without such leftovers; with ``task_id`` only that task's (:func:`_leftovers`).
        leftover_entries: index entries naming a record that is gone (a gc or rm killed midway):
            deleted (or would be); with ``task_id`` only that task's.
        leftover_tasks: task folders that hold no task -- no ref, index entry or call record; at
            most a ``task`` record no checkpoint backs and leases no live process holds, each
            older than ``grace`` -- left by an ``rm`` or a first commit killed midway (on
            ``file://`` also the empty folder a completed ``rm`` leaves): removed (or would be);
            whole-store gc only (:meth:`overnight.store.keyed.KeyedStore.abandoned_tasks`).
        seconds: wall time.
    """

    applied: bool
    grace_s: float
    tasks: list[TaskGc] = field(default_factory=list)
    checkpoints_deleted: int = 0
    checkpoint_bytes: int = 0
    objects: int = 0
    objects_referenced: int = 0
    objects_unreferenced: int = 0
    objects_young: int = 0
    young_bytes: int = 0
    objects_deleted: int = 0
    object_bytes: int = 0
    unreadable: list[Unreadable] = field(default_factory=list)
    leftover_records: int = 0
    leftover_bytes: int = 0
    leftover_entries: int = 0
    leftover_tasks: int = 0
    seconds: float = 0.0


def _archived_rows(store: TieredStore, task_id: str) -> list[CheckpointRow]:
    return store.archived_rows(task_id)


def pack_roots(store: Store) -> set[str]:
    """Digests of the packs named by the store's archive rows (roots in a cold store)."""
    out = set()
    for row in store.list_archives():
        try:
            m = manifest_of(row)
        except Exception:  # noqa: BLE001 - a damaged row cannot name a pack; verify reports it
            continue
        if m.pack is not None:
            out.add(m.pack["digest"])
    return out


def _live(store: TieredStore, task_id: str, hot_rows: list[CheckpointRow]) -> set[str]:
    """Ids of the checkpoints on a live branch's lineage (hot and archived)."""
    return lineage([*hot_rows, *_archived_rows(store, task_id)], store.list_refs(task_id).values())


def _dangling(store: TieredStore, task_id: str, hot_rows: list[CheckpointRow],
              live: set[str] | None = None) -> list[CheckpointRow]:
    """Hot checkpoints on no live branch's lineage, newest first."""
    live = _live(store, task_id, hot_rows) if live is None else live
    rows = [r for r in hot_rows if r.checkpoint_id not in live]
    return sorted(rows, key=lambda r: (r.created_at, r.seq), reverse=True)


def _chosen(dangling: list[CheckpointRow], keep_last: int | None, older_than_s: float | None) -> list[CheckpointRow]:
    """The dangling checkpoints to delete (``dangling`` is newest first). A kept one keeps its
    dangling ancestors too: a chain is never cut (``verify`` would find a missing parent)."""
    keep = {r.checkpoint_id for r in dangling[:keep_last]} if keep_last else set()
    if older_than_s is not None:
        cutoff = (datetime.now(timezone.utc) - timedelta(seconds=older_than_s)).isoformat(timespec="microseconds")
        keep |= {r.checkpoint_id for r in dangling if r.created_at >= cutoff}
    keep = lineage(dangling, keep)
    return [r for r in dangling if r.checkpoint_id not in keep]


def collect(
    store: Store,
    *,
    apply: bool = False,
    keep_last: int | None = None,
    older_than_s: float | None = None,
    task_id: str | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    on_progress: Callable[[int, int], None] | None = None,
) -> GcReport:
    """``overnight gc``: find (and with ``apply`` delete) dangling checkpoints and unreferenced
    objects. See the module docstring for what is kept and why it is safe.

    Args:
        keep_last: keep this many of each task's newest dangling checkpoints.
        older_than_s: only dangling checkpoints created more than this many seconds ago go.
        task_id: only this task's dangling checkpoints, only objects they alone needed, and only
            its leftovers (``file://``, ``s3://``: its unlisted records, its index entries naming no
            record; :func:`_leftovers`).
        grace_s: objects stored or refreshed less than this many seconds before gc started stay.
        on_progress: ``(done, total)`` over the checkpoints read.

    Raises:
        TaskNotFound: ``task_id`` does not exist.
        StoreCorrupt: a ``file://`` or ``s3://`` store holds a damaged ref, index entry or task
            record, or a ``sqlite://`` store such a row (:func:`_refuse_hidden_damage`: nothing is
            deleted); or a part of a checkpoint on a live branch's lineage cannot be read, not even
            from its ditto copy (:func:`_refuse_unreadable_live`: nothing is deleted).
        FormatTooNew: a checkpoint was written by a newer overnight (nothing is deleted).
        ConfigError: a negative ``keep_last``, ``older_than_s`` or ``grace_s``.
    """
    for name, value in (("keep_last", keep_last), ("older_than", older_than_s), ("grace", grace_s)):
        if value is not None and value < 0:
            raise ConfigError(f"gc: {name} must not be negative (got {value})", task_id=task_id)
    t0 = time.monotonic()
    # through the archive catalog always: a lineage may run through archived checkpoints
    store = tiered(store, own=False)
    hot = store.hot
    report = GcReport(applied=apply, grace_s=grace_s)
    # 1. mark: list everything first (T0), then read what the remaining checkpoints need
    if task_id is not None:
        hot.get_task(task_id)
    _refuse_hidden_damage(hot)
    tasks = [t.task_id for t in hot.list_tasks()]
    reach = Reach(store)
    # records read as a load reads them (a damaged one through its verified copy): a merge's second
    # parent, which keeps its lineage alive, is named in the body
    rows = {t: [reach.record(r)[0] for r in hot.list_checkpoints(t)] for t in tasks}
    live = {t: _live(store, t, rows[t]) for t in tasks}
    doomed: dict[str, list[CheckpointRow]] = {}
    for t in tasks:
        tg = TaskGc(t, checkpoints=len(rows[t]))
        dangling = _dangling(store, t, rows[t], live[t])
        tg.dangling = [r.checkpoint_id for r in dangling]
        if task_id is None or t == task_id:
            doomed[t] = _chosen(dangling, keep_last, older_than_s)
            chosen = {r.checkpoint_id for r in doomed[t]}
            tg.kept = [c for c in tg.dangling if c not in chosen]
            tg.deleted = [r.checkpoint_id for r in doomed[t]]
            tg.bytes = sum(len(r.body) for r in doomed[t])
            report.tasks.append(tg)
    doomed_ids = {r.checkpoint_id for rs in doomed.values() for r in rs}
    remaining = [r for t in tasks for r in rows[t] if r.checkpoint_id not in doomed_ids]
    total = len(remaining) + (len(doomed.get(task_id, [])) if task_id is not None else 0)
    marked = reach.checkpoints(remaining, on_progress, total=total) | pack_roots(hot)
    # what a live checkpoint needs is unknown: nothing may go (before any deletion, dry run included)
    _refuse_unreadable_live(store, reach.unreadable, live, rows)
    # ditto copies live and die with their originals (records and objects)
    marked = with_copies(marked | {r.checkpoint_id for r in remaining})
    if task_id is not None:  # only what the doomed checkpoints needed is a candidate
        scope = reach.checkpoints(doomed.get(task_id, []), on_progress, start=len(remaining), total=total)
        scope = with_copies(scope | {r.checkpoint_id for r in doomed.get(task_id, [])})
    stats = {s.digest: s for s in hot.iter_object_stats()}
    report.objects = len(stats)
    report.objects_referenced = len(marked & stats.keys())
    candidates = {d: s for d, s in stats.items() if d not in marked and (task_id is None or d in scope)}
    report.objects_unreferenced = len(candidates)

    def young(age_ms: int) -> bool:
        return age_ms < grace_s * 1000 + (time.monotonic() - t0) * 1000

    # 2. sweep
    if apply:
        survivors: list[CheckpointRow] = []
        for t, rs in doomed.items():
            if not rs:
                continue
            freed = hot.delete_checkpoints([r.checkpoint_id for r in rs])
            left = {r.checkpoint_id for r in hot.list_checkpoints(t)}
            kept = [r for r in rs if r.checkpoint_id in left]  # a parent of a checkpoint committed meanwhile
            survivors += kept
            tg = next(x for x in report.tasks if x.task_id == t)
            tg.kept += [r.checkpoint_id for r in kept]
            tg.deleted = [r.checkpoint_id for r in rs if r.checkpoint_id not in left]
            tg.bytes = freed
        if survivors:
            noted = len(reach.unreadable)
            marked |= with_copies(reach.checkpoints(survivors) | {r.checkpoint_id for r in survivors})
            # a survivor is a parent of a checkpoint committed meanwhile: live now
            _refuse_unreadable_live(store, reach.unreadable[noted:], {r.task_id: {r.checkpoint_id for r in survivors}
                                                                     for r in survivors}, rows)
            candidates = {d: s for d, s in candidates.items() if d not in marked}
        # asked by the store once it holds its lock (and again per batch): the time spent waiting
        # for the lock counts towards the age kept, so what a commit refreshed after T0 - grace stays
        def min_age_ms() -> int:
            return int(grace_s * 1000 + (time.monotonic() - t0) * 1000) + 1

        records, entries = _leftovers(hot, remaining + survivors, task_id)
        old_records = [c for c, (_, age) in records.items() if not young(age)]
        report.leftover_records, report.leftover_bytes, report.leftover_entries = hot.delete_leftovers(  # type: ignore[attr-defined]
            old_records, entries, min_age_ms=min_age_ms) if old_records or entries else (0, 0, 0)
        if task_id is None:
            found = _abandoned(hot, grace_s, t0)
            report.leftover_tasks = hot.delete_abandoned(found, min_age_ms=min_age_ms) if found else 0  # type: ignore[attr-defined]
        gone = _delete_objects(hot, candidates, min_age_ms)
        report.objects_deleted = len(gone)
        report.object_bytes = sum(gone.values())
        report.objects_young = len(candidates) - len(gone)
        report.young_bytes = sum(s.stored_bytes for d, s in candidates.items() if d not in gone)
    else:
        records, entries = _leftovers(hot, remaining, task_id)
        sizes = [size for size, age in records.values() if not young(age)]
        report.leftover_records, report.leftover_bytes, report.leftover_entries = len(sizes), sum(sizes), len(entries)
        if task_id is None:
            report.leftover_tasks = len(_abandoned(hot, grace_s, t0))
        old = {d: s for d, s in candidates.items() if not young(s.age_ms)}
        report.objects_deleted = len(old)
        report.object_bytes = sum(s.stored_bytes for s in old.values())
        report.objects_young = len(candidates) - len(old)
        report.young_bytes = sum(s.stored_bytes for d, s in candidates.items() if d not in old)
    report.checkpoints_deleted = sum(len(tg.deleted) for tg in report.tasks)
    report.checkpoint_bytes = sum(tg.bytes for tg in report.tasks)
    report.unreadable = reach.unreadable
    report.seconds = time.monotonic() - t0
    return report


def _leftovers(hot: Store, remaining: list[CheckpointRow],
               task_id: str | None = None) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """What interrupted deletions and commits left in a ``file://`` or ``s3://`` store that no
    listing shows (:meth:`overnight.store.keyed.KeyedStore.leftovers`): ``({checkpoint id: (bytes,
    age ms)}, {index key: checkpoint id})`` (``({}, {})`` for a store without such leftovers);
    with ``task_id``, only that task's (``gc --task``: its unnamed records, its index entries).
    A record that is the parent of a checkpoint that stays (``remaining``), or of such a record
    in turn, is no leftover: it is kept, whatever its index says."""
    found = getattr(hot, "leftovers", None)
    if found is None:
        return {}, {}
    records, entries = found(task_id)
    parents = {r.parent_id for r in remaining if r.parent_id is not None}
    while parents & records.keys():
        kept = parents & records.keys()
        for c in kept:
            del records[c]
        parents = set()
        for c in kept:
            try:
                p = hot.get_checkpoint(c).parent_id
            except OvernightError:
                continue
            if p is not None:
                parents.add(p)
    return records, entries


def _abandoned(hot: Store, grace_s: float, t0: float) -> dict[str, list[str]]:
    """The task folders a killed ``rm`` or first commit left holding no task, older than the grace
    period counted from ``t0`` (:meth:`overnight.store.keyed.KeyedStore.abandoned_tasks`): ``{folder:
    [its keys]}``; ``{}`` for a store without such folders."""
    found = getattr(hot, "abandoned_tasks", None)
    if found is None:
        return {}
    return found(int(grace_s * 1000 + (time.monotonic() - t0) * 1000) + 1)


def _hidden_damage(hot: Store) -> list[str]:
    """The store's entries whose references cannot be read (``damaged_entries`` of a key-value
    store or of SQLite, one line each naming the key or row; ``[]`` for a store without them)."""
    found = getattr(hot, "damaged_entries", None)
    return found() if found is not None else []


def _refuse_hidden_damage(hot: Store) -> None:
    """Raise StoreCorrupt when the store holds an entry whose references cannot be read.

    On a key-value store (``file://``, ``s3://``) a damaged ref, index entry or task record --
    garbage bytes, a planted link, a name overnight never writes -- hides what it references: the
    ref's head, the history the index records, every checkpoint of a task that is not listed; on
    SQLite a ``refs`` row with a cell that cannot be read (its head lists as a placeholder no
    checkpoint has: every checkpoint of the task looked dangling), a ``tasks`` row whose id cannot
    be read, a ``checkpoints`` row whose id, task or parent cannot be read. Any
    object, and (for a damaged ref) any checkpoint of that task, may be one of them, and gc cannot
    tell which. Sweeping the rest would delete what the entry keeps alive once it is restored, so
    gc refuses -- dry run included, which shows what ``--apply`` would do -- naming every such
    entry (the store's ``damaged_entries``, which ``overnight verify --all`` reports too), and
    deletes nothing until it is restored or removed. Listings and ``verify --all`` go on past it.

    Raises:
        StoreCorrupt: the first line names the entry; ``hint`` says how to go on.
    """
    damage = _hidden_damage(hot)
    if damage:
        more = f" (and {len(damage) - 1} more)" if len(damage) > 1 else ""
        raise StoreCorrupt(
            f"gc deletes nothing while the store holds an entry it cannot read, which may keep checkpoints and "
            f"objects alive: {damage[0]}{more}",
            hint="`overnight verify --all` lists every damaged entry; restore each from a backup or replica "
            "(`overnight repair`), or remove it (a planted link or file; `overnight rm` of its task), then run gc again")


def _unreadable_live(unreadable: list[Unreadable], live: dict[str, set[str]]) -> list[Unreadable]:
    """The parts of checkpoints on a live branch's lineage that could not be read."""
    return [u for u in unreadable if u.checkpoint_id in live.get(u.task_id, ())]


def _branches_of(store: TieredStore, task_id: str, rows: list[CheckpointRow], cid: str) -> str:
    """Which live branches need checkpoint ``cid`` (``head of branch 'main'``, ``on branch 'x'``)."""
    refs = store.list_refs(task_id)
    heads = sorted(b for b, h in refs.items() if h == cid)
    if heads:
        return ", ".join(f"head of branch {b!r}" for b in heads)
    every = [*rows, *_archived_rows(store, task_id)]
    on = sorted(b for b, h in refs.items() if cid in lineage(every, [h]))
    return ", ".join(f"on branch {b!r}" for b in on) or "on a live branch"


def _refuse_unreadable_live(store: TieredStore, unreadable: list[Unreadable], live: dict[str, set[str]],
                            rows: dict[str, list[CheckpointRow]]) -> None:
    """Raise StoreCorrupt when a part of a checkpoint on a live branch's lineage could not be read.

    The walk reads through verified ditto copies (:class:`~overnight.chain.reachability.Reach`),
    so what is left cannot be read at all: the objects behind it are unknown, and any unreferenced
    object may be one of them (a damaged merge record also hides which checkpoints its second
    parent keeps alive). As for hidden damage (:func:`_refuse_hidden_damage`) gc deletes nothing --
    no object, no checkpoint -- dry run included, naming the first such part.

    Raises:
        StoreCorrupt: ``task_id`` and ``checkpoint_id`` name the checkpoint; ``hint`` how to go on.
    """
    bad = _unreadable_live(unreadable, live)
    if not bad:
        return
    u = bad[0]
    where = _branches_of(store, u.task_id, rows.get(u.task_id, []), u.checkpoint_id)
    others = {(b.task_id, b.checkpoint_id) for b in bad} - {(u.task_id, u.checkpoint_id)}
    more = f" (and {len(others)} more checkpoint(s))" if others else ""
    try:
        head = u.checkpoint_id is not None and u.checkpoint_id in set(store.list_refs(u.task_id).values())
    except OvernightError:  # its refs cannot be read either: say what fits a head too
        head = True
    way_off = ("move the branch off it (a resume falls back past the damaged head; `overnight rollback`)" if head else
               "leave it: the branch's head loads and runs on, only gc waits (rolling the branch back to before "
               "the damage would give up the checkpoints after it)")
    raise StoreCorrupt(
        f"gc deletes nothing while a live checkpoint cannot be read, so the objects it needs are unknown: task "
        f"{u.task_id!r}, {where}, checkpoint {short_id(u.checkpoint_id)}: {u.detail}{more}",
        task_id=u.task_id, checkpoint_id=u.checkpoint_id,
        hint=f"`overnight verify {u.task_id}` shows the damage; `overnight verify --repair {u.task_id}` rewrites "
        "what a verified ditto copy still holds; restore the rest from a backup or replica (`overnight repair`); "
        f"or {way_off}; or remove the task (`overnight rm`) -- then run gc again")


def _delete_objects(hot: Store, candidates: dict, min_age_ms: MinAge) -> dict[str, int]:
    """Delete candidates one batch at a time; returns ``{digest: bytes}`` of those deleted.

    The store keeps any candidate refreshed within ``min_age_ms``; what it deleted is found by
    asking which candidates are still there.
    """
    gone: dict[str, int] = {}
    digests = sorted(candidates)
    for i in range(0, len(digests), 500):
        part = digests[i : i + 500]
        hot.delete_objects(part, min_age_ms=min_age_ms)
        missing = hot.missing_objects(part)
        gone.update({d: candidates[d].stored_bytes for d in missing})
    return gone


# -- rm --------------------------------------------------------------------------------------------


@dataclass
class RmReport:
    """Result of :func:`remove_task`.

    Attributes:
        applied: False for a dry run.
        checkpoints, checkpoint_bytes: the task's checkpoints and their body bytes.
        branches: its branches.
        archives: its archive runs (their catalog rows go; the cold store is not touched).
        objects_unreferenced: objects only this task needed.
        objects_deleted, object_bytes: of those, deleted (older than ``grace``), and their bytes.
        objects_young: of those, kept because stored less than ``grace`` ago (``gc`` takes them later).
        queue_status: the status of its queue row (``queued``, ``running``, ``failed``, ...) when it
            was submitted -- the row goes with it -- else None (set by :func:`overnight.api.rm`).
    """

    task_id: str
    applied: bool
    grace_s: float
    checkpoints: int = 0
    checkpoint_bytes: int = 0
    branches: list[str] = field(default_factory=list)
    archives: int = 0
    objects_unreferenced: int = 0
    objects_deleted: int = 0
    object_bytes: int = 0
    objects_young: int = 0
    unreadable: list[Unreadable] = field(default_factory=list)
    seconds: float = 0.0
    queue_status: str | None = None
    kept_for_damage: bool = False
    """True when every object of the task stayed because damage elsewhere (``unreadable`` on a live
    lineage of another task, or a store entry whose references cannot be read) leaves unknown
    which objects other tasks need: nothing was deleted because of it (``gc`` takes them later)."""


def remove_task(store: Store, task_id: str, *, apply: bool = True, grace_s: float = DEFAULT_GRACE_S,
                on_progress: Callable[[int, int], None] | None = None) -> RmReport:
    """Delete a task (``store.delete_task``), then the objects no other task needs.

    The caller holds the task's leases (``overnight rm`` refuses while a live process holds one).
    Objects stored less than ``grace_s`` seconds ago stay (another task may be committing them).
    While the store holds an entry whose references cannot be read (:func:`_refuse_hidden_damage`),
    or another task's checkpoint on a live lineage cannot be read (:func:`_refuse_unreadable_live`),
    no object is known to be this task's alone: the task is deleted, every object stays (``gc``
    takes them once the damage is repaired).

    Raises:
        TaskNotFound: no such task.
    """
    t0 = time.monotonic()
    store = tiered(store, own=False)
    hot = store.hot
    hot.get_task(task_id)
    rows = hot.list_checkpoints(task_id)
    rep = RmReport(task_id, applied=apply, grace_s=grace_s, checkpoints=len(rows),
                   checkpoint_bytes=sum(len(r.body) for r in rows), branches=sorted(hot.list_refs(task_id)),
                   archives=len(hot.list_archives(task_id)))
    reach = Reach(store)
    other_rows = {t.task_id: [reach.record(r)[0] for r in hot.list_checkpoints(t.task_id)]
                  for t in hot.list_tasks() if t.task_id != task_id}
    others = [r for rs in other_rows.values() for r in rs]
    total = len(rows) + len(others)
    mine = with_copies(reach.checkpoints(rows, on_progress, total=total) | {r.checkpoint_id for r in rows})
    noted = len(reach.unreadable)
    marked = with_copies(reach.checkpoints(others, on_progress, start=len(rows), total=total) | pack_roots(hot)
                         | {r.checkpoint_id for r in others})
    stats = {s.digest: s for s in hot.iter_object_stats()}
    candidates = {d: stats[d] for d in mine if d in stats and d not in marked}
    if _hidden_damage(hot):  # a task no listing shows may need any of them: the task goes, its objects stay
        candidates, rep.kept_for_damage = {}, True
    elif reach.unreadable[noted:]:  # another task's live checkpoint needs objects no one can name
        live = {t: _live(store, t, rs) for t, rs in other_rows.items()}
        if _unreadable_live(reach.unreadable[noted:], live):
            candidates, rep.kept_for_damage = {}, True
    rep.objects_unreferenced = len(candidates)
    if apply:
        hot.delete_task(task_id)
        gone = _delete_objects(hot, candidates, int(grace_s * 1000 + (time.monotonic() - t0) * 1000))
    else:
        limit = grace_s * 1000 + (time.monotonic() - t0) * 1000
        gone = {d: s.stored_bytes for d, s in candidates.items() if s.age_ms >= limit}
    rep.objects_deleted, rep.object_bytes = len(gone), sum(gone.values())
    rep.objects_young = len(candidates) - len(gone)
    rep.unreadable = reach.unreadable
    rep.seconds = time.monotonic() - t0
    return rep
