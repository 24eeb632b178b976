"""Packs and manifests: how one archive run lays out its data in a cold store (spec:
``docs/FORMAT.md``, "Tiered storage").

A **pack** is one object in the cold store holding every object an archive run moved there. It is
a plain zstd stream: the concatenation of one zstd frame per object, in manifest order, so

* ``zstd -d < pack`` prints the payloads one after the other (any zstd tool reads it);
* one object is read by decompressing the frame at its ``[offset, offset + length)``, without
  touching the rest;
* an object stored with codec ``zstd`` goes in as its stored frame, byte for byte, so restoring it
  gives back exactly the record that was archived; one stored with codec ``none`` (incompressible)
  goes in as a zstd frame of its payload and comes back with codec ``none``.

The pack is stored in the cold store as a ``blob`` object with codec ``none`` (its bytes are the
zstd stream): it is content-addressed like any object, and ``overnight verify --all`` on the cold
store checks it.

A **manifest** says what a pack holds and what was archived: the task, the archived checkpoint
records (whole rows, bodies included, with their journal rows, so ``show`` and ``log`` list
archived history without reading the pack) and one entry per packed object. It is canonical JSON
(sorted keys; bytes as tagged base64), addressed by its SHA-256 -- the archive id -- and stored,
zstd-compressed, in an :class:`~overnight.store.base.ArchiveRow` in both stores.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

import zstandard

from overnight.codec import compress, digest
from overnight.codec.canonical import dumps_sorted, from_tree, loads, to_tree
from overnight.errors import ConfigError, DecodeError, DigestMismatch, FormatTooNew
from overnight.store.base import ArchiveRow, CheckpointRow, JournalRow, ObjectRecord

MANIFEST_FORMAT = 1
LEVEL = 3  # zstd level of the frames written for codec-"none" objects and of the manifest
MAX_MANIFEST_SIZE = 256 * 1024 * 1024
"""The largest manifest (bytes, uncompressed) an archive run writes and a read decompresses. A
manifest holds each archived record whole, about 3 KB a checkpoint with its object entries, so
this is some 80,000 checkpoints in one run; it bounds the memory a read takes whatever a damaged
or forged manifest frame claims or expands to (:func:`~overnight.codec.compress.decompress_frame`)."""

MANIFEST_BYTES_PER = {"containers": 64, "strings": 10, "separators": 8}
"""The fewest manifest bytes (uncompressed) each JSON container (``{``/``[``), string and separator
(``,``/``:``, outside strings) may take, on average: :func:`check_manifest_shape` refuses a manifest
holding more, before it is parsed. Parsing makes a Python object of 28-200 bytes for each of them, and
:func:`~overnight.codec.canonical.from_tree` copies every container again, so without this bound a
manifest within :data:`MAX_MANIFEST_SIZE` of ``{},{},...`` (3 bytes a dict) would take some 50 times its
size in memory -- over 11 GiB for 256 MiB, from a frame of a few KB.

The figures come from the smallest entry :func:`encode_manifest` writes per unit: an object entry
``["sha256:<64 hex>","blob",0,"none",0,0],`` is 96 bytes for 1 container, 3 strings and 6 separators;
a journal row with every string field empty is 217 bytes for 1 container, 16 strings (10 of them
keys) and 20 separators (13.6 bytes a string, 10.9 a separator); a checkpoint row carries its record
in base64 (hundreds of bytes) and ``previous`` 74 bytes a string. The bounds sit below those minima
(1.3 to 1.5 times), so every manifest an archive run writes passes, whatever the user's strings hold
(only what lies outside strings is counted: a step name may be ``f[xs=[[], [], ...]]``), and a
manifest at the bound costs about what a legitimate one of the same size does. Measured peak memory
of reading a manifest (Python 3.11), in times its size: legitimate ones 4-7 (5.1 for 196 MiB of a
real archive's mix, 6.8 for object entries alone); forged ones at the bound 5-9 (short strings the
most, ``{"a":0}`` dicts 7), 13 for a tagged ``set`` of distinct ints
(:func:`~overnight.codec.canonical.from_tree` builds the set besides its list); forged ones over it
1-1.3 (the bytes themselves), where before this bound 32 MiB of ``{},{},...`` took 49 and of
``"ab","ab",...`` 17."""
MANIFEST_SHAPE_SLACK = 256
"""Containers, strings and separators a manifest may hold beyond :data:`MANIFEST_BYTES_PER`: its
fixed part (the top-level members, ``pack``, ``policy``), which a small manifest does not amortize."""
_SHAPE_PIECE = 256 * 1024  # bytes of a manifest whose strings are blanked at a time: bounds that copy
_STRING = re.compile(rb'"[^"]*"')
_UNCOUNTED = bytes(b for b in range(256) if b not in b'"{[,:')  # deleted from a piece before it is searched


@dataclass(frozen=True)
class PackEntry:
    """One object in a pack.

    Attributes:
        digest, kind, size: as in :class:`~overnight.store.base.ObjectRecord` (``size``: payload bytes).
        codec: the codec the object was stored with in the hot store (restored the same way).
        offset, length: where its zstd frame lies in the pack, in bytes.
    """

    digest: str
    kind: str
    size: int
    codec: str
    offset: int
    length: int


@dataclass
class Manifest:
    """What one archive run moved to a cold store.

    Attributes:
        task_id: the task.
        created_at: RFC 3339 UTC time of the run.
        source: URL of the hot store the data came from.
        pack: ``{"digest", "size"}`` of the pack object in the cold store (``size`` in bytes);
            None when the run moved only checkpoint records (all their objects were already in
            earlier packs of the same cold store).
        policy: the retention policy of the run (``{"keep_last": N}`` or ``{"older_than_s": S}``).
        checkpoints: the archived records, as stored.
        journal: their journal rows.
        objects: the packed objects.
        previous: archive ids of earlier runs (same task, same cold store) whose packs hold the
            other objects these checkpoints need.
    """

    task_id: str
    created_at: str
    source: str
    pack: dict[str, Any] | None
    policy: dict[str, Any]
    checkpoints: list[CheckpointRow] = field(default_factory=list)
    journal: list[JournalRow] = field(default_factory=list)
    objects: list[PackEntry] = field(default_factory=list)
    previous: list[str] = field(default_factory=list)


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=LEVEL, write_content_size=True)


def build_pack(objects: Iterable[ObjectRecord]) -> tuple[bytes, list[PackEntry]]:
    """The pack bytes for ``objects`` (each digest once) and their entries."""
    cctx = _compressor()
    parts: list[bytes] = []
    entries: list[PackEntry] = []
    offset = 0
    seen: set[str] = set()
    for o in objects:
        if o.digest in seen:
            continue
        seen.add(o.digest)
        frame = o.data if o.codec == "zstd" else cctx.compress(o.data)
        parts.append(frame)
        entries.append(PackEntry(o.digest, o.kind, o.size, o.codec, offset, len(frame)))
        offset += len(frame)
    return b"".join(parts), entries


def read_entry(pack: bytes, entry: PackEntry) -> ObjectRecord:
    """The object record ``entry`` names, as it was stored in the hot store.

    Raises:
        DigestMismatch: the frame is cut short or is not a zstd frame of ``entry.size`` bytes (the
            object's own digest is checked by whoever reads it, like any object).
    """
    frame = pack[entry.offset : entry.offset + entry.length]
    if len(frame) != entry.length:
        raise DigestMismatch(f"pack entry {entry.digest} lies outside the pack", object_digest=entry.digest)
    if entry.codec == "zstd":
        return ObjectRecord(entry.digest, entry.kind, entry.size, "zstd", frame)
    try:  # bounded by the entry's size, as any object (a frame's own size claim is not trusted)
        payload = compress.decompress("zstd", frame, entry.size)
    except DecodeError as exc:
        raise DigestMismatch(f"pack entry {entry.digest} is not a zstd frame of its {entry.size!r} bytes "
                             f"({exc.message})", object_digest=entry.digest) from exc
    return ObjectRecord(entry.digest, entry.kind, entry.size, "none", payload)


_ROW_FIELDS = ("checkpoint_id", "task_id", "parent_id", "branch", "seq", "created_at", "session", "event", "step",
               "body", "signature", "stored_bytes")
_JOURNAL_FIELDS = ("task_id", "checkpoint_id", "seq", "step_key", "step_name", "session", "started_at",
                   "duration_ms", "tokens_in", "tokens_out")
_ENTRY_FIELDS = ("digest", "kind", "size", "codec", "offset", "length")


def encode_manifest(m: Manifest) -> bytes:
    """Canonical bytes of a manifest (its SHA-256 is the archive id)."""
    tree = {
        "format": MANIFEST_FORMAT,
        "kind": "overnight-archive",
        "task_id": m.task_id,
        "created_at": m.created_at,
        "source": m.source,
        "pack": m.pack,
        "policy": m.policy,
        "checkpoints": [{f: getattr(r, f) for f in _ROW_FIELDS} for r in m.checkpoints],
        "journal": [{f: getattr(j, f) for f in _JOURNAL_FIELDS} for j in m.journal],
        "objects": [[getattr(e, f) for f in _ENTRY_FIELDS] for e in m.objects],
        "previous": m.previous,
    }
    return dumps_sorted(to_tree(tree, "manifest"))


def check_manifest_shape(data: bytes, what: str = "archive manifest") -> None:
    """Refuse manifest bytes a parse could turn into far more memory than a manifest
    :func:`encode_manifest` writes of the same size (see :data:`MANIFEST_BYTES_PER`). It counts at C
    speed, before anything is parsed (about 0.5 s for 32 MiB, a tenth of the parse), holding at
    most one copy of ``data`` (without its escapes) and a :data:`_SHAPE_PIECE` besides.

    Raises:
        DecodeError: ``data`` is not ASCII (a manifest is canonical JSON), or holds more containers,
            strings or separators than its size allows; the message names ``what`` and the count.
    """
    if not data.isascii():
        raise DecodeError(f"{what} is not ASCII JSON, as every manifest overnight writes")
    counts = _shape(data)
    for unit, count in counts.items():
        allowed = MANIFEST_SHAPE_SLACK + len(data) // MANIFEST_BYTES_PER[unit]
        if count > allowed:
            raise DecodeError(f"{what} holds {count} JSON {unit} in {len(data)} bytes, more than the {allowed} any "
                              f"manifest overnight writes holds (at least {MANIFEST_BYTES_PER[unit]} bytes each)")


def _shape(data: bytes) -> dict[str, int]:
    """``{"containers", "strings", "separators"}`` of the JSON ``data``: its ``{``/``[``, its strings
    (keys too) and its ``,``/``:``, counting only what lies outside strings (exact up to the first
    syntax error, where a parse stops too). Strings are blanked :data:`_SHAPE_PIECE` bytes at a time."""
    bare = data
    if b"\\" in data:  # escapes gone (backslash pairs first): every quote left opens or closes a string
        bare = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    counts = {"containers": 0, "strings": (bare.count(b'"') + 1) // 2, "separators": 0}  # an unclosed one too
    inside = False
    for at in range(0, len(bare), _SHAPE_PIECE):
        piece = bare[at : at + _SHAPE_PIECE].translate(None, _UNCOUNTED)
        piece = b'"' + piece if inside else piece
        inside = piece.count(b'"') % 2 == 1  # the piece ends inside a string: it is closed here, reopened next
        outside = _STRING.sub(b"", piece + b'"' if inside else piece)
        counts["containers"] += outside.count(b"{") + outside.count(b"[")
        counts["separators"] += outside.count(b",") + outside.count(b":")
    return counts


def decode_manifest(data: bytes, where: str = "archive manifest") -> Manifest:
    """Parse manifest bytes, once :func:`check_manifest_shape` has bounded what the parse takes.

    Raises:
        FormatTooNew: written by a newer overnight.
        DecodeError: not a manifest (or one :func:`check_manifest_shape` refuses).
    """
    check_manifest_shape(data, where)
    return _parse_manifest(data, where)


def _parse_manifest(data: bytes, where: str) -> Manifest:
    """:func:`decode_manifest` of bytes :func:`check_manifest_shape` accepted (ASCII: decoded as such,
    so the parser never guesses another encoding than the one counted)."""
    try:
        tree = from_tree(loads(data.decode("ascii")), "manifest")
        if not isinstance(tree, dict) or tree.get("kind") != "overnight-archive":
            raise DecodeError(f"{where} is not an overnight archive manifest")
        if not isinstance(tree.get("format"), int) or tree["format"] > MANIFEST_FORMAT:
            raise FormatTooNew(f"{where} has format {tree.get('format')!r}, written by a newer overnight "
                               f"(this one reads up to {MANIFEST_FORMAT})", hint="upgrade overnight")
        return Manifest(
            task_id=tree["task_id"], created_at=tree["created_at"], source=tree["source"], pack=tree["pack"],
            policy=tree["policy"],
            checkpoints=[CheckpointRow(**{f: r[f] for f in _ROW_FIELDS}) for r in tree["checkpoints"]],
            journal=[JournalRow(**{f: j[f] for f in _JOURNAL_FIELDS}) for j in tree["journal"]],
            objects=[PackEntry(*e) for e in tree["objects"]],
            previous=list(tree["previous"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(f"{where} is malformed ({exc})") from exc


def archive_row(m: Manifest, location: str) -> ArchiveRow:
    """The catalog row for a manifest; ``location`` names the other store (see :class:`ArchiveRow`).

    Raises:
        ConfigError: the manifest is larger than :data:`MAX_MANIFEST_SIZE`, so no read would
            accept it (the hint says to archive the task in several runs); or
            :func:`check_manifest_shape` refuses it, which no manifest should (the bound's figures
            would be wrong): refused here rather than written and then unreadable.
    """
    data = encode_manifest(m)
    if len(data) > MAX_MANIFEST_SIZE:
        raise ConfigError(f"the archive of {len(m.checkpoints)} checkpoints of task {m.task_id!r} needs a manifest of "
                          f"{len(data)} bytes, more than the {MAX_MANIFEST_SIZE} one archive run may write",
                          task_id=m.task_id, hint="archive the oldest history first, in several runs: a larger "
                          "--keep-last (or a longer --older-than), then the one you want")
    try:
        check_manifest_shape(data, f"the manifest of the archive of task {m.task_id!r}")
    except DecodeError as exc:
        raise ConfigError(f"{exc.message}: no read would accept it, so nothing was archived", task_id=m.task_id,
                          hint="this is a bug in overnight's manifest bounds (MANIFEST_BYTES_PER): please "
                          "report it") from exc
    return ArchiveRow(digest.sha256(data), m.task_id, m.created_at, location, _compressor().compress(data))


def manifest_of(row: ArchiveRow) -> Manifest:
    """The manifest of a catalog row, checked against its archive id. Its frame is decompressed
    within :data:`MAX_MANIFEST_SIZE` (:func:`~overnight.codec.compress.decompress_frame`): a frame
    claiming or expanding to more is refused before that much memory is taken; and it is parsed
    only once :func:`check_manifest_shape` has bounded what the parse takes.

    Raises:
        DigestMismatch: the manifest is not a zstd frame, is larger than :data:`MAX_MANIFEST_SIZE`,
            does not hash to the archive id, or holds more JSON values than its size allows
            (damaged or forged); the message names the archive.
        FormatTooNew / DecodeError: see :func:`decode_manifest`.
    """
    where = f"archive {row.archive_id} of task {row.task_id!r}"
    try:
        data = compress.decompress_frame(row.manifest, MAX_MANIFEST_SIZE, "its manifest")
    except DecodeError as exc:
        raise _damaged(row, where, exc) from exc
    if digest.sha256(data) != row.archive_id:
        raise DigestMismatch(f"archive {row.archive_id} of task {row.task_id!r}: manifest does not match its id",
                             task_id=row.task_id, object_digest=row.archive_id)
    try:
        check_manifest_shape(data, "its manifest")
    except DecodeError as exc:
        raise _damaged(row, where, exc) from exc
    return _parse_manifest(data, where)


def _damaged(row: ArchiveRow, where: str, exc: DecodeError) -> DigestMismatch:
    """The error of an archive row whose manifest cannot be read safely (see :func:`manifest_of`)."""
    return DigestMismatch(f"{where}: {exc.message}", task_id=row.task_id, object_digest=row.archive_id,
                          hint="this archive row is damaged or forged; where the other store of the archive (the "
                          "cold store, or the hot catalog) holds a sound copy, `overnight restore TASK --cold "
                          "URL` reads it from there")
