# Over 600 lines: one LangGraph BaseCheckpointSaver implementation: the sync and async halves of one protocol, which LangGraph's conformance suite checks together.
"""``OvernightSaver``: overnight as a LangGraph checkpointer (``BaseCheckpointSaver``).

Change one line -- ``checkpointer=OvernightSaver.from_url("sqlite:///agent.db")`` -- and a
LangGraph graph's checkpoints become overnight checkpoints: content-addressed, verified on every
load, deduplicated, and visible to ``overnight verify``, ``log``, ``fork`` and ``gc``.

Mapping (the README section "Use with LangGraph" shows it as a table):

* a LangGraph **thread** is an overnight **task** with id ``task_prefix + thread_id``
  (default ``"langgraph:<thread_id>"``; ``task_prefix + "sha256-<40 hex digits>"`` for an id that
  is not valid Unicode text);
* each LangGraph **checkpoint** is an overnight checkpoint with event ``step``, ``event.step`` =
  the LangGraph checkpoint id, ``event.key`` = ``"langgraph"`` and ``event.detail`` = the
  checkpoint namespace. Its channel values are artifacts ``channel/<name>`` (one blob each,
  encoded by overnight's codec, so a value that did not change is the same blob and is not stored
  again, and a growing message list is stored as content-defined chunks); the LangGraph
  checkpoint without its values, its metadata and its pending writes are the state's ``data``;
* the **chain** follows LangGraph's parent ids: a checkpoint whose parent is the head of a branch
  is appended to it; one whose parent is not (``update_state`` on an older checkpoint, a replay)
  starts a new branch ``<ns-branch>@<checkpoint id>`` from its parent, so both histories stay
  separate. The root namespace's first branch is ``main``, a subgraph namespace's is ``ns:<ns>``;
* **pending writes** (``put_writes``) are committed as a new overnight checkpoint that carries
  the LangGraph checkpoint again with the writes added (event key ``"langgraph-writes"``, same
  LangGraph id), so they are durable when ``put_writes`` returns and survive a crash; the write
  values are artifacts ``write/<task_id>/<idx>``. On the branch head the record is appended with
  compare-and-swap; otherwise (the next checkpoint was appended meanwhile) it starts a one-record
  branch ``<ns-branch>@<checkpoint id>/<suffix>``. Writes that arrive before their checkpoint is
  stored are committed at once as a root record of such a branch (event key
  ``"langgraph-pending"``); the checkpoint's ``put`` carries them on and deletes it. A
  checkpoint's pending writes are the union of those of all its records that no other record of
  it descends from, so concurrent writers in several processes never lose one.

Reading never trusts the store's index columns: which checkpoints a thread has is read from the
records reachable from its branch refs, each verified (digest, schema, signature) before its event
is used; a branch naming a missing record, or a damaged record or object, raises
:class:`~overnight.errors.ThreadCorrupt` naming the thread -- never an older checkpoint in its place.

Values go through :mod:`overnight.codec.canonical`: no pickle; LangChain messages (pydantic
models) and LangGraph's ``Interrupt``/``Command`` (dataclasses) round-trip; ``Send`` has a codec
registered here. A value no codec covers raises :class:`~overnight.errors.EncodeError` naming the
thread and the channel, before anything is written.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import langchain_core.messages  # noqa: F401  (message classes must be importable by name when loading)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.types import Send

from overnight.codec.canonical import decode, encode, from_tree, to_tree
from overnight.codec.chunking import Cutter
from overnight.codec.listcodec import ListCodec
from overnight.codec.registry import register_codec
from overnight.errors import (
    CheckpointNotFound,
    ConfigError,
    DecodeError,
    EncodeError,
    IntegrityError,
    OvernightError,
    ParentGone,
    SchemaError,
    StaleHead,
    TaskNotFound,
    ThreadCorrupt,
    short_id,
)
from overnight.store import open_store
from overnight.store.base import Closing, CheckpointRow, Store, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter, ChunkCache
from overnight.chain.write import ChainWriter, utc_now
from overnight.chain.rollback import Rollback, newer_descendant
from overnight.verify.drift import DriftReport, detect
from overnight.verify.fingerprint import WorldSpec, world
from overnight.chain.integrity import (
    LoadedCheckpoint,
    encode_state,
    load_checkpoint,
    parse_record,
    signing_key_from_env,
)
from overnight.chain.records import artifact_ref, event, initial_state

__all__ = ["OvernightSaver"]

EVENT_KEY = "langgraph"
"""``event.key`` of a checkpoint written by :meth:`OvernightSaver.put`."""
WRITES_EVENT_KEY = "langgraph-writes"
"""``event.key`` of a checkpoint written by :meth:`OvernightSaver.put_writes`."""
PENDING_EVENT_KEY = "langgraph-pending"
"""``event.key`` of a record holding writes that :meth:`OvernightSaver.put_writes` received before
their checkpoint was stored (a root of its own branch, without the checkpoint)."""
DATA_FORMAT = 1
"""Format of the ``data.langgraph`` document (the README section "Use with LangGraph")."""
COMMIT_ATTEMPTS = 8
"""Commits retried after another writer moved the branch (``StaleHead``) or deleted the parent."""

register_codec(Send, lambda s: {"node": s.node, "arg": s.arg}, lambda v: Send(v["node"], v["arg"]),
               name="langgraph.types:Send")


def _ns_branch(ns: str) -> str:
    """The first branch of checkpoint namespace ``ns``."""
    return "main" if ns == "" else f"ns:{ns}"


@dataclass(frozen=True)
class _Rec:
    """One record reachable from the thread's branch refs, as its verified body says (the store's
    index columns are not covered by the digest and are never used)."""

    cid: str
    parent: str | None
    branch: str
    order: tuple[str, int]
    """``(created_at, seq)``: newer records sort later."""
    ns: str
    lg_id: str | None
    """The LangGraph checkpoint id (None: a record not written by this adapter, e.g. a fork)."""
    kind: str | None
    """``event.key``: :data:`EVENT_KEY`, :data:`WRITES_EVENT_KEY` or :data:`PENDING_EVENT_KEY`."""


@dataclass(frozen=True)
class _Entry:
    """One LangGraph checkpoint ``(ns, lg_id)``: its records that no other record of it descends
    from (each carries all the writes of its ancestors), oldest first. Its pending writes are the
    union of theirs; ``cid`` is the newest of them holding the checkpoint (None: only writes that
    arrived before the checkpoint are stored)."""

    ns: str
    lg_id: str
    cid: str | None
    leaves: tuple[_Rec, ...]


def _entry(ns: str, lg_id: str, recs: list[_Rec]) -> _Entry:
    parents = {r.parent for r in recs}
    leaves = sorted((r for r in recs if r.cid not in parents), key=lambda r: r.order)
    full = [r for r in leaves if r.kind != PENDING_EVENT_KEY]
    return _Entry(ns, lg_id, full[-1].cid if full else None, tuple(leaves))


@dataclass
class _Index:
    """A thread's LangGraph checkpoints by ``(ns, id)``, built from the records reachable from the
    task's refs; valid while the refs are ``refs`` (every commit moves a ref)."""

    refs: dict[str, str]
    records: dict[tuple[str, str], list[_Rec]]
    entries: dict[tuple[str, str], _Entry]
    exists: bool
    newest: dict[str, _Entry] | None = None
    """Per namespace, the entry holding a checkpoint with the greatest id (None: not computed yet;
    :meth:`latest`). Carried over by :meth:`with_entry`, so it is computed once per thread, not per read."""

    def checkpoints(self, ns: str | None = None) -> list[_Entry]:
        """The entries holding a checkpoint (in namespace ``ns``; None: all)."""
        return [e for (n, _), e in self.entries.items() if e.cid is not None and (ns is None or n == ns)]

    def latest(self, ns: str) -> _Entry | None:
        """The entry of namespace ``ns`` holding a checkpoint with the greatest LangGraph id (ids
        sort by time), or None: what ``get_tuple`` without a checkpoint id returns."""
        if self.newest is None:
            newest: dict[str, _Entry] = {}
            for (n, _), e in self.entries.items():
                if e.cid is not None and (n not in newest or e.lg_id > newest[n].lg_id):
                    newest[n] = e
            self.newest = newest
        return self.newest.get(ns)

    def with_entry(self, refs: dict[str, str], records: dict[tuple[str, str], list[_Rec]], entry: _Entry) -> "_Index":
        """This index after a commit: the refs now ``refs``, ``records`` (a copy of this one's with
        the entry's records changed) and ``entry`` in place of the one with its key (its records
        only grew, or lost pending-writes ones: an entry holding a checkpoint still does)."""
        entries = dict(self.entries)
        entries[(entry.ns, entry.lg_id)] = entry
        newest = None
        if self.newest is not None:
            newest = dict(self.newest)
            top = newest.get(entry.ns)
            if entry.cid is not None and (top is None or entry.lg_id >= top.lg_id):
                newest[entry.ns] = entry
            elif top is not None and top.lg_id == entry.lg_id:  # (not expected) the newest lost its checkpoint
                newest = None
        return _Index(refs, records, entries, True, newest)


def _merge_writes(into: dict[tuple[str, int], dict[str, Any]], arts: dict[str, Any], writes: list[dict[str, Any]],
                  own_arts: dict[str, Any]) -> None:
    """Fold one record's writes into ``into``/``arts`` (records oldest first): a regular write
    already there is kept, a special channel's (negative index) is replaced, as LangGraph's savers do."""
    for w in writes:
        k = (w["task_id"], w["idx"])
        if k in into and w["idx"] >= 0:
            continue
        into[k] = w
        arts[w["artifact"]] = own_arts[w["artifact"]]


def _ordered(writes: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(writes.values(), key=lambda w: (w["task_path"], w["task_id"], w["idx"]))


def _check_text(value: str, field: str, thread: str) -> None:
    """Refuse a string that cannot be stored as text (a lone surrogate) before anything is written."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"LangGraph thread {thread!r}: {field} {value!r} is not valid Unicode text "
                          f"(a lone surrogate at position {exc.start}); it cannot be stored",
                          hint=f"use a {field} without lone surrogates") from None


class _KeepingReader(BlobReader):
    """A :class:`BlobReader` that keeps the verified bytes of every blob it read, for one read of
    a checkpoint: its deep load reads (and hashes) every artifact, and the values are decoded from
    those same bytes instead of reading them again."""

    def __init__(self, store: Store, verified: set[str], chunks: ChunkCache | None = None) -> None:
        super().__init__(store, verified, chunks)
        self._kept: dict[str, bytes] = {}

    def get(self, blob_digest: str, context: str = "a read", _depth: int = 0) -> bytes:
        """The verified bytes of a blob (read from the store once per reader)."""
        got = self._kept.get(blob_digest)
        if got is None:
            got = self._kept[blob_digest] = super().get(blob_digest, context, _depth)
        return got


@dataclass(frozen=True)
class _Merged:
    """A checkpoint's leaf records, loaded and verified, with their writes folded together."""

    main: LoadedCheckpoint | None
    """The newest record holding the checkpoint (None: only pending writes are stored)."""
    tree: dict[str, Any] | None
    """``main``'s state tree with the folded writes (and their artifacts)."""
    writes: list[dict[str, Any]]
    write_artifacts: dict[str, Any]
    seen: set[str]
    """Digests of every object verified while loading."""
    reader: BlobReader


class OvernightSaver(BaseCheckpointSaver[int], Closing):
    """A LangGraph checkpointer storing into any overnight store.

    Args:
        store: an open :class:`~overnight.store.base.Store`, or a store URL
            (``sqlite:///path.db``, ``postgresql://...``, ``file://dir``, ``s3://...``); a store
            opened from a URL is closed by :meth:`close`.
        key: HMAC-SHA256 signing key for the records (default: ``$OVERNIGHT_SIGNING_KEY``).
        task_prefix: prefix of the overnight task id of each thread.
        project_root: directory whose lock files (``uv.lock``, ``requirements*.txt``, ...) the
            world fingerprint records, with the installed distributions and the Python version and
            platform (default: the current directory); :meth:`drift` compares them with now.

    All methods are safe to call from several threads; the ``a*`` twins run the same code in a
    worker thread. Raises :class:`~overnight.errors.EncodeError` (a value no codec covers, naming
    thread and channel), :class:`~overnight.errors.IntegrityError` (a stored checkpoint fails
    verification: it is never returned).
    """

    def __init__(self, store: Store | str, *, key: bytes | None = None, task_prefix: str = "langgraph:",
                 project_root: str | Path | None = None) -> None:
        super().__init__()
        self._owns_store = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        self.key = key if key is not None else signing_key_from_env()
        self.task_prefix = task_prefix
        self._lock = threading.RLock()
        self._indexes: dict[str, _Index] = {}
        self._tip: dict[str, tuple[ChainWriter, dict[str, Any]]] = {}
        """task -> the writer of our last commit and the state it wrote (the next commit on top
        of it reuses its page cache and known digests instead of loading it again)."""
        self._session = "langgraph-" + uuid.uuid4().hex
        self.project_root = Path(project_root) if project_root is not None else Path.cwd()
        self._world: bytes | None = None
        """The world fingerprint recorded with every checkpoint this saver writes (taken once,
        at its first write: one blob for all of them)."""
        self._recs: dict[str, _Rec] = {}
        """Records verified so far, by checkpoint id (content-addressed: a record never changes)."""
        self._cutter = Cutter()
        """Shared by every chain this saver commits on (under ``_lock``): a growing channel value
        is cut and hashed from its last chunk boundary on."""
        self._codec = ListCodec()
        """Encodes and decodes channel and write values; a growing message list is converted
        item by item, only its new items each time (:mod:`overnight.codec.listcodec`)."""
        self._chunks = ChunkCache()
        """Verified chunk payloads of the blobs this saver read (a growing message list's
        checkpoints share all but their last chunks): each load still reads every record, page and
        chunk tree object and hashes every whole value, but a chunk it already hashed comes from
        here (:class:`~overnight.store.blobs.ChunkCache`)."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "OvernightSaver":
        """``OvernightSaver(url, **kwargs)``: open the store at ``url`` (see :func:`overnight.store.open_store`)."""
        return cls(url, **kwargs)

    def close(self) -> None:
        """Close the store if this saver opened it. Idempotent."""
        if self._owns_store:
            self.store.close()

    # -- mapping --------------------------------------------------------------------------------

    def task_id(self, thread_id: Any) -> str:
        """The overnight task id of LangGraph thread ``thread_id``: ``task_prefix + thread_id``, or
        ``task_prefix + "sha256-" + <40 hex digits of its SHA-256>`` when the id is not valid
        Unicode text (a lone surrogate), which a task id cannot hold."""
        tid = str(thread_id)
        try:
            tid.encode("utf-8")
        except UnicodeEncodeError:
            return f"{self.task_prefix}sha256-{hashlib.sha256(tid.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}"
        return f"{self.task_prefix}{tid}"

    def _thread_of(self, task_id: str) -> str:
        return task_id[len(self.task_prefix):] if task_id.startswith(self.task_prefix) else task_id

    def _corrupt(self, task_id: str, what: str, checkpoint_id: str | None,
                 cause: OvernightError | None = None) -> ThreadCorrupt:
        """The error for a thread whose stored records do not verify (``what`` says which and how)."""
        thread = self._thread_of(task_id)
        return ThreadCorrupt(
            f"LangGraph thread {thread!r}: {what}", thread_id=thread, task_id=task_id, checkpoint_id=checkpoint_id,
            object_digest=getattr(cause, "object_digest", None),
            hint=f"`overnight verify {task_id}` reports the damage and `overnight log {task_id}` the records "
                 f"that remain; nothing of the thread is returned until its branches verify")

    def _name_thread(self, exc: OvernightError, task_id: str) -> None:
        """Name the thread in an error raised while reading it (it is re-raised as is)."""
        thread = self._thread_of(task_id)
        exc.task_id = exc.task_id or task_id
        if f"thread {thread!r}" not in exc.message:
            exc.message = f"LangGraph thread {thread!r}: {exc.message}"
            exc.args = (exc.message,)
        exc.hint = exc.hint or f"`overnight verify {task_id}` checks the thread's records"

    def _rec(self, task_id: str, row: CheckpointRow) -> _Rec:
        """What a record says about itself, from its verified body (digest, schema, signature)."""
        cached = self._recs.get(row.checkpoint_id)
        if cached is not None:
            return cached
        try:
            record = parse_record(row, key=self.key)
            if record.task_id != task_id:
                raise SchemaError(f"checkpoint {short_id(row.checkpoint_id)} belongs to task {record.task_id!r}",
                                  task_id=task_id, checkpoint_id=row.checkpoint_id)
        except IntegrityError as exc:
            raise self._corrupt(task_id, f"checkpoint {short_id(row.checkpoint_id)} failed verification: {exc.message}",
                                row.checkpoint_id, exc) from exc
        ev = record.event
        ours = ev.kind == "step" and ev.step is not None and ev.key in (EVENT_KEY, WRITES_EVENT_KEY, PENDING_EVENT_KEY)
        rec = _Rec(row.checkpoint_id, record.parent_id, record.branch, (record.created_at, record.seq),
                   (ev.detail or "") if ours else "", ev.step if ours else None, ev.key if ours else None)
        self._recs[row.checkpoint_id] = rec
        return rec

    def _index(self, task_id: str) -> _Index:
        """The thread's checkpoints, from the records reachable from its refs (rebuilt when the
        refs changed since the last call).

        Raises:
            ThreadCorrupt: a branch names a record that is missing, or a record on it fails verification.
        """
        for _ in range(COMMIT_ATTEMPTS):
            refs = self.store.list_refs(task_id)
            cached = self._indexes.get(task_id)
            if cached is not None and cached.refs == refs and (refs or cached.exists is False):
                return cached
            index = self._build(task_id, refs)
            if index is not None:
                self._indexes[task_id] = index
                return index
        raise StaleHead(f"LangGraph thread {self._thread_of(task_id)!r} kept changing under {COMMIT_ATTEMPTS} "
                        "attempts to read it", task_id=task_id, hint="another process rewrites the thread; retry")

    def _build(self, task_id: str, refs: dict[str, str]) -> _Index | None:
        """Walk every branch from its head through the verified parent pointers. None: a branch
        moved (or was deleted) while it was read; the caller reads the refs again."""
        rows = {r.checkpoint_id: r for r in self.store.list_checkpoints(task_id)} if refs else {}
        recs: dict[str, _Rec] = {}
        for branch, head in sorted(refs.items()):
            cid, child = head, None
            while cid is not None and cid not in recs:
                row = rows.get(cid)
                if row is None:  # not listed: look it up by id (a damaged listing may hide rows)
                    try:
                        row = self.store.get_checkpoint(cid)
                    except CheckpointNotFound:
                        if self.store.get_ref(task_id, branch) != head:
                            return None
                        where = (f"branch {branch!r} names checkpoint {short_id(cid)}" if child is None else
                                 f"checkpoint {short_id(child)} on branch {branch!r} has parent {short_id(cid)}")
                        raise self._corrupt(task_id, f"{where}, which is missing from the store", cid) from None
                rec = self._rec(task_id, row)
                recs[cid] = rec
                child, cid = cid, rec.parent
        for branch, head in sorted(refs.items()):  # a ref moved back: newer records of it descend from its head
            rec = recs[head]
            newer = newer_descendant(self.store, task_id, rec.branch, head, rec.order[1], key=self.key)
            if newer is not None:
                if self.store.get_ref(task_id, branch) != head:
                    return None  # it moved on while this was read: read the refs again
                raise Rollback(task_id, branch, head, rec.order[1], newer[1], newer[0], "chain").error()
        records: dict[tuple[str, str], list[_Rec]] = {}
        for rec in recs.values():
            if rec.lg_id is not None:
                records.setdefault((rec.ns, rec.lg_id), []).append(rec)
        entries = {key: _entry(key[0], key[1], recs_of) for key, recs_of in records.items()}
        exists = bool(refs)
        if not exists:
            try:
                self.store.get_task(task_id)
                exists = True
            except TaskNotFound:
                pass
        return _Index(dict(refs), records, entries, exists)

    def _forget(self, task_id: str) -> None:
        self._indexes.pop(task_id, None)
        self._tip.pop(task_id, None)

    def _load(self, task_id: str, cid: str, reader: BlobReader | None = None) -> LoadedCheckpoint:
        """Load and fully verify one record (every artifact blob read and hashed).

        Raises:
            CheckpointNotFound: no such record (deleted meanwhile; the callers read the index again).
            ThreadCorrupt: it fails verification.
        """
        try:
            return load_checkpoint(self.store, cid, key=self.key, deep=True,
                                   reader=reader or BlobReader(self.store, chunks=self._chunks))
        except IntegrityError as exc:
            raise self._corrupt(task_id, f"checkpoint {short_id(cid)} failed verification: {exc.message}", cid,
                                exc) from exc

    def _merged(self, task_id: str, entry: _Entry) -> _Merged:
        """Load every leaf record of ``entry`` and fold their writes (oldest first)."""
        seen: set[str] = set()
        reader = _KeepingReader(self.store, seen, self._chunks)
        loaded = {r.cid: self._load(task_id, r.cid, reader) for r in entry.leaves}
        writes: dict[tuple[str, int], dict[str, Any]] = {}
        warts: dict[str, Any] = {}
        for r in entry.leaves:
            lc = loaded[r.cid]
            _merge_writes(writes, warts, lc.data["langgraph"]["writes"], lc.state_tree["artifacts"])
        main = loaded[entry.cid] if entry.cid is not None else None
        tree = main.state_tree if main is not None else None
        if tree is not None and len(entry.leaves) > 1:
            arts = {n: a for n, a in tree["artifacts"].items() if not n.startswith("write/")}
            arts.update(warts)
            lg = {**tree["data"]["langgraph"], "writes": _ordered(writes)}
            tree = {**tree, "artifacts": arts, "data": {**tree["data"], "langgraph": lg}}
        return _Merged(main, tree, _ordered(writes), warts, seen, reader)

    def _world_now(self) -> dict[str, Any]:
        return world(WorldSpec(deps="all", root=self.project_root))

    def _fingerprint(self, writer: BlobWriter) -> dict[str, Any]:
        if self._world is None:
            self._world = encode_state(self._world_now())
        return {"world": {"digest": writer.put(self._world), "size": len(self._world)}, "exports": {}, "accepted": []}

    def _encode(self, value: Any, where: str, task_id: str) -> bytes:
        try:
            return self._codec.encode(value, where)
        except EncodeError as exc:
            exc.task_id = task_id
            raise

    @staticmethod
    def _ref(writer: BlobWriter, data: bytes) -> dict[str, Any]:
        return artifact_ref(writer.put(data), len(data), text=False, step=None)

    # -- the write path -------------------------------------------------------------------------

    def _commit(self, task_id: str, thread_id: str, ns: str, lg_id: str, base_key: tuple[str, str] | None,
                build: Any, *, kind: str) -> bool:
        """Append one record for LangGraph checkpoint ``lg_id`` after the newest record of the
        checkpoint ``base_key`` names (None: a root).

        ``kind`` is :data:`EVENT_KEY` (``put``: ``base_key`` is the parent checkpoint) or
        :data:`WRITES_EVENT_KEY` (``put_writes``: ``base_key`` is the checkpoint itself, loaded
        with the writes of all its leaf records; when it is not stored, the record is a
        :data:`PENDING_EVENT_KEY` root of its own branch). ``build(base_state_tree | None,
        writer, pending) -> data | None`` returns the state tree to commit, or None when nothing
        changed; ``pending`` holds the writes of the checkpoint's :data:`PENDING_EVENT_KEY` records
        (for ``put`` to carry them; ``put_writes`` finds them in the base state already). Once the
        record is committed, those pending records are deleted (:meth:`_drop_pending`). Retries
        when another writer moved the branch meanwhile. Returns whether a record was written.
        """
        for _ in range(COMMIT_ATTEMPTS):
            index = self._index(task_id)
            base = index.entries.get(base_key) if base_key else None
            if base is not None and base.cid is None:
                base = None
            mode = PENDING_EVENT_KEY if kind == WRITES_EVENT_KEY and base is None else kind
            heads = {cid: b for b, cid in index.refs.items()}
            first = _ns_branch(ns)
            if mode == PENDING_EVENT_KEY:
                branch, expected = f"{first}@{lg_id}/{uuid.uuid4().hex[:8]}", None
            elif base is not None and base.cid in heads:
                branch, expected = heads[base.cid], base.cid
            elif base is None and first not in index.refs:
                branch, expected = first, None
            else:  # a new branch no other writer can name: nothing to compare-and-swap
                branch = f"{first}@{lg_id}"
                if mode == WRITES_EVENT_KEY or branch in index.refs:
                    branch += f"/{uuid.uuid4().hex[:8]}"
                expected = None
            tip = self._tip.get(task_id)
            if (base is not None and (mode == EVENT_KEY or len(base.leaves) == 1) and tip is not None
                    and tip[0].head == base.cid and tip[0].branch == branch):
                chain, base_state = tip
            else:
                chain = ChainWriter(self.store, task_id, branch, key=self.key, session_id=self._session, session_n=1)
                base_state = None
                if base is not None:
                    try:
                        merged = self._merged(task_id, base)
                    except CheckpointNotFound:
                        self._forget(task_id)
                        continue
                    assert merged.main is not None
                    chain.start_from(merged.main, None)
                    chain.known = merged.seen
                    base_state = merged.tree
                chain.ref_head = expected
                chain.cutter = self._cutter
            own = index.entries.get((ns, lg_id))
            pending = ([r for r in own.leaves if r.kind == PENDING_EVENT_KEY]
                       if own is not None and mode != PENDING_EVENT_KEY else [])
            if mode == EVENT_KEY and pending:
                try:
                    folded = self._merged(task_id, _Entry(ns, lg_id, None, tuple(pending)))
                except CheckpointNotFound:
                    self._forget(task_id)
                    continue
                chain.known |= folded.seen
            else:
                folded = _Merged(None, None, [], {}, set(), BlobReader(self.store, chunks=self._chunks))
            writer = chain.blob_writer()
            state = build(base_state, writer, folded)
            if state is None:
                return False
            task_row = None
            if not index.exists:
                spec = {"langgraph": {"thread_id": thread_id}}
                task_row = TaskRow(task_id, utc_now(), state["task"]["goal"], None, encode(spec))
            ev = event("step", step=lg_id, key=mode, detail=ns)
            try:
                cid = chain.commit(state, ev, writer=writer, task_row=task_row, fingerprint=self._fingerprint(writer))
            except (StaleHead, ParentGone):
                self._forget(task_id)
                continue
            except Exception:
                self._tip.pop(task_id, None)
                raise
            rec = self._rec(task_id, self.store.get_checkpoint(cid))
            key = (ns, lg_id)
            records = dict(index.records)
            records[key] = [*records.get(key, ()), rec]
            index = self._indexes[task_id] = index.with_entry({**index.refs, branch: cid}, records,
                                                              _entry(ns, lg_id, records[key]))
            self._tip[task_id] = (chain, state)
            if pending:
                self._drop_pending(task_id, index, key, pending)
            return True
        raise StaleHead(f"LangGraph checkpoint {lg_id} of thread {thread_id!r}: the thread kept changing under "
                        f"{COMMIT_ATTEMPTS} attempts to commit", task_id=task_id,
                        hint="another process writes the same thread at a high rate; retry")

    def _drop_pending(self, task_id: str, index: _Index, key: tuple[str, str], pending: list[_Rec]) -> None:
        """Delete pending-writes records (and their branches) whose writes the record just
        committed for checkpoint ``key`` carries. A crash midway leaves both: reading folds the
        same writes twice, which changes nothing; a branch another writer moved is left alone."""
        gone: set[str] = set()
        for rec in pending:
            try:
                self.store.set_ref(task_id, rec.branch, None, rec.cid)
            except StaleHead:
                continue
            self.store.delete_checkpoints([rec.cid])
            gone.add(rec.cid)
        if gone:
            records = dict(index.records)
            records[key] = [r for r in records[key] if r.cid not in gone]
            refs = {b: c for b, c in index.refs.items() if c not in gone}
            self._indexes[task_id] = index.with_entry(refs, records, _entry(key[0], key[1], records[key]))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store a checkpoint; returns its config (``thread_id``, ``checkpoint_ns``, ``checkpoint_id``).

        Channels not in ``new_versions`` whose version equals the parent's reuse the parent's blob
        (nothing is encoded or stored for them). Durable when it returns.

        Raises:
            EncodeError: a channel value (or metadata) no codec covers; names thread and channel.
            ConfigError: the namespace or checkpoint id is not valid Unicode text.
        """
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        parent_id = conf.get("checkpoint_id")
        task_id = self.task_id(thread_id)
        cp = dict(checkpoint)
        values: dict[str, Any] = cp.pop("channel_values", None) or {}
        versions: dict[str, Any] = cp.get("channel_versions", {}) or {}
        lg_id = cp["id"]
        _check_text(ns, "checkpoint namespace", thread_id)
        _check_text(lg_id, "checkpoint id", thread_id)
        try:
            meta_tree = to_tree(get_serializable_checkpoint_metadata(config, metadata), "metadata")
            cp_tree = to_tree(cp, "checkpoint")
        except EncodeError as exc:
            exc.task_id = task_id
            raise

        def build(base: dict[str, Any] | None, writer: BlobWriter, pending: _Merged) -> dict[str, Any]:
            base_arts = base["artifacts"] if base else {}
            base_versions = base["data"]["langgraph"]["checkpoint"].get("channel_versions", {}) if base else {}
            arts: dict[str, Any] = {}
            for name in sorted(set(versions) | set(values)):
                aname = f"channel/{name}"
                if (name not in new_versions and aname in base_arts and name in versions
                        and base_versions.get(name) == to_tree(versions[name])):
                    arts[aname] = base_arts[aname]
                elif name in values:
                    where = f"thread {thread_id!r} channel {name!r}"
                    arts[aname] = self._ref(writer, self._encode(values[name], where, task_id))
            arts.update(pending.write_artifacts)  # writes that arrived before this checkpoint
            data = {"langgraph": {
                "format": DATA_FORMAT, "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg_id,
                "parent_checkpoint_id": parent_id, "checkpoint": cp_tree, "metadata": meta_tree,
                "writes": pending.writes,
            }}
            return _state(task_id, thread_id, arts, data)

        with self._lock:
            self._commit(task_id, thread_id, ns, lg_id, (ns, parent_id) if parent_id else None, build, kind=EVENT_KEY)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg_id}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store the pending writes of task ``task_id`` against the checkpoint in ``config``.

        A regular write already stored under the same ``(task_id, index)`` is kept; special
        channels (errors, interrupts, ...) replace theirs, as LangGraph's own savers do. Every
        value is encoded before anything is written. Durable when it returns.

        Writes for a checkpoint not stored yet (LangGraph runs a checkpoint's ``put`` and its
        tasks' ``put_writes`` in parallel) are committed at once as a record of their own (a root
        on branch ``<ns-branch>@<checkpoint id>/<suffix>``, event key :data:`PENDING_EVENT_KEY`);
        the checkpoint's ``put`` carries them into its own record and deletes that one.

        Raises:
            EncodeError: a value no codec covers; names thread and channel.
            ConfigError: the namespace or checkpoint id is not valid Unicode text.
        """
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        lg_id = conf["checkpoint_id"]
        otask = self.task_id(thread_id)
        _check_text(ns, "checkpoint namespace", thread_id)
        _check_text(lg_id, "checkpoint id", thread_id)
        special = all(ch in WRITES_IDX_MAP for ch, _ in writes)
        encoded = [(channel, WRITES_IDX_MAP.get(channel, i),
                    self._encode(value, f"thread {thread_id!r} write to channel {channel!r}", otask))
                   for i, (channel, value) in enumerate(writes)]

        def build(base: dict[str, Any] | None, writer: BlobWriter, _pending: _Merged) -> dict[str, Any] | None:
            if base is None:  # the checkpoint is not stored (yet): a record of the writes alone
                lg = {"format": DATA_FORMAT, "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg_id,
                      "parent_checkpoint_id": None, "checkpoint": None, "metadata": None, "writes": []}
                arts: dict[str, Any] = {}
            else:
                lg = base["data"]["langgraph"]
                arts = dict(base["artifacts"])
            stored = {(w["task_id"], w["idx"]): w for w in lg["writes"]}
            changed = False
            for channel, widx, data in encoded:
                if (task_id, widx) in stored and not special:
                    continue
                aname = f"write/{task_id}/{widx}"
                ref = self._ref(writer, data)
                w = {"task_id": task_id, "task_path": task_path, "idx": widx, "channel": channel, "artifact": aname}
                if stored.get((task_id, widx)) == w and arts.get(aname) == ref:
                    continue
                stored[(task_id, widx)] = w
                arts[aname] = ref
                changed = True
            if not changed:
                return None
            return _state(otask, thread_id, arts, {"langgraph": {**lg, "writes": _ordered(stored)}})

        with self._lock:
            self._commit(otask, thread_id, ns, lg_id, (ns, lg_id), build, kind=WRITES_EVENT_KEY)

    # -- the read path --------------------------------------------------------------------------

    def _tuple(self, task_id: str, entry: _Entry) -> CheckpointTuple:
        merged = self._merged(task_id, entry)
        assert merged.tree is not None
        lg = merged.tree["data"]["langgraph"]
        thread_id, ns = lg["thread_id"], lg["checkpoint_ns"]
        arts = merged.tree["artifacts"]

        def value(aname: str, where: str) -> Any:
            try:
                return self._codec.decode(merged.reader.get(arts[aname]["digest"], where), where)
            except IntegrityError as exc:
                raise self._corrupt(task_id, f"{where} failed verification: {exc.message}", entry.cid, exc) from exc
            except DecodeError as exc:
                self._name_thread(exc, task_id)
                raise

        try:
            checkpoint = from_tree(lg["checkpoint"], "checkpoint")
            metadata = from_tree(lg["metadata"], "metadata")
        except DecodeError as exc:
            self._name_thread(exc, task_id)
            raise
        checkpoint["channel_values"] = {
            name[len("channel/"):]: value(name, f"thread {thread_id!r} channel {name[len('channel/'):]!r}")
            for name in arts if name.startswith("channel/")}
        pending = [(w["task_id"], w["channel"], value(w["artifact"], f"thread {thread_id!r} write to {w['channel']!r}"))
                   for w in lg["writes"]]
        parent = lg["parent_checkpoint_id"]
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg["checkpoint_id"]}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                           if parent else None),
            pending_writes=pending,
        )

    def _read(self, task_id: str, pick: Any) -> Any:
        """``pick(index)`` -> entries; loads them, rebuilding the index once if one vanished."""
        for attempt in (0, 1):
            with self._lock:
                index = self._index(task_id)
            try:
                return [self._tuple(task_id, e) for e in pick(index)]
            except CheckpointNotFound as exc:
                if attempt:
                    raise self._corrupt(task_id, f"a record of it is missing from the store: {exc.message}",
                                        exc.checkpoint_id) from exc
                with self._lock:
                    self._forget(task_id)
        raise AssertionError("unreachable")

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the newest one of the
        thread's namespace when it names none; None when there is no such checkpoint. Which
        checkpoints exist is read from the records reachable from the thread's branches, each
        verified; its pending writes are those of every record of it.

        Raises:
            ThreadCorrupt: a branch of the thread names a missing record, or a record or object
                it needs fails verification (nothing unverified is returned; names the thread).
            UnknownTypeError: a stored value names a class not loaded in this process.
        """
        conf = config["configurable"]
        task_id = self.task_id(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        lg_id = get_checkpoint_id(config)

        def pick(index: _Index) -> list[_Entry]:
            if lg_id:
                e = index.entries.get((ns, lg_id))
                return [e] if e is not None and e.cid is not None else []
            newest = index.latest(ns)
            return [newest] if newest is not None else []

        found = self._read(task_id, pick)
        return found[0] if found else None

    def drift(self, config: RunnableConfig) -> DriftReport:
        """The drift between the world recorded with a checkpoint (the one ``config`` names, or
        the thread's newest in its namespace) and the world now: installed distributions and lock
        files (``deps``), Python version, implementation and platform (``env``).

        Raises:
            CheckpointNotFound: the thread has no such checkpoint.
            ThreadCorrupt: the checkpoint fails verification.
        """
        conf = config["configurable"]
        task_id = self.task_id(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        lg_id = get_checkpoint_id(config)
        with self._lock:
            index = self._index(task_id)
        mine = [e for e in index.checkpoints(ns) if lg_id is None or e.lg_id == lg_id]
        if not mine:
            raise CheckpointNotFound(f"thread {conf['thread_id']!r} has no checkpoint {lg_id or ''} in namespace {ns!r}",
                                     task_id=task_id)
        entry = max(mine, key=lambda e: e.lg_id)
        assert entry.cid is not None
        loaded = self._load(task_id, entry.cid)
        return detect(checkpoint_id=entry.cid, recorded=loaded.world, now=self._world_now(), done=[],
                      step_versions={}, exports={}, salt=b"", sources={})

    def _thread_tasks(self, thread_id: Any | None) -> list[str]:
        if thread_id is not None:
            return [self.task_id(thread_id)]
        return [t.task_id for t in self.store.list_tasks() if t.task_id.startswith(self.task_prefix)]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id) of one thread (``config``), or of every
        thread (``config`` None), narrowed by namespace and checkpoint id when ``config`` gives
        them, by metadata equality (``filter``), to ids below ``before``'s, and to ``limit``."""
        conf = (config or {}).get("configurable", {})
        ns = conf.get("checkpoint_ns")
        want_id = conf.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        found: list[tuple[str, str, _Entry]] = []
        for task_id in self._thread_tasks(conf.get("thread_id")):
            with self._lock:
                index = self._index(task_id)
            for e in index.checkpoints(ns):
                if want_id and e.lg_id != want_id:
                    continue
                if before_id and not e.lg_id < before_id:
                    continue
                found.append((e.lg_id, task_id, e))
        found.sort(key=lambda x: x[0], reverse=True)
        n = 0
        for _, task_id, e in found:
            if limit is not None and n >= limit:
                return
            got = self._read(task_id, lambda index, e=e: [index.entries.get((e.ns, e.lg_id), e)])[0]
            if filter and any(got.metadata.get(k) != v for k, v in filter.items()):
                continue
            n += 1
            yield got

    # -- deletion and copies --------------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's task: every checkpoint, namespace, branch and write. Its blobs stay
        until ``overnight gc`` (another thread may share them)."""
        task_id = self.task_id(thread_id)
        with self._lock:
            self.store.delete_task(task_id)
            self._forget(task_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (all namespaces, all branches) and its writes to another thread,
        oldest first, keeping ids, parents, metadata and values. Blobs are shared, not copied."""
        source = self.task_id(source_thread_id)
        tuples = self._read(source, lambda index: sorted(index.checkpoints(), key=lambda e: e.lg_id))
        for tup in tuples:
            conf = tup.config["configurable"]
            ns = conf["checkpoint_ns"]
            target = {"configurable": {"thread_id": target_thread_id, "checkpoint_ns": ns}}
            if tup.parent_config:
                target["configurable"]["checkpoint_id"] = tup.parent_config["configurable"]["checkpoint_id"]
            stored = self.put(target, tup.checkpoint, tup.metadata, dict(tup.checkpoint["channel_versions"]))
            self._copy_writes(source, conf, stored)

    def _copy_writes(self, source: str, conf: dict[str, Any], target: RunnableConfig) -> None:
        with self._lock:
            entry = self._index(source).entries[(conf["checkpoint_ns"], conf["checkpoint_id"])]
        merged = self._merged(source, entry)
        by_task: dict[tuple[str, str], list[tuple[str, Any]]] = {}
        for w in merged.writes:
            ref = merged.write_artifacts[w["artifact"]]
            by_task.setdefault((w["task_path"], w["task_id"]), []).append(
                (w["channel"], decode(merged.reader.get(ref["digest"], w["artifact"]), w["artifact"])))
        for (task_path, task_id), ws in by_task.items():
            self.put_writes(target, ws, task_id, task_path)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep only each namespace's newest checkpoint (with its writes) per
        thread; ``delete``: delete the threads. Kept checkpoints are committed again as a new
        chain (:meth:`_rewrite`), so the thread still verifies; the blobs only the removed
        records used go at the next ``overnight gc``.

        Raises:
            ConfigError: an unknown strategy (a ``ValueError``).
        """
        if strategy not in ("keep_latest", "delete"):
            raise ConfigError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            task_id = self.task_id(thread_id)
            with self._lock:
                index = self._index(task_id)
                latest: dict[str, _Entry] = {}
                for e in index.checkpoints():
                    if e.ns not in latest or e.lg_id > latest[e.ns].lg_id:
                        latest[e.ns] = e
                if len(latest) < len(index.entries):
                    self._rewrite(task_id, index, list(latest.values()))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (with its writes) whose metadata ``run_id`` is in ``run_ids``,
        in every thread; the remaining ones of a thread are committed again as a new chain
        (:meth:`_rewrite`), each under its nearest remaining ancestor, so the thread still verifies."""
        runs = set(run_ids)
        if not runs:
            return
        for task_id in self._thread_tasks(None):
            with self._lock:
                index = self._index(task_id)
                stored = index.checkpoints()
                keep = [e for e in stored if e.cid is not None and from_tree(
                    self._load(task_id, e.cid).data["langgraph"]["metadata"]).get("run_id") not in runs]
                if len(keep) == len(stored):
                    continue
                if keep:
                    self._rewrite(task_id, index, keep)
                else:
                    self.store.delete_task(task_id)
                    self._forget(task_id)

    def _rewrite(self, task_id: str, index: _Index, keep: list[_Entry]) -> None:
        """Replace the thread's records by a new chain holding only ``keep``.

        Each kept checkpoint is committed again (same state: values, metadata, writes) under the
        new record of its nearest kept LangGraph ancestor (a root when none is kept), on temporary
        branches; then the refs are pointed at the new heads -- each namespace's newest
        checkpoint on its first branch (``main``, ``ns:<ns>``), the others on
        ``<branch>@<checkpoint id>`` -- and every old record is deleted. A crash midway leaves
        both copies, which hold the same checkpoints; never a record whose parent is gone.
        Records of writes whose checkpoint is not stored yet (:data:`PENDING_EVENT_KEY`) stay.
        """
        waiting = {r.cid for e in index.entries.values() if e.cid is None for r in e.leaves}
        old_rows = [r.checkpoint_id for r in self.store.list_checkpoints(task_id) if r.checkpoint_id not in waiting]
        merged = {(e.ns, e.lg_id): self._merged(task_id, e) for e in index.checkpoints()}
        parent_of = {key: (key[0], m.tree["data"]["langgraph"]["parent_checkpoint_id"])  # type: ignore[index]
                     for key, m in merged.items()}
        kept = {(e.ns, e.lg_id) for e in keep}
        gen = uuid.uuid4().hex[:8]
        chains: dict[tuple[str, str], ChainWriter] = {}  # kept key -> the writer that committed it
        new_cid: dict[tuple[str, str], str] = {}  # kept key -> its new record
        first_of: dict[str, tuple[str, str]] = {}  # temporary branch -> its first checkpoint's key
        for key in sorted(kept, key=lambda k: k[1]):
            anc = parent_of[key]
            walked: set[tuple[str, str]] = set()
            while anc[1] is not None and anc not in kept and anc in parent_of and anc not in walked:
                walked.add(anc)
                anc = parent_of[anc]
            if anc in new_cid and chains[anc].head == new_cid[anc]:
                chain = chains[anc]  # the ancestor is still its branch's head: append
            else:
                branch = f"rewrite-{gen}-{len(first_of)}"
                first_of[branch] = key
                chain = ChainWriter(self.store, task_id, branch, key=self.key, session_id=self._session, session_n=1)
                if anc in new_cid:
                    seen_objects: set[str] = set()
                    reader = BlobReader(self.store, seen_objects, self._chunks)
                    chain.start_from(self._load(task_id, new_cid[anc], reader), None)
                    chain.known = seen_objects
                    chain.ref_head = None
            main = merged[key].main
            assert main is not None
            fp = main.record.fingerprint
            new_cid[key] = chain.commit(merged[key].tree, event("step", step=key[1], key=EVENT_KEY, detail=key[0]),
                                        fingerprint=fp.model_dump() if fp is not None else None)
            chains[key] = chain
        heads = {b: c for b, c in self.store.list_refs(task_id).items() if b.startswith(f"rewrite-{gen}-")}
        newest = {ns: max(lid for n, lid in kept if n == ns) for ns, _ in kept}
        final: dict[str, str] = {}
        for branch, cid in heads.items():
            ns, lid = first_of[branch]
            has_newest = any(chains[k].branch == branch for k in kept if k == (ns, newest[ns]))
            final[_ns_branch(ns) if has_newest else f"{_ns_branch(ns)}@{lid}"] = cid
        current = dict(index.refs)
        for name, cid in final.items():
            self.store.set_ref(task_id, name, cid, current.get(name))
        for branch, cid in heads.items():
            self.store.set_ref(task_id, branch, None, cid)
        for name, cid in current.items():
            if name not in final and cid not in waiting:
                self.store.set_ref(task_id, name, None, cid)
        self.store.delete_checkpoints(old_rows, orphans=True)
        self._forget(task_id)

    # -- async twins ----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` in a worker thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list` in a worker thread (the matching checkpoints are loaded, then yielded)."""
        found = await asyncio.to_thread(lambda: [*self.list(config, filter=filter, before=before, limit=limit)])
        for tup in found:
            yield tup

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """:meth:`put` in a worker thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """:meth:`put_writes` in a worker thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`prune` in a worker thread."""
        await asyncio.to_thread(lambda: self.prune(thread_ids, strategy=strategy))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)


def _state(task_id: str, thread_id: str, artifacts: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """The overnight state tree of one LangGraph checkpoint record (no todo/done steps)."""
    goal = "LangGraph thread " + thread_id.encode("utf-8", "backslashreplace").decode()
    return initial_state(task_id, goal, {"langgraph": {"thread_id": thread_id}}, artifacts=artifacts, data=data)
