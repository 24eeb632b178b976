"""Layer 2: the ``Store`` protocol, its backends, and blobs (chunk trees) on top of any of them."""

from __future__ import annotations

import os
from pathlib import Path

from overnight.errors import ConfigError
from overnight.store.base import CheckpointRow, Commit, JournalRow, Lease, ObjectRecord, Store, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter

DEFAULT_PATH = Path(".overnight") / "overnight.db"


def default_store_url() -> str:
    """``$OVERNIGHT_STORE`` if set, else ``sqlite://.overnight/overnight.db`` (relative to the cwd)."""
    return os.environ.get("OVERNIGHT_STORE") or f"sqlite://{DEFAULT_PATH}"


def open_store(url: str | os.PathLike | None = None) -> Store:
    """Open a store by URL.

    Accepted forms: ``sqlite://PATH`` (relative or absolute: ``sqlite:///abs/x.db``), or a bare
    path ending in ``.db``/``.sqlite``/``.sqlite3``. ``None`` opens :func:`default_store_url`.

    Raises:
        ConfigError: an unknown scheme or a malformed URL (the message lists the accepted forms).
    """
    text = str(url) if url is not None else default_store_url()
    if text.startswith("sqlite://"):
        from overnight.store.sqlite import SQLiteStore

        path = text[len("sqlite://"):]
        if not path:
            raise ConfigError(f"store URL {text!r} has no path", hint="use sqlite://.overnight/overnight.db")
        return SQLiteStore(path)
    if "://" not in text and Path(text).suffix in (".db", ".sqlite", ".sqlite3"):
        from overnight.store.sqlite import SQLiteStore

        return SQLiteStore(text)
    raise ConfigError(
        f"unsupported store URL {text!r}",
        hint="use sqlite://PATH (the embedded default) or a path ending in .db",
    )


__all__ = [
    "BlobReader",
    "BlobWriter",
    "CheckpointRow",
    "Commit",
    "JournalRow",
    "Lease",
    "ObjectRecord",
    "Store",
    "TaskRow",
    "default_store_url",
    "open_store",
]
