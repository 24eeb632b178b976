"""The key layout and record encoding shared by the key-value backends (``file://``, ``s3://``).

Both backends keep the same records as the SQLite store (spec: ``docs/FORMAT.md``), one record
per key instead of one row per table. This module is the single place that says which key holds
what and how a record is laid out in bytes:

======================================  ==========================================================
key                                     record
======================================  ==========================================================
``overnight.json``                      store marker ``{"kind": "overnight-store", "layout": 1}``
``objects/<hex[:2]>/<hex[2:]>``         an object: header line + stored bytes (``data``)
``checkpoints/<hex[:2]>/<hex[2:]>``     a checkpoint: header line (index columns, signature,
                                        stored_bytes, journal rows) + ``body``
``tasks/<T>/task``                      a task registration: header line + ``spec``
``tasks/<T>/checkpoints/<C>``           the checkpoint id: "checkpoint C is committed on task T"
``tasks/<T>/refs/<B>``                  a ref: canonical JSON (``checkpoint_id`` null = no branch)
``tasks/<T>/leases/<B>``                a lease: canonical JSON
``archives/<T>/<A>``                    an archive catalog row: header line + manifest (layout 2)
======================================  ==========================================================

``<T>`` and ``<B>`` are task ids and branch names encoded by :func:`name` (lowercase letters,
digits, ``.``, ``_``, ``-`` kept; every other byte of the UTF-8 as ``%XX``; names longer than
:data:`MAX_NAME` as ``~`` + SHA-256), so any string -- ``/``, ``..``, U+0000, lone surrogates,
upper case on a case-insensitive share -- maps to one safe path component, injectively. The real
names are always read back from the records, never decoded from keys.

Layout 2 (this code) adds ``archives/`` and one rule: a write of an object that exists refreshes
its modification time (the object's *stored time*, which ``gc`` reads). A layout-1 store is
upgraded when opened (its marker is rewritten); older overnight versions then refuse it.

A *header line* is canonical JSON (``overnight.codec.canonical``: ASCII, sorted keys, exact for
every string) followed by ``\\n``; the raw bytes follow it. ``tail -n +2 FILE`` prints them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

from overnight.codec.canonical import dumps_sorted, from_tree, loads, to_tree
from overnight.codec.compress import MAX_SIZE
from overnight.errors import DecodeError
from overnight.store.base import ArchiveRow, CallRecord, CheckpointRow, JournalRow, Lease, ObjectRecord, TaskRow

LAYOUT_VERSION = 2
META_KEY = "overnight.json"
MAX_NAME = 120  # encoded bytes; longer names are hashed (file systems allow 255 per component)

MAX_KEY_BYTES = MAX_SIZE + (1 << 20)
"""The largest value a key-value store writes under one key (an object of
:data:`~overnight.codec.compress.MAX_SIZE` bytes compressed, with room for zstd's frame and the
header; every other record is smaller). A larger file or S3 object was planted (a sparse 4 GB file
costs no disk): both containers check the size *before* reading and read it as :data:`DAMAGED`,
never as an allocation of its size."""

DAMAGED = b'{"overnight":"a symbolic link, special file or oversized key in the store, not read: damage"}\n'
"""What a container returns for a key it refuses to read -- a symbolic link or special file
(``file://``), a value larger than :data:`MAX_KEY_BYTES` (``file://`` and ``s3://``): bytes no record
decoder accepts, so the key is damage like one that does not parse -- a ref or task record raises
StoreCorrupt naming its key, a checkpoint record is skipped (the load falls back, ``verify`` reports
it), an object reads as kind ``"unreadable"`` and is healed by the next write of it."""

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789._-")


def name(text: str) -> str:
    """One path component for any string: injective, case-insensitive-safe, never ``.``/``..``.

    >>> name("main"), name("Main"), name("a/b"), name("..")
    ('main', '%4Dain', 'a%2Fb', '%2E.')
    """
    raw = text.encode("utf-8", "surrogatepass")
    out = []
    for i, byte in enumerate(raw):
        if byte in _SAFE and not (i == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    encoded = "".join(out) or "%"  # the empty string: "%" alone is never produced otherwise
    if len(encoded) > MAX_NAME:
        return "~" + hashlib.sha256(raw).hexdigest()
    return encoded


def unname(encoded: str) -> str:
    """The string :func:`name` encoded (not for hashed names, which start with ``~``).

    Raises:
        DecodeError: ``encoded`` is no name :func:`name` writes (a file planted in the store: a
            ``%`` not followed by two hex digits, a character that is not ASCII).
    """
    if encoded == "%":
        return ""
    out = bytearray()
    i = 0
    try:
        while i < len(encoded):
            if encoded[i] == "%":
                pair = encoded[i + 1 : i + 3]
                if len(pair) != 2 or not all(c in "0123456789abcdefABCDEF" for c in pair):
                    raise DecodeError(f"{encoded[:80]!r} is not an encoded name ('%' followed by {pair!r})")
                out.append(int(pair, 16))
                i += 3
            else:
                out.extend(encoded[i].encode("ascii"))
                i += 1
        return out.decode("utf-8", "surrogatepass")
    except (ValueError, UnicodeError) as exc:
        raise DecodeError(f"{encoded[:80]!r} is not an encoded name ({exc})") from None


def _digest_key(folder: str, digest: str) -> str:
    if _DIGEST.match(digest):
        hexpart = digest[7:]
        return f"{folder}/{hexpart[:2]}/{hexpart[2:]}"
    return f"{folder}/_/{name(digest)}"  # not a sha256 digest: still stored, under its encoded name


def object_key(digest: str) -> str:
    return _digest_key("objects", digest)


def checkpoint_key(checkpoint_id: str) -> str:
    return _digest_key("checkpoints", checkpoint_id)


def checkpoint_id_of_key(key: str) -> str | None:
    """The checkpoint id stored under ``key`` (:func:`checkpoint_key`), None for a key no
    checkpoint is stored under (a planted name)."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "checkpoints":
        return None
    if parts[1] == "_":
        try:
            cid = unname(parts[2])
        except DecodeError:
            return None
        return cid if checkpoint_key(cid) == key else None
    cid = f"sha256:{parts[1]}{parts[2]}"
    return cid if _DIGEST.match(cid) else None


def task_dir(task_id: str) -> str:
    return f"tasks/{name(task_id)}"


def task_key(task_id: str) -> str:
    return f"{task_dir(task_id)}/task"


def index_dir(task_id: str) -> str:
    return f"{task_dir(task_id)}/checkpoints"


def index_key(task_id: str, checkpoint_id: str) -> str:
    return f"{index_dir(task_id)}/{name(checkpoint_id)}"


def refs_dir(task_id: str) -> str:
    return f"{task_dir(task_id)}/refs"


def ref_key(task_id: str, branch: str) -> str:
    return f"{refs_dir(task_id)}/{name(branch)}"


def lease_key(task_id: str, branch: str) -> str:
    return f"{task_dir(task_id)}/leases/{name(branch)}"


def calls_dir(task_id: str) -> str:
    return f"{task_dir(task_id)}/calls"


def call_key(call: CallRecord) -> str:
    """``tasks/<task>/calls/<step key>/<seq>-<request digest>`` (seq zero-padded: listed in order)."""
    return f"{calls_dir(call.task_id)}/{name(call.step_key)}/{call.seq:08d}-{name(call.request_digest)}"


_CALL_FIELDS = ("task_id", "step_key", "seq", "request_digest", "model", "tokens_in", "tokens_out", "latency_ms",
                "created_at")


def encode_call(call: CallRecord) -> bytes:
    return _with_header({f: getattr(call, f) for f in _CALL_FIELDS}, call.response)


def decode_call(data: bytes) -> CallRecord:
    try:
        head, payload = _split(data)
        call = CallRecord(**{f: head[f] for f in _CALL_FIELDS}, response=payload)
    except (KeyError, TypeError) as exc:
        raise DecodeError(f"call record is malformed ({exc})") from exc
    return _checked("call", call, _CALL_TYPES)
ARCHIVES = "archives"


def archive_dir(task_id: str) -> str:
    return f"{ARCHIVES}/{name(task_id)}"


def archive_key(task_id: str, archive_id: str) -> str:
    return f"{archive_dir(task_id)}/{name(archive_id)}"


def digest_of_object_key(key: str) -> str | None:
    """The digest stored under ``objects/<hex[:2]>/<hex[2:]>`` (None for any other key)."""
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "objects" and len(parts[1]) == 2 and len(parts[2]) == 62:
        return f"sha256:{parts[1]}{parts[2]}"
    return None


# -- records ------------------------------------------------------------------------------------

# -- records with members of the wrong type -------------------------------------------------------
#
# Every decoder below checks that a record parses, has its members, and what the members hold. A
# record another program (or damage) left with a member of the
# wrong type -- a checkpoint header whose ``seq`` is ``"2"`` or whose ``checkpoint_id`` is a number,
# a ref whose ``checkpoint_id`` or ``branch`` is not a string, an object claiming 2**70 bytes -- must
# not reach code that relies on the types of the store protocol: a text ``seq`` breaks every sort of
# a task's history, a number where an id belongs every lookup. So each decoder checks the type (and,
# for integers, the range) of every member, and a record that fails is a DecodeError like one whose
# header does not parse; the key-value stores (file://, s3://) then treat it so: a checkpoint record is unreadable (skipped by listings, not
# found by id, so a load falls back past it and verification reports it), a ref or task record
# raises StoreCorrupt naming its key, an object comes back with kind ``"unreadable"`` (which blob
# verification reports as corrupt), a lease, call or archive record is ignored as a garbled one is.

_NONE = type(None)
_TEXT: tuple[type, ...] = (str,)
_OPT_TEXT: tuple[type, ...] = (str, _NONE)
_INT: tuple[type, ...] = (int,)
_NUMBER: tuple[type, ...] = (int, float)
_BYTES: tuple[type, ...] = (bytes,)
_WANTED = {_TEXT: "a string", _OPT_TEXT: "a string or null", _INT: "an integer", _NUMBER: "a number",
           _BYTES: "bytes"}
_INT64 = 2**63
"""Every integer member lies in ``[-2**63, 2**63)``: what SQLite and PostgreSQL hold, so a record
a store returns can be copied to any other medium (repair, replicas)."""

_Fields = tuple[tuple[str, tuple[type, ...]], ...]
_CHECKPOINT_TYPES: _Fields = (
    ("checkpoint_id", _TEXT), ("task_id", _TEXT), ("parent_id", _OPT_TEXT), ("branch", _TEXT), ("seq", _INT),
    ("created_at", _TEXT), ("session", _TEXT), ("event", _TEXT), ("step", _OPT_TEXT), ("body", _BYTES),
    ("signature", _OPT_TEXT), ("stored_bytes", _INT))
_JOURNAL_TYPES: _Fields = (
    ("task_id", _TEXT), ("checkpoint_id", _TEXT), ("seq", _INT), ("step_key", _TEXT), ("step_name", _TEXT),
    ("session", _TEXT), ("started_at", _TEXT), ("duration_ms", _NUMBER), ("tokens_in", _INT), ("tokens_out", _INT))
_TASK_TYPES: _Fields = (("task_id", _TEXT), ("created_at", _TEXT), ("goal", _TEXT), ("entry", _OPT_TEXT),
                         ("spec", _BYTES))
_REF_TYPES: _Fields = (("task_id", _TEXT), ("branch", _TEXT), ("checkpoint_id", _OPT_TEXT), ("fence", _INT))
_LEASE_TYPES: _Fields = (("task_id", _TEXT), ("branch", _TEXT), ("holder_id", _TEXT), ("holder", _TEXT),
                          ("token", _INT), ("expires_at_ms", _INT))
_CALL_TYPES: _Fields = (
    ("task_id", _TEXT), ("step_key", _TEXT), ("seq", _INT), ("request_digest", _TEXT), ("model", _TEXT),
    ("response", _BYTES), ("tokens_in", _INT), ("tokens_out", _INT), ("latency_ms", _NUMBER), ("created_at", _TEXT))
_ARCHIVE_TYPES: _Fields = (("archive_id", _TEXT), ("task_id", _TEXT), ("created_at", _TEXT), ("location", _TEXT),
                            ("manifest", _BYTES))


def _wrong_members(get: Callable[[str], Any], fields: _Fields) -> list[str]:
    """What is wrong with the members ``get(name)`` returns for each of ``fields`` (``(name,
    accepted types)``; exact types: a ``bool`` is not an integer): ``["seq is str, not an
    integer"]``, or ``[]``."""
    bad = []
    for name, types in fields:
        value = get(name)
        if type(value) not in types:
            bad.append(f"{name} is {type(value).__name__}, not {_WANTED[types]}")
        elif type(value) is int and not -_INT64 <= value < _INT64:
            bad.append(f"{name} {value} is out of range")
    return bad


def _checked(what: str, record: Any, fields: _Fields) -> Any:
    """``record``, or DecodeError when an attribute of it named in ``fields`` has the wrong type."""
    bad = _wrong_members(lambda name: getattr(record, name), fields)
    if bad:
        raise DecodeError(f"{what} record has members of the wrong type: {'; '.join(bad)}")
    return record




def _json(fields: dict[str, Any]) -> bytes:
    return dumps_sorted(to_tree(fields, "record"))


def _unjson(data: bytes) -> dict[str, Any]:
    tree = from_tree(loads(data), "record")
    if not isinstance(tree, dict):
        raise DecodeError("record is not a JSON object")
    return tree


def _with_header(fields: dict[str, Any], payload: bytes) -> bytes:
    return _json(fields) + b"\n" + payload


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    head, sep, payload = data.partition(b"\n")
    if not sep:
        raise DecodeError("record has no header line")
    return _unjson(head), payload


def encode_meta() -> bytes:
    return _json({"kind": "overnight-store", "layout": LAYOUT_VERSION})


def decode_meta(data: bytes) -> dict[str, Any]:
    meta = _unjson(data)
    if meta.get("kind") != "overnight-store" or not isinstance(meta.get("layout"), int):
        raise DecodeError(f"not an overnight store marker: {meta!r}")
    return meta


def encode_object(obj: ObjectRecord) -> bytes:
    return _with_header({"codec": obj.codec, "kind": obj.kind, "size": obj.size}, obj.data)


def decode_object(digest: str, data: bytes) -> ObjectRecord:
    """The object stored under ``digest``. A record whose header cannot be read comes back with
    kind ``"unreadable"``, which blob verification reports as corrupt (never loaded)."""
    try:
        head, payload = _split(data)
        size = head["size"]
        if type(size) is int and 0 <= size < _INT64:  # a byte count, never 2**70 to allocate
            return ObjectRecord(digest, str(head["kind"]), size, str(head["codec"]), payload)
    except (DecodeError, KeyError, TypeError):
        pass
    return ObjectRecord(digest, "unreadable", len(data), "none", data)


_JOURNAL_FIELDS = ("task_id", "checkpoint_id", "seq", "step_key", "step_name", "session", "started_at",
                   "duration_ms", "tokens_in", "tokens_out")


def encode_checkpoint(row: CheckpointRow, stored_bytes: int, journal: list[JournalRow]) -> bytes:
    head = {
        "checkpoint_id": row.checkpoint_id, "task_id": row.task_id, "parent_id": row.parent_id,
        "branch": row.branch, "seq": row.seq, "created_at": row.created_at, "session": row.session,
        "event": row.event, "step": row.step, "signature": row.signature, "stored_bytes": stored_bytes,
        "journal": [{f: getattr(j, f) for f in _JOURNAL_FIELDS} for j in journal],
    }
    return _with_header(head, row.body)


def decode_checkpoint(data: bytes) -> tuple[CheckpointRow, list[JournalRow]]:
    """Raises :class:`DecodeError` when the record is unreadable."""
    try:
        h, body = _split(data)
        row = CheckpointRow(h["checkpoint_id"], h["task_id"], h["parent_id"], h["branch"], h["seq"],
                            h["created_at"], h["session"], h["event"], h["step"], body, h["signature"],
                            h["stored_bytes"])
        journal = [JournalRow(**{f: j[f] for f in _JOURNAL_FIELDS}) for j in h["journal"]]
    except (KeyError, TypeError) as exc:
        raise DecodeError(f"checkpoint record is malformed ({exc})") from exc
    for j in journal:
        _checked("checkpoint journal", j, _JOURNAL_TYPES)
    return _checked("checkpoint", row, _CHECKPOINT_TYPES), journal


def encode_archive(row: ArchiveRow) -> bytes:
    return _with_header({"archive_id": row.archive_id, "task_id": row.task_id, "created_at": row.created_at,
                         "location": row.location}, row.manifest)


def decode_archive(data: bytes) -> ArchiveRow:
    """Raises :class:`DecodeError` when the record is unreadable."""
    try:
        h, manifest = _split(data)
        row = ArchiveRow(h["archive_id"], h["task_id"], h["created_at"], h["location"], manifest)
    except (KeyError, TypeError) as exc:
        raise DecodeError(f"archive record is malformed ({exc})") from exc
    return _checked("archive", row, _ARCHIVE_TYPES)


def encode_task(task: TaskRow) -> bytes:
    return _with_header({"task_id": task.task_id, "created_at": task.created_at, "goal": task.goal,
                         "entry": task.entry}, task.spec)


def decode_task(data: bytes) -> TaskRow:
    try:
        h, spec = _split(data)
        row = TaskRow(h["task_id"], h["created_at"], h["goal"], h["entry"], spec)
    except (KeyError, TypeError) as exc:
        raise DecodeError(f"task record is malformed ({exc})") from exc
    return _checked("task", row, _TASK_TYPES)


def encode_ref(task_id: str, branch: str, checkpoint_id: str | None, fence: int, updated_at_ms: int) -> bytes:
    """``checkpoint_id`` None: the branch does not exist (deleted, or only fenced by a lease)."""
    return _json({"task_id": task_id, "branch": branch, "checkpoint_id": checkpoint_id, "fence": fence,
                  "updated_at_ms": updated_at_ms})


def decode_ref(data: bytes) -> dict[str, Any]:
    ref = _unjson(data)
    if "checkpoint_id" not in ref or not isinstance(ref.get("fence"), int):
        raise DecodeError(f"ref record is malformed: {ref!r}")
    bad = _wrong_members(ref.get, _REF_TYPES)
    if bad:
        raise DecodeError(f"ref record has members of the wrong type: {'; '.join(bad)}")
    return ref


def encode_lease(lease: Lease) -> bytes:
    """A released lease keeps its token (``holder_id`` empty, ``expires_at_ms`` 0), so tokens only grow."""
    return _json({"task_id": lease.task_id, "branch": lease.branch, "holder_id": lease.holder_id,
                  "holder": lease.holder, "token": lease.token, "expires_at_ms": lease.expires_at_ms})


def decode_lease(data: bytes) -> Lease:
    try:
        h = _unjson(data)
        lease = Lease(h["task_id"], h["branch"], h["holder_id"], h["holder"], h["token"], h["expires_at_ms"])
    except (KeyError, TypeError) as exc:
        raise DecodeError(f"lease record is malformed ({exc})") from exc
    return _checked("lease", lease, _LEASE_TYPES)
