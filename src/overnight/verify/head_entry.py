"""The code location recorded in a branch head's task spec, verified without loading the whole head.

``overnight resume`` needs the task's code location (``spec.entry``) *before* it can build the
runner, and the runner then loads and verifies the head itself (under its lease). Loading the head
twice -- every page of the done list parsed and validated each time -- doubled the part of a resume
that grows with the chain. The location lives in the state document alone, so this reads just
that: the head's record (digest, canonical form, schema, signature with ``key``) and its state
document (digest, size, canonical form, schema). Whatever does not verify this way -- a missing or
damaged record or state, a format this shortcut does not read -- returns :data:`UNKNOWN`, and the
caller loads the head in full (:func:`~overnight.verify.chain.load_head`, with its fallback to an
older valid checkpoint), as before.
"""

from __future__ import annotations

from typing import Final

from overnight.codec.canonical import dumps
from overnight.errors import OvernightError
from overnight.store.base import Store
from overnight.store.blobs import BlobReader
from overnight.verify.integrity import _parse, parse_record
from overnight.verify.migrate import STATE_MIGRATIONS
from overnight.verify.records import StateDoc


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()
"""The head could not be read this way: load it in full."""


def head_entry(store: Store, task_id: str, branch: str, *, key: bytes | None) -> str | None | _Unknown:
    """``spec.entry`` of the verified head of ``task_id``/``branch`` (None when the spec records
    none), or :data:`UNKNOWN` when the head's record or state does not verify (see the module
    docstring). Never raises an :class:`~overnight.errors.OvernightError`."""
    try:
        head = store.get_ref(task_id, branch)
        if head is None:
            return UNKNOWN
        row = store.get_checkpoint(head)
        record = parse_record(row, key=key)
        ids = {"task_id": task_id, "checkpoint_id": head}
        what = f"checkpoint {head[:19]} state"
        raw = BlobReader(store).get(record.state.digest, what)
        if len(raw) != record.state.size:
            return UNKNOWN
        tree, _ = _parse(raw, what, dumps, STATE_MIGRATIONS, ids)
        doc = StateDoc.model_validate(tree)
        if doc.task.id != record.task_id:
            return UNKNOWN
        spec = tree["task"]["spec"]
    except (OvernightError, ValueError, KeyError, TypeError):  # pydantic's ValidationError is a ValueError
        return UNKNOWN
    found = spec.get("entry") if isinstance(spec, dict) else None
    return found if isinstance(found, str) else None


__all__ = ["UNKNOWN", "head_entry"]
