"""Fault injection: damage a stored task the ways storage and software really fail.

Used by the test suite and by ``overnight bench`` to show that every damaged state is detected
and none is loaded. Works on an SQLite store file directly (faults bypass the ``Store`` protocol,
which forbids in-place changes). Each :meth:`Faults.inject` damages the branch head of a task
and returns an :class:`Injected` saying what was damaged and which checkpoint a resume must now
fall back to (the newest ancestor that does not depend on anything damaged).

Kinds (:data:`KINDS`):

* ``bit_flip`` -- one bit of the head record or of an object it references;
* ``truncation`` -- the same, cut short;
* ``removed_field`` -- a new head whose record or state lost a required member, re-encoded and
  re-digested (only the schema check can catch it);
* ``removed_blob`` -- an object the head references is deleted;
* ``swapped_blob`` -- two objects' stored bytes are exchanged;
* ``edited_value`` -- a new head whose state has an edited value, with the state blob, record
  and digest all recomputed: internally consistent, so only the HMAC signature catches it (the
  injector has no key);
* ``duplicated_member`` / ``reordered_members`` -- a new head whose record has a member twice,
  or its members out of canonical order, re-digested;
* ``torn_write`` -- a new head whose record was only partly written (a prefix of its bytes
  under the digest of the whole), as a non-atomic medium leaves it after a crash.
"""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.codec import digest
from overnight.codec.canonical import dumps, dumps_sorted, loads
from overnight.codec.compress import compress, decompress
from overnight.errors import ConfigError
from overnight.store.blobs import BlobReader
from overnight.store.sqlite import SQLiteStore

KINDS = (
    "bit_flip",
    "truncation",
    "removed_field",
    "removed_blob",
    "swapped_blob",
    "edited_value",
    "duplicated_member",
    "reordered_members",
    "torn_write",
)

NEEDS_KEY = {"edited_value"}
"""Kinds only a signing key can detect (the damage is internally consistent)."""


@dataclass
class Injected:
    """What :meth:`Faults.inject` did.

    Attributes:
        kind: one of :data:`KINDS`.
        bad_head: the checkpoint the branch ref now names (damaged, or depending on damage).
        expected: the checkpoint a resume must fall back to (None: nothing valid remains).
        damaged_objects: object digests whose stored bytes were changed or removed.
        detail: human-readable description.
    """

    kind: str
    bad_head: str
    expected: str | None
    damaged_objects: set[str] = field(default_factory=set)
    detail: str = ""


class Faults:
    """Injects faults into the SQLite store at ``path`` (close other handles' transactions first)."""

    def __init__(self, path: str | Path, rng: random.Random | None = None, *, copies: bool = False) -> None:
        """``copies``: damage the ditto copy (:mod:`overnight.chain.ditto`) of every record and object
        damaged in place as well, so nothing can heal it (the fault then costs a fallback, as in a
        store without copies). By default only the original is hit, as one bad sector or bit flip
        would, and a resume heals it from its copy."""
        self.path = Path(path)
        self.rng = rng or random.Random()
        self.copies = copies

    def _damage_copy(self, db: sqlite3.Connection, d: str, kind: str) -> None:
        """Damage the content of the ditto copy of ``d`` (no-op when it has none)."""
        from overnight.chain.ditto import ditto_key

        row = db.execute("SELECT data, codec, size FROM objects WHERE digest=?", (ditto_key(d),)).fetchone()
        if row is None:
            return
        # the store compresses a copy as it does any object (zstd when that saves space): its
        # header is inside the stored bytes then
        head, _, inner = decompress(row[1], bytes(row[0]), row[2]).partition(b"\n")
        parts = head.decode("ascii").split(" ")  # ditto 1 KIND DIGEST CODEC SIZE SIGNATURE
        bad = self._damage_object(inner, parts[4], int(parts[5]), kind) if inner else b"x"
        db.execute("UPDATE objects SET data=?, codec='none', size=? WHERE digest=?",
                   (head + b"\n" + bad, len(head) + 1 + len(bad), ditto_key(d)))

    # -- helpers --------------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, isolation_level=None)

    def _reachable(self, store: SQLiteStore, cid: str) -> set[str]:
        """Objects a checkpoint depends on (state and artifacts, with their chunks and indexes)."""
        row = store.get_checkpoint(cid)
        record = loads(row.body)
        reader = BlobReader(store)
        out = set(reader.reachable(record["state"]["digest"]))
        doc = loads(reader.get(record["state"]["digest"]))
        pages = {}
        for member in ("todo", "done", "artifacts"):
            middle = doc[member].get("middle")
            inner = loads(reader.get(middle["digest"])) if middle else []
            pages[member] = [*doc[member]["pages"][:1], *inner, *doc[member]["pages"][1:]]
        refs = [*pages["todo"], *pages["done"], *pages["artifacts"], *doc.get("values", {}).values(),
                *(doc[m]["middle"] for m in pages if doc[m].get("middle"))]
        if record.get("fingerprint"):
            refs.append(record["fingerprint"]["world"])
        for page in pages["artifacts"]:
            refs += loads(reader.get(page["digest"])).values()
        for ref in refs:
            out.update(reader.reachable(ref["digest"]))
        return out

    def _lineage(self, store: SQLiteStore, head: str) -> list[tuple[str, set[str]]]:
        """``(checkpoint, objects it depends on)`` from ``head`` back to the root, read before damage."""
        out = []
        cid: str | None = head
        while cid is not None:
            out.append((cid, self._reachable(store, cid)))
            cid = store.get_checkpoint(cid).parent_id
        return out

    def _new_head(self, db: sqlite3.Connection, task_id: str, branch: str, head: str, body: bytes,
                  stored_id: str | None = None) -> str:
        """Insert ``body`` as a child of ``head`` and point the branch at it."""
        new_id = stored_id or digest.sha256(body)
        row = db.execute("SELECT seq, session FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()
        db.execute(
            "INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (new_id, task_id, head, branch, row[0] + 1, "2099-01-01T00:00:00.000000+00:00", row[1], "step",
             "injected", body, None, len(body)),
        )
        db.execute("UPDATE refs SET checkpoint_id=? WHERE task_id=? AND branch=?", (new_id, task_id, branch))
        return new_id

    def _child_record(self, head_body: bytes, head: str) -> dict:
        record = loads(head_body)
        record["parent_id"] = head
        record["seq"] += 1
        record["created_at"] = "2099-01-01T00:00:00.000000+00:00"
        record["event"] = {"kind": "step", "step": "injected", "key": None, "ref": None, "detail": None}
        return record

    def _put_state(self, db: sqlite3.Connection, state_tree: Any) -> dict:
        raw = dumps(state_tree)
        d = digest.sha256(raw)
        codec, data = compress(raw)
        db.execute("INSERT OR IGNORE INTO objects (digest, kind, size, codec, data) VALUES (?,?,?,?,?)",
                   (d, "blob", len(raw), codec, data))
        return {"digest": d, "size": len(raw)}

    def _corrupt_bytes(self, data: bytes, kind: str) -> bytes:
        if kind == "bit_flip" or len(data) < 2:
            i = self.rng.randrange(len(data))
            return data[:i] + bytes([data[i] ^ (1 << self.rng.randrange(8))]) + data[i + 1 :]
        return data[: self.rng.randrange(len(data))]

    def _damage_object(self, data: bytes, codec: str, size: int, kind: str) -> bytes:
        """Corrupt stored bytes so that the *content* changes (or no longer decodes): a flip in a
        zstd frame's padding that still decodes to the same content damages nothing."""
        try:
            content = decompress(codec, data, size)
        except Exception:  # noqa: BLE001 - already unreadable
            return self._corrupt_bytes(data, kind)
        for _ in range(100):
            bad = self._corrupt_bytes(data, kind)
            try:
                if decompress(codec, bad, size) != content:
                    return bad
            except Exception:  # noqa: BLE001 - does not decode: damaged
                return bad
        raise ConfigError("could not damage the object's content in 100 tries", hint="try another seed or kind")

    # -- inject ---------------------------------------------------------------------------------

    def inject(self, kind: str, task_id: str, branch: str = "main") -> Injected:
        """Damage the head of ``task_id``/``branch`` in the way ``kind`` names."""
        if kind not in KINDS:
            raise ConfigError(f"unknown fault kind {kind!r}; one of {KINDS}", task_id=task_id)
        store = SQLiteStore(self.path)
        db = self._db()
        try:
            head = store.get_ref(task_id, branch)
            assert head is not None, f"no branch {branch!r} in task {task_id!r}"
            head_row = store.get_checkpoint(head)
            lineage = self._lineage(store, head)
            objects = sorted(lineage[0][1])
            db.execute("BEGIN IMMEDIATE")
            damaged: set[str] = set()
            bad: set[str] = set()
            if kind in ("bit_flip", "truncation"):
                if self.rng.random() < 0.3:
                    body = self._corrupt_bytes(head_row.body, kind)
                    db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (body, head))
                    bad.add(head)
                    detail = f"{kind} in the head record"
                else:
                    target = self.rng.choice(objects)
                    size, codec, data = db.execute("SELECT size, codec, data FROM objects WHERE digest=?",
                                                   (target,)).fetchone()
                    db.execute("UPDATE objects SET data=? WHERE digest=?",
                               (self._damage_object(bytes(data), codec, size, kind), target))
                    damaged.add(target)
                    detail = f"{kind} in object {target}"
                new_head = head
            elif kind == "removed_blob":
                target = self.rng.choice(objects)
                db.execute("DELETE FROM objects WHERE digest=?", (target,))
                damaged.add(target)
                new_head, detail = head, f"deleted object {target}"
            elif kind == "swapped_blob":
                a = self.rng.choice(objects)
                others = [r[0] for r in db.execute("SELECT digest FROM objects WHERE digest != ?", (a,))]
                b = self.rng.choice(others)
                ra = db.execute("SELECT kind, size, codec, data FROM objects WHERE digest=?", (a,)).fetchone()
                rb = db.execute("SELECT kind, size, codec, data FROM objects WHERE digest=?", (b,)).fetchone()
                db.execute("UPDATE objects SET kind=?, size=?, codec=?, data=? WHERE digest=?", (*rb, a))
                db.execute("UPDATE objects SET kind=?, size=?, codec=?, data=? WHERE digest=?", (*ra, b))
                damaged.update((a, b))
                new_head, detail = head, f"swapped objects {a} and {b}"
            elif kind == "removed_field":
                record = self._child_record(head_row.body, head)
                if self.rng.random() < 0.5:
                    victim = self.rng.choice(sorted(k for k in record if k != "format"))
                    del record[victim]
                    detail = f"record without {victim!r}"
                else:
                    state = loads(self._object_bytes(store, record["state"]["digest"]))
                    victim = self.rng.choice(sorted(k for k in state if k != "format"))
                    del state[victim]
                    record["state"] = self._put_state(db, state)
                    detail = f"state without {victim!r}"
                new_head = self._new_head(db, task_id, branch, head, dumps_sorted(record))
                bad.add(new_head)
            elif kind == "edited_value":
                record = self._child_record(head_row.body, head)
                state = loads(self._object_bytes(store, record["state"]["digest"]))
                if state["done"]["pages"]:
                    n = self.rng.randrange(len(state["done"]["pages"]))
                    page = loads(self._object_bytes(store, state["done"]["pages"][n]["digest"]))
                    entry = self.rng.choice(page)
                    entry["output"] = {"edited": True}
                    # the page's reference keeps its index (names, summary: an output is in neither)
                    state["done"]["pages"][n] = {**state["done"]["pages"][n], **self._put_state(db, page)}
                    detail = f"output of step {entry['name']!r} edited"
                else:
                    state["data"] = {"edited": True}
                    detail = "user data edited"
                record["state"] = self._put_state(db, state)
                new_head = self._new_head(db, task_id, branch, head, dumps_sorted(record))
                bad.add(new_head)
            elif kind in ("duplicated_member", "reordered_members"):
                record = self._child_record(head_row.body, head)
                text = dumps_sorted(record).decode("ascii")
                if kind == "duplicated_member":
                    body = (text[:-1] + f',"seq":{record["seq"] + 1}}}').encode("ascii")
                    detail = "record with 'seq' twice"
                else:
                    items = list(record.items())
                    self.rng.shuffle(items)
                    if [k for k, _ in items] == sorted(record):
                        items.reverse()
                    body = json.dumps(dict(items), separators=(",", ":")).encode("ascii")
                    detail = "record with members out of canonical order"
                new_head = self._new_head(db, task_id, branch, head, body)
                bad.add(new_head)
            else:  # torn_write
                record = self._child_record(head_row.body, head)
                full = dumps_sorted(record)
                new_head = self._new_head(db, task_id, branch, head, full[: self.rng.randrange(1, len(full))],
                                          stored_id=digest.sha256(full))
                bad.add(new_head)
                detail = "record written only in part"
            if self.copies:
                for d in sorted(damaged) + ([head] if head in bad else []):
                    self._damage_copy(db, d, kind if kind in ("bit_flip", "truncation") else "bit_flip")
            db.execute("COMMIT")
            expected = next((cid for cid, deps in lineage if cid not in bad and not deps & damaged), None)
            return Injected(kind, new_head, expected, damaged, detail)
        finally:
            db.close()
            store.close()

    @staticmethod
    def _object_bytes(store: SQLiteStore, d: str) -> bytes:
        obj = store.get_objects([d])[d]
        if obj.kind == "blob":
            return decompress(obj.codec, obj.data, obj.size)
        return BlobReader(store).get(d)


def forge_record(store: Any, like: Any, *, parent: str | None, seq: int, signature: str | None) -> str:
    """An attacker's record on any store (through the ``Store`` API, the write access a store's
    other users have): ``like`` (a :class:`~overnight.store.base.CheckpointRow`) with another
    ``parent`` and ``seq``, a later ``created_at``, its digest recomputed -- so only a signature
    can tell -- and ``signature`` as given (None: missing; another record's: a replayed "old" one).
    Stored beside the real records, no ref moved. Returns its id."""
    import dataclasses

    body = loads(like.body)
    body.update(parent_id=parent, seq=seq, created_at="2099-01-01T00:00:00.000000+00:00")
    raw = dumps_sorted(body)
    row = dataclasses.replace(like, checkpoint_id=digest.sha256(raw), parent_id=parent, seq=seq, body=raw,
                              signature=signature, created_at=body["created_at"])
    store.put_checkpoints([row])
    return row.checkpoint_id
