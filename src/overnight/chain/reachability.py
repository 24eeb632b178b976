"""Reachability: which checkpoints a branch needs, and which objects a checkpoint needs.

The two questions ``gc`` and ``archive`` ask (spec: ``docs/FORMAT.md``, "Deletion"):

* **lineage** -- a branch head and every checkpoint it descends from, through ``parent_id`` (the
  store's index column, so a damaged record still links its parent) and through a merge's second
  parent (``event.ref`` of a ``merge`` record). A checkpoint on no live branch's lineage is
  *dangling*: a record a fallback skipped, the history of a deleted branch.
* **objects** -- everything loading a checkpoint reads: its state document; the document's todo,
  done and artifact pages; every artifact blob; the world fingerprint blob; and, for each of these
  that is chunked, its tree object, its chunk index (itself possibly chunked) and its chunks.

The walk reads what a load reads, the way a load reads it: a record whose body does not hash to its
id, and a missing or damaged object, is read from its verified ditto copy
(:mod:`overnight.chain.ditto`; nothing is written back). The walk is *tolerant*: a record or an
object that cannot be read even so is reported (:class:`Unreadable`, saying what is wrong with it)
and the walk goes on with what it can read. A checkpoint that verifies
(healed or not) is fully readable, so everything it needs is found; what the walk reports hides
objects the checkpoint may still need -- ``gc`` therefore refuses to delete anything while a
checkpoint on a live lineage is reported (:func:`overnight.ops.gc.collect`). What the walk refuses is a record or state
document of a *newer* format (:class:`~overnight.errors.FormatTooNew`): it cannot know what
that references, so it stops rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from overnight.codec.canonical import loads
from overnight.errors import DecodeError, FormatTooNew, IntegrityError, OvernightError, short_id
from overnight.store.base import CheckpointRow, Store
from overnight.chain.ditto import HealingReader, body_digest_mismatch, get_checkpoint
from overnight.chain.migrate import RECORD_MIGRATIONS, STATE_MIGRATIONS, upgrade

_BATCH = 256  # objects fetched per get_objects call


@dataclass(frozen=True)
class Unreadable:
    """A part of a checkpoint the walk could not read (the objects behind it are unknown)."""

    task_id: str
    checkpoint_id: str
    detail: str


def merge_parent(row: CheckpointRow) -> str | None:
    """The second parent of a ``merge`` checkpoint (its ``event.ref``), else None."""
    if row.event != "merge":
        return None
    try:
        ref = loads(row.body)["event"]["ref"]
    except (OvernightError, KeyError, TypeError):
        return None
    return ref if isinstance(ref, str) else None


def lineage(rows: Iterable[CheckpointRow], heads: Iterable[str]) -> set[str]:
    """Ids of ``heads`` and of every checkpoint among ``rows`` they descend from."""
    by_id = {r.checkpoint_id: r for r in rows}
    seen: set[str] = set()
    todo = [h for h in heads if h is not None]
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        row = by_id.get(cid)
        if row is None:
            continue
        if row.parent_id is not None:
            todo.append(row.parent_id)
        second = merge_parent(row)
        if second is not None:
            todo.append(second)
    return seen


def first_parent_chain(rows: dict[str, CheckpointRow], head: str) -> list[CheckpointRow]:
    """The head and its first parents, newest first (stops at a missing record or a cycle)."""
    chain, seen = [], set()
    cid: str | None = head
    while cid is not None and cid in rows and cid not in seen:
        seen.add(cid)
        chain.append(rows[cid])
        cid = rows[cid].parent_id
    return chain


class Reach:
    """Computes the objects checkpoints need, caching what it has read (pages and chunk trees
    shared by many checkpoints are read once).

    Args:
        store: where the objects are (a :class:`~overnight.store.compose.tiered.TieredStore` reads
            archived ones from their cold store).

    Attributes:
        unreadable: what could not be read so far.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.reader = HealingReader(store, write_back=False)  # a damaged original is walked through its copy
        self.unreadable: list[Unreadable] = []
        self._closure: dict[str, frozenset[str]] = {}
        self._artifact_page: dict[str, list[str]] = {}

    # -- blobs ------------------------------------------------------------------------------------

    def blobs(self, digests: Iterable[str], *, where: tuple[str, str] = ("", "")) -> set[str]:
        """Every object the given blobs are made of (themselves, tree objects, indexes, chunks).

        A missing or damaged blob is read from its verified ditto copy; one that cannot be read even
        so counts as itself (kept if it is stored at all) and is reported -- for every checkpoint
        that needs it (a failure is not cached: the next checkpoint asking reports it too).
        """
        closure: dict[str, frozenset[str]] = {}
        wanted = [d for d in dict.fromkeys(digests) if d not in self._closure]
        for i in range(0, len(wanted), _BATCH):
            part = wanted[i : i + _BATCH]
            try:
                found = self.store.get_objects(part)
            except IntegrityError:  # a damaged row, or an archived object whose pack is damaged: one by one
                found = {}
                for d in part:
                    try:
                        found.update(self.store.get_objects([d]))
                    except IntegrityError:
                        pass  # read again below, through its copy
            for d in part:
                obj = found.get(d)
                if obj is not None and obj.kind != "tree":
                    closure[d] = self._closure[d] = frozenset((d,))
                    continue
                try:  # walked as a load reads it: through its copy if need be
                    closure[d] = self._closure[d] = frozenset(self._reachable(d))
                except IntegrityError as exc:
                    closure[d] = frozenset((d,))
                    what = "chunk tree" if obj is not None else "object"
                    self._note(where, exc.message if d in exc.message else f"{what} {d}: {exc.message}")
        out: set[str] = set()
        for d in digests:
            out.update(closure.get(d) or self._closure[d])
        return out

    def _reachable(self, d: str) -> list[str]:
        """:meth:`~overnight.store.blobs.BlobReader.reachable` through the healing reader: a missing
        or damaged object on the way (the blob itself, a tree object, a chunk index) is read from its
        verified ditto copy. Raises what the walk still cannot read (MissingObject, DigestMismatch)."""
        return self.reader.reachable_healed(d, "gc")

    def _note(self, where: tuple[str, str], detail: str) -> None:
        self.unreadable.append(Unreadable(where[0], where[1], detail))

    def _read(self, d: str, what: str, where: tuple[str, str]) -> Any | None:
        """Parse a blob holding canonical JSON; None (and a note) when it cannot be read."""
        try:
            return loads(self.reader.get(d, what))
        except (IntegrityError, DecodeError) as exc:
            self._note(where, f"{what}: {exc.message}")
            return None

    # -- checkpoints ------------------------------------------------------------------------------

    def roots(self, row: CheckpointRow) -> list[str]:
        """The blobs a checkpoint references directly (state document, its stored values, page
        lists, pages, artifacts, world).

        Raises:
            FormatTooNew: the record or its state document was written by a newer overnight.
        """
        where = (row.task_id, row.checkpoint_id)
        row, damaged = self.record(row)
        if damaged:  # its references are unverified: walked for what they keep, their own notes dropped
            noted = self.unreadable
            self.unreadable = []
            try:
                return self._roots(row, where)
            except FormatTooNew:  # what an unverified body claims is no reason to stop
                return []
            finally:
                self.unreadable = noted
                self._note(where, "record is damaged (its body does not hash to its checkpoint id) and has no "
                                  "verified ditto copy")
        return self._roots(row, where)

    def record(self, row: CheckpointRow) -> tuple[CheckpointRow, bool]:
        """``row`` as a load reads it: when its body does not hash to its id, the row rebuilt from
        the record's verified ditto copy (nothing written). Returns ``(row, damaged)``: ``damaged``
        when the body does not verify and no sound copy stands for it."""
        try:
            if not body_digest_mismatch(row.body, row.checkpoint_id):
                return row, False
        except (TypeError, ValueError, AttributeError):  # a body cell that is not bytes
            pass
        try:
            healed = get_checkpoint(self.store, row.checkpoint_id, [], write=False, row=row)
        except (OvernightError, TypeError, ValueError, AttributeError):
            return row, True
        return healed, healed is row

    def _roots(self, row: CheckpointRow, where: tuple[str, str]) -> list[str]:
        cp = f"checkpoint {short_id(row.checkpoint_id)}"
        try:
            record = upgrade(loads(row.body), cp, RECORD_MIGRATIONS, task_id=row.task_id,
                             checkpoint_id=row.checkpoint_id)
        except FormatTooNew:
            raise
        except (OvernightError, TypeError) as exc:
            self._note(where, f"record unreadable: {getattr(exc, 'message', exc)}")
            return []
        out: list[str] = []
        try:
            state_digest = record["state"]["digest"]
            out.append(state_digest)
        except (KeyError, TypeError):
            self._note(where, "record names no state")
            return out
        try:
            if record.get("fingerprint"):
                out.append(record["fingerprint"]["world"]["digest"])
        except (KeyError, TypeError):
            self._note(where, "record has a malformed fingerprint")
        doc = self._read(state_digest, f"{cp} state", where)
        if doc is None:
            return out
        try:
            doc = upgrade(doc, f"{cp} state", STATE_MIGRATIONS, task_id=row.task_id, checkpoint_id=row.checkpoint_id)
        except FormatTooNew:
            raise
        except OvernightError as exc:
            self._note(where, f"state unreadable: {exc.message}")
            return out
        for member in ("todo", "done", "artifacts"):
            try:
                pages = [p["digest"] for p in doc[member]["pages"]]
                if doc[member]["middle"] is not None:  # the inner pages' references, in their own blob
                    out.append(doc[member]["middle"]["digest"])
                    inner = self._read(doc[member]["middle"]["digest"], f"{cp} {member} page list", where)
                    pages[1:1] = [p["digest"] for p in inner or []]
            except (KeyError, TypeError):
                self._note(where, f"state has no {member} pages")
                continue
            out.extend(pages)
            if member == "artifacts":
                for p in pages:
                    out.extend(self._artifacts_of(p, cp, where))
        try:
            out.extend(ref["digest"] for ref in doc["values"].values())
        except (KeyError, TypeError, AttributeError):
            self._note(where, "state has malformed values")
        return out

    def _artifacts_of(self, page: str, cp: str, where: tuple[str, str]) -> list[str]:
        if page not in self._artifact_page:
            noted = len(self.unreadable)
            tree = self._read(page, f"{cp} artifact page", where)
            digests = []
            if isinstance(tree, dict):
                for ref in tree.values():
                    if isinstance(ref, dict) and isinstance(ref.get("digest"), str):
                        digests.append(ref["digest"])
            elif tree is not None:
                self._note(where, f"{cp} artifact page {page} is not an object")
            if len(self.unreadable) > noted:  # not cached: every checkpoint needing it reports it
                return digests
            self._artifact_page[page] = digests
        return self._artifact_page[page]

    def checkpoint(self, row: CheckpointRow) -> set[str]:
        """Every object ``row`` needs to load. Raises :class:`FormatTooNew` (see :meth:`roots`)."""
        return self.blobs(self.roots(row), where=(row.task_id, row.checkpoint_id))

    def checkpoints(self, rows: list[CheckpointRow], on_progress: Callable[[int, int], None] | None = None,
                    start: int = 0, total: int | None = None) -> set[str]:
        """The union of :meth:`checkpoint` over ``rows``; ``on_progress(done, total)`` after each."""
        out: set[str] = set()
        total = len(rows) if total is None else total
        for i, row in enumerate(rows, start=1):
            out |= self.checkpoint(row)
            if on_progress is not None:
                on_progress(start + i, total)
        return out
