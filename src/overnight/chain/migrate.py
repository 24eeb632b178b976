"""Format migrations: a record or state written by an earlier overnight is upgraded on load.

Each entry maps a format version ``N`` to a function that turns a format-``N`` tree into a new
format-``N+1`` tree (without mutating its input); :func:`upgrade` applies them in order up to
:data:`~overnight.chain.records.FORMAT_VERSION`. Migrations run on the *parsed, verified* tree
(the digest and signature cover the bytes as written, in their own format) and never write back:
stored records are immutable. A version above the current one is refused, never guessed at.

Pages (todo and done entries) carry no format of their own: they are upgraded with the format of
the state document that names them (:func:`upgrade_entries`). A writer continuing from an upgraded
checkpoint re-encodes its pages in the current format (:attr:`Page.migrated
<overnight.chain.integrity.Page>`), so a new record never names an old-format page.

**1 -> 2** (``docs/FORMAT.md``, "Changes"). Format 1 as specified lacks members that overnight
0.1 already wrote under format 1; the migration adds each one that is missing and keeps any that is
present, so both a strict format-1 record and one written by overnight 0.1 load:

- record: unchanged but for ``format``;
- state document: ``context.messages`` ``[]``, ``context.tokens`` 0, ``recompute`` null;
- todo entry: ``previous`` null (``added_by`` null when missing too);
- done entry: ``added_by`` null, ``replayed_tokens`` 0, ``reads.state`` ``["*"]`` (unknown: any
  change of the user state counts as read), ``produced`` ``{"output": sha256 of the output's
  canonical bytes, "state": {"*": "unknown"}, "artifacts": {name: "unknown" for each write}}``
  (unknown products count as changed).

**2 -> 3**: the state document gains ``values`` (top-level user-state values stored as their own
blobs), empty for a format-2 document, whose ``data`` holds every value, and each page collection
gains ``middle`` (the references of its inner pages, in their own blob), null for a format-2
document, whose ``pages`` lists every page; the record and the pages are unchanged but for the
record's ``format``.

**3 -> 4**: each done page reference gains ``names`` and ``summary`` (the index of its entries,
:class:`~overnight.chain.records.DoneRef`), null for a format-3 document (unknown: the page is read
for every look-up, as format 3 did); references listed in a format-3 ``middle`` blob are read as
such (:func:`upgrade_done_refs`). The record, the pages and their entries are unchanged but for the
record's ``format``. A writer continuing such a checkpoint writes every reference with its index.
"""

from __future__ import annotations

from typing import Any, Callable

from overnight.codec import digest
from overnight.codec.canonical import dumps
from overnight.errors import FormatTooNew, SchemaError
from overnight.chain.records import FORMAT_VERSION

Migration = Callable[[dict[str, Any]], dict[str, Any]]
EntryMigration = Callable[[dict[str, Any]], dict[str, Any]]


def _record_1_to_2(tree: dict[str, Any]) -> dict[str, Any]:
    return {**tree, "format": 2}


def _state_1_to_2(tree: dict[str, Any]) -> dict[str, Any]:
    ctx = tree.get("context")
    if isinstance(ctx, dict):
        ctx = {**ctx, "messages": ctx.get("messages", []), "tokens": ctx.get("tokens", 0)}
    out = {**tree, "format": 2, "context": ctx}
    out.setdefault("recompute", None)
    return out


def _todo_1_to_2(entry: dict[str, Any]) -> dict[str, Any]:
    if "previous" in entry and "added_by" in entry:
        return entry
    return {"added_by": None, "previous": None, **entry}


def _done_1_to_2(entry: dict[str, Any]) -> dict[str, Any]:
    if all(k in entry for k in ("added_by", "produced", "replayed_tokens")) and "state" in (entry.get("reads") or {}):
        return entry
    out = {"added_by": None, "replayed_tokens": 0, **entry}
    if "produced" not in entry:
        writes = entry.get("writes") if isinstance(entry.get("writes"), list) else []
        out["produced"] = {"output": digest.sha256(dumps(entry.get("output"))), "state": {"*": "unknown"},
                           "artifacts": {str(w): "unknown" for w in writes}}
    reads = entry.get("reads")
    if isinstance(reads, dict) and "state" not in reads:
        out["reads"] = {**reads, "state": ["*"]}
    return out


def _record_2_to_3(tree: dict[str, Any]) -> dict[str, Any]:
    return {**tree, "format": 3}


def _state_2_to_3(tree: dict[str, Any]) -> dict[str, Any]:
    out = {**tree, "format": 3, "values": {}}
    for member in ("todo", "done", "artifacts"):
        if isinstance(tree.get(member), dict):
            out[member] = {**tree[member], "middle": None}
    return out


def _record_3_to_4(tree: dict[str, Any]) -> dict[str, Any]:
    return {**tree, "format": 4}


def upgrade_done_refs(refs: Any) -> Any:
    """Done page references of a format-3 document (``{"digest", "size"}``) as format 4 reads
    them: ``names`` and ``summary`` null. Anything else is left for validation to refuse."""
    if not isinstance(refs, list):
        return refs
    return [{**r, "names": None, "summary": None} if isinstance(r, dict) else r for r in refs]


def _state_3_to_4(tree: dict[str, Any]) -> dict[str, Any]:
    out = {**tree, "format": 4}
    done = tree.get("done")
    if isinstance(done, dict):
        out["done"] = {**done, "pages": upgrade_done_refs(done.get("pages"))}
    return out


RECORD_MIGRATIONS: dict[int, Migration] = {1: _record_1_to_2, 2: _record_2_to_3, 3: _record_3_to_4}
"""Checkpoint record migrations, ``N -> N+1``."""

STATE_MIGRATIONS: dict[int, Migration] = {1: _state_1_to_2, 2: _state_2_to_3, 3: _state_3_to_4}
"""State document migrations, ``N -> N+1``."""

ENTRY_MIGRATIONS: dict[int, dict[str, EntryMigration]] = {1: {"todo": _todo_1_to_2, "done": _done_1_to_2}}
"""Page entry migrations, ``N -> N+1`` by collection (``todo``, ``done``; artifacts unchanged)."""


def upgrade(tree: Any, what: str, migrations: dict[int, Migration], **ids: Any) -> dict[str, Any]:
    """Return ``tree`` upgraded to :data:`FORMAT_VERSION`.

    Raises:
        SchemaError: no integer ``format`` member, or a version below 1 / with no migration path.
        FormatTooNew: written by a newer overnight.
    """
    fmt = tree.get("format") if isinstance(tree, dict) else None
    if type(fmt) is not int:
        raise SchemaError(f"{what} has no valid 'format' field", **ids)
    if fmt > FORMAT_VERSION:
        raise FormatTooNew(
            f"{what} was written by a newer overnight (format {fmt}); this one reads up to format {FORMAT_VERSION}",
            hint="upgrade overnight to resume this task",
            **ids,
        )
    while fmt < FORMAT_VERSION:
        step = migrations.get(fmt)
        if step is None:
            raise SchemaError(f"{what} has format {fmt}, which this overnight cannot read", **ids)
        tree = step(tree)
        fmt = tree["format"]
    return tree


def upgrade_entries(entries: Any, collection: str, fmt: int) -> Any:
    """A page's entries (a list of ``collection`` entries) upgraded from the format ``fmt`` of the
    state document naming the page to :data:`FORMAT_VERSION`; the same object when nothing
    changed. Entries that are not objects are left for validation to refuse."""
    if not isinstance(entries, list):
        return entries
    while fmt < FORMAT_VERSION:
        step = ENTRY_MIGRATIONS.get(fmt, {}).get(collection)
        if step is not None:
            new = [step(e) if isinstance(e, dict) else e for e in entries]
            if any(a is not b for a, b in zip(new, entries)):
                entries = new
        fmt += 1
    return entries
