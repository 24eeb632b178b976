"""When the medium under a store says no: an ``OSError`` (or a driver's connection error) becomes
one of the typed :class:`~overnight.errors.StoreError` kinds, naming the path or URL and saying what
to do. Every backend goes through :func:`os_refusal` (file, SQLite), :func:`unreachable` (PostgreSQL,
S3), so the same cause reads the same everywhere and the CLI exits 6 for all of them.

=====================  ==========================================================================
errno                  error
=====================  ==========================================================================
ENOSPC, EDQUOT, EFBIG  :class:`~overnight.errors.StoreFull` (the write in flight was rolled back)
EROFS                  :class:`~overnight.errors.StoreReadOnly` (a read-only file system)
EACCES, EPERM          :class:`~overnight.errors.StoreReadOnly` when writing (permission denied),
                       :class:`~overnight.errors.StoreUnavailable` when reading
ENOENT, ENOTDIR        :class:`~overnight.errors.StoreUnavailable` (a folder of the store is missing)
EIO, ENXIO, ESTALE,    :class:`~overnight.errors.StoreUnavailable` (the disk or share failed)
ECONNREFUSED, ...
=====================  ==========================================================================

Anything else is left as it is (the caller re-raises the original).
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from typing import Iterator

from overnight.errors import StoreError, StoreFull, StoreReadOnly, StoreUnavailable

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DENIED = {errno.EACCES, errno.EPERM}
_MISSING = {errno.ENOENT, errno.ENOTDIR}
_GONE = {errno.EIO, errno.ENXIO, errno.ESTALE, errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT,
         errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENODEV}


def _who() -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(os.geteuid()).pw_name!r}"
    except (ImportError, KeyError, AttributeError):  # pragma: no cover - Windows, or a uid without a name
        return "this user"


def os_refusal(exc: OSError, location: str, *, writing: bool, task_id: str | None = None) -> StoreError | None:
    """The typed error for ``exc`` raised while reading or ``writing`` the store at ``location``
    (a path or URL), or None when ``exc`` is not a refusal of the medium (then re-raise it)."""
    path = exc.filename if isinstance(exc.filename, str) else location
    code = exc.errno
    reason = os.strerror(code) if code else str(exc)
    if code in _FULL:
        return StoreFull(f"store {location}: no space left writing {path} ({reason}); the write in flight was "
                         "rolled back, everything committed before it is intact", location=location, task_id=task_id,
                         hint="free space on that file system (`df -h " + location + "`), then run the command "
                         "again (`overnight resume TASK_ID` continues a run)")
    if code == errno.EROFS:
        return StoreReadOnly(f"store {location} is on a read-only file system ({path})", location=location,
                             task_id=task_id,
                             hint="reading commands (ls, show, log, status, verify, cat) still work; to write, "
                             "remount it read-write or copy the store somewhere writable and pass --store")
    if code in _DENIED:
        if writing:
            return StoreReadOnly(f"store {location}: permission denied writing {path} for {_who()}",
                                 location=location, task_id=task_id,
                                 hint=f"reading commands still work; to write, run as the store's owner or give "
                                 f"this user write access (`ls -ld {path}`)")
        return StoreUnavailable(f"store {location}: permission denied reading {path} for {_who()}",
                                location=location, task_id=task_id,
                                hint=f"run as the store's owner or give this user read access (`ls -ld {path}`)")
    if code in _MISSING:
        return StoreUnavailable(f"store {location}: {path} is missing ({reason}) -- was the store's folder "
                                "deleted or unmounted?", location=location, task_id=task_id,
                                hint="mount or restore the folder, or point --store / OVERNIGHT_STORE at the store")
    if code in _GONE:
        return StoreUnavailable(f"store {location}: the medium failed reading or writing {path} ({reason})",
                                location=location, task_id=task_id,
                                hint="check the disk or network share (dmesg, mount), then run the command again")
    return None


@contextmanager
def refusals(location: str, *, writing: bool) -> Iterator[None]:
    """Run the block with any medium refusal (:func:`os_refusal`) raised as its typed error,
    the ``OSError`` chained."""
    try:
        yield
    except OSError as exc:
        typed = os_refusal(exc, location, writing=writing)
        if typed is None:
            raise
        raise typed from exc


def unreachable(location: str, detail: str, *, hint: str) -> StoreUnavailable:
    """A server store (PostgreSQL, S3) that cannot be reached: connection refused, timed out,
    name not resolved. ``location`` is the URL with any password masked."""
    return StoreUnavailable(f"store {location} is unreachable: {detail}", location=location, hint=hint)
