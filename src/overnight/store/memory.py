"""In-process store (``memory://``): the ``ephemeral`` level -- nothing survives the process.

Same contract as every backend (it passes the conformance module), so a task can run ephemeral
and be routed to a durable medium later without code changes. Leases only exclude threads and
runs of this process.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable, Iterator

from overnight.codec.digest import sha256
from overnight.errors import CheckpointNotFound, LeaseLost, TaskBusy, TaskNotFound
from overnight.store.base import ArchiveRow, CallRecord, CheckpointRow, Commit, JournalRow, TaskRow
from overnight.store.base import Closing, Lease, MinAge, ObjectRecord, ObjectStat, age_limit, check_parent, stale_head
from overnight.store.blobs import is_damaged
from overnight.store.leases import can_take_over, describe_holder, now_ms, released_holder


_named: dict[str, "MemoryStore"] = {}
_named_lock = threading.Lock()


def named(name: str) -> "MemoryStore":
    """The process-wide store ``memory://NAME`` (created empty on first use)."""
    with _named_lock:
        if name not in _named:
            _named[name] = MemoryStore(name)
        return _named[name]


class MemoryStore(Closing):
    """:class:`~overnight.store.base.Store` in this process's memory. ``url`` is ``memory://NAME``."""

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        self._lock = threading.RLock()
        self._objects: dict[str, ObjectRecord] = {}
        self._checkpoints: dict[str, CheckpointRow] = {}
        self._tasks: dict[str, TaskRow] = {}
        self._refs: dict[tuple[str, str], str] = {}
        self._journal: list[JournalRow] = []
        self._leases: dict[tuple[str, str], Lease] = {}
        self._calls: dict[tuple[str, str, int, str], CallRecord] = {}
        self._stored_at: dict[str, float] = {}  # digest -> monotonic seconds of its last write
        self._archives: dict[tuple[str, str], ArchiveRow] = {}

    # objects
    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        with self._lock:
            return {d for d in digests if d not in self._objects}

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        with self._lock:
            return {d: self._objects[d] for d in digests if d in self._objects}

    def _insert(self, objects: Iterable[ObjectRecord]) -> int:
        added = 0
        now = time.monotonic()
        for o in objects:
            self._stored_at[o.digest] = now  # a write refreshes the stored time (what gc relies on)
            stored = self._objects.get(o.digest)
            if stored is None or (stored != o and is_damaged(self, o.digest)):
                self._objects[o.digest] = o
                added += len(o.data)
        return added

    def put_objects(self, objects: Iterable[ObjectRecord]) -> None:
        with self._lock:
            self._insert(objects)

    def iter_object_digests(self) -> Iterator[str]:
        with self._lock:
            yield from list(self._objects)

    def iter_object_stats(self) -> Iterator[ObjectStat]:
        with self._lock:
            now = time.monotonic()
            stats = [ObjectStat(d, len(o.data), max(0, int((now - self._stored_at[d]) * 1000)))
                     for d, o in self._objects.items()]
        yield from stats

    def delete_objects(self, digests: Iterable[str], *, min_age_ms: MinAge | None = None) -> int:
        freed = 0
        with self._lock:
            now = time.monotonic()
            min_age_ms = age_limit(min_age_ms)
            for d in dict.fromkeys(digests):
                if d not in self._objects:
                    continue
                if min_age_ms is not None and (now - self._stored_at[d]) * 1000 < min_age_ms:
                    continue
                freed += len(self._objects.pop(d).data)
                del self._stored_at[d]
        return freed

    # checkpoints and refs
    def _check_lease(self, lease: Lease) -> None:
        held = self._leases.get((lease.task_id, lease.branch))
        if held is None or held.holder_id != lease.holder_id or held.token != lease.token:
            raise LeaseLost(f"lease on branch {lease.branch!r} was taken over", task_id=lease.task_id)

    def commit(self, commit: Commit) -> int:
        cp = commit.checkpoint
        with self._lock:
            if commit.lease is not None:
                self._check_lease(commit.lease)
            current = self._refs.get((cp.task_id, cp.branch))
            if current != commit.expected_head:
                raise stale_head(cp.task_id, cp.branch, commit.expected_head, current)
            if cp.parent_id is not None:
                parent = self._checkpoints.get(cp.parent_id)
                check_parent(cp, parent.task_id if parent is not None else None)
            if commit.task is not None:
                self._tasks.setdefault(commit.task.task_id, commit.task)
            added = len(cp.body) + self._insert(commit.objects)
            stored = self._checkpoints.get(cp.checkpoint_id)
            if stored is None or (stored.body != cp.body and sha256(stored.body) != cp.checkpoint_id):
                self._checkpoints[cp.checkpoint_id] = CheckpointRow(
                    cp.checkpoint_id, cp.task_id, cp.parent_id, cp.branch, cp.seq, cp.created_at, cp.session,
                    cp.event, cp.step, cp.body, cp.signature, added)
                if stored is None:
                    self._journal.extend(commit.journal)
            self._refs[(cp.task_id, cp.branch)] = cp.checkpoint_id
            return added

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        with self._lock:
            row = self._checkpoints.get(checkpoint_id)
        if row is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id} in {self.url}", checkpoint_id=checkpoint_id)
        return row

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        with self._lock:
            rows = [r for r in self._checkpoints.values() if r.task_id == task_id]
        return sorted(rows, key=lambda r: (r.seq, r.created_at, r.checkpoint_id))

    def checkpoints_after(self, task_id: str, branch: str, seq: int) -> list[CheckpointRow]:
        with self._lock:
            rows = [r for r in self._checkpoints.values() if r.task_id == task_id and r.branch == branch and r.seq > seq]
        return sorted(rows, key=lambda r: (r.seq, r.created_at, r.checkpoint_id))

    def get_ref(self, task_id: str, branch: str) -> str | None:
        with self._lock:
            return self._refs.get((task_id, branch))

    def list_refs(self, task_id: str) -> dict[str, str]:
        with self._lock:
            return dict(sorted((b, c) for (t, b), c in self._refs.items() if t == task_id))

    def set_ref(self, task_id: str, branch: str, new: str | None, expected: str | None) -> None:
        with self._lock:
            current = self._refs.get((task_id, branch))
            if current != expected:
                raise stale_head(task_id, branch, expected, current)
            if new is None:
                self._refs.pop((task_id, branch), None)
            else:
                self._refs[(task_id, branch)] = new

    def put_checkpoints(self, rows: Iterable[CheckpointRow], journal: Iterable[JournalRow] = ()) -> None:
        with self._lock:
            for cp in rows:
                self._checkpoints.setdefault(cp.checkpoint_id, cp)
            have = {(j.checkpoint_id, j.step_key) for j in self._journal}
            self._journal.extend(j for j in journal if (j.checkpoint_id, j.step_key) not in have)

    def delete_checkpoints(self, checkpoint_ids: Iterable[str], *, orphans: bool = False) -> int:
        with self._lock:
            doomed = {c for c in checkpoint_ids if c in self._checkpoints} - set(self._refs.values())
            while not orphans:  # a parent of a survivor stays; keeping it may keep its own parent
                kept = {r.parent_id for r in self._checkpoints.values() if r.checkpoint_id not in doomed} & doomed
                if not kept:
                    break
                doomed -= kept
            freed = sum(len(self._checkpoints.pop(c).body) for c in doomed)
            self._journal = [j for j in self._journal if j.checkpoint_id not in doomed]
        return freed

    def delete_task(self, task_id: str) -> None:
        with self._lock:
            self._tasks.pop(task_id, None)
            for table in (self._refs, self._leases):
                for k in [k for k in table if k[0] == task_id]:
                    del table[k]
            for c in [c for c, r in self._checkpoints.items() if r.task_id == task_id]:
                del self._checkpoints[c]
            self._journal = [j for j in self._journal if j.task_id != task_id]
            for table in (self._calls, self._archives):  # type: ignore[assignment]
                for k in [k for k in table if k[0] == task_id]:
                    del table[k]

    # tasks and journal
    def get_task(self, task_id: str) -> TaskRow:
        with self._lock:
            row = self._tasks.get(task_id)
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in {self.url}", task_id=task_id, hint="`overnight ls` lists the tasks")
        return row

    def list_tasks(self) -> list[TaskRow]:
        with self._lock:
            return sorted(self._tasks.values(), key=lambda t: (t.created_at, t.task_id))

    def journal(self, task_id: str) -> list[JournalRow]:
        with self._lock:
            return sorted((j for j in self._journal if j.task_id == task_id), key=lambda j: j.seq)

    # call journal
    def record_call(self, call: CallRecord) -> None:
        with self._lock:
            self._calls.setdefault((call.task_id, call.step_key, call.seq, call.request_digest), call)

    def calls(self, task_id: str, step_key: str | None = None) -> list[CallRecord]:
        with self._lock:
            out = [c for c in self._calls.values() if c.task_id == task_id and step_key in (None, c.step_key)]
        return sorted(out, key=lambda c: (c.created_at, c.seq))

    # archives
    def put_archive(self, row: ArchiveRow) -> None:
        with self._lock:
            self._archives.setdefault((row.task_id, row.archive_id), row)

    def list_archives(self, task_id: str | None = None) -> list[ArchiveRow]:
        with self._lock:
            out = [r for (t, _), r in self._archives.items() if task_id in (None, t)]
        return sorted(out, key=lambda r: (r.created_at, r.archive_id))

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        with self._lock:
            self._archives.pop((task_id, archive_id), None)

    # leases
    def acquire_lease(self, task_id: str, branch: str, holder_id: str, holder: str, ttl_ms: int) -> Lease:
        with self._lock:
            now = now_ms()
            held = self._leases.get((task_id, branch))
            if held is not None and held.holder_id != holder_id and held.holder_id and not can_take_over(
                    held.holder, held.expires_at_ms, now):
                raise TaskBusy(f"task {task_id!r} is busy (held by {describe_holder(held.holder)})", task_id=task_id,
                               holder=describe_holder(held.holder), hint="wait for that run to finish")
            lease = Lease(task_id, branch, holder_id, holder, (held.token + 1) if held else 1, now + ttl_ms)
            self._leases[(task_id, branch)] = lease
            return lease

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        with self._lock:
            self._check_lease(lease)
            renewed = Lease(lease.task_id, lease.branch, lease.holder_id, lease.holder, lease.token, now_ms() + ttl_ms)
            self._leases[(lease.task_id, lease.branch)] = renewed
            return renewed

    def read_lease(self, task_id: str, branch: str) -> Lease | None:
        with self._lock:
            return self._leases.get((task_id, branch))

    def release_lease(self, lease: Lease, outcome: str | None = None) -> None:
        with self._lock:
            held = self._leases.get((lease.task_id, lease.branch))
            if held is not None and held.holder_id == lease.holder_id and held.token == lease.token:
                self._leases[(lease.task_id, lease.branch)] = Lease(lease.task_id, lease.branch, "",
                                                                    released_holder(outcome), held.token, 0)

    def clock_ms(self) -> int:
        """Now, in Unix ms, by this machine's clock (one process)."""
        return now_ms()

    # housekeeping
    def stored_bytes(self) -> int:
        with self._lock:
            return sum(len(o.data) for o in self._objects.values()) + sum(len(c.body) for c in self._checkpoints.values())

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"MemoryStore({self.url!r})"
