"""Reachability: which checkpoints a branch needs, and which objects a checkpoint needs.

The two questions ``gc`` and ``archive`` ask (spec: ``docs/FORMAT.md``, "Deletion"):

* **lineage** -- a branch head and every checkpoint it descends from, through ``parent_id`` (the
  store's index column, so a damaged record still links its parent) and through a merge's second
  parent (``event.ref`` of a ``merge`` record). A checkpoint on no live branch's lineage is
  *dangling*: a record a fallback skipped, the history of a deleted branch.
* **objects** -- everything loading a checkpoint reads: its state document; the document's todo,
  done and artifact pages; every artifact blob; the world fingerprint blob; and, for each of these
  that is chunked, its tree object, its chunk index (itself possibly chunked) and its chunks.

The walk is *tolerant*: a record that does not parse, or an object that is missing or damaged,
is reported (:class:`Unreadable`) and the walk goes on with what it can read. That is safe for
deletion: a checkpoint that verifies is fully readable, so everything it needs is found; only a
checkpoint that can never load again may lose objects its damaged parts pointed to -- and a write
that heals such a record writes those objects again. What the walk refuses is a record or state
document of a *newer* format (:class:`~overnight.errors.FormatTooNew`): it cannot know what
that references, so it stops rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from overnight.codec.canonical import loads
from overnight.errors import DecodeError, FormatTooNew, IntegrityError, OvernightError, short_id
from overnight.store.base import CheckpointRow, Store
from overnight.chain.ditto import HealingReader
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

        A missing or damaged blob counts as itself (kept if it is stored at all) and is reported.
        """
        wanted = [d for d in dict.fromkeys(digests) if d not in self._closure]
        for i in range(0, len(wanted), _BATCH):
            part = wanted[i : i + _BATCH]
            try:
                found = self.store.get_objects(part)
            except IntegrityError:  # an archived object whose pack is damaged: one by one
                found = {}
                for d in part:
                    try:
                        found.update(self.store.get_objects([d]))
                    except IntegrityError as exc:
                        self._note(where, f"object {d}: {exc.message}")
            for d in part:
                obj = found.get(d)
                if obj is None:
                    self._closure[d] = frozenset((d,))
                    self._note(where, f"object {d} is missing")
                elif obj.kind == "tree":
                    try:
                        self._closure[d] = frozenset(self.reader.reachable(d, "gc"))
                    except IntegrityError as exc:
                        self._closure[d] = frozenset((d,))
                        self._note(where, f"chunk tree {d}: {exc.message}")
                else:
                    self._closure[d] = frozenset((d,))
        out: set[str] = set()
        for d in digests:
            out.update(self._closure[d])
        return out

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
            tree = self._read(page, f"{cp} artifact page", where)
            digests = []
            if isinstance(tree, dict):
                for ref in tree.values():
                    if isinstance(ref, dict) and isinstance(ref.get("digest"), str):
                        digests.append(ref["digest"])
            elif tree is not None:
                self._note(where, f"{cp} artifact page {page} is not an object")
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
