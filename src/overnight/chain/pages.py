"""Paged collections: the done list and the artifact map, stored as immutable page blobs.

A state document holds page references, not the collections themselves, so it stays small
however long the task runs, and a commit re-encodes and stores only the pages that changed
(usually one): commit cost and verification stay flat, and total storage grows with what
changed. Page boundaries (:data:`~overnight.chain.records.DONE_PAGE`,
:data:`~overnight.chain.records.PAGE_FANOUT`) depend only on the entries, so equal
collections always give equal pages (and digests).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Callable, Any

from pydantic import TypeAdapter, ValidationError

from overnight.errors import RecordInvalid
from overnight.store.blobs import BlobWriter
from overnight.chain.integrity import DoneList, StoredPage, encode_state
from overnight.chain.records import DONE_PAGE, FORMAT_VERSION, PAGE_FANOUT, validation_summary


def done_pages(done: list[dict[str, Any]] | DoneList) -> list[Any]:
    """The done list cut into pages of :data:`DONE_PAGE` entries (a lazily loaded one's stored
    pages that stay as they are as :class:`~overnight.chain.integrity.StoredPage`, not read)."""
    if isinstance(done, DoneList):
        return done.pages()
    return [done[i : i + DONE_PAGE] for i in range(0, len(done), DONE_PAGE)]


@functools.lru_cache(maxsize=1 << 16)  # asked again for every entry at every commit
def is_boundary(name: str) -> bool:
    """Does a todo or artifact page end after the entry named ``name``? (see :data:`PAGE_FANOUT`)"""
    h = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(h[:4], "big") % PAGE_FANOUT == 0


def todo_pages(todo: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The todo list cut into pages, in order, a page ending after each boundary name."""
    pages: list[list[dict[str, Any]]] = []
    page: list[dict[str, Any]] = []
    for entry in todo:
        page.append(entry)
        if is_boundary(entry["name"]):
            pages.append(page)
            page = []
    if page:
        pages.append(page)
    return pages


def artifact_pages(artifacts: dict[str, dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """The artifact map cut into pages: names sorted, a page ending after each boundary name."""
    pages: list[dict[str, dict[str, Any]]] = []
    page: dict[str, dict[str, Any]] = {}
    for name in sorted(artifacts):
        page[name] = artifacts[name]
        if is_boundary(name):
            pages.append(page)
            page = {}
    if page:
        pages.append(page)
    return pages


def page_list(refs: dict[str, Any], writer: BlobWriter) -> dict[str, Any]:
    """The state document's member for a collection whose pages are ``refs["pages"]`` (all of
    them, in order): ``{"count", "pages", "middle"}`` -- with three pages or more only the first
    and last stay inline and the others' references go in a ``middle`` blob staged in ``writer``
    (:class:`~overnight.chain.records.Pages`)."""
    pages = refs["pages"]
    if len(pages) < 3:
        return {"count": refs["count"], "pages": pages, "middle": None}
    raw = encode_state(pages[1:-1])
    return {"count": refs["count"], "pages": [pages[0], pages[-1]],
            "middle": {"digest": writer.put(raw), "size": len(raw)}}


class PageWriter:
    """Turns pages into blob references, re-encoding only pages whose entries changed.

    A page is reused when it holds the very same entry objects as a page written (or loaded and
    verified) before -- the runner builds each new state from the previous one's entry objects, so
    an unchanged page is recognised by identity without encoding it.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[dict[str, Any], list[Any]]] = {}
        self._pending: dict[tuple, tuple[dict[str, Any], list[Any]]] | None = None

    @staticmethod
    def _key(page: list | dict) -> tuple:
        return tuple(page) if isinstance(page, dict) else (len(page), id(page[0]) if page else None)

    @staticmethod
    def _entries(page: list | dict) -> list[Any]:
        return list(page.values()) if isinstance(page, dict) else list(page)

    def seed(self, page: list | dict, ref: dict[str, Any]) -> None:
        """Remember a loaded page's reference (its entries are the objects the state will hold)."""
        self._cache[self._key(page)] = (ref, self._entries(page))

    def refs(self, pages: list[list | dict], writer: BlobWriter, schema: TypeAdapter | None = None,
             what: str = "page", index: Callable[[Any], dict[str, Any]] | None = None,
             **ids: Any) -> dict[str, Any]:
        """``{"count", "pages"}`` for ``pages``, staging new page blobs in ``writer``. Each page
        encoded anew is first validated against ``schema`` (a page reused was validated when it
        was written or loaded). ``index``: the members a page's reference adds to ``{"digest",
        "size"}``, from its entries (done pages, format 4: :func:`~overnight.chain.records.
        done_index`); a reused reference without them (loaded from format 3) gets them too.

        Raises:
            RecordInvalid: a new page does not match ``schema`` (``ids``: task, checkpoint).
        """
        out, count, fresh = [], 0, {}
        for page in pages:
            if isinstance(page, StoredPage):  # named by the verified state continued from, unchanged
                out.append(page.ref)
                count += page.count
                continue
            key, entries = self._key(page), self._entries(page)
            count += len(entries)
            cached = self._cache.get(key)
            if cached is not None and len(cached[1]) == len(entries) and all(a is b for a, b in zip(cached[1], entries)):
                ref = cached[0]
                if index is not None and any(ref.get(k) is None for k in ("names", "summary")):
                    ref = {"digest": ref["digest"], "size": ref["size"], **index(page)}
            else:
                if schema is not None:
                    try:
                        schema.validate_python(page)
                    except ValidationError as exc:
                        raise RecordInvalid(f"{what} does not match record format {FORMAT_VERSION}: "
                                            f"{validation_summary(exc)}; nothing was written",
                                            hint="this is a bug in the code that built the record", **ids) from exc
                raw = encode_state(page)
                ref = {"digest": writer.put(raw), "size": len(raw), **(index(page) if index is not None else {})}
            fresh[key] = (ref, entries)
            out.append(ref)
        self._pending = fresh  # reused by the next commit only once this one is stored: :meth:`accept`
        return {"count": count, "pages": out}

    def accept(self) -> None:
        """The commit that staged the pages of the last :meth:`refs` is stored: the next one may
        reuse them. (After a failed commit they are not reused: their blobs may not be stored.)"""
        if self._pending is not None:
            self._cache, self._pending = self._pending, None
