"""Paged collections: the done list and the artifact map, stored as immutable page blobs.

A state document holds page references, not the collections themselves, so it stays small
however long the task runs, and a commit re-encodes and stores only the pages that changed
(usually one): commit cost and verification stay flat, and total storage grows with what
changed. Page boundaries (:data:`~overnight.chain.records.DONE_PAGE`,
:data:`~overnight.chain.records.PAGE_FANOUT`) depend only on the entries, so equal
collections always give equal pages (and digests).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import operator
from typing import Any, Callable

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


def _cut(names: list[str], artifacts: dict[str, dict[str, Any]], pages: list[dict[str, dict[str, Any]]],
         starts: list[int], at: int, page: dict[str, dict[str, Any]] | None = None) -> None:
    """Append to ``pages`` (and their first positions to ``starts``) the pages of ``names`` (sorted,
    the names from position ``at`` of the whole sorted map on), as :func:`artifact_pages` cuts them;
    ``page``: the start of the first page (entries before ``at``, none of them a boundary)."""
    if page:
        starts.append(at - len(page))
    else:
        page = {}
    for name in names:
        if not page:
            starts.append(at)
        page[name] = artifacts[name]
        at += 1
        if is_boundary(name):
            pages.append(page)
            page = {}
    if page:
        pages.append(page)


class ArtifactPager:
    """:func:`artifact_pages` for the successive artifact maps of one chain, at the cost of what
    changed: the pages before the first changed name are the page objects of the last accepted
    map, and only the pages from there on are cut again (an append or a pop: the last page).

    An entry is unchanged when the new map holds the very same object under the same name (as
    :class:`PageWriter`, which then reuses those pages without encoding them); an equal but
    distinct object counts as changed. The last map's entries are kept, so identity is never
    confused by a reused ``id``.

    Besides the pages, :meth:`cut` tells which artifact digests the commit references anew (those
    of entries added or changed), and :meth:`referenced` whether a digest is still named by the
    new map -- what the commit path needs instead of walking every entry (ditto copies, known
    objects).
    """

    def __init__(self) -> None:
        # the last accepted map: its names in insertion order, its entries in that order, its
        # names sorted, the first position (in sorted order) of each page, and the pages
        self._keys: list[str] = []
        self._vals: list[dict[str, Any]] = []
        self._names: list[str] = []
        self._starts: list[int] = []
        self._pages: list[dict[str, dict[str, Any]]] = []
        self._counts: dict[str, int] | None = None  # digest -> entries naming it; None: no map yet
        self._pending: tuple | None = None  # what :meth:`accept` makes the last map
        self._diff: dict[str, int] = {}  # the pending map's counts minus the last map's
        self.kept = 0
        """How many of the pages the last :meth:`cut` returned, from the first, are the very page
        objects of the last accepted map (``PageWriter.refs(kept=...)``)."""

    def reset(self) -> None:
        """Forget the last map: the next :meth:`cut` cuts the whole map (after a load)."""
        self._counts, self._pending, self._diff = None, None, {}

    def _changed(self, keys: list[str], vals: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
        """Names added, removed or given another entry object since the last map, each with its
        entry in the last map (None: added)."""
        old_keys, old_vals = self._keys, self._vals
        m = min(len(keys), len(old_keys))
        if keys[:m] == old_keys[:m] and all(map(operator.is_, vals, old_vals)):  # (the first m of each)
            # the common case: appended at, or removed from, the end
            out: dict[str, dict[str, Any] | None] = dict(zip(old_keys[m:], old_vals[m:]))
            out.update((k, None) for k in keys[m:])
            return out
        old_ids = dict(zip(old_keys, map(id, old_vals)))  # self._vals keeps every old entry alive
        changed = {n for n, _ in dict(zip(keys, map(id, vals))).items() ^ old_ids.items()}
        old = dict(zip(old_keys, old_vals))
        return {n: old.get(n) for n in changed}

    def cut(self, artifacts: dict[str, dict[str, Any]]) -> tuple[list[dict[str, dict[str, Any]]], list[str] | None]:
        """``(pages, fresh)``: the pages of ``artifacts`` (equal to :func:`artifact_pages`), and
        the digests of its entries added or changed since the last accepted map (None after
        :meth:`reset`: every entry is new to this pager). Takes effect with :meth:`accept`."""
        keys, vals = list(artifacts), list(artifacts.values())
        if self._counts is None:
            names = sorted(keys)
            pages: list[dict[str, dict[str, Any]]] = []
            starts: list[int] = []
            _cut(names, artifacts, pages, starts, 0)
            counts: dict[str, int] = {}
            for a in vals:
                d = a["digest"]
                counts[d] = counts.get(d, 0) + 1
            self._pending, self._diff = (keys, vals, names, starts, pages, counts), {}
            self.kept = 0
            return pages, None
        changed = self._changed(keys, vals)
        if not changed:
            self._pending, self._diff = (keys, vals, self._names, self._starts, self._pages, None), {}
            self.kept = len(self._pages)
            return self._pages, []
        old_names, old_starts, old_pages = self._names, self._starts, self._pages
        lo = min(changed)
        k = max(0, bisect.bisect_right(old_starts, bisect.bisect_left(old_names, lo)) - 1)
        pages, starts = old_pages[:k], old_starts[:k]
        tail: set[str] = set()
        prefix: dict[str, dict[str, Any]] = {}
        at = 0
        if old_pages:  # page k keeps its entries before the first changed name (not one of them
            at = old_starts[k]  # a boundary but maybe its last); the rest is cut again
            prefix = dict(old_pages[k])
            while prefix and next(reversed(prefix)) >= lo:
                name = prefix.popitem()[0]
                if name in artifacts:
                    tail.add(name)
            if k + 1 < len(old_starts):
                tail.update(n for n in old_names[old_starts[k + 1]:] if n in artifacts)
        tail.update(n for n in changed if n in artifacts)
        tail_names = sorted(tail)
        self.kept = k
        at += len(prefix)
        if prefix and len(prefix) == len(old_pages[k]) and is_boundary(next(reversed(prefix))):
            pages.append(old_pages[k])  # page k is whole and complete: the same page object
            starts.append(at - len(prefix))
            self.kept = k + 1
            prefix = {}
        _cut(tail_names, artifacts, pages, starts, at, prefix)
        diff: dict[str, int] = {}
        fresh: list[str] = []
        for n, a in changed.items():
            if a is not None:
                diff[a["digest"]] = diff.get(a["digest"], 0) - 1
            a = artifacts.get(n)
            if a is not None:
                d = a["digest"]
                diff[d] = diff.get(d, 0) + 1
                fresh.append(d)
        self._pending, self._diff = (keys, vals, old_names[:at] + tail_names, starts, pages, None), diff
        return pages, fresh

    def referenced(self, d: str) -> bool:
        """Does the map of the last :meth:`cut` name an artifact of digest ``d``?"""
        if self._pending is not None and self._pending[5] is not None:
            return d in self._pending[5]
        return self._counts is not None and self._counts.get(d, 0) + self._diff.get(d, 0) > 0

    def accept(self) -> None:
        """The commit of the last :meth:`cut` is stored: the next one is compared with its map."""
        if self._pending is None:
            return
        self._keys, self._vals, self._names, self._starts, self._pages, counts = self._pending
        if counts is not None:
            self._counts = counts
        else:
            assert self._counts is not None
            for d, n in self._diff.items():
                n += self._counts.get(d, 0)
                if n:
                    self._counts[d] = n
                else:
                    self._counts.pop(d, None)
        self._pending, self._diff = None, {}


def page_list(refs: dict[str, Any], writer: BlobWriter, last: list | None = None) -> dict[str, Any]:
    """The state document's member for a collection whose pages are ``refs["pages"]`` (all of
    them, in order): ``{"count", "pages", "middle"}`` -- with three pages or more only the first
    and last stay inline and the others' references go in a ``middle`` blob staged in ``writer``
    (:class:`~overnight.chain.records.Pages`).

    ``last``: ``[middle page references, middle blob reference]`` of an earlier call, updated
    here; when the middle pages are the very same reference objects and that blob is known to
    ``writer`` (stored and verified), it is named again without encoding the list."""
    pages = refs["pages"]
    if len(pages) < 3:
        return {"count": refs["count"], "pages": pages, "middle": None}
    middle = pages[1:-1]
    if (last is not None and last[1] is not None and len(last[0]) == len(middle)
            and all(map(operator.is_, last[0], middle)) and last[1]["digest"] in writer.known):
        ref = last[1]
    else:
        raw = encode_state(middle)
        ref = {"digest": writer.put(raw), "size": len(raw)}
        if last is not None:
            last[:] = [middle, ref]
    return {"count": refs["count"], "pages": [pages[0], pages[-1]], "middle": ref}


class PageWriter:
    """Turns pages into blob references, re-encoding only pages whose entries changed.

    A page is reused when it holds the very same entry objects as a page written (or loaded and
    verified) before -- the runner builds each new state from the previous one's entry objects, so
    an unchanged page is recognised by identity without encoding it.

    A page that did change is usually the previous version of itself with entries added or
    removed at its end (the last page of a growing list or map): its entries that are the very
    same objects as those of the previous version, in the same place, are not validated again
    (they were when that version was written or loaded), and the bytes of that version up to the
    first new entry are reused -- the canonical encoding of a JSON object or array is its
    members' encodings joined by commas, so the page's bytes are exactly those a whole encoding
    gives (entries removed from the end are encoded and must end those bytes, else the page is
    encoded whole).
    """

    def __init__(self) -> None:
        self._cache: dict[tuple, tuple[dict[str, Any], list[Any]]] = {}
        self._pending: dict[tuple, tuple[dict[str, Any], list[Any]]] | None = None
        # the pages of the last call whose commit was stored, in order: their keys, (ref, entries),
        # first entries, page objects and entry counts (five lists); and those of the last call
        self._placed: tuple[list, ...] = ([], [], [], [], [])
        self._pending_placed: tuple[list, ...] = ([], [], [], [], [])
        # first entry of a page (its name; for a list, the id of the entry object) -> the last
        # version of that page encoded or loaded: its names (None: a list), its entries and its
        # canonical bytes (None: not kept)
        self._versions: dict[Any, tuple[list[str] | None, list[Any], bytes | None]] = {}
        self._raw: list[Any] = []  # the first entries of the versions that keep their bytes

    @staticmethod
    def _key(page: list | dict) -> tuple:
        return tuple(page) if isinstance(page, dict) else (len(page), id(page[0]) if page else None)

    @staticmethod
    def _entries(page: list | dict) -> list[Any]:
        return list(page.values()) if isinstance(page, dict) else list(page)

    @staticmethod
    def _start(page: list | dict, entries: list[Any]) -> Any:
        if not entries:
            return None
        return next(iter(page)) if isinstance(page, dict) else ("id", id(entries[0]))

    def seed(self, page: list | dict, ref: dict[str, Any]) -> None:
        """Remember a loaded page's reference (its entries are the objects the state will hold)."""
        entries = self._entries(page)
        self._cache[self._key(page)] = (ref, entries)
        start = self._start(page, entries)
        if start is not None:
            self._versions[start] = (list(page) if isinstance(page, dict) else None, entries, None)

    def _same_prefix(self, page: list | dict, names: list[str] | None, entries: list[Any]) -> tuple[int, Any]:
        """``(n, version)``: the first ``n`` entries of ``page`` are those of ``version`` (the
        last version of the page that starts with the same entry), in the same places."""
        version = self._versions.get(self._start(page, entries))
        if version is None:
            return 0, None
        old_names, old_entries = version[0], version[1]
        n = min(len(entries), len(old_entries))
        if not all(map(operator.is_, entries[:n], old_entries[:n])) or (
                names is not None and (old_names is None or names[:n] != old_names[:n])):
            return 0, None
        return n, version

    @staticmethod
    def _member(names: list[str] | None, entries: list[Any], i: int) -> bytes:
        """The canonical bytes of member ``i`` of a page, with the comma before it (none for the first)."""
        out = encode_state(entries[i]) if names is None else encode_state(names[i]) + b":" + encode_state(entries[i])
        return b"," + out if i else out

    def _encode(self, page: list | dict, names: list[str] | None, entries: list[Any], schema: TypeAdapter | None,
                what: str, ids: dict[str, Any]) -> bytes:
        """The canonical bytes of a changed page, its new entries validated against ``schema``."""
        n, version = self._same_prefix(page, names, entries)
        if schema is not None and n < len(entries):
            new = {k: page[k] for k in names[n:]} if names is not None else entries[n:]  # type: ignore[index]
            try:
                schema.validate_python(new)
            except ValidationError as exc:
                raise RecordInvalid(f"{what} does not match record format {FORMAT_VERSION}: "
                                    f"{validation_summary(exc)}; nothing was written",
                                    hint="this is a bug in the code that built the record", **ids) from exc
        if n == 0 or version[2] is None:
            return encode_state(page)
        old_names, old_entries, raw = version
        body = raw[:-1]  # the previous version's members, joined; then those it has beyond the first n go
        for i in range(len(old_entries) - 1, n - 1, -1):
            member = self._member(old_names, old_entries, i)
            if not body.endswith(member):  # an entry changed in place since: encode the page whole
                return encode_state(page)
            body = body[: len(body) - len(member)]
        parts = [body, *(self._member(names, entries, i) for i in range(n, len(entries))), raw[-1:]]
        return b"".join(parts)

    def refs(self, pages: list[list | dict], writer: BlobWriter, schema: TypeAdapter | None = None,
             what: str = "page", index: Callable[[Any], dict[str, Any]] | None = None, *, kept: int = 0,
             **ids: Any) -> dict[str, Any]:
        """``{"count", "pages"}`` for ``pages``, staging new page blobs in ``writer``. The new
        entries of each page encoded anew are first validated against ``schema`` (a page reused,
        or an entry of the page's previous version, was validated when it was written or loaded).

        ``index``: the members a page's reference adds to ``{"digest", "size"}``, from its entries
        (done pages, format 4: :func:`~overnight.chain.records.done_index`); a reused reference
        without them (loaded from format 3) gets them too.

        ``kept``: the first ``kept`` pages are, in the same places, the very page objects of the
        last call whose commit was stored, not changed since (:class:`ArtifactPager` knows): their
        references are taken as they are, without looking at their entries.

        Raises:
            RecordInvalid: a new page does not match ``schema`` (``ids``: task, checkpoint).
        """
        last = self._placed  # the last stored call's pages: keys, (ref, entries), first entries, pages, counts
        if not (kept and len(last[3]) >= kept and all(map(operator.is_, last[3][:kept], pages[:kept]))):
            kept = 0
        keys, cached_refs, starts, objs, counts = (last[0][:kept], last[1][:kept], last[2][:kept],
                                                   last[3][:kept], last[4][:kept])
        fresh = dict(zip(keys, cached_refs))
        out = [c[0] for c in cached_refs]
        versions = dict(self._versions) if kept else {}
        fresh_raw: list[Any] = []
        for page in pages[kept:]:
            if isinstance(page, StoredPage):  # named by the verified state continued from, unchanged
                out.append(page.ref)
                keys.append(None), cached_refs.append((page.ref, [])), starts.append(None), objs.append(page)
                counts.append(page.count)
                continue
            key, entries = self._key(page), self._entries(page)
            start = self._start(page, entries)
            cached = self._cache.get(key)
            if cached is not None and len(cached[1]) == len(entries) and all(map(operator.is_, cached[1], entries)):
                ref = cached[0]
                if start in self._versions:
                    versions[start] = self._versions[start]
                if index is not None and any(ref.get(k) is None for k in ("names", "summary")):
                    ref = {"digest": ref["digest"], "size": ref["size"], **index(page)}
            else:
                names = list(page) if isinstance(page, dict) else None
                raw = self._encode(page, names, entries, schema, what, ids)
                ref = {"digest": writer.put(raw), "size": len(raw), **(index(page) if index is not None else {})}
                if start is not None:
                    versions[start] = (names, entries, raw)
                    fresh_raw.append(start)
            fresh[key] = (ref, entries)
            out.append(ref)
            keys.append(key), cached_refs.append((ref, entries)), starts.append(start), objs.append(page)
            counts.append(len(entries))
        if len(versions) > 2 * len(starts) + 16:  # versions of pages no longer there: dropped
            live = set(starts)
            versions = {k: v for k, v in versions.items() if k in live}
        # only the last page keeps its bytes (the page an append or a pop changes next)
        tail = starts[-1] if starts else None
        for s in (*self._raw, *fresh_raw):
            v = versions.get(s)
            if s != tail and v is not None and v[2] is not None:
                versions[s] = (v[0], v[1], None)
        self._raw = [tail] if tail in versions and versions[tail][2] is not None else []
        self._versions = versions
        # reused by the next commit only once this one is stored: :meth:`accept`
        self._pending, self._pending_placed = fresh, (keys, cached_refs, starts, objs, counts)
        return {"count": sum(counts), "pages": out}

    def accept(self) -> None:
        """The commit that staged the pages of the last :meth:`refs` is stored: the next one may
        reuse them. (After a failed commit they are not reused: their blobs may not be stored.)"""
        if self._pending is not None:
            self._cache, self._pending = self._pending, None
            self._placed, self._pending_placed = self._pending_placed, ([], [], [], [], [])
