"""The done pages a resume checks before its first step, at the cost of what this machine has not
checked before.

A runner builds on every done page of the head it resumes -- its memo look-up, plan
reconciliation and drift check go by each page's index (:class:`~overnight.chain.records.DoneRef`
``names`` and ``summary``), and its next commit names every page -- so before its first step it
makes sure of two things for each page (``tests/test_done_pages.py``):

1. **the page is stored intact**: its bytes hash to the digest the reference names (a damaged
   page is not built on: the load falls back past it, or heals it from its ditto copy);
2. **the page matches its index**: parsed, in canonical form, valid against the schema, and its
   entries' names and summary are the ones the reference carries (a forged index -- rehashed,
   without a signing key -- does not make a resume miss drift or re-run a done step).

(2) depends on nothing but the reference's content: the page is named by its SHA-256, and the
index is in the reference. So once this machine has checked (2) for a reference, it holds for that
reference forever, in any store; this module remembers which references it checked, per task and
branch, in the per-user state folder (:func:`~overnight.keys.state_dir`,
``checked/<sha256 of task and branch>.json``: the SHA-256 of each checked reference's canonical
encoding). A later resume then checks (1) for every page -- read, decompress and hash, in one
batched store read: ~6 ms for the 79 pages (3.3 MB) of 5,000 checkpoints, against ~120 ms for
(1) and (2) -- and (2) only for the references it has not seen: the last page, which every commit
extends, and the pages filled since.

The file is a cache in the trust domain of the user's other state files (the environment key, the
high-water marks, ``distributions.json``), never of a store: a store's writer cannot add to it, a
forged or damaged reference has another encoding (so another SHA-256) and is checked in full, and a
missing, unreadable or malformed file only means every page is checked in full (then the file is
written again). Pages of older record formats (read in full at the load) are not involved.

File shape (JSON): ``{"format": 1, "state_format": N, "refs": ["<64 hex>", ...]}``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from overnight.codec.canonical import dumps
from overnight.chain.integrity import LoadedCheckpoint
from overnight.chain.records import DoneRef
from overnight.errors import OvernightError
from overnight.keys import read_cache_file, state_dir, write_cache_file
from overnight.store.blobs import BlobReader

CACHE_DIR = "checked"
"""Folder, in the per-user state folder, of the files of checked done page references."""
CACHE_FORMAT = 1
"""Version of a file's shape; another version is ignored (every page checked in full)."""
MAX_CACHE_BYTES = 4 << 20
"""A cache file larger than this (bytes) is ignored: ~65 bytes a done page, so 4 MiB is ~4 million
checkpoints' worth."""


def cache_path(task_id: str, branch: str) -> Path:
    """The file of ``task_id``/``branch``'s checked references (it may not exist): named by the
    SHA-256 of the two, so no stored name becomes a path."""
    name = hashlib.sha256(f"{task_id}\0{branch}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return state_dir() / CACHE_DIR / f"{name}.json"


def ref_key(ref: DoneRef) -> str:
    """Hex SHA-256 of a done page reference's canonical encoding (digest, size, names, summary)."""
    return hashlib.sha256(dumps(ref.model_dump())).hexdigest()


def _recall(path: Path, state_format: int) -> set[str]:
    doc = read_cache_file(path, MAX_CACHE_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or doc.get("state_format") != state_format:
        return set()
    refs = doc.get("refs")
    return {r for r in refs if isinstance(r, str)} if isinstance(refs, list) else set()


def check_done_pages(loaded: LoadedCheckpoint, reader: BlobReader, task_id: str, branch: str) -> None:
    """Make sure of every done page of ``loaded`` before a runner builds on it: each page's bytes
    hash to its reference's digest, and each page matches its index -- parsed and validated now
    unless this machine checked that reference before (module docstring). A load that is not
    lazy (an older format, or ``lazy_done=False``) has checked every page already.

    ``reader``: verifies the pages checked by digest only (its ``verified`` set collects them).

    Raises:
        IntegrityError: a page is damaged, missing or does not match its index -- the error of the
            full check of that page (:class:`~overnight.chain.integrity.DonePages`), which heals a
            page that has a ditto copy instead.
    """
    pages = loaded.done_pages
    if not loaded.lazy_done or loaded.doc.done.middle is None:
        list(pages)  # at most two pages, or every one checked at the load already
        return
    refs = pages.refs  # the middle page list: read, hashed and checked against the state
    path = cache_path(task_id, branch)
    known = _recall(path, loaded.doc.format)
    keys = [ref_key(r) for r in refs]
    # what the cache vouches for is the page against its own reference; where the page sits is
    # this head's: a page checked as another head's last page (fewer entries) named here in the
    # middle must hold what this position holds -- its index says how many entries it has
    seen = [i for i, k in enumerate(keys)
            if k in known and refs[i].names is not None and len(refs[i].names) == 8 * pages.size(i)]
    if seen:
        try:
            sizes, errors = reader.verify_many([refs[i].digest for i in seen], f"{task_id} done pages")
            intact = not errors and all(sizes.get(refs[i].digest) == refs[i].size for i in seen)
        except OvernightError:
            intact = False
        if not intact:
            seen = []  # check every page in full: it raises the damaged page's error, or heals it
    hashed = set(seen)
    for i in range(len(refs)):
        if i not in hashed:
            pages[i]
    if len(seen) < len(refs):
        write_cache_file(path, {"format": CACHE_FORMAT, "state_format": loaded.doc.format, "refs": keys})


__all__ = ["CACHE_DIR", "cache_path", "check_done_pages", "ref_key"]
