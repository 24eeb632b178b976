"""Integrity: build checkpoint records, and load them back only when they verify.

A checkpoint loads only if, in this order:

1. its body hashes to its id (``sha256(body) == checkpoint_id``);
2. it parses strictly, is byte-for-byte in canonical form, and its ``format`` is one this code
   knows (older formats are migrated, :mod:`overnight.verify.migrate`; a newer one raises
   :class:`~overnight.errors.FormatTooNew`, never a misread);
3. it validates against :class:`~overnight.verify.records.CheckpointRecord` with every field
   present, and the store's index columns agree with the body;
4. with a signing key configured, its HMAC-SHA256 signature matches;
5. its state blob, and (``deep=True``) every artifact blob, is present and hashes to its digest,
   and the state document validates against :class:`~overnight.verify.records.TaskState`.

Anything else raises an :class:`~overnight.errors.IntegrityError` naming the checkpoint and the
failed check, and nothing is returned: a state that cannot be verified is never loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from overnight.codec import digest
from overnight.codec.canonical import dumps, dumps_sorted, loads
from overnight.errors import (
    DecodeError,
    DigestMismatch,
    IntegrityError,
    SchemaError,
    SignatureError,
    short_id,
)
from overnight.store.base import CheckpointRow, Store
from overnight.store.blobs import BlobReader
from overnight.verify.migrate import RECORD_MIGRATIONS, STATE_MIGRATIONS, upgrade
from overnight.verify.records import CheckpointRecord, TaskState


def signing_key_from_env() -> bytes | None:
    """``$OVERNIGHT_SIGNING_KEY`` as bytes (UTF-8), or None when unset or empty."""
    key = os.environ.get("OVERNIGHT_SIGNING_KEY")
    return key.encode("utf-8") if key else None


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint that passed verification: the stored row, the parsed record, the state."""

    row: CheckpointRow
    record: CheckpointRecord
    state: TaskState
    state_tree: dict[str, Any]

    @property
    def id(self) -> str:
        return self.row.checkpoint_id


def encode_record(record: dict[str, Any]) -> bytes:
    """Canonical bytes of a checkpoint record (sorted keys)."""
    return dumps_sorted(record)


def encode_state(state_tree: dict[str, Any]) -> bytes:
    """Canonical bytes of a state document (member order as built; user values keep theirs)."""
    return dumps(state_tree)


def _validation_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg'].lower()}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _parse(data: bytes, what: str, encoder: Any, migrations: dict, ids: dict[str, Any]) -> Any:
    """Parse strictly, refuse a newer format, require the canonical encoding, migrate older ones.

    Other bytes for the same tree (reordered or duplicated members, whitespace, other escapes)
    mean the record was not written by overnight: it is refused even if its digest matches.
    """
    try:
        tree = loads(data)
    except DecodeError as exc:
        raise SchemaError(f"{what} is not canonical JSON: {exc.message}", **ids) from exc
    upgraded = upgrade(tree, what, migrations, **ids)  # FormatTooNew before anything else
    try:
        canonical = encoder(tree) == data
    except (TypeError, ValueError):
        canonical = False
    if not canonical:
        raise SchemaError(f"{what} is not in canonical form (members reordered, duplicated or re-spaced)", **ids)
    return upgraded


def parse_record(row: CheckpointRow, *, key: bytes | None) -> CheckpointRecord:
    """Checks 1-4 on a stored checkpoint row. Raises an :class:`IntegrityError` subclass."""
    ids = {"task_id": row.task_id, "checkpoint_id": row.checkpoint_id}
    if digest.sha256(row.body) != row.checkpoint_id:
        raise DigestMismatch(f"checkpoint {short_id(row.checkpoint_id)} body does not match its digest", **ids)
    what = f"checkpoint {short_id(row.checkpoint_id)}"
    tree = _parse(row.body, what, dumps_sorted, RECORD_MIGRATIONS, ids)
    try:
        record = CheckpointRecord.model_validate(tree)
    except ValidationError as exc:
        raise SchemaError(
            f"checkpoint {short_id(row.checkpoint_id)} is incomplete or malformed: {_validation_summary(exc)}", **ids
        ) from exc
    mismatched = [
        name
        for name, stored, body in (
            ("task_id", row.task_id, record.task_id),
            ("parent_id", row.parent_id, record.parent_id),
            ("branch", row.branch, record.branch),
            ("seq", row.seq, record.seq),
        )
        if stored != body
    ]
    if mismatched:
        raise SchemaError(f"checkpoint {short_id(row.checkpoint_id)} index columns disagree with its body: {mismatched}", **ids)
    if key is not None:
        if not row.signature:
            raise SignatureError(
                f"checkpoint {short_id(row.checkpoint_id)} is not signed but a signing key is configured",
                hint="it was written without OVERNIGHT_SIGNING_KEY, or its signature was stripped",
                **ids,
            )
        if not digest.verify_signature(key, row.body, row.signature):
            raise SignatureError(
                f"checkpoint {short_id(row.checkpoint_id)} signature does not match (edited without the key, "
                "or a different key)",
                **ids,
            )
    return record


def load_checkpoint(
    store: Store,
    checkpoint_id: str,
    *,
    key: bytes | None = None,
    deep: bool = True,
    reader: BlobReader | None = None,
) -> LoadedCheckpoint:
    """Load and fully verify one checkpoint (all five checks).

    Args:
        deep: also read and hash every artifact blob (True on resume; ``show`` may skip it).

    Raises:
        CheckpointNotFound: no such checkpoint.
        IntegrityError: any check failed (subclass says which).
    """
    row = store.get_checkpoint(checkpoint_id)
    record = parse_record(row, key=key)
    ids = {"task_id": row.task_id, "checkpoint_id": row.checkpoint_id}
    reader = reader or BlobReader(store)
    where = f"checkpoint {short_id(row.checkpoint_id)} state"
    try:
        raw = reader.get(record.state.digest, where)
    except IntegrityError as exc:
        exc.task_id, exc.checkpoint_id = row.task_id, row.checkpoint_id
        raise
    if len(raw) != record.state.size:
        raise DigestMismatch(f"{where} is {len(raw)} bytes, the record says {record.state.size}", **ids)
    tree = _parse(raw, where, dumps, STATE_MIGRATIONS, ids)
    try:
        state = TaskState.model_validate(tree)
    except ValidationError as exc:
        raise SchemaError(f"{where} is incomplete or malformed: {_validation_summary(exc)}", **ids) from exc
    if state.task.id != record.task_id:
        raise SchemaError(f"{where} belongs to task {state.task.id!r}, not {record.task_id!r}", **ids)
    missing = store.missing_objects(a.digest for a in state.artifacts.values())
    if missing:
        names = sorted(n for n, a in state.artifacts.items() if a.digest in missing)
        raise IntegrityError(f"checkpoint {short_id(row.checkpoint_id)} artifacts are missing from the store: {names}", **ids)
    if deep:
        for name, art in state.artifacts.items():
            try:
                data = reader.get(art.digest, f"checkpoint {short_id(row.checkpoint_id)} artifact {name!r}")
            except IntegrityError as exc:
                exc.task_id, exc.checkpoint_id = row.task_id, row.checkpoint_id
                raise
            if len(data) != art.size:
                raise DigestMismatch(f"artifact {name!r} is {len(data)} bytes, the state says {art.size}", **ids)
    return LoadedCheckpoint(row=row, record=record, state=state, state_tree=tree)
