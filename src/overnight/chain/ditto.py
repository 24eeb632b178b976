"""Ditto copies: a second, verified copy of what a lineage depends on most (ZFS keeps its metadata
twice the same way), so one damaged or deleted object no longer ends a whole lineage.

Content addressing stores an unchanged object once: every checkpoint since the start shares it,
and a bit flip in it leaves nothing to fall back to. A commit therefore writes, next to each
*protected* object it stores for the first time, a **copy object** (spec: ``docs/FORMAT.md``,
"Ditto copies"):

* key: :func:`ditto_key` -- ``sha256:<hex>`` of the domain-separated wrapper
  ``b"overnight-ditto-v1\\0" + digest`` (ASCII), so the copy of ``D`` is found from ``D`` alone and
  never collides with an object addressed by its content;
* stored as an ordinary object of kind ``"ditto"``, codec ``"none"``, whose data is one header line
  ``ditto 1 KIND DIGEST CODEC SIZE SIGNATURE\\n`` followed by the original's stored bytes (a
  checkpoint record's copy: kind ``checkpoint``, codec ``none``, the canonical body, and its
  signature or ``-``).

So every backend keeps copies without a schema change, and ``gc`` keeps a copy exactly while its
original is kept (:func:`with_copies`).

Protected (:func:`protected`): the checkpoint record; the state document's object and its chunk
index; every todo/done/artifact page and the world fingerprint, whole (chunks included); each
artifact's tree object and chunk index (not the artifact's data chunks -- user bytes, the bulk of a
store: those are what replicas are for).

A copy is used only after it verified against the digest it stands for: a ``blob`` copy hashes to
it, a ``tree`` copy reassembles to it (the read that uses it checks), a record copy's body hashes to
the checkpoint id (and its signature is checked by the load as usual). A forged or damaged copy is
refused (:class:`Heal` is not produced) and the load fails -- or falls back -- exactly as without
copies.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from typing import Any, Iterable

from overnight.codec import compress, digest
from overnight.errors import CheckpointNotFound, DecodeError, IntegrityError, OvernightError, short_id
from overnight.store.base import CheckpointRow, Commit, ObjectRecord, Store
from overnight.store.blobs import BlobReader, BlobWriter

DOMAIN = b"overnight-ditto-v1\x00"
"""Domain separation of copy keys from content digests."""

KIND = "ditto"
"""The object kind of a copy."""

_MAGIC = b"ditto 1 "


def ditto_key(d: str) -> str:
    """The key a copy of object (or checkpoint) ``d`` is stored under."""
    # a digest is ASCII (the same bytes either way); another client's non-ASCII row gets a key too,
    # so it fails verification by name instead of crashing the check -- and so does a digest cell
    # that is not text at all (SQLite's NotUTF8, bytes): its own bytes
    raw = bytes(d) if isinstance(d, (bytes, bytearray)) else d.encode("utf-8", "surrogatepass")
    return digest.PREFIX + hashlib.sha256(DOMAIN + raw).hexdigest()


def with_copies(digests: Iterable[str]) -> set[str]:
    """``digests`` plus the copy key of each (what gc keeps for a set of live objects and records)."""
    out = set(digests)
    out.update(ditto_key(d) for d in list(out))
    return out


def object_copy(obj: ObjectRecord) -> ObjectRecord:
    """The copy object of a stored ``blob``/``tree`` object."""
    head = _MAGIC + f"{obj.kind} {obj.digest} {obj.codec} {obj.size} -\n".encode("ascii")
    data = head + obj.data
    return ObjectRecord(ditto_key(obj.digest), KIND, len(data), "none", data)


def record_copy(row: CheckpointRow) -> ObjectRecord:
    """The copy object of a checkpoint record (body and signature)."""
    codec, stored = compress.compress(row.body)
    head = _MAGIC + f"checkpoint {row.checkpoint_id} {codec} {len(row.body)} {row.signature or '-'}\n".encode("ascii")
    data = head + stored
    return ObjectRecord(ditto_key(row.checkpoint_id), KIND, len(data), "none", data)


@dataclass(frozen=True)
class Parsed:
    """A copy object's header and the original's stored bytes."""

    kind: str
    digest: str
    codec: str
    size: int
    signature: str | None
    data: bytes


def parse(obj: ObjectRecord) -> Parsed | None:
    """The parsed copy, or None when ``obj`` is not a well-formed copy stored under its right key."""
    if obj.kind != KIND or obj.codec != "none" or len(obj.data) != obj.size:
        return None
    head, sep, data = obj.data.partition(b"\n")
    if not sep or not head.startswith(_MAGIC):
        return None
    try:
        kind, d, codec, size, sig = head[len(_MAGIC):].decode("ascii").split(" ")
        n = int(size)
    except (UnicodeDecodeError, ValueError):
        return None
    if kind not in ("blob", "tree", "checkpoint") or ditto_key(d) != obj.digest or not d.startswith(digest.PREFIX):
        return None
    return Parsed(kind, d, codec, n, None if sig == "-" else sig, data)


def check(obj: ObjectRecord, parsed: Parsed | None = None) -> str | None:
    """Why a stored copy object is not a sound copy (None: it is). Blob and record copies are
    hashed; a tree copy is checked for form only (its use reassembles and hashes it).
    ``parsed``: :func:`parse` of ``obj`` when the caller has it."""
    p = parsed if parsed is not None else parse(obj)
    if p is None:
        return "not a well-formed copy under its key"
    try:
        payload = compress.decompress(p.codec, p.data, p.size)
    except DecodeError as exc:
        return f"does not decode ({exc})"
    if p.kind != "tree" and digest.sha256(payload) != p.digest:
        return f"does not hash to {p.digest}"
    return None


@dataclass(frozen=True)
class Heal:
    """One object (or record) read from its copy because the original was damaged or missing.

    Attributes:
        digest: the original's digest (a checkpoint id for ``what="record"``).
        what: ``"object"`` or ``"record"``.
        reason: what was wrong with the original (``"missing"`` or the failed check).
        written: the original was rewritten from the copy (False: read-only store, a branch head's
            record, or the caller asked not to write).
    """

    digest: str
    what: str
    reason: str
    written: bool

    def describe(self, task_id: str | None = None) -> str:
        """One line for the user; ``task_id`` (the task read) goes into the command that rewrites
        an original left as is."""
        where = "rewritten" if self.written else \
            f"left as is: `overnight verify --repair {shlex.quote(task_id) if task_id else 'TASK_ID'}` rewrites it"
        return f"healed {self.what} {short_id(self.digest)} from its ditto copy ({self.reason}; original {where})"


def _copy_of(store: Store, d: str) -> Parsed | None:
    obj = store.get_objects([ditto_key(d)]).get(ditto_key(d))
    return parse(obj) if obj is not None else None


class CopyReader(BlobReader):
    """A :class:`~overnight.store.blobs.BlobReader` whose :meth:`verify` also takes copy objects,
    checked on their own terms (:func:`check`). It never heals: ``verify --all`` runs its
    :meth:`~overnight.store.blobs.BlobReader.verify_many` on a thread pool and verifies what
    fails there again with a :class:`HealingReader`."""

    def __init__(self, store: Store, verified: set[str] | None = None) -> None:
        super().__init__(store, verified)
        self.copy_of: dict[str, str] = {}
        """Copy key -> the digest it is a copy of, for each copy object this reader verified."""

    def _verify_object(self, obj: ObjectRecord, context: str) -> int:
        if obj.kind != KIND:
            return super()._verify_object(obj, context)
        p = parse(obj)
        problem = check(obj, p)
        if problem is not None:
            raise _bad_copy(obj.digest, problem, context)
        assert p is not None
        self.copy_of[obj.digest] = p.digest
        self.verified.add(obj.digest)
        return obj.size


class HealingReader(CopyReader):
    """A :class:`~overnight.store.blobs.BlobReader` that reads a damaged or missing object from its
    verified copy (and, with ``write_back``, rewrites the original from it). :attr:`healed` lists
    every heal; what it returns is verified exactly as a plain reader's."""

    def __init__(self, store: Store, verified: set[str] | None = None, *, write_back: bool = True) -> None:
        super().__init__(store, verified)
        self.write_back = write_back
        self.healed: list[Heal] = []
        self._override: dict[str, ObjectRecord] = {}
        self._refused: set[str] = set()

    def _fetch(self, digests: list[str], context: str) -> dict[str, ObjectRecord]:
        wanted = [d for d in digests if d not in self._override]
        found = self.store.get_objects(wanted) if wanted else {}
        for d in digests:
            if d in self._override:
                found[d] = self._override[d]
            elif d not in found and self._heal(d, "missing"):
                found[d] = self._override[d]
        return _require(found, digests, context)

    def _heal(self, d: str, reason: str) -> bool:
        """Put the verified copy of ``d`` in place of the original; False when there is none."""
        if d in self._refused or d in self._override:
            return False
        try:
            p = _copy_of(self.store, d)
        except OvernightError:
            p = None
        if p is None or p.kind == "checkpoint":
            self._refused.add(d)
            return False
        obj = ObjectRecord(d, p.kind, p.size, p.codec, p.data)
        if p.kind == "blob":
            try:
                ok = digest.sha256(compress.decompress(p.codec, p.data, p.size)) == d
            except DecodeError:
                ok = False
            if not ok:
                self._refused.add(d)
                return False
        self._override[d] = obj
        self.healed.append(Heal(d, "object", reason, False))
        return True

    def _retry(self, call: Any) -> Any:
        for _ in range(64):
            try:
                return call()
            except IntegrityError as exc:
                d = getattr(exc, "object_digest", None)
                if not isinstance(d, str):  # no digest named (or a damaged cell, not a digest): nothing to heal
                    raise
                if d in self._override:  # the copy itself did not reassemble: refuse it
                    del self._override[d]
                    self._refused.add(d)
                    self.healed = [h for h in self.healed if h.digest != d]
                    raise
                if not self._heal(d, type(exc).__name__):
                    raise
        return call()

    def get(self, blob_digest: str, context: str = "a read", _depth: int = 0) -> bytes:
        out = self._retry(lambda: BlobReader.get(self, blob_digest, context, _depth))
        self._write_back()
        return out

    def reachable_healed(self, blob_digest: str, context: str = "a read") -> list[str]:
        """:meth:`~overnight.store.blobs.BlobReader.reachable` (the objects a blob is made of), a
        missing or damaged object on the way -- the blob, a tree object, a chunk index -- read from
        its verified copy; nothing is written back. Raises what cannot be read even so
        (MissingObject, DigestMismatch)."""
        return self._retry(lambda: BlobReader.reachable(self, blob_digest, context))

    def get_many(self, blob_digests: Iterable[str], context: str = "a read") -> dict[str, bytes]:
        wanted = list(blob_digests)
        out = self._retry(lambda: BlobReader.get_many(self, wanted, context))
        self._write_back()
        return out

    def verify(self, blob_digest: str, context: str) -> int:
        out = self._retry(lambda: CopyReader.verify(self, blob_digest, context))
        self._write_back()
        return out

    def _write_back(self) -> None:
        """Rewrite the healed originals that verified (every object still in the override map was
        used by a read that hashed it)."""
        for i, h in enumerate(self.healed):
            if h.written or h.what != "object" or not self.write_back or h.digest not in self.verified:
                continue
            try:
                self.store.put_objects([self._override[h.digest]])
            except OvernightError:
                continue  # a read-only store: the copy keeps serving reads
            self.healed[i] = Heal(h.digest, h.what, h.reason, True)


def _require(found: dict[str, ObjectRecord], digests: list[str], context: str) -> dict[str, ObjectRecord]:
    from overnight.errors import MissingObject

    for d in digests:
        if d not in found:
            raise MissingObject(f"object {d} is missing from the store (needed by {context})", object_digest=d)
    return found


def _bad_copy(d: str, problem: str, context: str) -> IntegrityError:
    from overnight.errors import DigestMismatch

    return DigestMismatch(f"ditto copy {d} {problem}; found by {context}", object_digest=d)


def get_checkpoint(store: Store, checkpoint_id: str, healed: list[Heal] | None, *, write: bool = True,
                   row: CheckpointRow | None = None) -> CheckpointRow:
    """The stored checkpoint row, or -- when its body does not hash to its id, or it is missing --
    the row rebuilt from its verified copy (body and signature; the index columns are copied from
    the stored row, or left for the load to check against the body). ``healed`` receives a
    :class:`Heal`; None disables healing (a plain read). With ``write``, a missing row is stored
    again from the copy. ``row``: the stored row when the caller listed it already (not read again).

    Raises:
        CheckpointNotFound: no row and no sound copy.
    """
    if row is None:
        try:
            row = store.get_checkpoint(checkpoint_id)
        except CheckpointNotFound:
            if healed is None:
                raise
    if healed is None or (row is not None and digest.sha256(row.body) == checkpoint_id):
        assert row is not None
        return row
    try:
        p = _copy_of(store, checkpoint_id)
    except OvernightError:
        p = None
    body = _record_body(p)
    if body is None:
        if row is None:
            raise CheckpointNotFound(f"checkpoint {short_id(checkpoint_id)} is not in the store",
                                     checkpoint_id=checkpoint_id)
        return row  # the load reports the damage
    if row is not None:
        healed_row = CheckpointRow(**{**_fields(row), "body": body, "signature": p.signature})
        reason = "body does not match its digest"
    else:
        healed_row = _row_from_body(checkpoint_id, body, p.signature)
        reason = "missing"
    written = False
    if row is None and write:
        try:
            store.put_checkpoints([healed_row])
            written = True
        except OvernightError:
            pass
    healed.append(Heal(checkpoint_id, "record", reason, written))
    return healed_row


def body_digest_mismatch(body: bytes, checkpoint_id: str) -> bool:
    return digest.sha256(body) != checkpoint_id


def _record_body(p: Parsed | None) -> bytes | None:
    """A record copy's body when it decodes and hashes to the checkpoint id it names, else None."""
    if p is None or p.kind != "checkpoint":
        return None
    try:
        body = compress.decompress(p.codec, p.data, p.size)
    except DecodeError:
        return None
    return body if digest.sha256(body) == p.digest else None


def _fields(row: CheckpointRow) -> dict[str, Any]:
    return {f: getattr(row, f) for f in CheckpointRow.__dataclass_fields__}


def _row_from_body(cid: str, body: bytes, signature: str | None) -> CheckpointRow:
    """A checkpoint row whose index columns are read from ``body`` (verified against ``cid``)."""
    from overnight.codec.canonical import loads

    rec = loads(body)
    event = rec.get("event") or {}
    session = rec.get("session") or {}
    return CheckpointRow(checkpoint_id=cid, task_id=rec["task_id"], parent_id=rec.get("parent_id"),
                         branch=rec["branch"], seq=rec["seq"], created_at=rec["created_at"],
                         session=session.get("id", "") if isinstance(session, dict) else str(session),
                         event=event.get("kind", ""), step=event.get("step"), body=body, signature=signature,
                         stored_bytes=len(body))


class CopyPolicy:
    """Which copies each commit of one :class:`~overnight.chain.write.ChainWriter` writes.

    * the checkpoint record (zstd-compressed) and the state document when it is one plain blob
      (up to 16 KiB, the usual case): always, so a damaged head heals instead of costing a step
      (a chunked state document's tree object and index are copied as below);
    * the protected parts -- pages and the world fingerprint whole, the state document's and each
      artifact's tree object and chunk index -- **when they become shared**: an object only the
      newest checkpoint references costs one step when damaged (the fallback lands on its parent,
      which does not need it), while an object every later checkpoint shares can end the lineage.
      So a part is copied by the first commit that references it again: from memory when the
      previous commit staged it, else (the first commit of a session) read from the store when no
      copy is there yet.

    The copies are thus the shared, slow-changing metadata (a full done page, an unchanged
    fingerprint, the settled head of a chunk index), not the tail every step rewrites.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: dict[str, ObjectRecord] = {}  # staged by the previous commit, not copied yet
        self._has_copy: set[str] = set()
        self._parts: dict[str, tuple[str, ...]] = {}  # protected root -> its protected parts
        self._settled: set[str] = set()  # artifact roots whose protected parts all have copies
        self._settled_whole: set[str] = set()  # the same for pages and fingerprints (copied whole)
        self._staged: tuple | None = None  # what the last copies() changes, once its commit is stored

    def _protected_parts(self, writer: BlobWriter, root: str, whole: bool) -> tuple[str, ...]:
        parts = writer.parts.get(root)
        if parts is None:
            return self._parts.get(root, (root,))
        if whole:
            out = parts
        elif len(parts) > 1:  # a tree: (itself, *index parts, *chunks)
            out = (parts[0], *writer.parts.get(parts[1], (parts[1],)))
        else:
            out = parts[:1]
        self._parts[root] = out
        return out

    def copies(self, writer: BlobWriter, row: CheckpointRow, *, state: str, whole: Iterable[str],
               artifacts: Iterable[str]) -> list[ObjectRecord]:
        """The copy objects the commit of ``row`` carries (``writer`` holds its staged objects).
        What they change in this policy (which objects have copies) takes effect with
        :meth:`accept`, once the commit is stored: after a failed commit the next one copies
        the same again.

        Args:
            state: the state document's digest.
            whole: page, page list and fingerprint digests (copied with every object they are made of).
            artifacts: artifact and stored user-state value digests (their tree object and chunk
                index); those of a previous commit whose parts all have copies may be left out.
        """
        out = [record_copy(row)]
        refs: set[str] = set()
        whole = [d for d in whole if d not in self._settled_whole]  # a settled one adds no copy
        for d in whole:
            refs.update(self._protected_parts(writer, d, True))
        artifacts = [d for d in artifacts if d not in self._settled]  # a settled one adds no copy
        for d in (state, *artifacts):
            refs.update(self._protected_parts(writer, d, False))
        copied: set[str] = set()
        obj = writer.objects.get(state)
        if obj is not None and obj.kind == "blob" and state not in self._has_copy:  # the state document: always
            out.append(object_copy(writer.objects[state]))
            copied.add(state)
        fresh = {d for d in refs if d in writer.objects}
        reused = refs - fresh - self._has_copy
        for d in sorted(reused & self._pending.keys()):
            out.append(object_copy(self._pending[d]))
            copied.add(d)
        unknown = sorted(reused - self._pending.keys())
        if unknown:  # shared since an earlier session: copy what has no copy yet
            missing = self.store.missing_objects(ditto_key(d) for d in unknown)
            lacking = [d for d in unknown if ditto_key(d) in missing]
            for obj in self.store.get_objects(lacking).values():
                if _sound(obj):
                    out.append(object_copy(obj))
            copied.update(unknown)
        has_copy = self._has_copy
        pending = {d: writer.objects[d] for d in fresh if d not in has_copy and d not in copied}
        settled = [[d for d in roots if all(p in has_copy or p in copied for p in self._parts.get(d, (d,)))]
                   for roots in (whole, artifacts)]
        self._staged = (copied, pending, settled)
        return out

    def accept(self) -> None:
        """The commit of the last :meth:`copies` is stored, with its copies."""
        if self._staged is not None:
            copied, self._pending, (whole, artifacts) = self._staged
            self._has_copy.update(copied)
            self._settled_whole.update(whole)
            self._settled.update(artifacts)
            self._staged = None

    def settled(self, d: str) -> bool:
        """Has every protected part of artifact ``d`` a copy (so no commit copies anything for it)?"""
        return d in self._settled


def _sound(obj: ObjectRecord) -> bool:
    """Does a stored ``blob`` hash to its digest (a ``tree`` is checked when a copy of it is used)?"""
    if obj.kind == "tree":
        return True
    try:
        return obj.kind == "blob" and digest.sha256(compress.decompress(obj.codec, obj.data, obj.size)) == obj.digest
    except DecodeError:
        return False


def rewrite_record(store: Store, heal: Heal, *, is_head: bool) -> Heal:
    """Rewrite a damaged checkpoint row from its verified copy (``verify --repair``): the row and
    its journal rows are deleted and put back with the copy's body and signature. A crash between
    the two steps leaves the row missing, which the next load heals from the same copy.

    A branch head's row is never deleted (the protocol keeps a head; ``delete_checkpoints`` skips
    it): it is committed again instead, on its own branch with itself as the expected head -- the
    ref stays where it is (compare-and-swap: a session that moved the branch meanwhile wins, and
    the row is left), and the store replaces a stored body that does not hash to its id. A head
    only of branches other than its own (a fork not moved on yet) is left; loads keep healing it
    from the copy. Returns the heal, ``written`` when the row now verifies."""
    try:
        p = _copy_of(store, heal.digest)
        body = _record_body(p)
        if p is None or body is None or body_digest_mismatch(body, heal.digest):
            return heal
        if is_head:
            if not _recommit_head(store, heal.digest, body, p.signature):
                return heal
        else:
            row = store.get_checkpoint(heal.digest)
            journal = [j for j in store.journal(row.task_id) if j.checkpoint_id == heal.digest]
            fixed = CheckpointRow(**{**_fields(row), "body": body, "signature": p.signature})
            store.delete_checkpoints([heal.digest], orphans=True)
            store.put_checkpoints([fixed], journal)
        ok = digest.sha256(store.get_checkpoint(heal.digest).body) == heal.digest
    except (OvernightError, KeyError, TypeError, ValueError):  # (a copy's body that is no record)
        return heal
    return Heal(heal.digest, heal.what, heal.reason, ok)


def _replaces_damaged_rows(store: Any) -> bool:
    """Does a commit of ``store`` replace a stored checkpoint row whose body does not hash to its id?
    SQLite and memory stores do -- told by the URL, which the wrappers verify and every command use
    (the prefetching one, a tiered store) share with the store they wrap. The key-value, PostgreSQL
    and replicated stores keep the stored row (the first write wins), so there a head's damaged row
    stays until the branch moves on."""
    return str(getattr(store, "url", "")).startswith(("sqlite://", "memory://"))


def recommittable(store: Store, checkpoint_id: str, body: bytes | None = None) -> bool:
    """Can :func:`rewrite_record` rewrite the damaged row of head ``checkpoint_id``: does the store
    replace a damaged row on commit (:func:`_replaces_damaged_rows`), and is it the head of its own
    branch (read from the verified ``body``, default: its copy's)? False when not, or when the copy
    or the ref cannot be read."""
    if not _replaces_damaged_rows(store):
        return False
    try:
        if body is None:
            body = _record_body(_copy_of(store, checkpoint_id))
            if body is None:
                return False
        from overnight.codec.canonical import loads

        rec = loads(body)
        return store.get_ref(rec["task_id"], rec["branch"]) == checkpoint_id
    except (OvernightError, KeyError, TypeError, ValueError):
        return False


def _recommit_head(store: Store, cid: str, body: bytes, signature: str | None) -> bool:
    """Commit the row of head ``cid`` again from its verified ``body`` (index columns read from
    it, the stored journal rows kept), its branch's ref expected -- and left -- on it. False when
    ``cid`` is not its own branch's head."""
    if not recommittable(store, cid, body):
        return False
    row = _row_from_body(cid, body, signature)
    journal = [j for j in store.journal(row.task_id) if j.checkpoint_id == cid]
    store.commit(Commit(row, cid, [], journal, None, None))
    return True
