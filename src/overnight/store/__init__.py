"""Layer 2: the ``Store`` protocol, its backends, blobs (chunk trees) on top of any of them, and
the tiered store (hot + cold, :mod:`overnight.store.tiered`)."""

from __future__ import annotations

import os
from pathlib import Path

from overnight.errors import ConfigError
from overnight.store.base import (
    ArchiveRow,
    CheckpointRow,
    Commit,
    JournalRow,
    Lease,
    ObjectRecord,
    ObjectStat,
    Store,
    TaskRow,
)
from overnight.store.blobs import BlobReader, BlobWriter

DEFAULT_PATH = Path(".overnight") / "overnight.db"


def default_store_url() -> str:
    """``$OVERNIGHT_STORE`` if set, else ``sqlite://.overnight/overnight.db`` (relative to the cwd)."""
    return os.environ.get("OVERNIGHT_STORE") or f"sqlite://{DEFAULT_PATH}"


def open_store(url: str | os.PathLike | None = None) -> Store:
    """Open a store by URL.

    Accepted forms:

    * ``sqlite://PATH`` (relative or absolute: ``sqlite:///abs/x.db``), or a bare path ending in
      ``.db``/``.sqlite``/``.sqlite3`` -- the embedded default;
    * ``file://DIR`` (``file:///abs/dir``) -- a plain directory, local or on a network share;
    * ``postgresql://[USER@]HOST[:PORT]/DB[?schema=NAME]`` (also ``postgres://``) -- needs the
      ``postgres`` extra;
    * ``s3://BUCKET[/PREFIX][?endpoint_url=URL&region=NAME&conditional_writes=auto|require|off]``
      -- needs the ``s3`` extra; credentials come from the usual AWS environment.

    ``None`` opens :func:`default_store_url`.

    Raises:
        ConfigError: an unknown scheme, a malformed URL or a missing extra (the message lists the
            accepted forms).
    """
    text = str(url) if url is not None else default_store_url()
    scheme, sep, rest = text.partition("://")
    if not sep:
        if Path(text).suffix in (".db", ".sqlite", ".sqlite3"):
            from overnight.store.sqlite import SQLiteStore

            return SQLiteStore(text)
        raise _unsupported(text)
    scheme = scheme.lower()
    if scheme == "sqlite":
        from overnight.store.sqlite import SQLiteStore

        if not rest:
            raise ConfigError(f"store URL {text!r} has no path", hint="use sqlite://.overnight/overnight.db")
        return SQLiteStore(rest)
    if scheme == "file":
        from overnight.store.file import FileStore

        if not rest or "?" in rest or "#" in rest:
            raise ConfigError(f"store URL {text!r} needs a directory path (and no query)",
                              hint="use file://DIR, e.g. file://.overnight/store or file:///srv/overnight")
        return FileStore(rest)
    if scheme in ("postgresql", "postgres"):
        _need_extra("psycopg", "postgres", text)
        _need_extra("psycopg_pool", "postgres", text)
        from overnight.store.postgres import PostgresStore

        return PostgresStore(text)
    if scheme == "s3":
        _need_extra("boto3", "s3", text)
        from overnight.store.s3 import S3Store

        return S3Store(text)
    raise _unsupported(text)


def _unsupported(text: str) -> ConfigError:
    return ConfigError(
        f"unsupported store URL {text!r}",
        hint="use sqlite://PATH (the embedded default), a path ending in .db, file://DIR, "
             "postgresql://HOST/DB?schema=NAME or s3://BUCKET/PREFIX",
    )


def _need_extra(module: str, extra: str, url: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"store URL {url!r} needs the {module!r} package",
                          hint=f"pip install 'overnight[{extra}]'")


__all__ = [
    "ArchiveRow",
    "BlobReader",
    "BlobWriter",
    "CheckpointRow",
    "Commit",
    "JournalRow",
    "Lease",
    "ObjectRecord",
    "ObjectStat",
    "Store",
    "TaskRow",
    "default_store_url",
    "open_store",
]
