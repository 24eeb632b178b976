# Over 600 lines: the load of one checkpoint with all five checks (record, state document, its value blobs, pages, artifacts) and the page views a load hands out (DonePages/DoneList: checked as read); they change together whenever the format does.
"""Integrity: build checkpoint records, and load them back only when they verify.

A checkpoint loads only if, in this order:

1. its body hashes to its id (``sha256(body) == checkpoint_id``);
2. it parses strictly, is byte-for-byte in canonical form, and its ``format`` is one this code
   knows (older formats are migrated, :mod:`overnight.chain.migrate`; a newer one raises
   :class:`~overnight.errors.FormatTooNew`, never a misread);
3. it validates against :class:`~overnight.chain.records.CheckpointRecord` with every field
   present, and the store's index columns agree with the body;
4. with a signing key configured, its HMAC-SHA256 signature matches;
5. its state blob, and (``deep=True``) every artifact blob, is present and hashes to its digest,
   and the state document validates against :class:`~overnight.chain.records.TaskState`.

Anything else raises an :class:`~overnight.errors.IntegrityError` naming the checkpoint and the
failed check, and nothing is returned: a state that cannot be verified is never loaded.

A record or object that is missing or fails its digest is first looked up in its ditto copy
(:mod:`overnight.chain.ditto`): a copy that verifies against the same digest is used -- the bytes
are then exactly the original's -- and listed in :attr:`LoadedCheckpoint.healed`; a copy that does
not is refused and the check fails as above.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Iterable, Iterator, Sequence

from pydantic import TypeAdapter, ValidationError

from overnight.codec import digest
from overnight.codec.canonical import canonical_tree, dumps, dumps_sorted, loads
from overnight.errors import (
    DecodeError,
    DigestMismatch,
    FormatTooNew,
    IntegrityError,
    MissingObject,
    OvernightError,
    SchemaError,
    SignatureError,
    short_id,
)
from overnight.store.base import CheckpointRow, Store
from overnight.store.blobs import BlobReader
from overnight.chain.ditto import Heal, HealingReader
from overnight.chain.ditto import get_checkpoint as ditto_checkpoint
from overnight.chain.records import WORLD_FORMAT
from overnight.keys import signing_key_from_env  # noqa: F401 (re-exported)
from overnight.chain.migrate import RECORD_MIGRATIONS, STATE_MIGRATIONS, upgrade, upgrade_done_refs, upgrade_entries
from overnight.chain.records import (
    ARTIFACT_PAGE,
    DONE_PAGE,
    DONE_PAGE_LIST,
    DONE_PAGE_SCHEMA,
    TODO_PAGE,
    WORLD,
    ArtifactRef,
    BlobRef,
    DoneRef,
    PAGE_LIST,
    CheckpointRecord,
    Pages,
    StateDoc,
    TaskState,
    done_index,
    merge_summaries,
    name_tag,
    validation_summary,
)


@dataclass(frozen=True)
class Page:
    """One verified page blob: its reference, its entries as stored (a list or an object), and
    the same entries as validated models."""

    ref: dict[str, Any]
    tree: Any
    entries: Any
    migrated: bool = False
    """The entries were upgraded from an older format (``tree`` is not what ``ref``'s bytes hold):
    a writer must encode the page again rather than reuse ``ref``."""

    @cached_property
    def index(self) -> dict[str, Any]:
        """``{"names", "summary"}`` of a done page's entries (:func:`~overnight.chain.records.
        done_index`), computed once per page however many checkpoints name it."""
        return done_index(self.tree)

    @cached_property
    def ordered(self) -> bool:
        """Its names (an object page's members) are non-empty and in strictly increasing order,
        checked once per page (a load checks the order across pages at their boundaries)."""
        names = list(self.tree)
        return bool(names) and all(a < b for a, b in zip(names, names[1:]))


PageCache = dict[str, Page]
"""Verified pages by digest, shared across loads (a page is parsed and checked once)."""


class BoundedPageCache(OrderedDict[str, Page]):
    """A :data:`PageCache` keeping the ``limit`` most recently used pages (``verify --all`` over a
    long history: consecutive checkpoints share most pages, old ones are not needed again).
    At the default 4,096 pages of at most ~64 KB of entries each, memory stays bounded.

    It also keeps the newest page read of each kind with its bytes (:attr:`tails`): the next
    checkpoint's last done or artifact page is usually that page with entries appended, and only
    the appended entries are then parsed and validated (:func:`_extend`). A tail superseded by a
    newer page of its kind leaves the cache unless the loading checkpoint still uses it, so a long
    history does not fill it with versions of the pages every step rewrites."""

    def __init__(self, limit: int = 4096) -> None:
        super().__init__()
        self.limit = limit
        self.tails: dict[str, tuple[bytes, Page]] = {}
        self.middles: OrderedDict[tuple[str, str, int], Middle] = OrderedDict()
        """The middle page lists of the last loads, checked (:class:`Middle`), by ``(collection,
        page-list digest, state format)``: consecutive checkpoints mostly share them, and a load
        then checks only the first and the last page, not every page again."""

    def middle(self, key: tuple[str, str, int]) -> Middle | None:
        found = self.middles.get(key)
        if found is not None:
            self.middles.move_to_end(key)
        return found

    def add_middle(self, key: tuple[str, str, int], middle: Middle) -> None:
        self.middles[key] = middle
        while len(self.middles) > 8:
            self.middles.popitem(last=False)


@dataclass
class Middle:
    """A verified middle page list (:attr:`~overnight.chain.records.Pages.middle`) and, once a load
    has read them, its pages with what a load checks across them -- each page verified, done pages
    full, artifact pages each in order and in order across their boundaries -- so the next load
    naming the same list checks only its first and last page against it. ``pages`` is None until
    its pages were all read (a lazy load reads none)."""

    refs: list[BlobRef]
    digests: set[str]
    distinct: bool
    pages: list[Page] | None = None
    entries: int = 0
    """Entries in ``pages``."""
    sound: bool = False
    """Done pages: each holds :data:`DONE_PAGE` entries; artifact pages: each ordered, and in order
    across the boundaries between them."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def __setitem__(self, key: str, value: Page) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)

_DONE_PAGE = DONE_PAGE_SCHEMA
_TODO_PAGE = TODO_PAGE
_WORLD = WORLD
_ARTIFACT_PAGE = ARTIFACT_PAGE


def _done_page_size(i: int, pages: int, count: int) -> int:
    """Entries done page ``i`` of ``pages`` holds when they hold ``count`` in all: :data:`DONE_PAGE`,
    the last one the rest."""
    return DONE_PAGE if i < pages - 1 else count - DONE_PAGE * (pages - 1)


class DonePages(Sequence[Page]):
    """The done pages of one checkpoint, each read and verified the first time it is used.

    The state document -- verified before this exists -- names every page by digest and size and
    says how many entries they hold; page ``i`` is read, hashed against that digest, checked for
    canonical form and against :data:`~overnight.chain.records.DONE_PAGE_SCHEMA`, and must hold
    :data:`~overnight.chain.records.DONE_PAGE` entries (the last: the rest of ``count``) -- the
    checks a full load makes -- when it is first asked for, then kept. A page that fails raises
    that check's :class:`~overnight.errors.IntegrityError` (naming the task and checkpoint) then,
    and nothing of it is returned. ``len()`` is the number of pages; :attr:`count` the entries.
    """

    def __init__(self, refs: list[DoneRef] | Callable[[], list[DoneRef]], count: int,
                 load: Callable[[int, DoneRef], Page], ends: tuple[DoneRef, DoneRef] | None = None) -> None:
        self._refs = refs if isinstance(refs, list) else None
        self._read_refs = None if isinstance(refs, list) else refs
        self._ends = ends
        self.count = count
        self._n = -(-count // DONE_PAGE)
        self._load = load
        self._pages: dict[int, Page] = {}

    @property
    def refs(self) -> list[DoneRef]:
        """Every page's reference, in order. Given as a callable (a lazy load of a long list), the
        references of the middle pages are read from the state's middle page list -- hashed,
        checked and matched against ``count`` -- the first time they are needed, which raises
        that check's :class:`~overnight.errors.IntegrityError` if it fails; the first and the last
        page (``ends``, inline in the state document) are read without it."""
        if self._refs is None:
            assert self._read_refs is not None
            self._refs = self._read_refs()
            self._read_refs = None
        return self._refs

    def __len__(self) -> int:
        return self._n  # what the verified state document's count implies; the references agree

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        page = self._pages.get(i)
        if page is None:
            ends = self._ends if self._refs is None else None
            ref = ends[0] if ends and i == 0 else ends[1] if ends and i == self._n - 1 else self.refs[i]
            page = self._pages[i] = self._load(i, ref)
        return page

    def size(self, i: int) -> int:
        """Entries page ``i`` holds (from the verified state document; nothing is read)."""
        return _done_page_size(i, self._n, self.count)

    def loaded(self) -> list[Page]:
        """The pages read (and verified) so far, in order."""
        return [self._pages[i] for i in sorted(self._pages)]

    def candidates(self, name: str) -> list[int]:
        """Pages that may hold an entry named ``name``, in order: those whose index
        (:attr:`~overnight.chain.records.DoneRef.names`, verified with the state document) has
        its tag, and those without an index (format 3). Nothing is read."""
        tag = name_tag(name)
        out = []
        for i, ref in enumerate(self.refs):
            names = ref.names
            if names is None:
                out.append(i)
                continue
            at = names.find(tag)
            while at != -1 and at % 8:
                at = names.find(tag, at + 1)
            if at != -1:
                out.append(i)
        return out

    def summary(self) -> dict[str, Any] | None:
        """The :class:`~overnight.chain.records.DoneSummary` tree of every stored entry, from the
        page references (nothing is read); None when a page has none (format 3)."""
        if any(ref.summary is None for ref in self.refs):
            return None
        return merge_summaries(ref.summary.model_dump() for ref in self.refs)  # type: ignore[union-attr]


@dataclass(frozen=True)
class StoredPage:
    """A done page a writer keeps as it is stored: its reference and entry count (the page of a
    lazily loaded checkpoint that a commit leaves unchanged, :meth:`DoneList.pages`)."""

    ref: dict[str, Any]
    count: int


class DoneList(Sequence[dict[str, Any]]):
    """The done list (entry trees) of a checkpoint loaded with ``lazy_done=True``, read page by
    page as it is used, plus the entries appended since.

    ``len()`` and ``done + [entry]`` (a new list sharing the pages) read nothing; ``done[i]`` reads
    the page holding entry ``i``; iterating reads the pages in order as it goes, so a search that
    stops at its match reads only the pages up to it; ``reversed()`` reads from the last page.
    Every page is verified before its entries are returned (:class:`DonePages`).
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, pages: DonePages, tail: tuple[dict[str, Any], ...] = ()) -> None:
        self.stored = pages
        self.tail = tail

    def __len__(self) -> int:
        return self.stored.count + len(self.tail)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i >= self.stored.count:
            return self.tail[i - self.stored.count]
        return self.stored[i // DONE_PAGE].tree[i % DONE_PAGE]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for page in self.stored:
            yield from page.tree
        yield from self.tail

    def __reversed__(self) -> Iterator[dict[str, Any]]:
        yield from reversed(self.tail)
        for i in reversed(range(len(self.stored))):
            yield from reversed(self.stored[i].tree)

    def __add__(self, other: Any) -> DoneList:
        if not isinstance(other, (list, tuple)):
            return NotImplemented
        return DoneList(self.stored, self.tail + tuple(other))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, DoneList)):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    def named(self, name: str, key: str | None = None, *, last: bool = False) -> dict[str, Any] | None:
        """The first (``last``: the last) entry named ``name`` (and, given ``key``, with that step
        key), or None -- what a scan in order finds, reading (and verifying) only the pages whose
        index may hold it (:meth:`DonePages.candidates`)."""
        def hit(e: dict[str, Any]) -> bool:
            return e["name"] == name and (key is None or e["key"] == key)

        if last:
            found = next((e for e in reversed(self.tail) if hit(e)), None)
            for i in reversed(self.stored.candidates(name)) if found is None else ():
                found = next((e for e in reversed(self.stored[i].tree) if hit(e)), None)
                if found is not None:
                    break
            return found
        for i in self.stored.candidates(name):
            found = next((e for e in self.stored[i].tree if hit(e)), None)
            if found is not None:
                return found
        return next((e for e in self.tail if hit(e)), None)

    def summary(self) -> dict[str, Any] | None:
        """The :class:`~overnight.chain.records.DoneSummary` tree of the whole list (stored pages
        from their references, appended entries computed), or None (format-3 pages)."""
        stored = self.stored.summary()
        if stored is None:
            return None
        return merge_summaries([stored, done_index(self.tail)["summary"]]) if self.tail else stored

    def pages(self) -> list[Any]:
        """The list cut into done pages as a writer stores it: a :class:`StoredPage` for each
        stored page that stays as it is (every one when nothing was appended; all but a partly
        filled last one otherwise, which is read to be extended), then lists of entries."""
        n = len(self.stored)
        keep = n if not self.tail or self.stored.count % DONE_PAGE == 0 else n - 1
        rest = [*(self.stored[keep].tree if keep < n else ()), *self.tail]
        return [*(StoredPage(self.stored.refs[i].model_dump(), self.stored.size(i)) for i in range(keep)),
                *(rest[i : i + DONE_PAGE] for i in range(0, len(rest), DONE_PAGE))]


def done_named(done: Sequence[dict[str, Any]], name: str, key: str | None = None, *,
               last: bool = False) -> dict[str, Any] | None:
    """The first (``last``: the last) done entry named ``name`` (and, given ``key``, with that
    step key), or None: by the pages' index for a :class:`DoneList` (:meth:`DoneList.named`), by
    a scan otherwise."""
    if isinstance(done, DoneList):
        return done.named(name, key, last=last)
    entries = reversed(done) if last else iter(done)
    return next((d for d in entries if d["name"] == name and (key is None or d["key"] == key)), None)


def done_summary_of(done: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The :class:`~overnight.chain.records.DoneSummary` tree of a :class:`DoneList` from its
    pages' references (:meth:`DoneList.summary`), or None (a plain list, or format-3 pages: the
    caller reads the entries)."""
    return done.summary() if isinstance(done, DoneList) else None


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint that passed verification: the stored row, the parsed record, the state
    document and its pages. ``state``/``state_tree`` assemble the full state on first use."""

    row: CheckpointRow
    record: CheckpointRecord
    doc: StateDoc
    doc_tree: dict[str, Any]
    todo_pages: list[Page]
    done_pages: DonePages
    """Read and verified as used (:class:`DonePages`); all of them by a load without ``lazy_done``."""
    artifact_pages: list[Page]
    world: dict[str, Any] | None = None
    """The recorded world fingerprint (:class:`~overnight.chain.records.WorldDoc` tree), if any."""
    healed: tuple[Heal, ...] = ()
    """Objects and records read from their ditto copies (:mod:`overnight.chain.ditto`) by this load."""
    data: Any = None
    """The user state (``ctx.state``) as a tree, with the values the document stores as their own
    blobs (``values``, format 3) read back in place."""
    lazy_done: bool = False
    """Loaded with ``lazy_done=True``: :attr:`state_tree`'s ``done`` is a :class:`DoneList`."""
    heal_log: list[Heal] | None = field(default=None, repr=False, compare=False)
    """The loading reader's list of heals, which grows when pages read later (a lazy load's done
    pages and middle page list) come from ditto copies (:meth:`with_later_heals`)."""

    @property
    def id(self) -> str:
        return self.row.checkpoint_id

    def with_later_heals(self) -> LoadedCheckpoint:
        """This load with :attr:`healed` brought up to date: what its reader read from ditto copies
        since it returned (done pages and the middle page list of a lazy load, read as used)."""
        log = self.heal_log
        return self if log is None or len(log) == len(self.healed) else replace(self, healed=tuple(log))

    @cached_property
    def artifacts(self) -> dict[str, ArtifactRef]:
        """Artifact references by name (validated models)."""
        return {name: ref for p in self.artifact_pages for name, ref in p.entries.items()}

    @cached_property
    def state_tree(self) -> dict[str, Any]:
        """The state as a tree with ``done`` as one list and ``artifacts`` as one mapping (the
        entries are the pages' own objects, so unchanged pages are recognised when committing).
        ``done`` is a :class:`DoneList`, read page by page as used, when loaded with ``lazy_done``."""
        done = DoneList(self.done_pages) if self.lazy_done else [e for p in self.done_pages for e in p.tree]
        return {**{k: v for k, v in self.doc_tree.items() if k != "values"}, "data": self.data,
                "todo": [e for p in self.todo_pages for e in p.tree], "done": done,
                "artifacts": {n: a for p in self.artifact_pages for n, a in p.tree.items()}}

    @cached_property
    def state(self) -> TaskState:
        d = self.doc
        return TaskState.model_construct(format=d.format, task=d.task,
                                         todo=[e for p in self.todo_pages for e in p.entries],
                                         done=[e for p in self.done_pages for e in p.entries],
                                         artifacts=self.artifacts, data=self.data, context=d.context,
                                         recompute=d.recompute)


def encode_record(record: dict[str, Any]) -> bytes:
    """Canonical bytes of a checkpoint record (sorted keys)."""
    return dumps_sorted(record)


def encode_state(doc_tree: dict[str, Any]) -> bytes:
    """Canonical bytes of a state document or done page (member order as built; user values keep theirs)."""
    return dumps(doc_tree)


_validation_summary = validation_summary


def _parse(data: bytes, what: str, encoder: Any, migrations: dict, ids: dict[str, Any]) -> tuple[Any, int]:
    """Parse strictly, refuse a newer format, require the canonical encoding, migrate older ones.
    Returns ``(upgraded tree, format as stored)``.

    Other bytes for the same tree (reordered or duplicated members, whitespace, other escapes)
    mean the record was not written by overnight: it is refused even if its digest matches.
    """
    tree = canonical_tree(data, sort_keys=encoder is dumps_sorted)  # the fast path shows it, or:
    if tree is not None:
        return upgrade(tree, what, migrations, **ids), tree["format"]
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
    return upgraded, tree["format"]


_CLOSE = {ord("]"): b"[", ord("}"): b"{"}


def _extend(prev_raw: bytes, prev: Page, raw: bytes, adapter: TypeAdapter) -> tuple[Any, Any] | None:
    """``(tree, validated entries)`` of page bytes ``raw`` that are the verified page ``prev``
    (canonical bytes ``prev_raw``) with entries appended -- ``prev_raw`` without its closing
    bracket, a comma, the new entries, the bracket -- parsing and validating only the new ones;
    None when ``raw`` is not that (the caller parses it whole). The entries of a page are
    validated one by one, so this checks exactly what a whole parse checks: the appended part
    alone is canonical, and a dict page's new names are not already on it (a duplicate member).
    A list page that is ``prev`` with its first entries taken off is recognised too
    (:func:`_trimmed`)."""
    if not prev.migrated and isinstance(prev.tree, list) and 2 < len(raw) < len(prev_raw):
        return _trimmed(prev_raw, prev, raw)
    if prev.migrated or not prev.tree or len(raw) <= len(prev_raw) or raw[len(prev_raw) - 1] != ord(",") \
            or not raw.startswith(prev_raw[:-1]) or raw[-1] != prev_raw[-1]:
        return None
    tail = canonical_tree(_CLOSE[raw[-1]] + raw[len(prev_raw):])
    if not tail:
        return None
    try:  # an entry that does not validate: the whole parse names it at its place on the page
        if isinstance(prev.tree, dict):
            if not isinstance(tail, dict) or not tail.keys().isdisjoint(prev.tree):
                return None
            return {**prev.tree, **tail}, {**prev.entries, **adapter.validate_python(tail)}
        return [*prev.tree, *tail], [*prev.entries, *adapter.validate_python(tail)]
    except ValidationError:
        return None


def _trimmed(prev_raw: bytes, prev: Page, raw: bytes) -> tuple[Any, Any] | None:
    """``(tree, validated entries)`` of list-page bytes ``raw`` that are the verified page ``prev``
    (canonical bytes ``prev_raw``) with its first entries taken off -- ``[``, then the bytes of
    ``prev_raw`` after the comma that ends them -- without parsing or validating anything: the
    entries left are ``prev``'s, encoded as they were (a todo page consumed from the front).
    The bytes taken off must parse as those first entries, so the cut is between two entries
    (a cut inside an entry, a string or a nested value leaves them unbalanced). None otherwise."""
    cut = len(prev_raw) - len(raw) + 1  # where the entries kept start in prev_raw
    if raw[0] != ord("[") or prev_raw[cut - 1] != ord(",") or not prev_raw.endswith(raw[1:]):
        return None
    head = canonical_tree(prev_raw[: cut - 1] + b"]")
    if not isinstance(head, list) or not 0 < len(head) < len(prev.tree) or head != prev.tree[: len(head)]:
        return None
    return prev.tree[len(head):], prev.entries[len(head):]


_NONE = type(None)
_ROW_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("checkpoint_id", (str,), "text"), ("task_id", (str,), "text"), ("parent_id", (str, _NONE), "text or null"),
    ("branch", (str,), "text"), ("seq", (int,), "an integer"), ("created_at", (str,), "text"),
    ("session", (str,), "text"), ("event", (str,), "text"), ("step", (str, _NONE), "text or null"),
    ("body", (bytes,), "bytes"), ("signature", (str, _NONE), "text or null"), ("stored_bytes", (int,), "an integer"),
)
"""Each :class:`~overnight.store.base.CheckpointRow` field, the exact types it may hold, and how a
message names them."""


def _check_row_fields(row: CheckpointRow) -> None:
    """Check that every field of a stored checkpoint row has exactly its declared type (``seq`` an
    ``int``, not a ``bool``, a ``str`` or a float; ``body`` ``bytes``; ...), before anything is
    computed from it.

    A store that read a cell of the wrong type hands out a placeholder of a *subclass* of the
    field's type carrying a ``damage`` attribute (``overnight.store.sqlite.DamagedInt`` and its
    siblings) so that listings still work; the exact-type check refuses it here, with the store's
    description of the cell.

    Raises:
        SchemaError: a field of the wrong type; the message names each such field (and what it
            held), ``task_id``/``checkpoint_id`` name the row where they are text.
    """
    bad = []
    for name, types, wanted in _ROW_FIELDS:
        value = getattr(row, name)
        if type(value) not in types:
            bad.append(getattr(value, "damage", None) or f"its {name} is {type(value).__name__}, not {wanted}")
    if bad:
        cid = row.checkpoint_id if isinstance(row.checkpoint_id, str) else None
        raise SchemaError(f"checkpoint {short_id(cid) if cid else repr(row.checkpoint_id)} row is damaged in the "
                          f"store: {'; '.join(bad)}",
                          task_id=row.task_id if isinstance(row.task_id, str) else None, checkpoint_id=cid,
                          hint="another program wrote this row; the record is skipped (a load falls back past it); "
                          "`overnight verify` lists every damaged record")


def parse_record(row: CheckpointRow, *, key: bytes | None) -> CheckpointRecord:
    """Checks 1-4 on a stored checkpoint row: field types (:func:`_check_row_fields`), digest,
    canonical form and schema, index columns, signature (with ``key``).

    Raises:
        IntegrityError: a subclass saying which check failed (SchemaError, DigestMismatch,
            FormatTooNew, SignatureError) -- nothing else, whatever the row holds.
    """
    _check_row_fields(row)
    ids = {"task_id": row.task_id, "checkpoint_id": row.checkpoint_id}
    if digest.sha256(row.body) != row.checkpoint_id:
        raise DigestMismatch(f"checkpoint {short_id(row.checkpoint_id)} body does not match its digest", **ids)
    what = f"checkpoint {short_id(row.checkpoint_id)}"
    tree, _ = _parse(row.body, what, dumps_sorted, RECORD_MIGRATIONS, ids)
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
        if not row.signature.isascii():  # what hmac.compare_digest cannot even compare: forged or damaged
            raise SignatureError(
                f"checkpoint {short_id(row.checkpoint_id)} signature is not an hmac-sha256 digest (it holds "
                "characters outside ASCII): forged or damaged", **ids)
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
    pages: PageCache | None = None,
    check_artifacts: bool = True,
    lazy_done: bool = False,
    row: CheckpointRow | None = None,
) -> LoadedCheckpoint:
    """Load and fully verify one checkpoint (all five checks).

    Args:
        deep: also read and hash every artifact blob (True on resume; ``show`` may skip it).
        pages: cache of verified pages to reuse and fill (fsck checks each page once).
        check_artifacts: check that every artifact blob is present (callers that verify every
            artifact blob themselves, like fsck, turn it off). With a
            :class:`~overnight.chain.ditto.HealingReader` (the default), a missing artifact object
            -- a large artifact's tree object, say -- whose ditto copy verifies (reassembles and
            hashes to its digest) is present: it is read through the copy, as ``verify`` counts it.
        lazy_done: read no done page now: each is read and verified when first used
            (:class:`DonePages`, :class:`DoneList`), and so is the list of the middle pages'
            references (the state's ``done.middle`` blob), so the load costs the same at any chain
            length; a damaged done page or page list then raises when (if) it is used, not here.
            Without it every done page is verified before this returns. (A state document of an older
            format is loaded in full either way: its pages are upgraded.)
        row: the stored row of ``checkpoint_id`` when the caller listed it (fsck); verified
            exactly as one read here.

    Raises:
        CheckpointNotFound: no such checkpoint.
        IntegrityError: any check failed (subclass says which).
    """
    reader = reader or HealingReader(store)
    healed: list[Heal] | None = reader.healed if isinstance(reader, HealingReader) else None
    row = ditto_checkpoint(store, checkpoint_id, healed, write=getattr(reader, "write_back", False), row=row)  # a damaged/missing record: from its verified copy
    record = parse_record(row, key=key)
    ids = {"task_id": row.task_id, "checkpoint_id": row.checkpoint_id}
    pages = pages if pages is not None else {}
    cp = f"checkpoint {short_id(row.checkpoint_id)}"

    def read(ref_digest: str, size: int, what: str) -> bytes:
        try:
            raw = reader.get(ref_digest, what)
        except IntegrityError as exc:
            exc.task_id, exc.checkpoint_id = row.task_id, row.checkpoint_id
            raise
        if len(raw) != size:
            raise DigestMismatch(f"{what} is {len(raw)} bytes, the reference says {size}", object_digest=ref_digest, **ids)
        return raw

    where = f"{cp} state"
    tree, stored_format = _parse(read(record.state.digest, record.state.size, where), where, dumps, STATE_MIGRATIONS, ids)
    try:
        doc = StateDoc.model_validate(tree)
    except ValidationError as exc:
        raise SchemaError(f"{where} is incomplete or malformed: {_validation_summary(exc)}", **ids) from exc
    if doc.task.id != record.task_id:
        raise SchemaError(f"{where} belongs to task {doc.task.id!r}, not {record.task_id!r}", **ids)
    data = tree["data"]
    if doc.values:  # top-level values stored as their own blobs: read back into their places
        if not isinstance(data, dict) or "$t" in data or any(data.get(k, 0) is not None for k in doc.values):
            raise SchemaError(f"{where} names values {sorted(doc.values)} that its data does not hold as null", **ids)
        data = dict(data)
        for k, ref in doc.values.items():
            what = f"{where} value {k!r}"
            raw = read(ref.digest, ref.size, what)
            try:
                data[k] = loads(raw)
            except DecodeError as exc:
                raise SchemaError(f"{what} is not canonical JSON: {exc.message}", **ids) from exc
            if dumps(data[k]) != raw:
                raise SchemaError(f"{what} is not in canonical form", **ids)

    tails = getattr(pages, "tails", None)  # pages superseded by this checkpoint's leave the cache
    in_use = {r.digest for part in (doc.todo, doc.done, doc.artifacts) for r in part.pages} if tails is not None else set()
    in_use_middles: list[set[str]] = []  # the pages of this checkpoint's middle page lists are in use too
    memo: BoundedPageCache | None = pages if isinstance(pages, BoundedPageCache) else None

    def page(ref: BlobRef, what: str, adapter: TypeAdapter, kind: str, collection: str | None = None) -> Page:
        """A verified page. ``kind``: the collection (todo, done, artifacts) whose entries are
        validated one by one -- a page extending the last one read of its kind is parsed in part
        (:func:`_extend`) -- or "" for a page validated whole; ``collection``: one whose entries
        are migrated from older formats."""
        # a page read for an older state document is cached apart: its entries were upgraded
        cache_key = ref.digest if stored_format == doc.format or collection is None else f"{ref.digest}@{stored_format}"
        cached = pages.get(cache_key)
        if cached is not None:
            return cached
        raw = read(ref.digest, ref.size, what)
        tail_key = f"{kind}@{stored_format}"
        try:
            prev = tails.get(tail_key) if tails is not None and kind and cache_key == ref.digest else None
            extended = _extend(*prev, raw, adapter) if prev is not None else None
            if extended is not None:
                stored, entries = extended
                tree = stored
            else:
                stored = canonical_tree(raw)
                if stored is None:
                    stored = loads(raw)
                    if dumps(stored) != raw:
                        raise SchemaError(f"{what} is not in canonical form", **ids)
                tree = upgrade_entries(stored, collection, stored_format) if collection else stored
                entries = adapter.validate_python(tree)
        except (DecodeError, ValidationError) as exc:
            detail = _validation_summary(exc) if isinstance(exc, ValidationError) else exc.message
            raise SchemaError(f"{what} is incomplete or malformed: {detail}", **ids) from exc
        found = pages[cache_key] = Page(ref.model_dump(), tree, entries, migrated=tree is not stored)
        if extended is not None and kind == "done" and "index" in prev[1].__dict__:
            # the page extends one whose index is known: index only the appended entries
            before, added = prev[1].index, done_index(tree[len(prev[1].tree):])
            found.__dict__["index"] = {"names": before["names"] + added["names"],
                                       "summary": merge_summaries([before["summary"], added["summary"]])}
        if tails is not None and kind:
            old = tails.get(tail_key)
            if old is not None and old[1].ref["digest"] not in in_use \
                    and not any(old[1].ref["digest"] in m for m in in_use_middles):
                pages.pop(old[1].ref["digest"], None)  # superseded (a linear history never reads it again)
            tails[tail_key] = (raw, found)
        return found

    def refs(member: str, pages: Pages) -> tuple[list[BlobRef], Middle | None]:
        """Every page reference of a collection: the inline ones and those of its ``middle`` blob;
        and the checked middle list (None without one)."""
        if pages.middle is None:
            return pages.pages, None
        if len(pages.pages) != 2:
            raise SchemaError(f"{where} {member} has a middle page list but {len(pages.pages)} inline pages, not 2",
                              **ids)
        key = (member, pages.middle.digest, stored_format)
        mid = memo.middle(key) if memo is not None else None
        if mid is None:
            if member == "done" and stored_format < 4:  # format 3: plain references, read without index
                listed = page(pages.middle, f"{cp} {member} page list", PAGE_LIST, "").entries
                middle = [DoneRef.model_validate(r) for r in upgrade_done_refs([r.model_dump() for r in listed])]
            else:
                middle = page(pages.middle, f"{cp} {member} page list",
                              DONE_PAGE_LIST if member == "done" else PAGE_LIST, "").entries
            if not middle:
                raise SchemaError(f"{where} {member} page list is empty", **ids)
            digests = {r.digest for r in middle}
            mid = Middle(middle, digests, len(digests) == len(middle))
            if memo is not None:
                memo.add_middle(key, mid)
        if tails is not None:
            in_use_middles.append(mid.digests)  # before its pages are read: none of them is evicted
        first, last = pages.pages
        if member != "todo" and not (mid.distinct and first.digest != last.digest and first.digest not in mid.digests
                                     and last.digest not in mid.digests):  # done entries and names are unique
            raise SchemaError(f"{where} {member} page list names a page twice", **ids)
        return [first, *mid.refs, last], mid

    todo_pages = [page(r, f"{cp} todo page {i}", _TODO_PAGE, "todo", "todo") for i, r in enumerate(refs("todo", doc.todo)[0])]
    if sum(len(p.tree) for p in todo_pages) != doc.todo.count or any(not p.tree for p in todo_pages):
        raise SchemaError(f"{where} todo pages do not hold the {doc.todo.count} entries the state says", **ids)
    n_done = -(-doc.done.count // DONE_PAGE)
    done_middle: Middle | None = None

    def require_index(done_refs: list[DoneRef]) -> None:
        if stored_format >= 4 and any(r.names is None or r.summary is None for r in done_refs):
            raise SchemaError(f"{where} names a done page without its index (names, summary): format "
                              f"{stored_format} requires them", **ids)

    def done_refs() -> list[DoneRef]:
        """Every done page's reference (the middle ones from the middle page list, read and
        checked), checked against the state's count and format."""
        nonlocal done_middle
        found, done_middle = refs("done", doc.done)
        require_index(found)
        if len(found) != n_done:
            raise SchemaError(f"{where} has {len(found)} done pages; the state says {doc.done.count} "
                              f"entries in pages of {DONE_PAGE}", **ids)
        return found

    def done_page(i: int, ref: DoneRef) -> Page:
        found = page(ref, f"{cp} done page {i}", _DONE_PAGE, "done", "done")
        if len(found.tree) != _done_page_size(i, n_done, doc.done.count):  # not done_pages.size: no cycle
            raise SchemaError(f"{where} done page {i} holds {len(found.tree)} entries; the state says "
                              f"{doc.done.count} in pages of {DONE_PAGE}", **ids)
        memo = found.__dict__.get("_checked_for")  # (reference, page handed out): a middle blob's
        if memo is not None and memo[0] is ref:  # references are shared by every checkpoint naming it
            return memo[1] or found
        if ref.names is not None or ref.summary is not None:  # the index must say what the page holds
            index = found.index
            if (ref.names is not None and ref.names != index["names"]) or (ref.summary is not None and (
                    ref.summary.fns != index["summary"]["fns"] or ref.summary.reads != index["summary"]["reads"])):
                raise SchemaError(f"{where} done page {i}: its index (names, summary) does not match its entries",
                                  **ids)
        # a page shared with another load (the cache) carries this document's reference, index included
        summary = None if ref.summary is None else {"fns": ref.summary.fns, "reads": ref.summary.reads}
        same = found.ref.get("names") == ref.names and found.ref.get("summary") == summary
        out = found if same else replace(found, ref=ref.model_dump())
        # held: the identity test above stays sound; None for the page itself (no reference cycle,
        # so a load is freed as soon as it is dropped, without waiting for the cyclic collector)
        found.__dict__["_checked_for"] = (ref, None if out is found else out)
        return out

    lazy_done = lazy_done and stored_format == doc.format
    if lazy_done and doc.done.middle is not None:
        # a lazy load of a long list reads its middle page list when first used (~560 bytes a page:
        # it grows with the chain), so the load costs the same at any length; what the state
        # document says of it is checked now, the list itself (and its references) when read
        inline = doc.done.pages
        if len(inline) != 2 or n_done < 3:
            raise SchemaError(f"{where} done has a middle page list but {len(inline)} inline pages (not 2) "
                              f"for {doc.done.count} entries", **ids)
        require_index(inline)
        done_pages = DonePages(done_refs, doc.done.count, done_page, ends=(inline[0], inline[1]))
    else:
        done_pages = DonePages(done_refs(), doc.done.count, done_page)
    if done_middle is not None and done_middle.pages is not None and done_middle.sound:
        done_pages._pages.update(enumerate(done_middle.pages, 1))  # checked by the load that read them
    if not lazy_done:
        for i in range(n_done):  # every page verified now
            done_pages[i]
        if done_middle is not None and done_middle.pages is None:
            done_middle.pages = [done_pages[i] for i in range(1, n_done - 1)]
            done_middle.sound = all(len(p.tree) == DONE_PAGE for p in done_middle.pages)  # as done_page checked
    art_refs, art_middle = refs("artifacts", doc.artifacts)
    if art_middle is not None and art_middle.pages is not None and art_middle.sound:
        first = page(art_refs[0], f"{cp} artifact page 0", _ARTIFACT_PAGE, "artifacts")
        last = page(art_refs[-1], f"{cp} artifact page {len(art_refs) - 1}", _ARTIFACT_PAGE, "artifacts")
        artifact_pages = [first, *art_middle.pages, last]
        sorted_pages = len(first.tree) + art_middle.entries + len(last.tree) == doc.artifacts.count \
            and first.ordered and last.ordered and next(reversed(first.tree)) < next(iter(art_middle.pages[0].tree)) \
            and next(reversed(art_middle.pages[-1].tree)) < next(iter(last.tree))
    else:
        artifact_pages = [page(r, f"{cp} artifact page {i}", _ARTIFACT_PAGE, "artifacts") for i, r in enumerate(art_refs)]
        sorted_pages = sum(len(p.tree) for p in artifact_pages) == doc.artifacts.count \
            and all(p.ordered for p in artifact_pages) \
            and all(next(reversed(a.tree)) < next(iter(b.tree)) for a, b in zip(artifact_pages, artifact_pages[1:]))
        if art_middle is not None and sorted_pages:
            art_middle.pages = artifact_pages[1:-1]
            art_middle.entries = sum(len(p.tree) for p in art_middle.pages)
            art_middle.sound = True  # every page in order, and across every boundary
    if not sorted_pages:
        raise SchemaError(f"{where} artifact pages are not {doc.artifacts.count} names in sorted order", **ids)
    world = None
    if record.fingerprint is not None:
        world = page(record.fingerprint.world, f"{cp} fingerprint", _WORLD, "").tree
        if world["format"] > WORLD_FORMAT:
            raise FormatTooNew(f"{cp} fingerprint was written by a newer overnight (world format {world['format']}); "
                               f"this one reads up to {WORLD_FORMAT}", hint="upgrade overnight to resume this task",
                               **ids)
    loaded = LoadedCheckpoint(row=row, record=record, doc=doc, doc_tree=tree, todo_pages=todo_pages,
                              done_pages=done_pages, artifact_pages=artifact_pages, world=world,
                              healed=tuple(healed or ()), data=data, lazy_done=lazy_done, heal_log=healed)

    if check_artifacts:
        arts = loaded.artifacts
        missing = store.missing_objects(a.digest for a in arts.values())
        if missing and healed is not None:  # served by a verified ditto copy, as `verify` counts it
            missing = _not_served_by_copy(reader, missing, arts, cp)  # type: ignore[arg-type]
        if missing:
            names = sorted(n for n, a in arts.items() if a.digest in missing)
            raise MissingObject(f"{cp} artifacts are missing from the store: {names}",
                                object_digest=sorted(missing)[0], **ids)
    if deep:
        verify_artifacts(loaded, reader)
    if healed is not None and len(healed) != len(loaded.healed):  # artifact trees healed after the build
        loaded = replace(loaded, healed=tuple(healed))
    return loaded


def _not_served_by_copy(reader: HealingReader, missing: set[str], arts: dict[str, ArtifactRef], cp: str) -> set[str]:
    """Those of the ``missing`` artifact objects that no verified ditto copy serves: each other one
    was read through its copy (the artifact's tree object, or a plain blob) and its bytes hashed
    to its digest by ``reader`` -- so a load accepts exactly what ``verify`` counts as served by a
    copy, and the reader records the heal (and writes the original back where it writes back)."""
    names = {a.digest: n for n, a in sorted(arts.items(), reverse=True)}
    out = set()
    for d in sorted(missing):
        try:
            reader.verify(d, f"{cp} artifact {names.get(d)!r}")
        except IntegrityError:
            out.add(d)
    return out


def verify_artifacts(loaded: LoadedCheckpoint, reader: BlobReader) -> None:
    """The deep check of a checkpoint loaded with ``deep=False``: read and hash every artifact blob
    (the other checks passed when it loaded), so a caller that loaded it shallow can finish the
    verification later without loading it again.

    Raises:
        IntegrityError: an artifact blob is missing, damaged or not the size its reference says.
    """
    cp = f"checkpoint {short_id(loaded.id)}"
    for name, art in loaded.artifacts.items():
        try:
            raw = reader.get(art.digest, f"{cp} artifact {name!r}")
        except IntegrityError as exc:
            exc.task_id, exc.checkpoint_id = loaded.row.task_id, loaded.id
            raise
        if len(raw) != art.size:
            raise DigestMismatch(f"{cp} artifact {name!r} is {len(raw)} bytes, the reference says {art.size}",
                                 object_digest=art.digest, task_id=loaded.row.task_id, checkpoint_id=loaded.id)




def record_problems(store: Store, rows: Iterable[CheckpointRow], *, key: bytes | None) -> dict[str, str]:
    """``checkpoint_id -> "ErrorKind: message"`` for every row of ``rows`` that does not verify:
    its record (digest, schema, signature), and the objects a load reads first -- the state
    document, its page lists, todo/done/artifact pages, stored values and the world fingerprint -- present and hashing to
    their digests, and every artifact object present (artifact bytes are hashed by ``verify``, and for
    each branch head by :func:`~overnight.chain.read.head_problems`). What ``show``, ``log`` and ``ls`` mark as
    damaged. Each object is read and hashed once however many rows share it, and nothing is
    decoded beyond the state document's page references (a load would validate every page).
    """
    reader = BlobReader(store)
    bad: dict[str, str] = {}
    problems: dict[str, str] = {}
    artifacts_of: dict[str, list[str]] = {}  # artifact page -> the artifact digests it names
    present: set[str] = set()

    def read(digests: list[str], what: str) -> dict[str, bytes]:
        for d in digests:
            if d in bad:
                raise DigestMismatch(bad[d], object_digest=d)
        todo = [d for d in digests if d not in reader.verified]
        try:
            return reader.get_many(todo, what)
        except IntegrityError:
            for d in todo:  # which one: each on its own
                try:
                    reader.get(d, what)
                except IntegrityError as exc:
                    bad[d] = exc.message
                    raise
            raise

    for row in rows:
        try:
            record = parse_record(row, key=key)
            what = f"checkpoint {short_id(row.checkpoint_id)}"
            state = read([record.state.digest], f"{what} state").get(record.state.digest)
            doc = json.loads(state if state is not None else reader.get(record.state.digest, f"{what} state"))
            lists = {part: doc.get(part) or {} for part in ("todo", "done", "artifacts")}
            middles = [str(m.get("digest")) for m in (p.get("middle") for p in lists.values()) if isinstance(m, dict)]
            middle = read(middles, f"{what} page list")
            page_refs = {part: [*p.get("pages", [])[:1], *(json.loads(middle.get(m["digest"]) or reader.get(
                m["digest"], f"{what} page list")) if isinstance(m := p.get("middle"), dict) else []),
                *p.get("pages", [])[1:]] for part, p in lists.items()}
            refs = [ref.get("digest") for part in page_refs.values() for ref in part if isinstance(ref, dict)]
            refs += [ref.get("digest") for ref in (doc.get("values") or {}).values() if isinstance(ref, dict)]
            art_pages = [str(ref.get("digest")) for ref in page_refs["artifacts"] if isinstance(ref, dict)]
            world = (json.loads(row.body).get("fingerprint") or {}).get("world")
            if isinstance(world, dict):
                refs.append(world.get("digest"))
            fetched = read([str(d) for d in dict.fromkeys(refs)], f"{what} page")
            for d in art_pages:  # every artifact blob present (its bytes are hashed by `verify`)
                if d not in artifacts_of:
                    raw = fetched.get(d) or reader.get(d, f"{what} artifact page")
                    artifacts_of[d] = [str(a.get("digest")) for a in json.loads(raw).values() if isinstance(a, dict)]
            wanted = {a for d in art_pages for a in artifacts_of[d]} - present
            gone = store.missing_objects(wanted) if wanted else set()
            present.update(wanted - gone)
            if gone:
                raise MissingObject(f"{what}: artifact object {sorted(gone)[0]} is missing", object_digest=sorted(gone)[0])
        except (IntegrityError, ValueError, AttributeError, TypeError) as exc:
            kind = type(exc).__name__ if isinstance(exc, OvernightError) else "SchemaError"
            problems[row.checkpoint_id] = f"{kind}: {getattr(exc, 'message', exc)}"
    return problems
