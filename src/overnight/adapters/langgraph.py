"""``OvernightSaver``: overnight as a LangGraph checkpointer (``BaseCheckpointSaver``).

Change one line -- ``checkpointer=OvernightSaver.from_url("sqlite:///agent.db")`` -- and a
LangGraph graph's checkpoints become overnight checkpoints: content-addressed, verified on every
load, deduplicated, and visible to ``overnight verify``, ``log``, ``fork`` and ``gc``.

Mapping (the README section "Use with LangGraph" shows it as a table):

* a LangGraph **thread** is an overnight **task** with id ``task_prefix + thread_id``
  (default ``"langgraph:<thread_id>"``);
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
  the LangGraph checkpoint again with the writes added (event key ``"langgraph-writes"``; same
  LangGraph id, the newest such record wins), so they are durable when ``put_writes`` returns
  and survive a crash; the write values are artifacts ``write/<task_id>/<idx>``.

Values go through :mod:`overnight.codec.canonical`: no pickle; LangChain messages (pydantic
models) and LangGraph's ``Interrupt``/``Command`` (dataclasses) round-trip; ``Send`` has a codec
registered here. A value no codec covers raises :class:`~overnight.errors.EncodeError` naming the
thread and the channel, before anything is written.
"""

from __future__ import annotations

import asyncio
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

from overnight.codec.canonical import decode, encode, from_tree, loads, to_tree
from overnight.codec.registry import register_codec
from overnight.errors import (
    CheckpointNotFound,
    EncodeError,
    ParentGone,
    StaleHead,
    TaskNotFound,
)
from overnight.store import open_store
from overnight.store.base import Store, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.verify.chain import ChainWriter, utc_now
from overnight.verify.drift import DriftReport, detect
from overnight.verify.fingerprint import WorldSpec, world
from overnight.verify.integrity import LoadedCheckpoint, encode_state, load_checkpoint, signing_key_from_env
from overnight.verify.records import FORMAT_VERSION, event

__all__ = ["OvernightSaver"]

EVENT_KEY = "langgraph"
"""``event.key`` of a checkpoint written by :meth:`OvernightSaver.put`."""
WRITES_EVENT_KEY = "langgraph-writes"
"""``event.key`` of a checkpoint written by :meth:`OvernightSaver.put_writes`."""
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
class _Entry:
    """Where the newest record of one LangGraph checkpoint lives."""

    ns: str
    lg_id: str
    cid: str
    branch: str
    seq: int
    created_at: str


@dataclass
class _Index:
    """A thread's LangGraph checkpoints by ``(ns, id)``, valid while the task's refs are ``refs``
    (every commit moves a ref; a checkpoint deleted behind our back is found missing on load)."""

    refs: dict[str, str]
    entries: dict[tuple[str, str], _Entry]
    exists: bool


class OvernightSaver(BaseCheckpointSaver[int]):
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
        self._early: dict[tuple[str, str, str], list[tuple[list[tuple[str, Any]], str, str]]] = {}
        """Writes that arrived before their checkpoint (``(task, ns, id)`` -> ``put_writes`` args)."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "OvernightSaver":
        """``OvernightSaver(url, **kwargs)``: open the store at ``url`` (see :func:`overnight.store.open_store`)."""
        return cls(url, **kwargs)

    def close(self) -> None:
        """Close the store if this saver opened it. Idempotent."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "OvernightSaver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- mapping --------------------------------------------------------------------------------

    def task_id(self, thread_id: Any) -> str:
        """The overnight task id of LangGraph thread ``thread_id``."""
        return f"{self.task_prefix}{thread_id}"

    def _index(self, task_id: str) -> _Index:
        refs = self.store.list_refs(task_id)
        cached = self._indexes.get(task_id)
        if cached is not None and cached.refs == refs and (refs or cached.exists is False):
            return cached
        entries: dict[tuple[str, str], _Entry] = {}
        rows = self.store.list_checkpoints(task_id)
        for row in rows:
            if row.event != "step" or row.step is None:
                continue
            ev = loads(row.body).get("event") or {}
            if ev.get("key") not in (EVENT_KEY, WRITES_EVENT_KEY):
                continue
            ns = ev.get("detail") or ""
            e = _Entry(ns, row.step, row.checkpoint_id, row.branch, row.seq, row.created_at)
            old = entries.get((ns, row.step))
            if old is None or (e.seq, e.created_at) > (old.seq, old.created_at):
                entries[(ns, row.step)] = e
        exists = bool(rows)
        if not exists:
            try:
                self.store.get_task(task_id)
                exists = True
            except TaskNotFound:
                pass
        index = self._indexes[task_id] = _Index(refs, entries, exists)
        return index

    def _forget(self, task_id: str) -> None:
        self._indexes.pop(task_id, None)
        self._tip.pop(task_id, None)

    def _load(self, entry_cid: str) -> tuple[LoadedCheckpoint, set[str], BlobReader]:
        seen: set[str] = set()
        reader = BlobReader(self.store, seen)
        loaded = load_checkpoint(self.store, entry_cid, key=self.key, deep=True, reader=reader)
        return loaded, seen, reader

    def _world_now(self) -> dict[str, Any]:
        return world(WorldSpec(deps="all", root=self.project_root))

    def _fingerprint(self, writer: BlobWriter) -> dict[str, Any]:
        if self._world is None:
            self._world = encode_state(self._world_now())
        return {"world": {"digest": writer.put(self._world), "size": len(self._world)}, "exports": {}, "accepted": []}

    @staticmethod
    def _blob(writer: BlobWriter, value: Any, where: str, task_id: str) -> dict[str, Any]:
        try:
            data = encode(value, where)
        except EncodeError as exc:
            exc.task_id = task_id
            raise
        return {"digest": writer.put(data), "size": len(data), "text": False, "step": None}

    # -- the write path -------------------------------------------------------------------------

    def _commit(self, task_id: str, thread_id: str, ns: str, lg_id: str, base: _Entry | None,
                build: Any, *, writes: bool) -> bool:
        """Append one record for LangGraph checkpoint ``lg_id`` after ``base`` (None: a root).

        ``build(base_state_tree | None, writer) -> data | None`` returns the state tree to commit,
        or None when nothing changed. Retries when another writer moved the branch meanwhile.
        Returns whether a record was written.
        """
        for _ in range(COMMIT_ATTEMPTS):
            index = self._index(task_id)
            if base is not None:  # the newest record of the parent (None: it was deleted meanwhile)
                base = index.entries.get((ns, base.lg_id))
            heads = {cid: b for b, cid in index.refs.items()}
            first = _ns_branch(ns)
            if base is not None and base.cid in heads:
                branch, expected = heads[base.cid], base.cid
            elif base is None and first not in index.refs:
                branch, expected = first, None
            else:
                branch = f"{first}@{lg_id}"
                if writes or branch in index.refs:
                    branch += f"/{uuid.uuid4().hex[:8]}"
                expected = None
            tip = self._tip.get(task_id)
            if base is not None and tip is not None and tip[0].head == base.cid and tip[0].branch == branch:
                chain, base_state = tip
            else:
                chain = ChainWriter(self.store, task_id, branch, key=self.key, session_id=self._session, session_n=1)
                base_state = None
                if base is not None:
                    try:
                        loaded, seen, _ = self._load(base.cid)
                    except CheckpointNotFound:
                        self._forget(task_id)
                        continue
                    chain.start_from(loaded, None)
                    chain.known = seen
                    base_state = loaded.state_tree
                chain.ref_head = expected
            writer = chain.blob_writer()
            state = build(base_state, writer)
            if state is None:
                return False
            task_row = None
            if not index.exists:
                spec = {"langgraph": {"thread_id": thread_id}}
                task_row = TaskRow(task_id, utc_now(), state["task"]["goal"], None, encode(spec))
            ev = event("step", step=lg_id, key=WRITES_EVENT_KEY if writes else EVENT_KEY, detail=ns)
            try:
                cid = chain.commit(state, ev, writer=writer, task_row=task_row, fingerprint=self._fingerprint(writer))
            except (StaleHead, ParentGone):
                self._forget(task_id)
                continue
            except Exception:
                self._tip.pop(task_id, None)
                raise
            refs = dict(index.refs)
            refs[branch] = cid
            entries = dict(index.entries)
            entries[(ns, lg_id)] = _Entry(ns, lg_id, cid, branch, chain.seq, utc_now())
            self._indexes[task_id] = _Index(refs, entries, True)
            self._tip[task_id] = (chain, state)
            return True
        raise StaleHead(f"LangGraph checkpoint {lg_id} of thread {thread_id!r}: the thread kept changing under "
                        f"{COMMIT_ATTEMPTS} attempts to commit", task_id=task_id,
                        hint="another process writes the same thread at a high rate; retry")

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store a checkpoint; returns its config (``thread_id``, ``checkpoint_ns``, ``checkpoint_id``).

        Channels not in ``new_versions`` whose version equals the parent's reuse the parent's blob
        (nothing is encoded or stored for them). Durable when it returns.

        Raises:
            EncodeError: a channel value (or metadata) no codec covers; names thread and channel.
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
        try:
            meta_tree = to_tree(get_serializable_checkpoint_metadata(config, metadata), "metadata")
            cp_tree = to_tree(cp, "checkpoint")
        except EncodeError as exc:
            exc.task_id = task_id
            raise

        def build(base: dict[str, Any] | None, writer: BlobWriter) -> dict[str, Any]:
            base_arts = base["artifacts"] if base else {}
            base_versions = base["data"]["langgraph"]["checkpoint"].get("channel_versions", {}) if base else {}
            arts: dict[str, Any] = {}
            for name in sorted(set(versions) | set(values)):
                aname = f"channel/{name}"
                if (name not in new_versions and aname in base_arts and name in versions
                        and base_versions.get(name) == to_tree(versions[name])):
                    arts[aname] = base_arts[aname]
                elif name in values:
                    arts[aname] = self._blob(writer, values[name], f"thread {thread_id!r} channel {name!r}", task_id)
            data = {"langgraph": {
                "format": DATA_FORMAT, "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg_id,
                "parent_checkpoint_id": parent_id, "checkpoint": cp_tree, "metadata": meta_tree, "writes": [],
            }}
            return _state(task_id, thread_id, arts, data)

        with self._lock:
            base = self._index(task_id).entries.get((ns, parent_id)) if parent_id else None
            self._commit(task_id, thread_id, ns, lg_id, base, build, writes=False)
            stored = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg_id}}
            for early in self._early.pop((task_id, ns, lg_id), []):
                self.put_writes(stored, *early)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg_id}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store the pending writes of task ``task_id`` against the checkpoint in ``config``.

        A regular write already stored under the same ``(task_id, index)`` is kept; special
        channels (errors, interrupts, ...) replace theirs, as LangGraph's own savers do. Durable
        when it returns.

        Writes for a checkpoint not stored yet (LangGraph runs a checkpoint's ``put`` and its
        tasks' ``put_writes`` in parallel) are held until that ``put``, which commits them.

        Raises:
            EncodeError: a value no codec covers; names thread and channel.
        """
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        lg_id = conf["checkpoint_id"]
        otask = self.task_id(thread_id)
        special = all(ch in WRITES_IDX_MAP for ch, _ in writes)

        def build(base: dict[str, Any] | None, writer: BlobWriter) -> dict[str, Any] | None:
            assert base is not None
            lg = base["data"]["langgraph"]
            stored = {(w["task_id"], w["idx"]): w for w in lg["writes"]}
            arts = dict(base["artifacts"])
            changed = False
            for i, (channel, value) in enumerate(writes):
                widx = WRITES_IDX_MAP.get(channel, i)
                if (task_id, widx) in stored and not special:
                    continue
                aname = f"write/{task_id}/{widx}"
                ref = self._blob(writer, value, f"thread {thread_id!r} write to channel {channel!r}", otask)
                w = {"task_id": task_id, "task_path": task_path, "idx": widx, "channel": channel, "artifact": aname}
                if stored.get((task_id, widx)) == w and arts.get(aname) == ref:
                    continue
                stored[(task_id, widx)] = w
                arts[aname] = ref
                changed = True
            if not changed:
                return None
            ordered = sorted(stored.values(), key=lambda w: (w["task_path"], w["task_id"], w["idx"]))
            data = {"langgraph": {**lg, "writes": ordered}}
            return _state(otask, thread_id, arts, data)

        with self._lock:
            entry = self._index(otask).entries.get((ns, lg_id))
            if entry is None:
                # LangGraph submits a checkpoint's put and its tasks' writes to background threads
                # at the same time: the writes may come first. They are committed right after
                # the checkpoint; without it they are meaningless (a resume starts before it).
                self._early.setdefault((otask, ns, lg_id), []).append((list(writes), task_id, task_path))
                return
            self._commit(otask, thread_id, ns, lg_id, entry, build, writes=True)

    # -- the read path --------------------------------------------------------------------------

    def _tuple(self, task_id: str, entry: _Entry) -> CheckpointTuple:
        loaded, _, reader = self._load(entry.cid)
        lg = loaded.doc.data["langgraph"]
        thread_id, ns = lg["thread_id"], lg["checkpoint_ns"]
        arts = loaded.artifacts

        def value(aname: str, where: str) -> Any:
            ref = arts[aname]
            return decode(reader.get(ref.digest, where), where)

        checkpoint = from_tree(lg["checkpoint"], "checkpoint")
        checkpoint["channel_values"] = {
            name[len("channel/"):]: value(name, f"thread {thread_id!r} channel {name[len('channel/'):]!r}")
            for name in arts if name.startswith("channel/")}
        pending = [(w["task_id"], w["channel"], value(w["artifact"], f"thread {thread_id!r} write to {w['channel']!r}"))
                   for w in lg["writes"]]
        parent = lg["parent_checkpoint_id"]
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": lg["checkpoint_id"]}},
            checkpoint=checkpoint,
            metadata=from_tree(lg["metadata"], "metadata"),
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
            except CheckpointNotFound:
                if attempt:
                    raise
                with self._lock:
                    self._forget(task_id)
        raise AssertionError("unreachable")

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the newest one of the
        thread's namespace when it names none; None when there is no such checkpoint.

        Raises:
            IntegrityError: the stored checkpoint fails verification (never returned unverified).
        """
        conf = config["configurable"]
        task_id = self.task_id(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        lg_id = get_checkpoint_id(config)

        def pick(index: _Index) -> list[_Entry]:
            if lg_id:
                e = index.entries.get((ns, lg_id))
                return [e] if e else []
            mine = [e for (n, _), e in index.entries.items() if n == ns]
            return [max(mine, key=lambda e: e.lg_id)] if mine else []

        found = self._read(task_id, pick)
        return found[0] if found else None

    def drift(self, config: RunnableConfig) -> DriftReport:
        """The drift between the world recorded with a checkpoint (the one ``config`` names, or
        the thread's newest in its namespace) and the world now: installed distributions and lock
        files (``deps``), Python version, implementation and platform (``env``).

        Raises:
            CheckpointNotFound: the thread has no such checkpoint.
            IntegrityError: the checkpoint fails verification.
        """
        conf = config["configurable"]
        task_id = self.task_id(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        lg_id = get_checkpoint_id(config)
        with self._lock:
            index = self._index(task_id)
        mine = [e for (n, lid), e in index.entries.items() if n == ns and (lg_id is None or lid == lg_id)]
        if not mine:
            raise CheckpointNotFound(f"thread {conf['thread_id']!r} has no checkpoint {lg_id or ''} in namespace {ns!r}",
                                     task_id=task_id)
        entry = max(mine, key=lambda e: e.lg_id)
        loaded = self._load(entry.cid)[0]
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
            for (ens, lid), e in index.entries.items():
                if ns is not None and ens != ns:
                    continue
                if want_id and lid != want_id:
                    continue
                if before_id and not lid < before_id:
                    continue
                found.append((lid, task_id, e))
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
        tuples = self._read(source, lambda index: sorted(index.entries.values(), key=lambda e: e.lg_id))
        for tup in tuples:
            conf = tup.config["configurable"]
            ns = conf["checkpoint_ns"]
            target = {"configurable": {"thread_id": target_thread_id, "checkpoint_ns": ns}}
            if tup.parent_config:
                target["configurable"]["checkpoint_id"] = tup.parent_config["configurable"]["checkpoint_id"]
            stored = self.put(target, tup.checkpoint, tup.metadata, dict(tup.checkpoint["channel_versions"]))
            self._copy_writes(source, conf, stored)

    def _copy_writes(self, source: str, conf: dict[str, Any], target: RunnableConfig) -> None:
        entry = self._index(source).entries[(conf["checkpoint_ns"], conf["checkpoint_id"])]
        loaded, _, reader = self._load(entry.cid)
        arts = loaded.artifacts
        by_task: dict[tuple[str, str], list[tuple[str, Any]]] = {}
        for w in loaded.doc.data["langgraph"]["writes"]:
            ref = arts[w["artifact"]]
            by_task.setdefault((w["task_path"], w["task_id"]), []).append(
                (w["channel"], decode(reader.get(ref.digest, w["artifact"]), w["artifact"])))
        for (task_path, task_id), ws in by_task.items():
            self.put_writes(target, ws, task_id, task_path)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep only each namespace's newest checkpoint (with its writes) per
        thread; ``delete``: delete the threads. Kept checkpoints are committed again as a new
        chain (:meth:`_rewrite`), so the thread still verifies; the blobs only the removed
        records used go at the next ``overnight gc``.

        Raises:
            ValueError: an unknown strategy.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            task_id = self.task_id(thread_id)
            with self._lock:
                index = self._index(task_id)
                latest: dict[str, _Entry] = {}
                for (ns, lid), e in index.entries.items():
                    if ns not in latest or lid > latest[ns].lg_id:
                        latest[ns] = e
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
                keep = [e for e in index.entries.values()
                        if from_tree(self._load(e.cid)[0].doc.data["langgraph"]["metadata"]).get("run_id") not in runs]
                if len(keep) == len(index.entries):
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
        """
        old_rows = [r.checkpoint_id for r in self.store.list_checkpoints(task_id)]
        loaded = {key: self._load(e.cid)[0] for key, e in index.entries.items()}
        parent_of = {key: (key[0], lc.doc.data["langgraph"]["parent_checkpoint_id"]) for key, lc in loaded.items()}
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
                    parent_loaded, seen_objects, _ = self._load(new_cid[anc])
                    chain.start_from(parent_loaded, None)
                    chain.known = seen_objects
                    chain.ref_head = None
            fp = loaded[key].record.fingerprint
            new_cid[key] = chain.commit(loaded[key].state_tree, event("step", step=key[1], key=EVENT_KEY, detail=key[0]),
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
            if name not in final:
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
    return {
        "format": FORMAT_VERSION,
        "task": {"id": task_id, "goal": f"LangGraph thread {thread_id}", "spec": {"langgraph": {"thread_id": thread_id}}},
        "todo": [],
        "done": [],
        "artifacts": artifacts,
        "data": data,
        "context": {"summary": None, "compactions": 0, "messages": [], "tokens": 0},
        "recompute": None,
    }
