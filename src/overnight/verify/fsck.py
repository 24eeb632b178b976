"""Full verification of a task or a whole store, like ``git fsck`` / ``restic check``.

For every checkpoint of the tasks checked: the record (digest, canonical form, format, schema,
index columns, signature), the chain (its parent exists, belongs to the task, ``seq`` is the
parent's + 1), the state blob and document, and every artifact blob, streamed through SHA-256
chunk by chunk; for every branch ref, that it names a checkpoint that verifies and that was not
moved back (:mod:`overnight.chain.rollback`). With
``all_objects`` every object in the store is checked too, referenced or not (dangling objects are
counted as ``dangling_objects``, not errors; ditto copies of checked objects and records are
checked and not counted). Each object is hashed once per run. A damaged or missing original whose
ditto copy verifies is a problem ("healable") unless ``repair`` rewrote it (``healed``).

Records are checked in order on the calling thread; object content is hashed in batches
meanwhile (:class:`_ContentCheck`) -- in helper processes for a large check of a store they can
open again (:mod:`overnight.verify.content_proc`), else on a thread pool -- and the next
checkpoints' state documents and pages are fetched ahead in bulk (:class:`_Prefetched`).
docs/perf.md describes the method and its figures.
"""

from __future__ import annotations

import math
import os
import shlex
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import orjson

from overnight.codec.compress import decompress
from overnight.codec.digest import from_raw
from overnight.errors import (CheckpointNotFound, ConfigError, DecodeError, IntegrityError, MissingObject, OvernightError,
                              short_id)
from overnight.store.base import CheckpointRow, ObjectRecord, Store
from overnight.store.blobs import ChunkCache
from overnight.chain.ditto import CopyReader, HealingReader, ditto_key, recommittable, rewrite_record
from overnight.chain.integrity import BoundedPageCache, PageCache, load_checkpoint
from overnight.chain.reachability import lineage
from overnight.chain.rollback import find_rollback
from overnight.verify.content_proc import Helper, HelperGone, reopen_url


_AHEAD = 64
"""Checkpoints whose state documents and new pages are fetched ahead together (:class:`_Prefetched`)."""

_BATCH_BYTES = 2_000_000
"""Bytes of content (the sizes known when queued) after which a batch is sent even with fewer
than ``batch`` digests: a batch of large artifacts is checked in a few ms, so a helper never
holds much that the calling thread would wait for at the end of a task."""

_HELPER_DEPTH = 3
"""Batches waiting at most in a helper process's pipe: a batch beyond is checked on the calling
thread, which so takes over the content the helpers cannot keep up with (on a busy machine, or
while they start) instead of waiting for it at the end."""

_HELPER_STALL_S = 60.0
"""Seconds a helper process may hold batches without answering any before it is stuck: killed, named
in a warning, and its batches checked on the calling thread (a batch takes well under a second).
``OVERNIGHT_VERIFY_HELPER_STALL_S`` overrides it."""

_STALL_MAX_S = 7 * 24 * 3600.0
"""The largest stall the variable may set (a week; a wait longer than ~292 years overflows the
platform's time_t, so a value in between would crash the wait rather than mean "never")."""

_PAGE_CHUNKS = 1024 * 1024
"""Bytes of verified chunk payloads the calling thread's reader keeps (:class:`~overnight.store.blobs.ChunkCache`):
consecutive versions of a chunked page (a done page growing by one entry a step) share all but
their last chunks, each read, decompressed and hashed once per run instead of once per version."""

_HELPERS_AFTER = 4_000_000
"""Bytes of content queued (artifacts' sizes) after which helper processes start by default: a
process costs ~0.2 s of CPU to start, worth it only for a check with much to hash (the batches
queued before are hashed by the threads)."""


@dataclass
class Problem:
    """One failed check: where (task, checkpoint, object), which check, and what was found."""

    task_id: str | None
    checkpoint_id: str | None
    check: str
    detail: str
    object: str | None = None
    dangling: bool = False
    """On a record no branch uses (kept for inspection after a fallback): a warning, not a failure."""


@dataclass
class VerifyReport:
    """Result of :func:`verify_store`. ``ok`` when ``problems`` is empty.

    Attributes:
        objects_checked: distinct objects read and hashed (records' state, pages, artifacts,
            chunks, chunk indexes; with ``all_objects`` every stored object).
        bytes_verified: bytes of artifact content hashed (the reassembled size of each artifact).
        seconds: wall time of the check.
        heads: ``task -> branch -> "ok" | "invalid" | "missing"`` (missing also when the ref itself
            cannot be read: ``problems`` names it).
    """

    tasks: int = 0
    checkpoints: int = 0
    checkpoints_invalid: int = 0
    objects_checked: int = 0
    objects_invalid: int = 0
    dangling_objects: int = 0
    bytes_verified: int = 0
    seconds: float = 0.0
    heads: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    healed: list[str] = field(default_factory=list)
    """Damaged or missing originals rewritten from their verified ditto copies (``repair=True``),
    one line each (:mod:`overnight.chain.ditto`)."""
    signatures_unchecked: int = 0
    """Signed checkpoints checked without a key: digest and schema only, so an edit that also
    recomputed the digest would pass. Set ``OVERNIGHT_SIGNING_KEY`` to check them."""

    @property
    def ok(self) -> bool:
        """No problem on anything a branch uses (damaged records no branch reaches are warnings)."""
        return not any(not p.dangling for p in self.problems)


_TASK_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("task_id", (str,), "text"), ("created_at", (str,), "text"), ("goal", (str,), "text"),
    ("entry", (str, type(None)), "text or null"), ("spec", (bytes,), "bytes"),
)
"""Each :class:`~overnight.store.base.TaskRow` field and the exact types it may hold."""


def _task_row_damage(task: Any) -> list[str]:
    """What is wrong with the types of a listed task row: a store that read a cell of the wrong
    type lists the row with a placeholder of a *subclass* of the field's type carrying a
    ``damage`` attribute (``overnight.store.base.DamagedText`` and its siblings), which reading
    the task by id refuses (StoreCorrupt naming the column). ``[]`` when every field is sound."""
    return [getattr(value, "damage", None) or f"its {name} is {type(value).__name__}, not {wanted}"
            for name, types, wanted in _TASK_FIELDS
            if type(value := getattr(task, name)) not in types]


def _index_mismatches(row: Any, record: Any) -> list[str]:
    """Index columns of a stored checkpoint row that differ from its verified record (the columns
    are not covered by the digest: ``ls``/``log`` read them, loading never trusts them)."""
    expected = {"task_id": record.task_id, "parent_id": record.parent_id, "branch": record.branch, "seq": record.seq,
                "created_at": record.created_at, "session": record.session.id, "event": record.event.kind,
                "step": record.event.step}
    return [name for name, value in expected.items() if getattr(row, name) != value]


def _archived_only(store: Any, task_id: str, down: dict[str, str | None]) -> dict[str, tuple[str, str]]:
    """On a :class:`~overnight.store.compose.tiered.TieredStore`: ``checkpoint id -> (archive id,
    cold store location)`` of the task's archived checkpoints that are not in hot (loading them
    reads their archive's pack), from its catalog's sound rows (:meth:`~overnight.store.compose.
    tiered.TieredStore.archives`: a damaged one is a problem of check "archive" already). ``down``
    caches, per location, why its cold store cannot be opened (None: it opens), so each is tried
    once a run whatever the number of checkpoints."""
    archives = getattr(store, "archives", None)
    found = archives(task_id) if archives is not None else []
    if not found:  # (a store without archives pays one catalog read a task)
        return {}
    from overnight.store.compose.tiered import shown

    out: dict[str, tuple[str, str]] = {}
    for row, m in found:
        if m.task_id != task_id:
            continue  # filed under another task: a problem of check "archive" already
        if row.location not in down:
            try:
                store.cold(row.location)
                down[row.location] = None
            except OvernightError as exc:
                down[row.location] = f"cannot be opened ({shown(row.location, exc.message)})"
        for cp in m.checkpoints:
            out.setdefault(cp.checkpoint_id, (row.archive_id, row.location))
    for row in store.hot.list_checkpoints(task_id):
        out.pop(row.checkpoint_id, None)
    return out


def _cold_down(task_id: str, cid: str, archive_id: str, location: str, why: str) -> Problem:
    """The problem of an archived checkpoint whose archive's cold store cannot be opened or read."""
    from overnight.store.compose.tiered import shown

    return Problem(task_id, cid, "archive", f"checkpoint {short_id(cid)} is in archive {archive_id}, whose cold store "
                   f"{shown(location)} {shown(location, why)}: it cannot be loaded or verified", archive_id)


class _ContentCheck:
    """Object content checks beside the record checks: digests are queued, checked in batches of
    ``batch`` digests or :data:`_BATCH_BYTES` of content (one store call each,
    :meth:`~overnight.store.blobs.BlobReader.verify_many`), and the results handed back on the
    calling thread, which checks the records meanwhile. The batches go to helper processes when
    :meth:`start_helpers` started any (:mod:`overnight.verify.content_proc`: each its own
    interpreter, so the content check runs on another core whatever the GIL) -- a batch the
    helpers have no room for (:data:`_HELPER_DEPTH` waiting each) is checked on the calling thread
    right away, the same call, so neither side waits for the other -- else to ``workers`` threads
    (decompression and SHA-256 release the GIL, the rest does not). At most ``2 * workers``
    batches are in flight, and results are taken as they come, so memory stays bounded whatever
    the store's size.

    A digest that fails in a batch (or whose helper died, or was stuck for ``stall_s`` seconds and
    killed: :meth:`~overnight.verify.content_proc.Helper.result`) is verified again on the calling thread
    with the healing reader -- exactly the one-object path of a plain ``verify`` -- which heals it
    from its ditto copy or raises the error that names it (with its ``context``).
    """

    def __init__(self, reader: HealingReader, workers: int, batch: int = 64, stall_s: float = _HELPER_STALL_S) -> None:
        self.reader = reader
        self.stall_s = stall_s
        self.fast = CopyReader(reader.store, reader.verified)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="overnight-verify")
        self.workers = workers
        self.batch = batch
        self.helpers: list[Helper] = []
        self._plan: tuple[str, int] | None = None
        self._start_at = 0
        self._queued_bytes = 0
        self._batch_bytes = 0
        self._turn = 0
        self.copy_of: dict[str, str] = {}
        """Copy key -> original, for the copy objects the helpers verified."""
        self.queued: dict[str, str] = {}
        self.in_flight: deque[tuple[dict[str, str], Future, Helper | None]] = deque()
        self.results: list[tuple[str, int | OvernightError]] = []

    def start_helpers(self, url: str | None, count: int, *, after_bytes: int = 0) -> None:
        """Check the batches in ``count`` helper processes opening the store at ``url``, started
        once ``after_bytes`` of content were queued (none when ``url`` is None or a process
        cannot be started: the threads check them)."""
        if url is None or count <= 0:
            return
        self._plan, self._start_at = (url, count), after_bytes
        if self._queued_bytes >= after_bytes:
            self._start()

    def _start(self) -> None:
        assert self._plan is not None
        url, count = self._plan
        self._plan = None
        for _ in range(count):
            try:
                self.helpers.append(Helper(url, "verify", self.stall_s))
            except OSError:
                break
        self.workers = max(self.workers, 4 * len(self.helpers))  # a helper's batches wait in its pipe, not in memory

    def original_of(self, d: str) -> str | None:
        """The digest ``d`` is a ditto copy of, if it was verified as one (None otherwise)."""
        return self.copy_of.get(d) or self.fast.copy_of.get(d) or self.reader.copy_of.get(d)

    def add(self, d: str, context: str, size: int = 0) -> None:
        """Queue ``d`` (``context`` names its user in an error; ``size``: its bytes, if known)."""
        self._queued_bytes += size
        if self._plan is not None and self._queued_bytes >= self._start_at:
            self._start()
        self.queued[d] = context
        self._batch_bytes += size
        if len(self.queued) >= self.batch or self._batch_bytes >= _BATCH_BYTES:
            self._submit()

    def _submit(self) -> None:
        part, self.queued, self._batch_bytes = self.queued, {}, 0
        helpers = [h for h in self.helpers if h.alive]
        helper: Helper | None = None
        if helpers:
            self._turn += 1
            helper = helpers[self._turn % len(helpers)]
            if helper.pending < _HELPER_DEPTH:
                future = helper.submit(list(part))
            else:  # the helpers are behind: this thread checks the batch itself rather than wait
                helper, future = None, Future()
                future.set_result(self.fast.verify_many(part, "verify"))
        else:
            future = self.pool.submit(self.fast.verify_many, part, "verify")
        self.in_flight.append((part, future, helper))
        while len(self.in_flight) > 2 * self.workers:
            self._collect()

    def _collect(self) -> None:
        part, future, helper = self.in_flight.popleft()
        try:  # (a helper's: killed if it is stuck, see Helper.result)
            result = helper.result(future) if helper is not None else future.result()
        except HelperGone:
            result = ({}, [])
        sizes = result[0]
        if len(result) == 3:  # a helper's: what it verified on the way, and the copies' originals
            self.reader.verified.update(result[1])
            self.copy_of.update(result[2])
        for d, context in part.items():
            if d in sizes:
                self.results.append((d, sizes[d]))
                continue
            try:  # again on this thread: heal from the ditto copy, or name the fault
                self.results.append((d, self.reader.verify(d, context)))
            except OvernightError as exc:
                self.results.append((d, exc))

    def take(self, *, wait: bool = False) -> list[tuple[str, int | OvernightError]]:
        """``(digest, size in bytes or error)`` of every check finished since the last call; with
        ``wait``, after checking everything queued."""
        if wait and self.queued:
            self._submit()
        while self.in_flight and (wait or self.in_flight[0][1].done()):
            self._collect()
        out, self.results = self.results, []
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for helper in self.helpers:
            helper.close()


class _Prefetched:
    """The store, with the state documents and new pages of the next checkpoints fetched ahead in
    two store calls (:meth:`ahead`) instead of three calls per checkpoint. Only a hint: the load
    still hashes and parses what it reads, and an object not fetched ahead (or a wrong hint: the
    records are not verified yet) is read from the store as usual. Everything else is the store's."""

    def __init__(self, store: Store, chunks: ChunkCache | None = None) -> None:
        self._store = store
        self.chunks = chunks
        """The loading reader's chunk cache: chunks it holds are not fetched ahead."""
        self._ahead: dict[str, ObjectRecord] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        ahead = self._ahead
        out: dict[str, ObjectRecord] = {}
        rest = []
        for d in digests:
            obj = ahead.get(d)
            if obj is None:
                rest.append(d)
            else:
                out[d] = obj
        if rest:
            out.update(self._store.get_objects(rest))
        return out

    def ahead(self, rows: list[CheckpointRow], pages: PageCache) -> None:
        """Fetch what loading ``rows`` reads first: their state documents, then the pages they
        name that ``pages`` does not hold (replacing what was fetched for the rows before). A read
        that fails here (a damaged archive pack) only ends the fetching ahead: the load reads the
        same objects again and reports what is wrong with them."""
        self._ahead = {}
        try:
            self._fetch_ahead(rows, pages)
        except OvernightError:
            pass

    def _fetch_ahead(self, rows: list[CheckpointRow], pages: PageCache) -> None:
        states: set[str] = set()
        worlds: set[str] = set()
        for row in rows:
            try:
                record = orjson.loads(row.body)
                states.add(record["state"]["digest"])
                if record.get("fingerprint"):
                    worlds.add(record["fingerprint"]["world"]["digest"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
        ahead = self._ahead = self._store.get_objects(d for d in states if isinstance(d, str))
        wanted = set(worlds)
        for obj in list(ahead.values()):
            try:
                payload = self._unpacked(obj)
                doc = orjson.loads(payload)
                wanted.update(ref["digest"] for part in ("todo", "done", "artifacts") for ref in doc[part]["pages"])
            except (DecodeError, orjson.JSONDecodeError, KeyError, TypeError):
                continue
        ahead.update(self._store.get_objects(d for d in wanted if isinstance(d, str) and d not in pages))
        trees = [obj for obj in ahead.values() if obj.kind == "tree"]  # chunked pages: their indexes, then chunks
        for _ in range(2):
            found = self._store.get_objects(self._parts(trees))
            ahead.update(found)
            trees = list(found.values())

    def _unpacked(self, obj: ObjectRecord) -> bytes:
        """The payload of ``obj``, decompressed; the object fetched ahead becomes the same object
        holding it as it is (codec ``none``), so the load does not decompress it again (it still
        hashes it: a payload is only ever what the stored bytes decompress to)."""
        payload = decompress(obj.codec, obj.data, obj.size)
        if obj.codec != "none":
            self._ahead[obj.digest] = ObjectRecord(obj.digest, obj.kind, obj.size, "none", payload)
        return payload

    def _parts(self, objects: list[ObjectRecord]) -> set[str]:
        """The chunk index named by each ``tree`` object and the chunks named by each chunk index
        (a ``blob`` of 32-byte digests) in ``objects`` that the chunk cache does not hold -- hints,
        like the rest."""
        out: set[str] = set()
        for obj in objects:
            try:
                payload = self._unpacked(obj)
                if obj.kind == "tree":
                    out.add(orjson.loads(payload)["index"])
                elif len(payload) % 32 == 0:
                    out.update(from_raw(payload[i:i + 32]) for i in range(0, len(payload), 32))
            except (DecodeError, orjson.JSONDecodeError, KeyError, TypeError):
                continue
        held = self.chunks.get_many(out) if self.chunks is not None else {}
        return {d for d in out if isinstance(d, str) and d not in held}


def verify_store(
    store: Store,
    task_ids: list[str] | None = None,
    *,
    key: bytes | None = None,
    all_objects: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    repair: bool = False,
    workers: int | None = None,
    processes: int | None = None,
) -> VerifyReport:
    """Check ``task_ids`` (default: every task) and, with ``all_objects``, every stored object.

    ``on_progress(done, total)`` is called after each checkpoint (and object batch). A damaged or
    missing original whose ditto copy verifies is read from the copy; with ``repair`` it is
    rewritten from it and listed in ``healed``, without it reported as a problem ("healable").

    Records are checked in order on the calling thread while artifact blobs and (``all_objects``)
    the other stored objects are hashed on ``workers`` threads (default: the CPU count, at most
    4), in batches fetched with one store call each -- or in ``processes`` helper processes
    (:mod:`overnight.verify.content_proc`), each its own interpreter, so the hashing runs on
    another core whatever the GIL. Default: one per core but the calling thread's (at most
    ``workers``), started once 4 MB of content were queued, for an SQLite, file or PostgreSQL
    store, which a helper can open again; 0: threads only. A helper that cannot start or dies leaves its
    batches to the calling thread; so does one that answers none of its batches for 60 s
    (:data:`_HELPER_STALL_S`; ``OVERNIGHT_VERIFY_HELPER_STALL_S``, in seconds, overrides it),
    which is killed and named in a :class:`RuntimeWarning` -- not a problem of the store.

    Every checkpoint that needs a damaged object is invalid (counted in ``checkpoints_invalid``),
    a branch head or not, and one that does not reference it stays valid: an object its load
    reads (state document, stored values, pages) fails the load (check ``"object"``, ``object``
    set and the digest in the detail; ``"record"`` is the record itself), and with ``all_objects``
    it is not listed again as a stored object; a damaged ditto copy found among the stored objects
    names its original (and the task and checkpoint of the original's first problem); an artifact, hashed once a run however many checkpoints name it (through a
    page they share, or their own), gives each of them a problem with ``object`` set -- the first
    with the error, the others "failed verification".

    A task row whose fields do not have their types (a store that read a cell of the wrong type
    lists it with placeholders) is a problem (check ``"task"``) naming what each cell held, and
    with ``all_objects`` the store's ``check_medium`` (when it has one) reports what it finds
    below the records -- for a key-value store, a task record that does not parse (which listings
    leave out), a damaged index entry, a file planted in an index -- so checking every task finds
    what reading each one by id would refuse. A ref the store cannot read (listed with a
    placeholder carrying ``damage``: SQLite's damaged row, a damaged ``file://``/``s3://`` ref) is a
    problem (check ``"ref"``) naming it, and every other task is still checked.

    On a :class:`~overnight.store.compose.tiered.TieredStore` (every command's), each archive catalog
    row of the tasks checked (no ``task_ids``: every row, a task's that is gone from hot too) that
    :meth:`~overnight.store.compose.tiered.TieredStore.catalog_problems` finds damaged -- its manifest
    does not decode or check, is of another task, or its cold store cannot be read, lacks its pack or
    its copy of the row -- is a problem (check ``"archive"``, ``object`` = the archive id) naming
    the task and the archive.

    Raises:
        TaskNotFound: a named task does not exist.
        StoreCorrupt: a named task's row or record is damaged.
        ConfigError: ``OVERNIGHT_VERIFY_HELPER_STALL_S`` is not a number of seconds in (0, a week].
    """
    t0 = time.perf_counter()
    report = VerifyReport()
    verified: set[str] = set()
    chunks = ChunkCache(_PAGE_CHUNKS)
    fetched = _Prefetched(store, chunks)
    reader = HealingReader(fetched, verified, write_back=repair)  # type: ignore[arg-type]
    reader.chunks = chunks
    content = _ContentCheck(reader, workers or min(4, os.cpu_count() or 1), stall_s=_helper_stall_s())
    try:
        _verify(fetched, task_ids, key, all_objects, on_progress, repair, report, reader, content, processes)
    finally:
        content.close()
    report.seconds = time.perf_counter() - t0
    return report


def _helper_stall_s() -> float:
    """Seconds after which a helper holding batches and answering none is stuck:
    ``OVERNIGHT_VERIFY_HELPER_STALL_S`` when set, else :data:`_HELPER_STALL_S`.

    Raises:
        ConfigError: the variable is set and not a number of seconds in (0, :data:`_STALL_MAX_S`].
    """
    raw = os.environ.get("OVERNIGHT_VERIFY_HELPER_STALL_S", "").strip()
    if not raw:
        return _HELPER_STALL_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= _STALL_MAX_S):
        raise ConfigError(f"OVERNIGHT_VERIFY_HELPER_STALL_S={raw!r} is not a number of seconds in (0, "
                          f"{_STALL_MAX_S:g}]", hint=f"unset it for the default ({_HELPER_STALL_S:g} s)")
    return seconds


def _verify(store: _Prefetched, task_ids: list[str] | None, key: bytes | None, all_objects: bool,
            on_progress: Callable[[int, int], None] | None, repair: bool, report: VerifyReport,
            reader: HealingReader, content: _ContentCheck, processes: int | None = None) -> None:
    """The body of :func:`verify_store`, filling ``report``."""
    verified = reader.verified
    artifact_pages_checked: set[str] = set()
    # an artifact page seen -> (name, digest, size) of its artifacts not verified yet (:func:`_prune`)
    unsettled: dict[str, list[tuple[str, str, int]]] = {}
    bad_objects: set[str] = set()
    load_failed: dict[str, str] = {}  # an object a load reads (page, state chunk) found damaged -> its first checkpoint
    records: set[str] = set()  # every checkpoint id checked (``all_objects``: a record is live)
    record_task: dict[str, str] = {}  # ``all_objects``: checkpoint id -> its task (names a damaged record copy)
    # a damaged object -> (task, checkpoint) of the first checkpoint it failed: the store-wide pass
    # reports it no again, and names it for its damaged ditto copy
    first_user: dict[str, tuple[str, str]] = {}
    tasks = [store.get_task(t) for t in task_ids] if task_ids else store.list_tasks()
    # a task's rows are listed when its turn comes, so a check of many tasks holds one task's
    # records at a time (the progress bar's total then costs one more listing per task)
    listed = {tasks[0].task_id: store.list_checkpoints(tasks[0].task_id)} if len(tasks) == 1 else {}
    counted = {t.task_id: len(listed.get(t.task_id) or store.list_checkpoints(t.task_id)) for t in tasks} \
        if on_progress is not None else {}
    total = sum(counted.values())
    done = 0
    report.tasks = len(tasks)
    catalog = getattr(store, "catalog_problems", None)  # a TieredStore's archive catalog (and cold side)
    if catalog is not None:
        for task_id, archive_id, detail in catalog(task_ids):
            report.problems.append(Problem(task_id, None, "archive", detail, archive_id))
    cores = os.cpu_count() or 1  # one core checks the records; the others hash in helpers
    helpers = processes if processes is not None else min(content.workers, cores - 1)
    content.start_helpers(reopen_url(store._store), helpers, after_bytes=0 if processes is not None else _HELPERS_AFTER)
    waiting: dict[str, list[tuple[str, str, str]]] = {}  # queued digest -> (task, checkpoint, what) using it
    cold_down: dict[str, str | None] = {}  # cold store location -> why it cannot be used (None: it can)

    def blob(task_id: str, cid: str, d: str, what: str, size: int = 0) -> None:
        if d in verified:
            return
        if d in bad_objects:
            report.problems.append(Problem(task_id, cid, what, f"object {d} failed verification", d))
            return
        if d not in waiting:
            waiting[d] = []
            content.add(d, f"checkpoint {short_id(cid)} {what}", size)
        waiting[d].append((task_id, cid, what))

    def settle(*, wait: bool) -> None:
        """Account the finished content checks of queued blobs (each blob's first user gets the error)."""
        for d, result in content.take(wait=wait):
            users = waiting.pop(d)
            if isinstance(result, int):
                report.bytes_verified += result
                verified.add(d)  # (the check's reader added it; so a later checkpoint never queues it again)
                continue
            bad_objects.add(d)
            if users:
                first_user.setdefault(d, users[0][:2])
            for i, (task_id, cid, what) in enumerate(users):
                detail = f"{type(result).__name__}: {result.message}" if i == 0 else f"object {d} failed verification"
                report.problems.append(Problem(task_id, cid, what, detail, d))

    for task in tasks:
        damage = _task_row_damage(task)
        if damage:  # what reading it by id (``verify TASK``) refuses with StoreCorrupt
            named = task.task_id if type(task.task_id) is str else None
            which = f"the row of task {named!r}" if named is not None else "a row of the tasks table"
            report.problems.append(Problem(named, None, "task", f"{which} is damaged in the store: {'; '.join(damage)} "
                                           "(reading the task fails until the row is restored)"))
            if named is None:  # no id to find its checkpoints by
                continue
        rows = listed.pop(task.task_id, None) or store.list_checkpoints(task.task_id)
        total += len(rows) - counted.get(task.task_id, len(rows))  # a run may have committed since
        by_id = {r.checkpoint_id: r for r in rows}
        if all_objects:
            records.update(by_id)
            record_task.update((cid, task.task_id) for cid in by_id)
        # pages are a task's own (content-addressed, but another task's rarely match): a fresh
        # cache per task keeps memory flat in the number of tasks
        pages: PageCache = BoundedPageCache()
        ahead = 0
        refs = store.list_refs(task.task_id)
        head_loaded: dict[str, Any] = {}
        problems_start = len(report.problems)
        archived = _archived_only(store, task.task_id, cold_down)  # checkpoint -> (archive id, its cold store)
        for i, row in enumerate(rows):
            if i >= ahead:  # the next rows' state documents and new pages, in two store calls
                _prune(unsettled, verified)
                ahead = i + _AHEAD  # (not those whose cold store is down: each would try it again)
                store.ahead([r for r in rows[i:ahead] if not cold_down.get(archived.get(r.checkpoint_id, ("", ""))[1])]
                            if archived else rows[i:ahead], pages)
            report.checkpoints += 1
            if key is None and row.signature:
                report.signatures_unchecked += 1
            cold = archived.get(row.checkpoint_id)
            loaded = None
            try:
                if cold is not None and cold_down.get(cold[1]):  # reported, not loaded: its cold store is down
                    report.problems.append(_cold_down(task.task_id, row.checkpoint_id, *cold, cold_down[cold[1]]))
                else:
                    loaded = load_checkpoint(store, row.checkpoint_id, key=key, deep=False, reader=reader, pages=pages,
                                             check_artifacts=False, row=row)
            except (IntegrityError, CheckpointNotFound) as exc:
                d = getattr(exc, "object_digest", None)
                first = load_failed.setdefault(d, row.checkpoint_id) if d is not None else row.checkpoint_id
                # the first checkpoint whose load needs the damaged object carries the error; the
                # others (a page every later checkpoint names) say which one, not the error again
                detail = (f"{type(exc).__name__}: {exc.message}" if first == row.checkpoint_id else
                          f"object {d} failed verification (needed by this checkpoint's load; checkpoint "
                          f"{short_id(first)} names the error)")
                # "object": an object the load reads (state document, page, value) is damaged and no
                # copy heals it; "record": the checkpoint record itself
                report.problems.append(Problem(task.task_id, row.checkpoint_id, "object" if d is not None else "record",
                                               detail, d))
                if d is not None:
                    first_user.setdefault(d, (task.task_id, row.checkpoint_id))
            except OvernightError as exc:  # an archived one's cold store failed during the run: the rest of it too
                if cold is None:
                    raise
                cold_down[cold[1]] = f"cannot be read ({exc.message})"
                report.problems.append(_cold_down(task.task_id, row.checkpoint_id, *cold, cold_down[cold[1]]))
            if loaded is not None:
                if row.checkpoint_id in refs.values():
                    head_loaded[row.checkpoint_id] = loaded
                for column in _index_mismatches(row, loaded.record):
                    report.problems.append(Problem(
                        task.task_id, row.checkpoint_id, "index",
                        f"the store's {column} column disagrees with the verified record (the index was edited; "
                        "listings may mislead, loading uses the record)"))
                blob(task.task_id, row.checkpoint_id, loaded.record.state.digest, "state")
                for name, ref in loaded.doc.values.items():
                    blob(task.task_id, row.checkpoint_id, ref.digest, f"state value {name!r}", ref.size)
                for page in loaded.artifact_pages:
                    page_digest = page.ref["digest"]
                    if page_digest in artifact_pages_checked:
                        # a page seen in an earlier checkpoint: its artifacts are queued or checked, and
                        # this checkpoint needs those not verified (yet) too -- failed by one found
                        # damaged, a user of one still in flight -- without hashing any again
                        for name, d, size in unsettled.get(page_digest, ()):
                            blob(task.task_id, row.checkpoint_id, d, f"artifact {name!r}", size)
                        continue
                    artifact_pages_checked.add(page_digest)
                    pending = []
                    for name, art in page.entries.items():
                        if art.digest not in verified:  # (what blob() skips first: most entries of a page)
                            blob(task.task_id, row.checkpoint_id, art.digest, f"artifact {name!r}", art.size)
                            pending.append((name, art.digest, art.size))
                    if pending:
                        unsettled[page_digest] = pending
                parent = row.parent_id
                if parent is not None:
                    p = by_id.get(parent)
                    if p is None:
                        report.problems.append(Problem(task.task_id, row.checkpoint_id, "chain",
                                                       f"parent {short_id(parent)} is missing"))
                    elif p.seq + 1 != row.seq:
                        report.problems.append(Problem(task.task_id, row.checkpoint_id, "chain",
                                                       f"seq {row.seq} does not follow parent seq {p.seq}"))
                elif row.seq != 0:
                    report.problems.append(Problem(task.task_id, row.checkpoint_id, "chain",
                                                   f"seq {row.seq} has no parent"))
            settle(wait=False)
            done += 1
            if on_progress:
                on_progress(done, total)
        settle(wait=True)
        _prune(unsettled, verified)  # what is left: artifacts found damaged (a later task's pages may name them)
        failed = {p.checkpoint_id for p in report.problems[problems_start:]}
        if bad_objects:  # a head that needs an object found damaged (every checkpoint naming one is failed
            for cid, loaded in head_loaded.items():  # above, through ``unsettled``): a net, it fails too
                if cid not in failed:
                    for what, d in _needs_bad(loaded, bad_objects):
                        report.problems.append(Problem(task.task_id, cid, what, f"object {d} failed verification", d))
                        failed.add(cid)
        valid = {r.checkpoint_id for r in rows} - failed
        report.checkpoints_invalid += len(rows) - len(valid)
        _report_heals(store, reader, task.task_id, report, repair=repair, heads=set(refs.values()))
        live = lineage(rows, refs.values())
        for p in report.problems:
            if p.task_id == task.task_id and p.checkpoint_id is not None and p.checkpoint_id in by_id \
                    and p.checkpoint_id not in live:
                p.dangling = True
        heads = {}
        for branch, cid in refs.items():
            damage = getattr(cid, "damage", None)  # a ref the store cannot read (a placeholder naming it)
            if damage is not None:
                heads[branch] = "missing"
                report.problems.append(Problem(task.task_id, None, "ref", f"branch {branch!r} cannot be read: {damage}"))
            elif cid not in by_id:
                heads[branch] = "missing"
                report.problems.append(Problem(task.task_id, cid, "ref",
                                               f"branch {branch!r} names checkpoint {short_id(cid)}, which is missing"))
            else:
                heads[branch] = "ok" if cid in valid else "invalid"
                moved_back = find_rollback(store, head_loaded[cid], key=key, named=cid, branch=branch) \
                    if cid in valid else None
                if moved_back is not None:
                    heads[branch] = "rolled back"
                    report.problems.append(Problem(task.task_id, cid, "rollback", moved_back.describe()))
        report.heads[task.task_id] = heads

    if all_objects:
        medium = getattr(getattr(store, "hot", store), "check_medium", None)
        if medium is not None:
            try:
                found = medium()
            except IntegrityError as exc:
                found = [exc.message]
            seen = " ".join(p.detail for p in report.problems if p.check == "ref")  # a damaged ref: reported once
            report.problems.extend(Problem(None, None, "medium", detail) for detail in found if detail not in seen)
        # an object already reported against the checkpoints that need it is not reported again
        outside = {d for d in store.iter_object_digests()
                   if d not in verified and d not in bad_objects and d not in first_user}
        for odd in [d for d in outside if type(d) is not str]:  # a row another SQLite client wrote without a
            outside.discard(odd)  # digest, or with bytes that are not text: nothing names it
            held = "no digest (NULL)" if odd is None else f"a digest that is not text ({repr(odd)[:60]})"
            report.problems.append(Problem(None, None, "object", f"an object row has {held}: it cannot be "
                                           "verified or read; delete it"))
        unreferenced = sorted(outside)  # live: a record, or an object verified before this scan (not one of these)

        def live(d: str | None) -> bool:
            return d is not None and (d in records or (d in verified and d not in outside))
        report.dangling_objects = len(unreferenced)

        def tally(results: list[tuple[str, int | OvernightError]]) -> None:
            for d, result in results:
                if isinstance(result, int):
                    if live(content.original_of(d)):
                        report.dangling_objects -= 1  # the ditto copy of a live object or record
                elif isinstance(result, MissingObject):  # nothing references it, and a part of it is gone:
                    report.problems.append(Problem(  # what a gc killed in its sweep leaves -- no damage
                        None, None, "object", f"unreferenced object {d} lacks a part ({result.message}): left by an "
                        "interrupted gc; the next `overnight gc --apply` removes it", d, dangling=True))
                else:
                    bad_objects.add(d)
                    original = copy_original(d)
                    if original is not None and (live(original) or original in first_user):
                        report.dangling_objects -= 1  # the (damaged) ditto copy of a checked object or record
                    report.problems.append(_store_wide(d, result, original, first_user, record_task, report))

        originals: dict[str, str] = {}

        def copy_original(d: str) -> str | None:
            """The original whose ditto copy key ``d`` is, among the objects and records known
            (the key is a hash: the map is built once, when a damaged object is met)."""
            if not originals:
                originals.update((ditto_key(o), o) for o in (*verified, *records))
            if d not in originals:  # (damaged ones: a few, found meanwhile)
                originals.update((ditto_key(o), o) for o in (*first_user, *bad_objects))
            return originals.get(d)

        for i, d in enumerate(unreferenced):
            if d not in verified:  # else a chunk of an unreferenced tree checked just before
                content.add(d, "store")
            tally(content.take())
            if on_progress and i % 256 == 0:
                on_progress(i, len(unreferenced))
        tally(content.take(wait=True))
    load_bad = {d for d in first_user if d not in bad_objects}  # failed a load (not hashed in a batch)
    report.objects_checked = len(verified) + len(bad_objects) + len(load_bad)
    report.objects_invalid = len(bad_objects) + len(load_bad)


def _store_wide(d: str, error: OvernightError, original: str | None, first_user: dict[str, tuple[str, str]],
                record_task: dict[str, str], report: VerifyReport) -> Problem:
    """The problem (check ``"object"``) of a damaged object the store-wide pass (``all_objects``)
    found. A ditto copy names its original -- and the task and checkpoint that need it, when one does (the copy of a
    record: that checkpoint) -- instead of the pass ("found by store")."""
    found = f"{type(error).__name__}: {error.message}"
    if original is None:
        return Problem(None, None, "object", found, d)
    user = first_user.get(original) or ((record_task[original], original) if original in record_task else None)
    what = "checkpoint record" if original in record_task else "object"
    of_original = [p for p in report.problems if p.object == original]
    state = ("damaged too: nothing heals the original" if original in first_user or of_original else
             "the original verifies (nothing is lost; it has no sound second copy until it is written again)")
    needed = f" (needed by checkpoint {short_id(user[1])})" if user is not None and what == "object" else ""
    why = error.message.removeprefix(f"ditto copy {d} ").split("; found by ", 1)[0]
    return Problem(user[0] if user else None, user[1] if user else None, "object",
                   f"the ditto copy of {what} {original}{needed} is damaged ({why}); {state}", d,
                   dangling=bool(of_original) and all(p.dangling for p in of_original))


def _prune(unsettled: dict[str, list[tuple[str, str, int]]], verified: set[str]) -> None:
    """Drop from ``unsettled`` (artifact page digest -> ``(name, digest, size)`` of its artifacts
    not verified when last looked at) the artifacts verified since, and the pages left with none:
    what stays is what is still being checked or was found damaged, so it holds little whatever
    the history's length, and a later checkpoint naming a page looks at only those."""
    for page_digest, pending in list(unsettled.items()):
        left = [e for e in pending if e[1] not in verified]
        if left:
            unsettled[page_digest] = left
        else:
            del unsettled[page_digest]


def _needs_bad(loaded: Any, bad_objects: set[str]) -> list[tuple[str, str]]:
    """``(what, digest)`` of each object in ``bad_objects`` (found damaged, with no copy that heals
    it) that loading checkpoint ``loaded`` deeply needs: its state document, stored state values
    and artifacts. Content addressing checks an object once a run, for its first user; every later
    checkpoint naming it is failed as it is read (through ``blob`` and the pages' unsettled
    artifacts), and this is a net for the heads."""
    out = []
    if loaded.record.state.digest in bad_objects:
        out.append(("state", loaded.record.state.digest))
    out.extend((f"state value {name!r}", ref.digest) for name, ref in loaded.doc.values.items()
               if ref.digest in bad_objects)
    for page in loaded.artifact_pages:
        out.extend((f"artifact {name!r}", art.digest) for name, art in page.entries.items()
                   if art.digest in bad_objects)
    return list(dict.fromkeys(out))


def _report_heals(store: Store, reader: HealingReader, task_id: str, report: VerifyReport, *, repair: bool,
                  heads: set[str]) -> None:
    """Turn the reader's heals of one task into report lines: rewritten (``repair``) -> ``healed``;
    else a problem saying the copy can heal it. Records are rewritten here (objects by the reader)."""
    for h in reader.healed:
        is_head = h.what == "record" and h.digest in heads
        if h.what == "record" and repair and not h.written:
            h = rewrite_record(store, h, is_head=is_head)
        if h.written:
            report.healed.append(h.describe())
        else:
            # a head's record is never deleted: rewritten by committing it again on its own branch,
            # where the store replaces a damaged row on commit (rewrite_record); else only once the
            # branch moves on -- so a plain verify promises --repair only what --repair does
            stuck = is_head and not recommittable(store, h.digest)
            why = (f"a branch head's record is rewritten (by `overnight verify --repair {shlex.quote(task_id)}`) once the branch "
                   "moves on"
                   if stuck else
                   f"`overnight verify --repair {shlex.quote(task_id)}` rewrites it" if not repair else
                   "the store refused the write")
            report.problems.append(Problem(task_id, h.digest if h.what == "record" else None, "ditto",
                                           f"{h.what} {short_id(h.digest)} is damaged ({h.reason}); its ditto copy "
                                           f"verifies and serves reads -- {why}", h.digest if h.what == "object" else None))
    reader.healed.clear()
