"""A damaged medium: a store whose own files are broken below the record level, set aside.

A replicated task keeps a copy on several media. When one medium's store cannot be read at all
-- an SQLite file truncated, overwritten with garbage, its pages malformed
(:class:`~overnight.errors.StoreCorrupt`) -- that copy is lost, but the file is still evidence:
it is never deleted. :meth:`DamagedMedium.set_aside` renames it (with its ``-wal``/``-shm``
companions) to ``<name>.damaged-<UTC timestamp>`` next to where it was, so ``sqlite3 ... .recover``
can still be tried on it, and opens a fresh, empty store at the original place, which
:func:`~overnight.ops.repair.repair_task` then fills from a healthy replica.

Only a file store (``sqlite://``) can be set aside; other media (a database schema, a bucket) are
never moved by overnight.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from overnight.errors import ConfigError, StoreCorrupt
from overnight.store.base import Store

SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")
"""Suffixes of the files making up one SQLite store (the database, its WAL, shared memory, journal)."""


def set_aside(url: str, *, now: datetime | None = None) -> list[tuple[Path, Path]]:
    """Rename the files of the damaged SQLite store at ``url`` to ``<name>.damaged-<UTC
    timestamp>`` (companions keep their suffix after it: ``overnight.db.damaged-20261130T052000Z-wal``),
    so a fresh store can be made at ``url``. Nothing is deleted. Returns ``[(old, new), ...]``.

    Raises:
        ConfigError: ``url`` is not a ``sqlite://`` store (nothing else is moved), or a file with
            the new name already exists.
    """
    scheme, sep, rest = str(url).partition("://")
    if not sep or scheme.lower() != "sqlite" or not rest:
        raise ConfigError(f"cannot set aside the damaged medium {url}: only an SQLite file is moved aside",
                          hint="restore that medium from a backup, or remove it from the task's media")
    path = Path(rest)
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S%fZ")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    moves = [(Path(f"{path}{s}"), Path(f"{target}{s}")) for s in SQLITE_COMPANIONS if Path(f"{path}{s}").exists()]
    for _, new in moves:
        if new.exists():
            raise ConfigError(f"cannot set aside {path}: {new} already exists", hint="retry in a moment")
    done = []
    for old, new in moves:
        try:
            os.replace(old, new)
            done.append((old, new))
        except FileNotFoundError:  # another process set it aside first
            continue
    return done


class DamagedMedium:
    """Stands for a medium whose store is damaged (it could not be opened, or reading it raised
    :class:`~overnight.errors.StoreCorrupt`): every store call raises that error again, until
    :meth:`set_aside` moves the files away; from then on it is the fresh store opened in their
    place (every call goes to it).

    Args:
        url: the medium's store URL.
        error: what reading it raised.

    Attributes:
        moved: ``[(old path, new path), ...]`` after :meth:`set_aside`, else empty.
    """

    def __init__(self, url: str, error: StoreCorrupt) -> None:
        self.url = url
        self.error = error
        self.moved: list[tuple[Path, Path]] = []
        self._fresh: Any = None

    def set_aside(self) -> list[tuple[Path, Path]]:
        """Move the damaged files aside (:func:`set_aside`) and open a fresh store at :attr:`url`.

        Raises:
            ConfigError: not a file store (see :func:`set_aside`).
        """
        if self._fresh is None:
            from overnight.store import open_store

            self.moved = set_aside(self.url)
            self._fresh = open_store(self.url)
        return self.moved

    def describe(self) -> str:
        """``"<error>; moved aside to <path>"`` -- for reports."""
        if not self.moved:
            return self.error.message
        return f"{self.error.message}; the damaged file was moved aside to {self.moved[0][1]} (nothing deleted)"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("url", "error", "moved", "_fresh"):
            raise AttributeError(name)
        if self._fresh is not None:
            return getattr(self._fresh, name)
        if not callable(getattr(Store, name, None)):
            raise AttributeError(name)

        def damaged(*args: Any, **kwargs: Any) -> Any:
            raise StoreCorrupt(self.error.message, hint=self.error.hint)

        return damaged

    def close(self) -> None:
        if self._fresh is not None:
            self._fresh.close()

    def __repr__(self) -> str:
        return f"DamagedMedium({self.url!r}, moved={bool(self.moved)})"
