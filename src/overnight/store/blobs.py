"""Blobs on top of a store's objects: content addressing, chunk trees, compression, verified reads.

A blob is addressed by ``sha256:<hex>`` of its bytes. Small blobs (<= 16 KiB) are one ``blob``
object. Larger ones are cut by FastCDC (:mod:`overnight.codec.chunking`) into chunks, each a
``blob`` object, and stored as a ``tree`` object under the blob's digest whose payload names the
*chunk index* -- the concatenated 32-byte chunk digests -- which is itself a blob (and chunked in
turn when large). An append to a 500 KB artifact therefore stores one or two new chunks and the
tail of the index, not 500 KB (the O(N²) growth of full-snapshot checkpointers is avoided).

Every read re-hashes what it returns: a chunk that does not match its digest, a tree whose
reassembled bytes do not, or a missing object raises an :class:`~overnight.errors.IntegrityError`.
"""

from __future__ import annotations

from typing import Iterable

from overnight.codec import chunking, compress, digest
from overnight.codec.canonical import dumps_sorted, loads
from overnight.errors import DecodeError, DigestMismatch, MissingObject
from overnight.store.base import ObjectRecord, Store


class BlobWriter:
    """Stages the new objects of one commit.

    ``put`` returns the blob digest at once; :attr:`objects` holds only objects the store does not
    have yet (checked in one batched query per ``put``), ready for :class:`~overnight.store.base.Commit`.

    Args:
        store: where to look up what already exists.
        known: digests known to be stored already (a per-run cache, shared across commits).
    """

    def __init__(self, store: Store, known: set[str] | None = None) -> None:
        self.store = store
        self.known = known if known is not None else set()
        self.objects: dict[str, ObjectRecord] = {}

    def _have(self, digests: Iterable[str]) -> set[str]:
        todo = [d for d in digests if d not in self.known and d not in self.objects]
        if not todo:
            return set(digests)
        missing = self.store.missing_objects(todo)
        self.known.update(d for d in todo if d not in missing)
        return {d for d in digests if d not in missing}

    def _stage(self, d: str, kind: str, payload: bytes) -> None:
        codec, data = compress.compress(payload)
        self.objects[d] = ObjectRecord(d, kind, len(payload), codec, data)

    def put(self, data: bytes | bytearray | memoryview, *, _index: bool = False) -> str:
        """Stage ``data`` as a blob; returns its ``sha256:<hex>`` digest."""
        data = bytes(data)
        d = digest.sha256(data)
        if d in self.objects or d in self.known:
            return d
        if len(data) <= chunking.inline_limit(_index):
            # small: no existence query; the store's INSERT OR IGNORE deduplicates
            self._stage(d, "blob", data)
            return d
        if d in self._have([d]):
            return d
        chunks = chunking.cut(data, index=_index)
        chunk_digests = [digest.sha256(c) for c in chunks]
        present = self._have(chunk_digests)
        for c, cd in zip(chunks, chunk_digests):
            if cd not in present and cd not in self.objects:
                self._stage(cd, "blob", bytes(c))
        index = b"".join(digest.raw(cd) for cd in chunk_digests)
        index_digest = self.put(index, _index=True)
        payload = dumps_sorted({"chunks": len(chunks), "index": index_digest, "size": len(data)})
        self._stage(d, "tree", payload)
        return d


class BlobReader:
    """Reads and verifies blobs. Raises :class:`MissingObject` / :class:`DigestMismatch`.

    Args:
        store: where objects live.
        context: text naming what is being read (``"checkpoint 1a2b3c… state"``), used in errors.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def _fetch(self, digests: list[str], context: str) -> dict[str, ObjectRecord]:
        found = self.store.get_objects(digests)
        for d in digests:
            if d not in found:
                raise MissingObject(f"object {d} is missing from the store (needed by {context})")
        return found

    def _payload(self, obj: ObjectRecord, context: str) -> bytes:
        try:
            return compress.decompress(obj.codec, obj.data, obj.size)
        except DecodeError as exc:
            raise DigestMismatch(f"object {obj.digest} is corrupt ({exc}); needed by {context}") from exc

    def get(self, blob_digest: str, context: str = "a read") -> bytes:
        """The verified bytes of a blob."""
        obj = self._fetch([blob_digest], context)[blob_digest]
        return self._assemble(obj, context)

    def _assemble(self, obj: ObjectRecord, context: str) -> bytes:
        payload = self._payload(obj, context)
        if obj.kind == "blob":
            data = payload
        elif obj.kind == "tree":
            try:
                tree = loads(payload)
                index_digest, n_chunks, size = tree["index"], tree["chunks"], tree["size"]
            except (DecodeError, KeyError, TypeError) as exc:
                raise DigestMismatch(f"chunk tree {obj.digest} is malformed ({exc}); needed by {context}") from exc
            index = self.get(index_digest, context)
            if len(index) != 32 * n_chunks:
                raise DigestMismatch(f"chunk index of {obj.digest} lists {len(index) // 32} chunks, expected {n_chunks}")
            chunk_digests = [digest.from_raw(index[i : i + 32]) for i in range(0, len(index), 32)]
            chunks = self._fetch(list(dict.fromkeys(chunk_digests)), f"{context}, blob {obj.digest}")
            parts = []
            for cd in chunk_digests:
                part = self._assemble(chunks[cd], f"{context}, blob {obj.digest}")
                parts.append(part)
            data = b"".join(parts)
            if len(data) != size:
                raise DigestMismatch(f"blob {obj.digest} reassembled to {len(data)} bytes, expected {size}")
        else:
            raise DigestMismatch(f"object {obj.digest} has unknown kind {obj.kind!r}; needed by {context}")
        if digest.sha256(data) != obj.digest:
            raise DigestMismatch(f"object {obj.digest} does not match its content; needed by {context}")
        return data

    def reachable(self, blob_digest: str, context: str = "a walk") -> list[str]:
        """Every object digest ``blob_digest`` is made of, itself included (for verify and gc)."""
        obj = self._fetch([blob_digest], context)[blob_digest]
        out = [blob_digest]
        if obj.kind == "tree":
            tree = loads(self._payload(obj, context))
            out.extend(self.reachable(tree["index"], context))
            index = self.get(tree["index"], context)
            out.extend(dict.fromkeys(digest.from_raw(index[i : i + 32]) for i in range(0, len(index), 32)))
        return out
