"""The ``Store`` protocol on a key-value container with write-once keys and compare-and-swap.

``file://`` and ``s3://`` differ only in their container (:class:`Container`): a directory with
``link``/``rename`` and ``flock``, or a bucket with conditional ``PutObject``. Everything a store
*means* -- what a commit writes and in which order, how refs and leases fence each other -- is here,
once, so both backends behave the same and pass the same conformance module.

There are no multi-key transactions, so a commit is ordered so that the **ref swap is its single
commit point**:

1. read the ref (its value and version) and, with a lease, the lease record: a stale head raises
   :class:`~overnight.errors.StaleHead` and a lost lease :class:`~overnight.errors.LeaseLost`
   before anything is written;
2. write the new objects, the task registration, the checkpoint record (with its journal rows) and
   the old head's entry in the task's checkpoint index (``tasks/<T>/checkpoints/``); all are
   write-once and content-addressed, so writing them twice is harmless;
3. once all of them are durable, swap the ref from the version read in 1 to the new head (the
   compare-and-swap); if it lost a race, the commit fails as in 1 and what step 2 wrote is
   unreferenced garbage -- never listed, never loaded as a head (``get_checkpoint`` by id still
   finds such a record: it is immutable and verifiable, like an unreachable git commit);
4. add the new head to the index, without waiting for it to be durable (step 2 of the next commit
   makes it so).

Steps 2 to 4 are one container call, :meth:`Container.publish`, so that a container can wait for
the disk once for a whole batch rather than once per key (:mod:`overnight.store.file`).

A checkpoint is *committed* once a ref has named it. The index lists committed checkpoints: a
commit or :meth:`KeyedStore.set_ref` indexes the ref's old value (durably) before moving it away,
and listings add the current heads, so a crash that loses step 4 loses nothing.

**Fencing.** Each ref record carries a ``fence``: the highest lease token seen on that branch.
:meth:`KeyedStore.acquire_lease` writes the lease record (compare-and-swap, token + 1) and then
raises the ref's fence to its token (compare-and-swap, which changes the ref's version). A commit
by the previous holder therefore either lands before the new holder's acquisition completes (and
the new holder, which reads the head after acquiring, builds on it), or fails its ref swap and sees
a fence above its token: :class:`~overnight.errors.LeaseLost`. Tokens never go back, because a
released lease keeps its token.

**Deletion** (``gc``, ``rm``, ``archive``; no transactions here either). A commit's step 2 *refreshes*
each object that already exists (:meth:`Container.refresh`: a new modification time), re-creates one
that vanished meanwhile, and after the ref swap checks once more that every object it refreshed is
still there, writing back any that a concurrent ``gc`` removed in the instant between its age check
and its delete (S3 has no atomic check-and-delete; files do, see :mod:`overnight.store.file`).
Likewise an object another writer created between this commit's existence check and its own write
is compared after the swap, and replaced if that copy is damaged (:meth:`KeyedStore._heal`). A
commit checks that its parent record exists, a checkpoint of the same task, before writing anything
(:func:`~overnight.store.base.check_parent`).
Deleting a task removes its refs first, then its checkpoint records and index, archive rows and
leases, and its task record last, so an interrupted ``rm`` leaves a task that ``rm`` can finish.

**Damage is the entry's, not the store's.** A ref, index entry or task record that cannot be read
-- garbage bytes, a link or special file planted in its place or in place of its folder
(``file://``), an object larger than any record (:data:`~overnight.store.layout.MAX_KEY_BYTES`) --
fails the reads of that entry (StoreCorrupt naming its key), never a listing of every task:
:meth:`KeyedStore.list_refs` lists a damaged ref with a placeholder head, a task's checkpoints
are listed without a damaged index entry, and :meth:`KeyedStore.check_medium` (``verify --all``)
names each one. What such an entry references is unknown, so ``gc`` deletes nothing while there
is one (:meth:`KeyedStore.damaged_entries`), and no checkpoint of a task whose ref is damaged is
deleted (:meth:`KeyedStore.delete_checkpoints`).

**A first commit cut short.** A new task's first commit writes its ``task`` record in step 2, so a
process killed before step 3 leaves a task record that no committed checkpoint backs (no ref names
a checkpoint of it, its index is empty). That is no task yet -- as in a transactional store, which
writes the task row and the first checkpoint in one transaction: :meth:`KeyedStore.get_task` raises
:class:`~overnight.errors.TaskNotFound` saying to run it, listings leave it out, and the task's next
first commit replaces the leftover record with its own (:meth:`KeyedStore.commit`).
"""

from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator, Protocol

from overnight.errors import (
    CheckpointNotFound,
    ConfigError,
    DecodeError,
    LeaseLost,
    StoreBusy,
    StoreCorrupt,
    StoreVersionError,
    TaskBusy,
    TaskNotFound,
)
from overnight.store import layout
from overnight.store.blobs import is_damaged
from overnight.store.base import ArchiveRow, CallRecord, CheckpointRow, Commit, JournalRow, TaskRow
from overnight.store.base import Closing, DamagedText, Lease, MinAge, ObjectRecord, ObjectStat, check_parent, stale_head
from overnight.store.leases import can_take_over, describe_holder, now_ms, released_holder

_SWAP_RETRIES = 50  # lease/fence swaps that lose a race re-read and retry this many times


def _damaged(key: str, damage: str) -> DamagedText:
    """The placeholder :meth:`KeyedStore.list_refs` lists for a ref it cannot read: the text
    ``damaged:<key>`` (no checkpoint id or branch looks like it), ``damage`` the message naming
    the key."""
    out = DamagedText(f"damaged:{key}")
    out.damage = damage
    return out


def _is_damaged(value: str) -> bool:
    """Is ``value`` a placeholder of :func:`_damaged`?"""
    return isinstance(value, DamagedText)


class Container(Protocol):
    """Bytes under string keys (``a/b/c``), with two write primitives.

    ``create`` is write-once (the first bytes win; durable when it returns); ``swap`` is an atomic
    compare-and-swap on a *version* -- an opaque string the container returns with every read
    (a content hash for files, the ETag for S3). Implementations are thread-safe.
    """

    def read(self, key: str) -> tuple[bytes, str] | None:
        """``(data, version)``, or None when the key does not exist."""
        ...

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Data of the keys that exist."""
        ...

    def exists_many(self, keys: Iterable[str]) -> set[str]:
        """The keys that exist."""
        ...

    def create_many(self, items: dict[str, bytes]) -> set[str]:
        """Write each key that does not exist yet; returns the keys this call wrote. All of them --
        and the names of those that existed -- are durable when it returns."""
        ...

    def swap(self, key: str, data: bytes, expected: str | None) -> str | None:
        """Replace the key's data if its version is ``expected`` (None: the key must not exist).
        Returns the new version, or None when the key had another version (nothing written)."""
        ...

    def publish(self, items: dict[str, bytes], key: str, data: bytes, expected: str | None,
                then: dict[str, bytes] | None = None) -> tuple[set[str], str | None]:
        """``create_many(items)``, then ``swap(key, data, expected)``, then, if the swap landed,
        ``create_many(then)``. Every item -- and the name of every one that already existed -- is
        durable before the swap can land, and the swap when this returns; ``then`` may be lost to a
        crash (never torn) until a later ``publish`` names it in ``items``. Returns ``(keys of
        items this call wrote, what the swap returns)`` (the items stay written either way)."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Names of the keys and sub-folders directly under the folder ``prefix``."""
        ...

    def occupied(self, prefix: str) -> bool:
        """Does the folder ``prefix`` hold any key? Stops at the first one (no listing of a large
        folder)."""
        ...

    def stats(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        """``(key, bytes, age in ms)`` of every key under the folder ``prefix``, at any depth; the
        age is measured since the key was last written or refreshed, by the container's clock."""
        ...

    def refresh(self, keys: Iterable[str]) -> set[str]:
        """Set the keys' modification time to now; returns the keys that do not exist."""
        ...

    def delete(self, keys: Iterable[str], *, min_age_ms: MinAge | None = None) -> dict[str, int]:
        """Delete keys; returns ``{key: bytes}`` of those deleted. With ``min_age_ms``, a key
        written or refreshed less than that many ms ago is kept (checked as close to the delete as
        the medium allows; a callable is asked again for each key, :func:`~overnight.store.base.age_limit`)."""
        ...

    def size(self) -> int:
        """Bytes of every stored key."""
        ...

    def close(self) -> None:
        ...


class KeyedStore(Closing):
    """:class:`~overnight.store.base.Store` on a :class:`Container` (layout: :mod:`overnight.store.layout`).

    Args:
        container: where the bytes live.
        url: the store URL (for messages, and to reopen the store from another process).

    Raises:
        ConfigError: the container holds something that is not an overnight store.
        StoreVersionError: the store was written by a newer overnight (a larger layout version).
    """

    def __init__(self, container: Container, url: str) -> None:
        self._c = container
        self.url = url
        self._check_layout()

    # -- plumbing ---------------------------------------------------------------------------

    def _check_layout(self) -> None:
        got = self._c.read(layout.META_KEY)
        if got is None:
            if [n for n in self._c.list("") if not n.startswith(".")]:  # ".": temporary and probe keys
                raise ConfigError(
                    f"{self.url} is not empty and holds no {layout.META_KEY}: not an overnight store",
                    hint="point the store URL at an empty or new location",
                )
            self._c.create_many({layout.META_KEY: layout.encode_meta()})
            got = self._c.read(layout.META_KEY)
            assert got is not None
        try:
            version = layout.decode_meta(got[0])["layout"]
        except DecodeError as exc:
            raise ConfigError(f"{self.url}: unreadable {layout.META_KEY} ({exc})",
                              hint="is this an overnight store?") from exc
        if version > layout.LAYOUT_VERSION:
            raise StoreVersionError(
                f"store {self.url} has layout version {version}, written by a newer overnight "
                f"(this one knows up to {layout.LAYOUT_VERSION})",
                hint="upgrade overnight (pip install -U overnight) to open this store",
            )
        if version < layout.LAYOUT_VERSION:
            # layout 1 -> 2 adds keys and the refresh rule, nothing to convert: rewrite the marker so
            # older overnight versions (which do not refresh objects) stop writing here
            if self._c.swap(layout.META_KEY, layout.encode_meta(), got[1]) is None:
                self._check_layout()  # another process upgraded it first

    def _read_ref(self, task_id: str, branch: str) -> tuple[str | None, int, str | None]:
        """``(checkpoint_id or None, fence, version or None)`` of the branch's ref record."""
        key = layout.ref_key(task_id, branch)
        got = self._c.read(key)
        if got is None:
            return None, 0, None
        ref = self._decoded(layout.decode_ref, key, got[0])
        return ref["checkpoint_id"], ref["fence"], got[1]

    def _read_lease(self, task_id: str, branch: str) -> tuple[Lease | None, str | None]:
        """``(lease, version)``; a garbled lease record reads as no lease (a lease only
        coordinates: the ref's fence, raised past it by the next holder, keeps commits safe)."""
        got = self._c.read(layout.lease_key(task_id, branch))
        if got is None:
            return None, None
        try:
            return layout.decode_lease(got[0]), got[1]
        except DecodeError:
            return None, got[1]

    def _decoded(self, decode: Any, key: str, data: bytes) -> Any:
        """``decode(data)``, or StoreCorrupt naming the record's key."""
        try:
            return decode(data)
        except DecodeError as exc:
            why = ("it is a symbolic link, a special file or larger than any record, so it was not read"
                   if data == layout.DAMAGED else exc.message)
            raise StoreCorrupt(f"{self.url}: the record at {key} is unreadable ({why})",
                               hint="restore it from a replica (`overnight repair`) or a backup; `overnight verify "
                               "--all` lists what else is damaged") from exc

    @staticmethod
    def _index_entries(task_id: str, checkpoint_ids: Iterable[str]) -> dict[str, bytes]:
        """The index records saying the checkpoints are committed on the task."""
        return {layout.index_key(task_id, c): c.encode("utf-8", "surrogatepass") for c in checkpoint_ids}

    @staticmethod
    def _lost(lease: Lease, holder: Lease | None) -> LeaseLost:
        who = describe_holder(holder.holder) if holder is not None and holder.holder_id else "nobody"
        return LeaseLost(
            f"lease on branch {lease.branch!r} was taken over (now held by {who})",
            task_id=lease.task_id,
            hint="this process stalled past its lease TTL; the other holder continues the task",
        )

    def _check_lease(self, lease: Lease, fence: int) -> None:
        current, _ = self._read_lease(lease.task_id, lease.branch)
        if (current is None or current.holder_id != lease.holder_id or current.token != lease.token
                or fence > lease.token):
            raise self._lost(lease, current)

    # -- objects ----------------------------------------------------------------------------

    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        keys = {d: layout.object_key(d) for d in dict.fromkeys(digests)}
        present = self._c.exists_many(keys.values())
        return {d for d, k in keys.items() if k not in present}

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        keys = {layout.object_key(d): d for d in dict.fromkeys(digests)}
        return {keys[k]: layout.decode_object(keys[k], data) for k, data in self._c.read_many(keys).items()}

    @staticmethod
    def _encoded(objects: Iterable[ObjectRecord]) -> dict[str, tuple[ObjectRecord, bytes]]:
        """Each distinct object by its key, with the record bytes that store it."""
        out: dict[str, tuple[ObjectRecord, bytes]] = {}
        for o in objects:
            key = layout.object_key(o.digest)
            if key not in out:
                out[key] = (o, layout.encode_object(o))
        return out

    def _heal(self, staged: dict[str, tuple[ObjectRecord, bytes]], keys: Iterable[str]) -> set[str]:
        """Replace the stored copy under each of ``keys`` whose bytes differ from the staged ones
        (which hash to the digest) and that is damaged; an intact copy is kept (the first write
        wins). Returns the keys replaced."""
        healed = set()
        for key in sorted(keys):
            o, data = staged[key]
            got = self._c.read(key)
            if (got is not None and got[0] != data and is_damaged(self, o.digest)
                    and self._c.swap(key, data, got[1]) is not None):
                healed.add(key)
        return healed

    def _stage(self, staged: dict[str, tuple[ObjectRecord, bytes]]) -> tuple[dict[str, bytes], int, set[str]]:
        """Get the objects ready to write: ``(records to create, data bytes they add, keys refreshed)``.

        Objects already stored are refreshed instead (a damaged copy is replaced, :meth:`_heal`); one
        that vanishes meanwhile (``gc``) is created again. The bytes added count the objects not
        stored when this looked (a concurrent writer of the same object may link it first; both
        then count it)."""
        present = self._c.exists_many(staged)
        healed = self._heal(staged, present)  # a fresh write: nothing to refresh
        refreshed = present - healed
        refreshed -= self._c.refresh(refreshed)
        new = {k: data for k, (_, data) in staged.items() if k not in refreshed and k not in healed}
        return new, sum(len(staged[k][0].data) for k in [*new, *healed]), refreshed

    def _repair(self, staged: dict[str, tuple[ObjectRecord, bytes]], keys: set[str]) -> None:
        """After a commit point: write back any refreshed object a concurrent ``gc`` deleted in the
        instant between its age check and its delete (see the module docstring)."""
        if keys:
            self._c.create_many({k: staged[k][1] for k in keys - self._c.exists_many(keys)})

    def put_objects(self, objects: Iterable[ObjectRecord]) -> None:
        staged = self._encoded(objects)
        items, _, refreshed = self._stage(staged)
        created = self._c.create_many(items)
        self._heal(staged, set(items) - created)  # another writer linked it first
        self._repair(staged, refreshed)

    def iter_object_digests(self) -> Iterator[str]:
        for shard in self._c.list("objects"):
            if len(shard) == 2:
                for rest in self._c.list(f"objects/{shard}"):
                    yield f"sha256:{shard}{rest}"

    def iter_object_stats(self) -> Iterator[ObjectStat]:
        for key, size, age in self._c.stats("objects"):
            d = layout.digest_of_object_key(key)
            if d is not None:
                yield ObjectStat(d, size, age)

    def delete_objects(self, digests: Iterable[str], *, min_age_ms: MinAge | None = None) -> int:
        keys = [layout.object_key(d) for d in dict.fromkeys(digests)]
        return sum(self._c.delete(keys, min_age_ms=min_age_ms).values())

    # -- checkpoints and refs ---------------------------------------------------------------

    def commit(self, commit: Commit) -> int:
        """Commit a checkpoint (:meth:`overnight.store.base.ChainStore.commit`, in the order of the
        module docstring). A first commit (``commit.task`` set) that finds the ``task`` record an
        interrupted first commit left -- no checkpoint of the task committed -- replaces that
        record with its own before writing (compare-and-swap; the record is otherwise written
        once), so the task's registration is the one of the commit that created it, as in a
        transactional store.

        Returns the bytes the commit added.

        Raises:
            StaleHead, LeaseLost, ParentGone, SchemaError: as every store (nothing is committed).
            StoreBusy: a compare-and-swap kept losing, or (``file://``) a lock stayed held.
        """
        cp = commit.checkpoint
        current, fence, version = self._read_ref(cp.task_id, cp.branch)
        if commit.lease is not None:
            self._check_lease(commit.lease, fence)
        if current != commit.expected_head:
            raise stale_head(cp.task_id, cp.branch, commit.expected_head, current)
        if cp.parent_id is not None:
            check_parent(cp, self._parent_task(cp))
        if commit.task is not None:
            self._replace_leftover_task(commit.task)
        staged = self._encoded(commit.objects)
        items, written, refreshed = self._stage(staged)
        new = set(items)
        added = len(cp.body) + written
        items[layout.checkpoint_key(cp.checkpoint_id)] = layout.encode_checkpoint(cp, added, commit.journal)
        if commit.task is not None:
            items[layout.task_key(commit.task.task_id)] = layout.encode_task(commit.task)
        if current is not None:
            items.update(self._index_entries(cp.task_id, [current]))
        new_fence = max(fence, commit.lease.token) if commit.lease is not None else fence
        ref = layout.encode_ref(cp.task_id, cp.branch, cp.checkpoint_id, new_fence, now_ms())
        indexed = self._index_entries(cp.task_id, [cp.checkpoint_id])
        created, swapped = self._c.publish(items, layout.ref_key(cp.task_id, cp.branch), ref, version, indexed)
        if swapped is None:
            current, fence, _ = self._read_ref(cp.task_id, cp.branch)
            if commit.lease is not None:
                self._check_lease(commit.lease, fence)
            raise stale_head(cp.task_id, cp.branch, commit.expected_head, current)
        self._heal(staged, new - created)  # another writer linked it first
        self._repair(staged, refreshed)
        record = layout.checkpoint_key(cp.checkpoint_id)
        back = [record] + ([layout.task_key(commit.task.task_id)] if commit.task is not None else [])
        missing = [k for k in back if k not in created]
        missing = [k for k in missing if k not in self._c.exists_many(missing)] if missing else []
        if missing:
            # the record (or the first commit's ``task`` record) was there already -- an earlier
            # attempt of this very commit, or an ``rm`` of the task, killed before the swap -- and a
            # gc took it as a leftover meanwhile (:meth:`leftovers`, :meth:`abandoned_tasks`): back
            self._c.create_many({k: items[k] for k in missing})
        return added

    def _parent_task(self, cp: CheckpointRow) -> str | None:
        """The task of ``cp``'s parent record, None when it is not stored (a damaged record counts
        as ``cp``'s own task: verification reports it)."""
        got = self._c.read(layout.checkpoint_key(cp.parent_id or ""))
        if got is None:
            return None
        try:
            return layout.decode_checkpoint(got[0])[0].task_id
        except DecodeError:
            return cp.task_id

    def _read_checkpoints(self, checkpoint_ids: Iterable[str]) -> list[tuple[CheckpointRow, list[JournalRow]]]:
        keys = [layout.checkpoint_key(c) for c in dict.fromkeys(checkpoint_ids)]
        out = []
        for data in self._c.read_many(keys).values():
            try:
                out.append(layout.decode_checkpoint(data))
            except DecodeError:
                continue  # an unreadable record: verification of the chain reports it as missing
        return out

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        got = self._c.read(layout.checkpoint_key(checkpoint_id))
        if got is not None:
            try:
                return layout.decode_checkpoint(got[0])[0]
            except DecodeError:
                pass
        raise CheckpointNotFound(f"no checkpoint {checkpoint_id} in {self.url}", checkpoint_id=checkpoint_id)

    def _index(self, folder: str) -> tuple[set[str], list[str], list[str]]:
        """``(ids, damage, foreign)`` of the index folder ``folder`` (``tasks/<T>/checkpoints``):
        the ids its entries name; one line per damaged entry -- a hashed entry (``~`` + SHA-256)
        whose bytes are not the id hashing to its name (garbage, a link), a link in place of the
        folder (its entries are not the store's) --, which may hide a committed checkpoint; and
        one line per file under a name :func:`~overnight.store.layout.name` never writes (planted:
        it names no checkpoint and hides none, so ``gc`` and ``rm`` leave it). The listing goes
        on without them; :meth:`damaged_entries` and :meth:`check_medium` report them."""
        try:
            names = self._c.list(folder)
        except StoreCorrupt as exc:
            return set(), [exc.message], []
        ids, damage, foreign = set(), [], []
        for n in names:
            if not n.startswith("~"):
                try:
                    ids.add(layout.unname(n))
                except DecodeError as exc:
                    foreign.append(f"{self.url}: the index entry {folder}/{n} is no name overnight writes "
                                   f"({exc.message}): it names no checkpoint; remove it")
        hashed = {f"{folder}/{n}": n for n in names if n.startswith("~")}
        for key, data in self._c.read_many(hashed).items():
            try:
                cid = data.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                cid = None
            if cid is not None and layout.name(cid) == hashed[key]:
                ids.add(cid)
            else:
                damage.append(f"{self.url}: the index entry {key} is unreadable (it does not hold the checkpoint id "
                              "its name is the hash of)")
        return ids, damage, foreign

    def _committed_ids(self, task_id: str) -> set[str]:
        """Ids of the task's committed checkpoints: its index plus its current heads (a damaged
        index entry or ref left out: :meth:`damaged_entries`)."""
        ids = self._index(layout.index_dir(task_id))[0]
        ids.update(c for c in self.list_refs(task_id).values() if not _is_damaged(c))
        return ids

    def _committed(self, task_id: str) -> list[tuple[CheckpointRow, list[JournalRow]]]:
        """Committed checkpoints of the task (its index plus its current heads), by seq."""
        rows = [r for r in self._read_checkpoints(self._committed_ids(task_id)) if r[0].task_id == task_id]
        rows.sort(key=lambda r: (r[0].seq, r[0].created_at, r[0].checkpoint_id))
        return rows

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        return [row for row, _ in self._committed(task_id)]

    def checkpoints_after(self, task_id: str, branch: str, seq: int) -> list[CheckpointRow]:
        # the index names checkpoints by id only: every committed record is read (layout 2)
        return [row for row, _ in self._committed(task_id) if row.branch == branch and row.seq > seq]

    def get_ref(self, task_id: str, branch: str) -> str | None:
        return self._read_ref(task_id, branch)[0]

    def list_refs(self, task_id: str) -> dict[str, str]:
        """The task's branches and their heads. A ref the store cannot read -- a record that does
        not decode, a link or special file in place of the record or of the ``refs`` folder -- is
        listed as the SQLite store lists a ref row with a cell of the wrong type: with a
        :class:`~overnight.store.base.DamagedText` head (``damaged:<key>``, its ``damage`` the
        StoreCorrupt message naming the key; no checkpoint has that id), under the branch its key
        names (a ``damaged:`` placeholder too for a damaged folder). So one damaged ref does not
        end a listing of every task (``ls``, ``verify --all``); reading that branch (``get_ref``, a
        load, a commit) raises StoreCorrupt naming the key, and ``gc`` refuses to run
        (:meth:`damaged_entries`)."""
        return self._refs(layout.refs_dir(task_id))[0]

    def _refs(self, folder: str) -> tuple[dict[str, str], list[str]]:
        """``(branch -> head, damage)`` of the refs folder ``folder`` (see :meth:`list_refs`): one
        line per damaged ref, naming its key."""
        try:
            names = self._c.list(folder)
        except StoreCorrupt as exc:
            return {_damaged(folder, exc.message): _damaged(folder, exc.message)}, [exc.message]
        keys = {f"{folder}/{n}": n for n in names}
        out: dict[str, str] = {}
        damage = []
        for key, data in self._c.read_many(keys).items():
            try:
                ref = self._decoded(layout.decode_ref, key, data)
            except StoreCorrupt as exc:
                damage.append(exc.message)
                try:
                    branch = layout.unname(keys[key])  # a label only: the record, which names it, is unreadable
                except DecodeError:
                    branch = keys[key]
                out[branch] = _damaged(key, exc.message)
                continue
            if ref["checkpoint_id"] is not None:
                out[ref["branch"]] = ref["checkpoint_id"]
        return dict(sorted(out.items())), damage

    def set_ref(self, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        current, fence, version = self._read_ref(task_id, branch)
        if current != expected:
            raise stale_head(task_id, branch, expected, current)
        if new is None and expected is None:
            return
        items = self._index_entries(task_id, [current]) if current is not None else {}
        ref = layout.encode_ref(task_id, branch, new, fence, now_ms())
        indexed = self._index_entries(task_id, [new]) if new is not None else None
        if self._c.publish(items, layout.ref_key(task_id, branch), ref, version, indexed)[1] is None:
            raise stale_head(task_id, branch, expected, self.get_ref(task_id, branch))

    def put_checkpoints(self, rows: Iterable[CheckpointRow], journal: Iterable[JournalRow] = ()) -> None:
        rows = list(rows)
        by_cp: dict[str, list[JournalRow]] = {}
        for j in journal:
            by_cp.setdefault(j.checkpoint_id, []).append(j)
        records = {layout.checkpoint_key(r.checkpoint_id):
                   layout.encode_checkpoint(r, r.stored_bytes, by_cp.get(r.checkpoint_id, [])) for r in rows}
        there = set(records) - self._c.create_many(records)
        for task_id in dict.fromkeys(r.task_id for r in rows):
            self._c.create_many(self._index_entries(task_id, [r.checkpoint_id for r in rows if r.task_id == task_id]))
        if there:  # stored already, unindexed: a gc may have taken it as a leftover meanwhile (:meth:`leftovers`)
            self._c.create_many({k: records[k] for k in there - self._c.exists_many(there)})

    def delete_checkpoints(self, checkpoint_ids: Iterable[str], *, orphans: bool = False) -> int:
        """Delete checkpoint records (:meth:`overnight.store.base.Store.delete_checkpoints`: never
        a branch head, nor, unless ``orphans``, a parent of a checkpoint that stays). Each record
        goes before its index entry, so a delete killed midway leaves nothing that ``gc`` cannot
        find again. Returns the body bytes freed.

        Raises:
            StoreCorrupt: a ref of the task cannot be read (it may name any of them: nothing of
                that task is deleted); the message names the ref's key.
        """
        found = {row.checkpoint_id: row for row, _ in self._read_checkpoints(checkpoint_ids)}
        freed = 0
        for task_id in dict.fromkeys(r.task_id for r in found.values()):
            doomed = {c for c, r in found.items() if r.task_id == task_id}
            heads, damage = self._refs(layout.refs_dir(task_id))
            if damage and doomed:  # a ref that cannot be read may name any of them
                raise StoreCorrupt(f"not deleting checkpoints of task {task_id!r}: {damage[0]}", task_id=task_id,
                                   hint="restore or remove the damaged ref first; `overnight verify --all` lists "
                                   "what is damaged")
            doomed -= set(heads.values())
            if not orphans and doomed:
                rows = [r for r, _ in self._committed(task_id)]
                while True:
                    keep = {r.parent_id for r in rows if r.checkpoint_id not in doomed and r.parent_id in doomed}
                    if not keep:
                        break
                    doomed -= keep
            # the records first, their index entries after: the index is how gc finds a task's
            # records, so a delete killed in between leaves records it still finds (and deletes on
            # its next run) or index entries naming no record (listings skip them; the next gc
            # removes them, :meth:`leftovers`) -- never a record nothing lists. Newest first, so a
            # record left by a kill never names a deleted parent (``file://`` deletes in order;
            # ``s3://`` a few side by side)
            order = sorted(doomed, key=lambda c: (found[c].seq, found[c].created_at, c), reverse=True)
            self._c.delete([layout.checkpoint_key(c) for c in order])
            self._c.delete([layout.index_key(task_id, c) for c in order])
            freed += sum(len(found[c].body) for c in doomed)
        return freed

    def leftovers(self, task_id: str | None = None) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
        """What an interrupted deletion or commit left that no listing shows, for ``gc`` to remove
        (:func:`overnight.ops.gc.collect`): ``(records, entries)``.

        ``records``: ``{checkpoint id: (bytes, age in ms)}`` of the records under ``checkpoints/``
        that no index entry and no ref of any task folder names -- a commit killed (or beaten) before
        its ref swap, a record a delete from before layout 2 unindexed first; never listed, so no
        other gc would find them. One a commit is writing right now looks the same: the caller
        deletes only those older than its grace period (:meth:`delete_leftovers`).
        ``entries``: ``{index key: checkpoint id}`` of the index entries naming a record that is not
        stored (a delete killed between a record and its entry), ref heads excepted.

        ``task_id``: only that task's leftovers (``gc --task``): the entries of its own index folder,
        and the unnamed records that say they are its checkpoints. A record's key does not name its
        task, so the names under ``checkpoints/`` and in every index are listed as for the whole
        store (listings only), but only the unnamed records are read -- to learn their task -- and
        only this task's index entries are checked against the records; an unnamed record that
        cannot be read belongs to no task (a whole-store gc takes it).

        ``({}, {})`` while a ref, index entry or folder cannot be read (:meth:`damaged_entries`:
        it may name any record), and records whose key names no checkpoint are left out.
        """
        try:
            folders = self._c.list("tasks")
        except StoreCorrupt:
            return {}, {}
        named: set[str] = set()
        indexed: dict[str, str] = {}
        for n in folders:
            heads, damage = self._refs(f"tasks/{n}/refs")
            folder = f"tasks/{n}/checkpoints"
            ids, broken, _ = self._index(folder)
            if damage or broken:
                return {}, {}
            named.update(c for c in heads.values() if not _is_damaged(c))
            named.update(ids)
            indexed.update({f"{folder}/{layout.name(c)}": c for c in ids})
        stored: dict[str, tuple[int, int]] = {}
        for key, size, age in self._c.stats("checkpoints"):
            cid = layout.checkpoint_id_of_key(key)
            if cid is not None:
                stored[cid] = (size, age)
        heads = named - set(indexed.values())
        records = {c: v for c, v in stored.items() if c not in named}
        if task_id is not None:
            mine = layout.index_dir(task_id) + "/"
            indexed = {k: c for k, c in indexed.items() if k.startswith(mine)}
            records = {row.checkpoint_id: records[row.checkpoint_id] for row, _ in self._read_checkpoints(records)
                       if row.task_id == task_id and row.checkpoint_id in records}
        entries = {k: c for k, c in indexed.items() if c not in stored and c not in heads}
        return records, entries

    def delete_leftovers(self, records: Iterable[str], entries: dict[str, str], *,
                         min_age_ms: MinAge | None = None) -> tuple[int, int, int]:
        """Delete what :meth:`leftovers` found: each record in ``records`` still stored ``min_age_ms``
        or longer (checked as the container deletes it) and still named by no index entry or ref --
        a record that a commit or restore indexed meanwhile stays --, then each of ``entries`` (an
        entry whose record was written again meanwhile is put back). Returns ``(records deleted,
        their bytes, entries deleted)``."""
        records = list(dict.fromkeys(records))
        now, _ = self.leftovers() if records else ({}, {})  # the whole store's: listings only, no reads
        gone = self._c.delete([layout.checkpoint_key(c) for c in records if c in now], min_age_ms=min_age_ms)
        removed = self._c.delete(entries)
        again = self._c.exists_many([layout.checkpoint_key(entries[k]) for k in removed]) if removed else set()
        back = {k: entries[k].encode("utf-8", "surrogatepass") for k in removed
                if layout.checkpoint_key(entries[k]) in again}
        if back:  # written again (a restore, a repair) between the listing and the delete
            self._c.create_many(back)
        return len(gone), sum(gone.values()), len(removed) - len(back)

    def abandoned_tasks(self, min_age_ms: int) -> dict[str, list[str]]:
        """The task folders an ``rm`` (or a first commit) killed midway left holding no task:
        ``{task folder: [its keys]}``, for a whole-store ``gc`` to remove (:meth:`delete_abandoned`).

        A folder qualifies when it holds no ref, no index entry and no call record -- nothing but,
        maybe, its ``task`` record (which no committed checkpoint backs, so no listing shows it:
        :meth:`list_tasks`) and lease records no live holder holds (released, expired, or held by a
        process that is gone) -- and every key in it, and on ``file://`` every folder in it
        (:meth:`FileContainer.folder_age_ms <overnight.store.file.FileContainer.folder_age_ms>`),
        was last written ``min_age_ms`` or more ago: a first commit in flight writes its ``task``
        record, and a worker starting a task its lease, moments before its ref, so a grace period
        longer than a commit keeps them. An empty folder (what even a completed ``rm`` leaves on
        ``file://``) qualifies with no keys. A lease record that cannot be read keeps its folder.
        """
        try:
            folders = self._c.list("tasks")
        except StoreCorrupt:
            return {}
        folder_age = getattr(self._c, "folder_age_ms", None)
        now = now_ms()
        found: dict[str, list[str]] = {}
        for n in folders:
            base = f"tasks/{n}"
            try:
                keys = list(self._c.stats(base))
            except StoreCorrupt:  # a link in place of the folder: damage, not ours to remove
                continue
            if any(age < min_age_ms for _, _, age in keys):
                continue
            leases = [k for k, _, _ in keys if k.startswith(f"{base}/leases/")]
            if any(k != f"{base}/task" and k not in leases for k, _, _ in keys):
                continue  # a ref, an index entry, a call record: a task (or one being made)
            held = False
            for data in self._c.read_many(leases).values():
                try:
                    lease = layout.decode_lease(data)
                except DecodeError:
                    held = True
                    break
                if lease.holder_id and not can_take_over(lease.holder, lease.expires_at_ms, now):
                    held = True
                    break
            if held or (folder_age is not None and folder_age(base) < min_age_ms):
                continue
            found[base] = [k for k, _, _ in keys]
        return found

    def delete_abandoned(self, folders: dict[str, list[str]], *, min_age_ms: MinAge) -> int:
        """Delete what :meth:`abandoned_tasks` found: each folder's keys still stored ``min_age_ms``
        or longer (checked as the container deletes each), then, on ``file://``, the folder itself
        once empty (:meth:`FileContainer.remove_empty_folder
        <overnight.store.file.FileContainer.remove_empty_folder>`: a folder something was written
        into meanwhile stays). Returns how many folders were removed whole (``s3://``, which has no
        folders: how many were emptied)."""
        prune = getattr(self._c, "remove_empty_folder", None)
        removed = 0
        for base, keys in folders.items():
            gone = self._c.delete(keys, min_age_ms=min_age_ms) if keys else {}
            if len(gone) != len(keys):
                continue  # written again meanwhile: a task is being made there
            if prune is None or prune(base):
                removed += 1
        return removed

    def delete_task(self, task_id: str) -> None:
        folder = layout.task_dir(task_id)
        ids = self._committed_ids(task_id)
        self._c.delete([f"{layout.refs_dir(task_id)}/{n}" for n in self._c.list(layout.refs_dir(task_id))])
        self._c.delete([layout.checkpoint_key(c) for c in ids])
        rest = [key for key, _, _ in self._c.stats(folder) if key != layout.task_key(task_id)]
        rest += [key for key, _, _ in self._c.stats(layout.archive_dir(task_id))]
        self._c.delete(rest)
        self._c.delete([layout.task_key(task_id)])

    # -- archives ---------------------------------------------------------------------------

    def put_archive(self, row: ArchiveRow) -> None:
        self._c.create_many({layout.archive_key(row.task_id, row.archive_id): layout.encode_archive(row)})

    def list_archives(self, task_id: str | None = None) -> list[ArchiveRow]:
        folder = layout.ARCHIVES if task_id is None else layout.archive_dir(task_id)
        rows = []
        for data in self._c.read_many([key for key, _, _ in self._c.stats(folder)]).values():
            try:
                row = layout.decode_archive(data)
            except DecodeError:
                continue
            if task_id is None or row.task_id == task_id:
                rows.append(row)
        return sorted(rows, key=lambda r: (r.created_at, r.archive_id))

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        self._c.delete([layout.archive_key(task_id, archive_id)])

    # -- tasks and journal ------------------------------------------------------------------

    def _ever_committed(self, task_id: str) -> bool:
        """Has a ref of the task ever named a checkpoint? True when its index has an entry (a
        commit or ref move indexes the ref's old value before moving it) or a ref names one now --
        or a ref cannot be read (damage: the task stays visible, so verification reports it)."""
        try:
            if self._c.occupied(layout.index_dir(task_id)):
                return True
            folder = layout.refs_dir(task_id)
            names = self._c.list(folder)
        except StoreCorrupt:  # a link in place of its index or refs folder
            return True
        for data in self._c.read_many([f"{folder}/{n}" for n in names]).values():
            try:
                if layout.decode_ref(data)["checkpoint_id"] is not None:
                    return True
            except DecodeError:
                return True
        return False

    def _never_committed(self, task_id: str, data: bytes) -> TaskNotFound:
        """The error for a task whose ``task`` record (``data``) a first commit wrote before it was
        interrupted: the hint says how to start it (again)."""
        try:
            entry = layout.decode_task(data).entry
        except DecodeError:
            entry = None
        again = (f"`overnight run {shlex.quote(entry)} --store {shlex.quote(self.url)}`" if entry else
                 "run its code again (`overnight run FILE.py`)")
        exc = TaskNotFound(
            f"task {task_id!r} in {self.url} has no checkpoint: the run that created it was stopped before its "
            "first commit completed (or an `overnight rm` of it before it ended), so nothing of it was kept",
            task_id=task_id, hint=f"start it with {again}, or remove what is left with `overnight rm`; "
            "`overnight ls` lists the tasks")
        exc.leftover = True  # type: ignore[attr-defined]  # `overnight rm` removes what is left (api.rm)
        return exc

    def _replace_leftover_task(self, task: TaskRow) -> None:
        """Put the record of ``task`` in place of a ``task`` record no committed checkpoint backs
        (called by :meth:`commit` once the commit's head and lease checked out, so that a commit
        refused for a stale head or a lost lease writes nothing here either)."""
        key = layout.task_key(task.task_id)
        got = self._c.read(key)
        data = layout.encode_task(task)
        if got is None or got[0] == data or self._ever_committed(task.task_id):
            return
        self._c.swap(key, data, got[1])  # None: another writer replaced it a moment ago; its record stands

    def get_task(self, task_id: str) -> TaskRow:
        """The task's registration.

        Raises:
            TaskNotFound: no such task -- or only the ``task`` record of a first commit that never
                completed (no checkpoint of the task was ever committed): the hint says to run it.
            StoreCorrupt: its record is unreadable (a member of the wrong type included); the
                message names the record's key.
        """
        key = layout.task_key(task_id)
        got = self._c.read(key)
        if got is None:
            raise TaskNotFound(f"no task {task_id!r} in {self.url}", task_id=task_id, hint="`overnight ls` lists the tasks")
        if not self._ever_committed(task_id):
            raise self._never_committed(task_id, got[0])
        row = self._decoded(layout.decode_task, key, got[0])
        if row.task_id != task_id:
            raise StoreCorrupt(f"the task record {key} in {self.url} names task {row.task_id!r}, not {task_id!r}: "
                               "it was changed outside overnight",
                               hint="`overnight verify --all` lists what else is damaged")
        return row

    def list_tasks(self) -> list[TaskRow]:
        """Every task, oldest first (by ``created_at``, then id). A task record that is unreadable
        (a member of the wrong type included), or that a first commit wrote without ever completing
        (see :meth:`get_task`), is left out."""
        keys = [f"tasks/{n}/task" for n in self._c.list("tasks")]
        rows = []
        for key, data in self._c.read_many(keys).items():
            try:
                row = layout.decode_task(data)
            except DecodeError:
                continue
            if layout.task_key(row.task_id) == key:  # a record naming another task than its folder is damage
                rows.append(row)
        if len(rows) > 1:  # one or two container calls a task (a round trip each on S3): side by side
            with ThreadPoolExecutor(max_workers=min(16, len(rows)), thread_name_prefix="overnight-tasks") as pool:
                committed = list(pool.map(self._ever_committed, [t.task_id for t in rows]))
        else:
            committed = [self._ever_committed(t.task_id) for t in rows]
        tasks = [t for t, ok in zip(rows, committed) if ok]
        return sorted(tasks, key=lambda t: (t.created_at, t.task_id.encode("utf-8", "surrogatepass")))

    def journal(self, task_id: str) -> list[JournalRow]:
        return [j for _, rows in self._committed(task_id) for j in rows]

    # -- call journal -----------------------------------------------------------------------

    def record_call(self, call: CallRecord) -> None:
        self._c.create_many({layout.call_key(call): layout.encode_call(call)})

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        base = layout.calls_dir(task_id)
        steps = [layout.name(step_key)] if step_key is not None else self._c.list(base)
        keys = [f"{base}/{s}/{n}" for s in steps for n in self._c.list(f"{base}/{s}")]
        out = []
        for data in self._c.read_many(keys).values():
            try:
                out.append(layout.decode_call(data))
            except DecodeError:
                continue  # unreadable: that call is simply made again (the journal only saves cost)
        return sorted(out, key=lambda c: (c.created_at, c.seq))

    # -- leases -----------------------------------------------------------------------------

    def _raise_fence(self, task_id: str, branch: str, token: int) -> None:
        key = layout.ref_key(task_id, branch)
        for _ in range(_SWAP_RETRIES):
            current, fence, version = self._read_ref(task_id, branch)
            if fence >= token:
                return
            if self._c.swap(key, layout.encode_ref(task_id, branch, current, token, now_ms()), version) is not None:
                return
        raise self._busy(task_id, branch)

    def _busy(self, task_id: str, branch: str) -> StoreBusy:
        return StoreBusy(
            f"branch {branch!r} of {self.url} kept changing under {_SWAP_RETRIES} compare-and-swap attempts",
            task_id=task_id, hint="many processes are contending for this branch; retry later",
        )

    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        key = layout.lease_key(task_id, branch)
        for _ in range(_SWAP_RETRIES):
            current, version = self._read_lease(task_id, branch)
            now = now_ms()
            if (current is not None and current.holder_id not in ("", holder_id)
                    and not can_take_over(current.holder, current.expires_at_ms, now)):
                raise TaskBusy(
                    f"task {task_id!r} is busy (held by {describe_holder(current.holder)}, "
                    f"lease expires in {(current.expires_at_ms - now) / 1000:.0f} s)",
                    task_id=task_id,
                    holder=describe_holder(current.holder),
                    hint="wait for that run to finish, or stop it (Ctrl-C / kill) and resume",
                )
            # no readable lease: continue above the ref's fence, so the new token outranks every old one
            token = (current.token if current is not None else self._read_ref(task_id, branch)[1]) + 1
            lease = Lease(task_id, branch, holder_id, holder, token, now + ttl_ms)
            if self._c.swap(key, layout.encode_lease(lease), version) is not None:
                self._raise_fence(task_id, branch, token)
                return lease
            time.sleep(0.001)
        raise self._busy(task_id, branch)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        key = layout.lease_key(lease.task_id, lease.branch)
        for _ in range(_SWAP_RETRIES):
            current, version = self._read_lease(lease.task_id, lease.branch)
            if current is None or current.holder_id != lease.holder_id or current.token != lease.token:
                raise self._lost(lease, current)
            renewed = Lease(lease.task_id, lease.branch, lease.holder_id, lease.holder, lease.token, now_ms() + ttl_ms)
            if self._c.swap(key, layout.encode_lease(renewed), version) is not None:
                return renewed
        raise self._busy(lease.task_id, lease.branch)

    def read_lease(self, task_id: str, branch: str) -> Lease | None:
        return self._read_lease(task_id, branch)[0]

    def release_lease(self, lease: Lease, outcome: str | None = None) -> None:
        key = layout.lease_key(lease.task_id, lease.branch)
        for _ in range(_SWAP_RETRIES):
            current, version = self._read_lease(lease.task_id, lease.branch)
            if current is None or current.holder_id != lease.holder_id or current.token != lease.token:
                return
            released = Lease(lease.task_id, lease.branch, "", released_holder(outcome) if outcome else "", lease.token, 0)
            if self._c.swap(key, layout.encode_lease(released), version) is not None:
                return

    def clock_ms(self) -> int:
        """Now, in Unix ms, by this machine's clock (``file://``: one host; S3: each writer's own, to be kept in sync)."""
        return now_ms()

    # -- housekeeping -----------------------------------------------------------------------

    def damaged_entries(self) -> list[str]:
        """Entries under ``tasks/`` whose references cannot be read, one line each naming its key
        (``[]`` when there is none): a ``task`` record that does not decode (a member of the wrong
        type included, a link) or names another task than its folder -- :meth:`list_tasks` leaves
        that task out, :meth:`get_task` refuses it --, a damaged ref (:meth:`list_refs`), a damaged
        index entry or index folder (:meth:`_index`).

        Each may keep checkpoints alive that no listing shows -- a ref's head, the history an
        index entry records, every checkpoint of an unlisted task -- and so the objects those
        need: ``gc`` deletes nothing while there is one (:func:`overnight.ops.gc.collect`).
        ``verify --all`` reports them (:meth:`check_medium`)."""
        return self._entries()[0]

    def check_medium(self) -> list[str]:
        """What is wrong below what the ``Store`` protocol lists, run by ``overnight verify --all``,
        one line each naming its key (``[]`` when nothing is): :meth:`damaged_entries`, then the
        files planted in a task's index under a name overnight never writes (:meth:`_index`), then
        the archive catalog records that do not decode (:meth:`list_archives` leaves them out)."""
        damage, foreign = self._entries()
        return damage + foreign + self._damaged_archives()

    def _damaged_archives(self) -> list[str]:
        """One line per record under ``archives/`` that does not decode, naming its key."""
        found = []
        try:
            records = self._c.read_many([k for k, _, _ in self._c.stats(layout.ARCHIVES)])
        except StoreCorrupt as exc:
            return [exc.message]
        for key, data in sorted(records.items()):
            try:
                self._decoded(layout.decode_archive, key, data)
            except StoreCorrupt as exc:
                found.append(f"{exc.message}; this archive catalog row is not listed (its archived history cannot "
                             "be read through it)")
        return found

    def _entries(self) -> tuple[list[str], list[str]]:
        """``(damaged_entries, foreign index names)``, in one pass over ``tasks/``."""
        try:
            folders = self._c.list("tasks")
        except StoreCorrupt as exc:
            return [exc.message], []
        keys = [f"tasks/{n}/task" for n in folders]
        found, foreign = [], []
        for key, data in sorted(self._c.read_many(keys).items()):
            try:
                row = self._decoded(layout.decode_task, key, data)
            except StoreCorrupt as exc:
                found.append(f"{exc.message}; its task is not listed and cannot be read")
                continue
            if layout.task_key(row.task_id) != key:
                found.append(f"the task record {key} names task {row.task_id!r}, another task than its folder's; "
                             "its task is not listed and cannot be read")
        for n in folders:
            found += self._refs(f"tasks/{n}/refs")[1]
            _, damage, planted = self._index(f"tasks/{n}/checkpoints")
            found += damage
            foreign += planted
        return list(dict.fromkeys(found)), foreign  # a link in place of a task folder: once, not per folder under it

    def stored_bytes(self) -> int:
        """Bytes of every record and object under the store's root (their sizes, not disk blocks)."""
        return self._c.size()

    def close(self) -> None:
        self._c.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
