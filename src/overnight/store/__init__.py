"""Layer 2: the ``Store`` protocol, its backends, blobs (chunk trees) on top of any of them, and
the tiered store (hot + cold, :mod:`overnight.store.compose.tiered`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from overnight.errors import ConfigError
from overnight.store.base import Store


def default_store_url() -> str:
    """``$OVERNIGHT_STORE``, else ``store.url`` of ``overnight.toml``, else
    ``sqlite://.overnight/overnight.db`` (relative to the cwd); see :mod:`overnight.config`."""
    from overnight.config import load

    return load().get("store.url")


def _source(text: str) -> str:
    """`` (from $OVERNIGHT_STORE)`` when the environment variable set this URL, else ``""``:
    a bad URL the user did not type on the command line must say where it came from."""
    import os

    return " (from the environment variable OVERNIGHT_STORE)" if os.environ.get("OVERNIGHT_STORE") == text else ""


def _fix(text: str) -> str:
    return "; fix or unset OVERNIGHT_STORE" if _source(text) else ""


def _check_bare(text: str) -> None:
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", text):  # "sqlite:/x.db", "s3:bucket": a URL typo
        raise ConfigError(f"store URL {text!r}{_source(text)} is malformed (missing '//' after the scheme?)",
                          hint="use sqlite://PATH, file://DIR, postgresql://HOST/DB, s3://BUCKET/PREFIX" + _fix(text))


def location(url: str) -> str:
    """Where a store URL points, for messages: the absolute path of a file or directory store;
    other URLs with a password masked (``postgresql://user:***@host/db``)."""
    scheme, sep, rest = str(url).partition("://")
    if not sep:
        return str(Path(url).resolve())
    if scheme.lower() in ("sqlite", "file") and rest:
        return str(Path(rest).resolve())
    from overnight.config import mask_password

    return mask_password(str(url))


def exists(url: str | os.PathLike | None = None) -> bool:
    """Whether a store is already there (an SQLite file, a store directory, a PostgreSQL schema),
    so that reading commands never create one. A bucket answers True (opening creates nothing),
    as does a PostgreSQL server that cannot be asked (opening it then says why)."""
    text = str(url) if url is not None else default_store_url()
    scheme, sep, rest = text.partition("://")
    if not sep:
        _check_bare(text)
        return Path(text).exists()
    if scheme.lower() in ("sqlite", "file"):
        return bool(rest) and Path(rest).exists()
    if scheme.lower() in ("postgresql", "postgres"):
        try:
            from overnight.store.postgres import schema_exists
        except ImportError:
            return True  # opening it reports the missing extra
        return schema_exists(text) is not False
    return True


def open_store(url: str | os.PathLike | None = None, *, read_only: bool = False) -> Store:
    """:func:`open_url`, with a folder that cannot be made or written (a read-only current
    directory, a parent that is a file or not writable) reported as
    :class:`~overnight.errors.OutputNotWritable` naming it, never as a traceback.

    Raises:
        ConfigError: see :func:`open_url`; OutputNotWritable (a ConfigError): the store's folder.
    """
    from overnight.errors import OutputNotWritable

    try:
        return open_url(url, read_only=read_only)
    except OSError as exc:
        import errno

        where = os.path.abspath(exc.filename) if exc.filename else str(url if url is not None else default_store_url())
        reason = (f"{where} is a file, not a folder" if exc.errno in (errno.EEXIST, errno.ENOTDIR)
                  else exc.strerror or str(exc))
        raise OutputNotWritable(f"cannot create or open the store at {where}: {reason}",
                                path=str(where), reason=reason,
                                hint="run in a folder you can write, or pass --store URL (or set "
                                "OVERNIGHT_STORE) to put the store elsewhere") from exc


def open_url(url: str | os.PathLike | None = None, *, read_only: bool = False) -> Store:
    """Open a store by URL; ``read_only`` (what reading commands pass) opens it without writing
    anything -- an SQLite file read-only (see :class:`~overnight.store.sqlite.SQLiteStore`); the
    other backends write nothing when they open an existing store.

    Accepted forms:

    * ``sqlite://PATH`` (relative or absolute: ``sqlite:///abs/x.db``), or a bare path ending in
      ``.db``/``.sqlite``/``.sqlite3`` -- the embedded default;
    * ``file://DIR`` (``file:///abs/dir``) -- a plain directory, local or on a network share;
    * ``postgresql://[USER@]HOST[:PORT]/DB[?schema=NAME]`` (also ``postgres://``) -- needs the
      ``postgres`` extra;
    * ``s3://BUCKET[/PREFIX][?endpoint_url=URL&region=NAME&conditional_writes=auto|require|off]``
      -- needs the ``s3`` extra; credentials come from the usual AWS environment;
    * ``memory://NAME`` -- in this process only (the ``ephemeral`` level); the same NAME is the
      same store within a process.

    ``None`` opens :func:`default_store_url`.

    Raises:
        ConfigError: an unknown scheme, a malformed URL or a missing extra (the message lists the
            accepted forms).
    """
    text = str(url) if url is not None else default_store_url()
    scheme, sep, rest = text.partition("://")
    if not sep:
        _check_bare(text)
        if Path(text).suffix in (".db", ".sqlite", ".sqlite3"):
            from overnight.store.sqlite import SQLiteStore

            return SQLiteStore(text, read_only=read_only)
        raise _unsupported(text)
    scheme = scheme.lower()
    if scheme == "sqlite":
        from overnight.store.sqlite import SQLiteStore

        if not rest:
            raise ConfigError(f"store URL {text!r}{_source(text)} has no path",
                              hint="use sqlite://.overnight/overnight.db" + _fix(text))
        return SQLiteStore(rest, read_only=read_only)
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
    if scheme == "memory":
        from overnight.store.memory import named

        return named(rest)
    raise _unsupported(text)


def _unsupported(text: str) -> ConfigError:
    return ConfigError(
        f"unsupported store URL {text!r}{_source(text)}",
        hint="use sqlite://PATH (the embedded default), a path ending in .db, file://DIR, "
             "postgresql://HOST/DB?schema=NAME, s3://BUCKET/PREFIX or memory://NAME" + _fix(text),
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
    "exists",
    "open_store",
]
