"""Blobs on top of a store's objects: content addressing, chunk trees, compression, verified reads.

A blob is addressed by ``sha256:<hex>`` of its bytes. Small blobs (<= 16 KiB) are one ``blob``
object. Larger ones are cut by FastCDC (:mod:`overnight.codec.chunking`) into chunks, each a
``blob`` object, and stored as a ``tree`` object under the blob's digest whose payload names the
*chunk index* -- the concatenated 32-byte chunk digests -- which is itself a blob (and chunked in
turn when large). An append to a 500 KB artifact therefore stores one or two new chunks and the
tail of the index, not 500 KB (the O(N²) growth of full-snapshot checkpointers is avoided).

Every read re-hashes what it returns: a chunk that does not match its digest, a tree whose
reassembled bytes do not, or a missing object raises an :class:`~overnight.errors.IntegrityError`.
A reader given a :class:`ChunkCache` takes the chunks that cache holds from memory instead: each
was hashed against its digest when it entered, and a digest names one content, so they are the
verified bytes (the tree object is still read and the reassembled blob hashed; a large chunk
index is itself a chunked blob, whose chunks may come from the cache too). What came from the
cache says nothing about the store's copy, so it is not added to the reader's ``verified`` set: a
writer that takes that set as ``known`` writes such a chunk again (healing a damaged copy) instead
of trusting it.

Deduplication never trusts what it has not verified: a writer reuses a stored object only if it
is in its ``known`` set (objects this process wrote, or verified when it loaded the checkpoint
it continues from) or if it hashes the stored bytes first. A stored object that turns out to be
damaged is simply written again; the store replaces the damaged copy (:func:`is_damaged`) --
same digest, same content -- and keeps an intact one.

Deduplication is also what ``gc`` has to be safe against: a commit may reference an object that
no checkpoint references at that moment. So ``known`` holds only objects reachable from checkpoints
on the writer's own branch, and an intact object found in the store by hashing it is not trusted
beyond this commit: it goes in :attr:`BlobWriter.reused`, which the commit carries like a new
object, so the store refreshes its stored time and a concurrent ``gc`` keeps it
(``overnight/ops/gc.py``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Iterable

from overnight.codec import chunking, compress, digest
from overnight.codec.canonical import dumps_sorted, loads
from overnight.errors import DecodeError, DigestMismatch, IntegrityError, MissingObject, OvernightError
from overnight.store.base import ObjectRecord, Store

MAX_TREE_DEPTH = 4
"""Chunk indexes of chunk indexes nest at most this deep (4 levels address far beyond 1 TB)."""

LOOKUP_MIN_BYTES = 256 * 1024
"""New chunks of one blob that together stay under this size (bytes) are staged without asking the
store whether it holds them already: re-sending them costs less than the query's round trip (the
store keeps an intact copy it has: :func:`is_damaged`). A commit that appends to a page or a
transcript has one or two such chunks; only a large unknown blob (a new file, content copied from
another task) is looked up first, where deduplication saves real bytes on the wire."""


def is_damaged(store: Store, blob_digest: str) -> bool:
    """Is the stored copy of ``blob_digest`` damaged (unreadable, or not hashing to its digest)?

    Stores call this when a write meets a stored object with *other* bytes under the same digest:
    only a damaged copy is replaced; an intact one is kept (the first write wins).
    """
    try:
        BlobReader(store).get(blob_digest, "a store write")
    except (DigestMismatch, MissingObject, DecodeError):
        return True
    return False


class BlobWriter:
    """Stages the new objects of one commit.

    ``put`` returns the blob digest at once; :attr:`objects` holds what the commit must write,
    :attr:`reused` the stored objects it found and will reference (:meth:`commit_objects` is both).

    Args:
        store: where to look up what already exists.
        known: digests reachable from checkpoints committed on the writer's own branch and
            verified intact (shared across commits of a run). Anything else is hashed before it is
            reused, and carried in the commit (see the module docstring).
        cutter: cuts and hashes large blobs, reusing its earlier cuts (shared across commits of a
            run, so a commit that appends to a large blob cuts and hashes only the new tail).
    """

    def __init__(self, store: Store, known: set[str] | None = None, cutter: chunking.Cutter | None = None) -> None:
        self.store = store
        self.known = known if known is not None else set()
        self.cutter = cutter if cutter is not None else chunking.Cutter()
        self.objects: dict[str, ObjectRecord] = {}
        self.reused: dict[str, ObjectRecord] = {}
        self.parts: dict[str, tuple[str, ...]] = {}
        """Blob digest -> the digests of the objects it is made of (itself, its chunk index, its
        chunks), for every blob :meth:`put` staged."""

    def _sound(self, digests: list[str]) -> set[str]:
        """Which of ``digests`` are stored intact: known, staged, or fetched and verified now (one
        query; those go in :attr:`reused`). Only plain ``blob`` objects are checked here; a stored
        tree is rebuilt from its chunks.

        A damaged stored object is not sound, and so is staged again (the commit heals it): one
        that does not decompress or hash to its digest, and one the store refuses to read as
        damaged -- an :class:`~overnight.errors.IntegrityError` from ``get_objects``, as SQLite
        raises for a row with a cell of the wrong type (the query is then made again one digest
        at a time, so the intact objects among them are still reused). Whatever else the store
        raises (unreachable, busy) is raised.
        """
        todo = [d for d in dict.fromkeys(digests)
                if d not in self.known and d not in self.objects and d not in self.reused]
        if todo:
            for d, obj in self._stored(todo).items():
                if obj.kind != "blob":
                    continue
                try:
                    if digest.sha256(compress.decompress(obj.codec, obj.data, obj.size)) == d:
                        self.reused[d] = obj
                except DecodeError:
                    pass  # damaged: staged again below, and the commit heals it
        return {d for d in digests if d in self.known or d in self.objects or d in self.reused}

    def _stored(self, digests: list[str]) -> dict[str, ObjectRecord]:
        """``store.get_objects(digests)`` without the objects the store refuses to read as damaged
        (IntegrityError): those are left out, as if not stored, and written again by the commit."""
        try:
            return self.store.get_objects(digests)
        except IntegrityError:
            if len(digests) == 1:
                return {}
        out: dict[str, ObjectRecord] = {}
        for d in digests:
            out.update(self._stored([d]))
        return out

    def _stage(self, d: str, kind: str, payload: bytes) -> None:
        codec, data = compress.compress(payload)
        self.objects[d] = ObjectRecord(d, kind, len(payload), codec, data)

    def commit_objects(self) -> list[ObjectRecord]:
        """What a commit must carry: the staged objects and the reused ones (to refresh them)."""
        return [*self.objects.values(), *(o for d, o in self.reused.items() if d not in self.objects)]

    def closure(self, blob_digests: Iterable[str]) -> set[str]:
        """The objects that make up the given blobs, as far as this writer staged or reused them."""
        out: set[str] = set()
        for d in blob_digests:
            out.update(self.parts.get(d, ()))
        return out

    def put(self, data: bytes | bytearray | memoryview, *, _index: bool = False) -> str:
        """Stage ``data`` as a blob; returns its ``sha256:<hex>`` digest."""
        data = bytes(data)
        if len(data) <= chunking.inline_limit(_index):
            d = digest.sha256(data)
            if d not in self.objects and d not in self.known:
                # small: staged without a lookup; the store skips it if an intact copy is there
                self._stage(d, "blob", data)
                self.parts[d] = (d,)
            return d
        cut = self.cutter.cut(data, index=_index)
        d = cut.digest
        if d in self.objects or d in self.known:
            return d
        chunks, chunk_digests = cut.chunks(), cut.chunk_digests
        if len(chunks) == 1:  # content-defined cutting found no boundary: one plain blob, not a
            self._stage(d, "blob", data)  # tree listing itself as its only chunk
            self.parts[d] = (d,)
            return d
        have = {cd for cd in chunk_digests if cd in self.known or cd in self.objects or cd in self.reused}
        if sum(len(c) for c, cd in zip(chunks, chunk_digests) if cd not in have) >= LOOKUP_MIN_BYTES:
            have = self._sound(chunk_digests)
        for c, cd in zip(chunks, chunk_digests):
            if cd not in have:
                self._stage(cd, "blob", bytes(c))
        index = b"".join(digest.raw(cd) for cd in chunk_digests)
        index_digest = self.put(index, _index=True)
        self._stage(d, "tree", dumps_sorted({"chunks": len(chunks), "index": index_digest, "size": len(data)}))
        self.parts[d] = (d, *self.parts.get(index_digest, (index_digest,)), *dict.fromkeys(chunk_digests))
        return d


class ChunkCache:
    """Verified chunk payloads by digest, least recently used dropped first, for the readers of a
    long-lived object that re-reads the same large blobs (the LangGraph saver: each checkpoint of
    a growing message list shares all but its last chunks with the one before).

    Only :class:`BlobReader` puts payloads here, after hashing them against their digest; a
    payload is an immutable ``bytes``. Safe to share between threads (one lock).

    Args:
        max_bytes: payload bytes kept, at most (default 64 MiB); a payload larger than a quarter
            of it is not kept.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get_many(self, digests: Iterable[str]) -> dict[str, bytes]:
        """The payloads this cache holds among ``digests`` (each marked as just used)."""
        out: dict[str, bytes] = {}
        with self._lock:
            items = self._items
            for d in digests:
                payload = items.get(d)
                if payload is not None:
                    items.move_to_end(d)
                    out[d] = payload
        return out

    def put(self, chunk_digest: str, payload: bytes) -> None:
        """Keep a payload that was hashed to ``chunk_digest`` (by :class:`BlobReader` only)."""
        if len(payload) * 4 > self.max_bytes:
            return
        with self._lock:
            items = self._items
            if chunk_digest in items:
                return
            items[chunk_digest] = payload
            self._bytes += len(payload)
            while self._bytes > self.max_bytes:
                self._bytes -= len(items.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._items)


class BlobReader:
    """Reads and verifies blobs. Raises :class:`MissingObject` / :class:`DigestMismatch`.

    Args:
        store: where objects live.
        verified: a set that collects the digest of every object this reader verified (pass a
            writer's ``known`` set to let it deduplicate against them).
        chunks: verified chunk payloads shared with other readers (:class:`ChunkCache`): a chunk
            it holds is not read, decompressed or hashed again; the chunks this reader hashes
            are added to it.

    Methods take ``context``: text naming what is being read (``"checkpoint 1a2b3c… state"``),
    used in errors.
    """

    def __init__(self, store: Store, verified: set[str] | None = None, chunks: ChunkCache | None = None) -> None:
        self.store = store
        self.verified = verified if verified is not None else set()
        self.chunks = chunks

    def _chunk_payloads(self, chunk_digests: list[str], where: str) -> dict[str, bytes]:
        """The verified payload of each distinct chunk in ``chunk_digests``: from :attr:`chunks`
        when it holds one, else read in one store call, decompressed and hashed (added to the
        cache, and to :attr:`verified`: only a chunk read from the store is known to be stored
        intact -- a writer given that set as ``known`` trusts it instead of writing it again).

        Raises:
            MissingObject, DigestMismatch: a chunk is missing, not a blob, or not its digest's content.
        """
        wanted = list(dict.fromkeys(chunk_digests))
        cache = self.chunks
        payloads = cache.get_many(wanted) if cache is not None else {}
        missing = [cd for cd in wanted if cd not in payloads]
        if missing:
            found = self._fetch(missing, where)
            for cd in missing:
                part = self._chunk(found[cd], where)
                if digest.sha256(part) != cd:
                    raise DigestMismatch(f"chunk {cd} does not match its content; needed by {where}", object_digest=cd)
                payloads[cd] = part
                self.verified.add(cd)
                if cache is not None:
                    cache.put(cd, part)
        return payloads

    def _fetch(self, digests: list[str], context: str) -> dict[str, ObjectRecord]:
        found = self.store.get_objects(digests)
        for d in digests:
            if d not in found:
                raise MissingObject(f"object {d} is missing from the store (needed by {context})", object_digest=d)
        return found

    def _payload(self, obj: ObjectRecord, context: str) -> bytes:
        try:
            return compress.decompress(obj.codec, obj.data, obj.size)
        except DecodeError as exc:
            raise DigestMismatch(f"object {obj.digest} is corrupt ({exc}); needed by {context}",
                                 object_digest=obj.digest) from exc

    def get(self, blob_digest: str, context: str = "a read", _depth: int = 0) -> bytes:
        """The verified bytes of a blob."""
        obj = self._fetch([blob_digest], context)[blob_digest]
        return self._assemble(obj, context, _depth)

    def get_many(self, blob_digests: Iterable[str], context: str = "a read") -> dict[str, bytes]:
        """The verified bytes of several blobs by digest, their objects fetched in one store call
        (raises as :meth:`get` does, for the first blob that fails)."""
        wanted = list(dict.fromkeys(blob_digests))
        objects = self._fetch(wanted, context) if wanted else {}
        return {d: self._assemble(objects[d], context) for d in wanted}

    def _tree_index(self, obj: ObjectRecord, context: str, depth: int) -> tuple[list[str], int, str]:
        """``(chunk digests, size, index digest)`` of a ``tree`` object, its chunk index read and verified."""
        if depth > MAX_TREE_DEPTH:
            raise DigestMismatch(f"chunk tree {obj.digest} nests deeper than {MAX_TREE_DEPTH} levels (a cycle?); "
                                 f"needed by {context}", object_digest=obj.digest)
        try:
            tree = loads(self._payload(obj, context))
            index_digest, n_chunks, size = tree["index"], tree["chunks"], tree["size"]
        except (DecodeError, KeyError, TypeError) as exc:
            raise DigestMismatch(f"chunk tree {obj.digest} is malformed ({exc}); needed by {context}",
                                 object_digest=obj.digest) from exc
        index = self.get(index_digest, context, depth + 1)  # verified (and recorded) by get
        if len(index) != 32 * n_chunks:
            raise DigestMismatch(f"chunk index of {obj.digest} lists {len(index) // 32} chunks, expected {n_chunks}",
                                 object_digest=obj.digest)
        return [digest.from_raw(index[i : i + 32]) for i in range(0, len(index), 32)], size, index_digest

    def _chunk(self, chunk: ObjectRecord, where: str) -> bytes:
        """Payload of a chunk, which must be a plain ``blob`` object."""
        if chunk.kind != "blob":
            raise DigestMismatch(f"chunk {chunk.digest} is a {chunk.kind!r}, not a blob; needed by {where}",
                                 object_digest=chunk.digest)
        return self._payload(chunk, where)

    def _assemble(self, obj: ObjectRecord, context: str, depth: int = 0) -> bytes:
        if obj.kind == "blob":
            data = self._payload(obj, context)
        elif obj.kind == "tree":
            chunk_digests, size, index_digest = self._tree_index(obj, context, depth)
            payloads = self._chunk_payloads(chunk_digests, f"{context}, blob {obj.digest}")
            data = b"".join([payloads[cd] for cd in chunk_digests])
            if len(data) != size:
                raise DigestMismatch(f"blob {obj.digest} reassembled to {len(data)} bytes, expected {size}",
                                     object_digest=obj.digest)
        else:
            raise DigestMismatch(f"object {obj.digest} has unknown kind {obj.kind!r}; needed by {context}",
                                 object_digest=obj.digest)
        if digest.sha256(data) != obj.digest:
            raise DigestMismatch(f"object {obj.digest} does not match its content; needed by {context}",
                                 object_digest=obj.digest)
        # the blob is known to be stored intact only when each object it is made of was read from
        # the store (or known before), not served from the chunk cache
        if obj.kind != "tree" or (index_digest in self.verified and all(cd in self.verified for cd in payloads)):
            self.verified.add(obj.digest)
        return data

    def verify(self, blob_digest: str, context: str) -> int:
        """Check a blob without keeping it in memory: chunks are streamed through the hash.

        Objects already in :attr:`verified` are not hashed again (a chunk shared by many trees is
        decompressed for each, hashed once). Returns the blob's size in bytes.

        Raises:
            MissingObject, DigestMismatch: as for :meth:`get`.
        """
        return self._verify_object(self._fetch([blob_digest], context)[blob_digest], context)

    def verify_many(self, blob_digests: Iterable[str], context: str) -> tuple[dict[str, int], dict[str, OvernightError]]:
        """:meth:`verify` of several blobs, their objects fetched in one store call (chunk windows
        as in :meth:`verify`). Returns ``(size in bytes of each blob that verifies, the error of
        each that does not)``; nothing is raised for one blob, so a damaged object in a batch is
        named and the others are still checked.

        Safe to call from several threads on one reader: it only adds to :attr:`verified`. What
        it spends is decompression and SHA-256, which release the GIL (``verify --all`` runs it
        on a thread pool).
        """
        wanted = list(dict.fromkeys(blob_digests))
        sizes: dict[str, int] = {}
        errors: dict[str, OvernightError] = {}
        try:
            objects = self.store.get_objects(wanted) if wanted else {}
        except OvernightError as exc:  # the batch's read failed (a damaged archive pack): each on its own
            if len(wanted) == 1:
                return sizes, {wanted[0]: exc}
            for d in wanted:
                more_sizes, more_errors = self.verify_many([d], context)
                sizes.update(more_sizes)
                errors.update(more_errors)
            return sizes, errors
        for d in wanted:
            try:
                obj = objects.get(d)
                if obj is None:
                    raise MissingObject(f"object {d} is missing from the store (needed by {context})", object_digest=d)
                sizes[d] = self._verify_object(obj, context)
            except OvernightError as exc:
                errors[d] = exc
        return sizes, errors

    def _verify_object(self, obj: ObjectRecord, context: str) -> int:
        """:meth:`verify` of a fetched object; returns its blob size."""
        verified = self.verified
        blob_digest = obj.digest
        if obj.kind != "tree":
            if blob_digest not in verified:
                self._assemble(obj, context)
                verified.add(blob_digest)
            return obj.size
        chunk_digests, size, index_digest = self._tree_index(obj, context, 0)
        hasher = hashlib.sha256()
        total = 0
        where = f"{context}, blob {obj.digest}"
        cache = self.chunks
        for i in range(0, len(chunk_digests), 256):
            batch = chunk_digests[i : i + 256]
            cached = cache.get_many(batch) if cache is not None else {}
            missing = [cd for cd in dict.fromkeys(batch) if cd not in cached]
            found = self._fetch(missing, where) if missing else {}
            for cd in batch:
                payload = cached.get(cd)
                if payload is None:  # read from the store: verified, and known to be stored intact
                    payload = self._chunk(found[cd], where)
                    if cd not in verified and digest.sha256(payload) != cd:
                        raise DigestMismatch(f"chunk {cd} does not match its content; needed by {where}",
                                             object_digest=cd)
                    verified.add(cd)
                hasher.update(payload)
                total += len(payload)
        if total != size or digest.PREFIX + hasher.hexdigest() != blob_digest:
            raise DigestMismatch(f"blob {blob_digest} does not match its reassembled chunks; needed by {context}",
                                 object_digest=blob_digest)
        if index_digest in verified and all(cd in verified for cd in chunk_digests):
            verified.add(blob_digest)
        return size

    def reachable(self, blob_digest: str, context: str = "a walk", _depth: int = 0) -> list[str]:
        """Every object digest ``blob_digest`` is made of, itself included (for verify and gc).

        Raises:
            MissingObject, DigestMismatch: a tree or chunk index on the way is missing or damaged.
        """
        obj = self._fetch([blob_digest], context)[blob_digest]
        out = [blob_digest]
        if obj.kind == "tree":
            chunk_digests, _, _ = self._tree_index(obj, context, _depth)
            out.extend(self.reachable(loads(self._payload(obj, context))["index"], context, _depth + 1))
            out.extend(dict.fromkeys(chunk_digests))
        return out
