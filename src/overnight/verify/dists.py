"""The installed distributions (``normalized name -> version``), cached on disk between processes.

Reading the metadata of every installed distribution with :mod:`importlib.metadata` costs
200-1,200 ms (one ``METADATA`` file parsed per distribution); every resume at the ``durable``
level records that map in its world fingerprint. What it depends on is cheap to look at: the
``sys.path`` entries, in order (the first entry holding a distribution wins), and for each entry
the names and modification times of its ``*.dist-info`` / ``*.egg-info`` entries (an install, an
upgrade, a reinstall or an uninstall adds, renames, re-creates or removes one). So the map is kept
in ``<state dir>/distributions.json`` (the per-user state folder of
:func:`~overnight.keys.state_dir`: ``$OVERNIGHT_STATE_DIR``, else
``$XDG_STATE_HOME/overnight``, else ``~/.local/state/overnight``) under the digest of all that
(:func:`path_key`) and re-read from the distributions only when the digest differs.

The file is a cache, never a source of truth: unreadable, malformed or from another key, it is
ignored and rewritten; a failure to write it only costs the next process the full read. It holds
names and versions, nothing secret, and is never written into a store.

File shape (JSON): ``{"format": 1, "key": "<64 hex>", "packages": {name: version}}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

from overnight.keys import read_cache_file, state_dir, write_cache_file

CACHE_FILE = "distributions.json"
"""Name of the cache file in the per-user state folder."""
CACHE_FORMAT = 1
"""Version of the cache file's shape; another version is ignored (read afresh)."""
MAX_CACHE_BYTES = 16 << 20
"""A cache file larger than this (bytes) is ignored (read afresh): a map of ~100,000 distributions."""
_SUFFIXES = (".dist-info", ".egg-info")

scans = 0
"""Full reads of the installed distributions' metadata in this process (for tests and benches)."""

_memo: dict[str, dict[str, str]] = {}
"""Maps read in this process, by :func:`path_key`."""


def cache_path() -> Path:
    """Where the cache file lives (it may not exist)."""
    return state_dir() / CACHE_FILE


def _entry_listing(entry: str) -> list[object]:
    """What of one ``sys.path`` entry decides the distributions found there: for a directory,
    ``[name, mtime_ns]`` of each ``*.dist-info`` / ``*.egg-info`` in it, sorted; for a file (a zip),
    its ``[size, mtime_ns]``; ``None`` when it does not exist."""
    try:
        with os.scandir(entry) as it:
            found = []
            for e in it:
                if e.name.endswith(_SUFFIXES):
                    try:
                        found.append([e.name, e.stat(follow_symlinks=True).st_mtime_ns])
                    except OSError:
                        found.append([e.name, None])
            return sorted(found, key=lambda x: x[0])  # type: ignore[arg-type,return-value]
    except NotADirectoryError:
        try:
            st = os.stat(entry)
            return [st.st_size, st.st_mtime_ns]
        except OSError:
            return [None]
    except OSError:
        return [None]


def path_key() -> str:
    """Hex SHA-256 of what decides :func:`importlib.metadata.distributions`: the interpreter, the
    ``sys.path`` entries in order (``""`` as the current directory) with their distribution
    listings (:func:`_entry_listing`), and the meta-path finders that can find distributions."""
    finders = [f"{type(f).__module__}.{type(f).__qualname__}" for f in sys.meta_path
               if hasattr(f, "find_distributions")]
    entries = [[p, _entry_listing(p)] for p in (os.path.abspath(e or ".") for e in sys.path if isinstance(e, str))]
    blob = json.dumps([sys.executable, sys.version, finders, entries], separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogateescape")).hexdigest()


def _read(path: Path, key: str) -> dict[str, str] | None:
    doc = read_cache_file(path, MAX_CACHE_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT or doc.get("key") != key:
        return None
    packages = doc.get("packages")
    if not isinstance(packages, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in packages.items()):
        return None
    return dict(packages)


def cached_distributions(scan: Callable[[], dict[str, str]]) -> dict[str, str]:
    """``scan()`` -- the full read of the installed distributions -- unless this process or the cache
    file already holds its result under the current :func:`path_key`; a fresh result is written
    to the cache file. Returns a new dict each call (the caller may change it)."""
    global scans
    key = path_key()
    found = _memo.get(key)
    if found is None:
        found = _read(cache_path(), key)
        if found is None:
            scans += 1
            found = scan()
            write_cache_file(cache_path(), {"format": CACHE_FORMAT, "key": key, "packages": found})
        _memo.clear()
        _memo[key] = found
    return dict(found)


__all__ = ["CACHE_FILE", "cache_path", "cached_distributions", "path_key"]
