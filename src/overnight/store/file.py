"""File backend: a plain directory (``file:///srv/overnight`` or ``file://relative/dir``).

The layout is :mod:`overnight.store.layout` (spec: ``docs/FORMAT.md``, "File layout"); the
algorithm is :class:`~overnight.store.keyed.KeyedStore`. This module supplies the two write
primitives on a POSIX file system:

* **write once** (objects, checkpoints, task records, index entries): write a temporary file in the
  target's directory, ``fsync`` it, ``link`` it to the final name (which fails if the name exists:
  the first bytes win, nothing is ever overwritten), unlink the temporary, ``fsync`` the directory.
  On a file system without hard links, ``rename`` after an existence check takes the place of
  ``link`` (then two writers racing on one *new* digest may both write it -- the same bytes).
* **compare-and-swap** (refs, leases): write a temporary file and ``fsync`` it, then, under an
  exclusive ``fcntl.flock`` on ``locks/<key>.lock`` held only while comparing and swapping, read
  the current file, compare its SHA-256 with the expected version, ``rename`` the temporary over
  the target (atomic), ``fsync`` the directory.

A batch of writes (:meth:`FileContainer.publish`, which a commit uses; ``create_many``) waits for
the disk three times in all, not per file: every temporary file is written, then all of them --
the records and the ref's new value alike -- are fsynced side by side on a thread pool (the file
system commits them together; one after the other, each would wait for its own journal commit);
then the names are linked and every directory they are in is fsynced side by side, with the
parent of any directory this process has not yet seen made durable (new, or made a moment ago by
another writer), and the directories of names that already existed (another writer's link may not
be durable yet); only then is the ref renamed into place and its directory fsynced. So no name
ever points at bytes that were not on disk first, and the ref never names a record whose bytes
or name are not. The new head's index entry (``then``) is fsynced with the rest and linked after
the swap, its directory left to the next commit.

Every write is durable when the call returns, and a crash at any instant leaves each file either
absent, old or new -- never torn (temporary files, ``.tmp-*``, are ignored and can be deleted).

**Reading.** A record with a member of the wrong type is damaged like one that does not parse (the
layout's decoders check the types: :mod:`overnight.store.layout`). A ``task`` record that no
committed checkpoint backs -- written by a first commit killed before its ref swap -- is no task
yet, as in a transactional store; the task's next first commit replaces it
(:meth:`~overnight.store.keyed.KeyedStore.commit`, shared with ``s3://``).

**Stored time and deletion.** An object's stored time is its file's modification time; a commit
that finds an object already there refreshes it with ``utime``. Deleting with a minimum age is
atomic against that refresh: the file is first *renamed* to a temporary name in its directory
(after which a writer's ``utime`` fails and the writer writes the object anew), then its
modification time is read; if it turns out fresh (a writer refreshed it just before the rename) it
is linked back under its name, otherwise removed.

**Network shares.** The directory may live on NFS or SMB if that share supports ``flock`` locks
across clients (Linux NFSv4 and NFSv3 with ``lockd`` map ``flock`` onto POSIX byte-range locks; a
CIFS mount must not use ``nobrl``; ``local_lock=all`` or ``nolock`` make locks local to one client
and so break compare-and-swap between machines). Because NFS emulates ``flock`` with per-process
POSIX locks, this module also serializes the threads of one process on a lock in memory.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shlex
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from overnight.store.base import MinAge, age_limit
from overnight.errors import ConfigError, StoreBusy, StoreCorrupt
from overnight.store import layout
from overnight.store.keyed import KeyedStore
from overnight.store.refusal import os_refusal, refusals

_F = TypeVar("_F", bound=Callable[..., Any])

_TMP = ".tmp-"
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a link as the last component: ELOOP (Linux, macOS)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)  # a planted FIFO never blocks a read

_PLANTED = layout.DAMAGED
"""What reading a key that is a symbolic link or not a regular file (a FIFO, device, socket,
folder), or a key under a folder that is a link, or a file larger than
:data:`~overnight.store.layout.MAX_KEY_BYTES` (a sparse 4 GB plant costs no disk), returns instead
of following or reading it (:data:`~overnight.store.layout.DAMAGED`, shared with ``s3://``): damage
like a file that does not parse. Never the content of a file outside the store, never an
allocation of a planted size."""

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

# one in-memory lock per lock file, shared by every FileContainer of this process
_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _process_lock(path: str) -> threading.Lock:
    with _process_locks_guard:
        return _process_locks.setdefault(path, threading.Lock())


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fsync(path: Path, follow: bool = False) -> None:
    """``fsync`` a file or a directory, by path; a link there is not followed (ELOOP) unless
    ``follow`` (the store's root and the folders above it: the user named them)."""
    fd = os.open(path, _READ if not follow else _READ & ~_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _medium(*, writing: bool) -> Callable[[_F], _F]:
    """A container method whose ``OSError`` from the disk (full, read-only, permission denied, a
    folder gone) is raised as the typed :class:`~overnight.errors.StoreError` (see
    :mod:`overnight.store.refusal`), never as a raw traceback; a symbolic link met where
    ``O_NOFOLLOW`` refuses one (ELOOP) as :class:`~overnight.errors.StoreCorrupt` naming it."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def call(self: "FileContainer", *args: Any, **kwargs: Any) -> Any:
            with refusals(str(self.root), writing=writing):
                try:
                    return fn(self, *args, **kwargs)
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise
                    where = exc.filename if isinstance(exc.filename, (str, os.PathLike)) else self.root
                    raise self._planted(Path(where)) from exc

        return call  # type: ignore[return-value]

    return wrap


class FileContainer:
    """A directory as a :class:`~overnight.store.keyed.Container` (see the module docstring).

    **Links are never followed inside the store.** Whoever can write the store can plant a
    symbolic link (``objects/ab -> ~/notes``, a ref -> ``/etc/passwd``); overnight must still not read,
    write, rename or delete anything outside it. So every file under the root is opened with
    ``O_NOFOLLOW`` (reads, temporary files, lock files, fsyncs), and every folder under the root is
    checked with ``lstat`` before it is read or written through -- once per process, remembered in
    a set, so a commit costs no more system calls than before (a delete checks its folders again).
    A key that is a link or not a regular file, or that lies under a folder that is a link, reads
    as damage (:data:`_PLANTED`: a ref raises StoreCorrupt naming it, a checkpoint record is
    skipped, an object is ``"unreadable"``); a write into such a folder, or a listing of it, raises
    :class:`~overnight.errors.StoreCorrupt` naming the folder; a delete removes a link itself,
    never what it points to. The root itself may be a link (``~/store -> /mnt/disk/store``): the
    user named it. Limit: a folder swapped for a link *after* this process checked it is noticed
    by the next delete or the next process, not by reads and writes meanwhile (paths, not
    ``openat`` descriptors, so that each file keeps one name the tests and the power-cut model see).

    Args:
        root: the store's directory; created (with parents) when missing.
        busy_timeout_ms: how long a compare-and-swap waits for another process's lock (ms)
            before raising :class:`~overnight.errors.StoreBusy`.
    """

    def __init__(self, root: Path, *, busy_timeout_ms: int = 10_000) -> None:
        if fcntl is None:  # pragma: no cover
            raise ConfigError("the file store needs fcntl.flock (POSIX); use sqlite:// on this platform")
        self.root = root
        self.busy_timeout_ms = busy_timeout_ms
        self._dirs: set[Path] = set()  # folders under root whose entries this process saw made durable
        self._dirs_lock = threading.Lock()
        self._real: set[Path] = set()  # folders under root this process saw to be folders, not links (_folder)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="overnight-file")
        self._opened = False
        try:
            self._sync_all({d.parent for d in self._mkdir(root)}, follow=True)
        except OSError as exc:
            typed = os_refusal(exc, str(root), writing=True)
            raise (typed or ConfigError(f"cannot create store directory {root}: {exc}")) from exc
        if not root.is_dir():
            raise ConfigError(f"store path {root} is not a directory", hint="use file://DIR with a directory")
        self._opened = True

    # -- paths ------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def _mkdir(self, path: Path) -> list[Path]:
        """Create ``path`` (the root: links followed, the user named it) and its missing parents;
        returns the folders created, outermost first. Their entries are not durable yet
        (:meth:`_unknown_parents`). Folders under the root: :meth:`_folder`."""
        missing = []
        p = path
        while p not in self._dirs and not p.is_dir():
            if p == self.root and self._opened:  # never recreate a store that vanished (an unmounted share)
                raise FileNotFoundError(errno.ENOENT, "the store's folder is missing", str(p))
            missing.append(p)
            p = p.parent
        created = []
        for d in reversed(missing):
            try:
                d.mkdir()
            except FileExistsError:
                continue
            created.append(d)
        return created

    def _folder(self, folder: Path, *, create: bool = False, fresh: bool = False) -> bool:
        """Is ``folder`` (the root or a folder under it) there, it and every folder between it and
        the root a real folder? True, or False when one is missing or is a file (nothing is stored
        under it); ``create`` makes the missing ones instead. A symbolic link among them is never
        followed: :class:`~overnight.errors.StoreCorrupt` naming it. A folder seen real is
        remembered (``lstat`` once per folder and process); ``fresh`` checks again (before a delete)."""
        if not fresh and folder in self._real:
            return True
        chain = []
        p = folder
        while p != self.root and p != p.parent and (fresh or p not in self._real):
            chain.append(p)
            p = p.parent
        for d in reversed(chain):
            try:
                mode = os.lstat(d).st_mode
            except FileNotFoundError:
                if not create:
                    return False
                try:
                    os.mkdir(d)
                    mode = stat.S_IFDIR
                except FileExistsError:  # another writer made it a moment ago (or planted something)
                    mode = os.lstat(d).st_mode
            if stat.S_ISLNK(mode):
                raise self._planted(d)
            if not stat.S_ISDIR(mode):
                if create:
                    raise NotADirectoryError(errno.ENOTDIR, "a file where the store keeps a folder", str(d))
                return False
            self._real.add(d)
        return True

    def _planted(self, path: Path) -> StoreCorrupt:
        """The error for a symbolic link met where the store keeps its own folders and files."""
        return StoreCorrupt(
            f"store {self.root}: {path} is a symbolic link; overnight never follows a link inside a store, so "
            "nothing was read or written through it",
            hint=f"someone with write access to the store put it there (or a copy kept links): see where it points "
            f"(`ls -l {shlex.quote(str(path))}`), remove it, then run `overnight verify --all`")

    def _unknown_parents(self, folders: Iterable[Path]) -> set[Path]:
        """The parent of each of ``folders`` not yet known durable, and its parent in turn if that one
        is not either, up to the root: what to fsync so that the folders' own entries are durable
        (a folder may be new -- made by this writer, or by another a moment ago)."""
        out: set[Path] = set()
        for f in folders:
            while f != self.root and f not in self._dirs:
                f = f.parent
                out.add(f)
        return out

    def _write_temp(self, folder: Path, data: bytes) -> Path:
        """A new temporary file in ``folder`` holding ``data``, not yet fsynced."""
        tmp = folder / f"{_TMP}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return tmp

    def _sync_all(self, paths: Iterable[Path], *, follow: bool = False) -> None:
        """``fsync`` every file or directory in ``paths``, side by side (the first on this thread, the
        others on the pool): the file system commits them together, so the batch waits about as
        long as one. Links are not followed, but for the root (``follow``: nor for any path, which
        then lies at or above the root)."""
        first, *rest = list(paths) or [None]
        futures = [self._pool.submit(_fsync, p, follow or p == self.root) for p in rest]
        try:
            if first is not None:
                _fsync(first, follow or first == self.root)
        finally:
            wait(futures)
        for f in futures:
            f.result()

    # -- reads ------------------------------------------------------------------------------

    def _read_bytes(self, key: str) -> bytes | None:
        """The key's bytes; None when it does not exist; :data:`_PLANTED` when it is a link or not
        a regular file, or a folder on its way is a link (never followed)."""
        path = self._path(key)
        try:
            if not self._folder(path.parent):
                return None
            fd = os.open(path, _READ)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except StoreCorrupt:
            return _PLANTED
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return _PLANTED
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > layout.MAX_KEY_BYTES:
                return _PLANTED  # a record or object of that size was never written here (a sparse plant)
            chunks = []
            while chunk := os.read(fd, st.st_size + 1 if not chunks else 1 << 20):
                chunks.append(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

    @_medium(writing=False)
    def read(self, key: str) -> tuple[bytes, str] | None:
        data = self._read_bytes(key)
        return None if data is None else (data, _version(data))

    @_medium(writing=False)
    def read_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(dict.fromkeys(keys))
        found = self._pool.map(self._read_bytes, keys) if len(keys) > 16 else map(self._read_bytes, keys)
        return {k: d for k, d in zip(keys, found) if d is not None}

    def _exists(self, path: Path) -> bool:
        """Is there a key at ``path``: a file, or a link or special file (damage, read as such), also
        when a folder on its way is a link? A folder is no key."""
        try:
            if not self._folder(path.parent):
                return False
            return not stat.S_ISDIR(os.lstat(path).st_mode)
        except StoreCorrupt:
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    @_medium(writing=False)
    def exists_many(self, keys: Iterable[str]) -> set[str]:
        return {k for k in keys if self._exists(self._path(k))}

    @_medium(writing=False)
    def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        try:
            if not self._folder(folder):  # a link: StoreCorrupt, its entries are not the store's
                return []
            return sorted(n for n in os.listdir(folder) if not n.startswith(_TMP))
        except (FileNotFoundError, NotADirectoryError):
            return []

    @_medium(writing=False)
    def occupied(self, prefix: str) -> bool:
        """Does the folder ``prefix`` hold a key or a sub-folder (temporary files aside)? Stops at
        the first one: no listing of a large folder."""
        folder = self._path(prefix)
        try:
            if not self._folder(folder):
                return False
            with os.scandir(folder) as entries:
                return any(not e.name.startswith(_TMP) for e in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def size(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root):  # links to folders are not walked into
            for f in files:
                try:
                    total += os.lstat(os.path.join(folder, f)).st_size
                except FileNotFoundError:
                    continue
        return total

    def stats(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        """A link to a folder is never walked into; a link to a file (or a dangling one) is listed as
        a key: damage, which a delete removes itself."""
        base = self._path(prefix)
        if not self._folder(base):  # a link: StoreCorrupt
            return
        now = time.time()
        for folder, dirs, files in os.walk(base):
            dirs.sort()
            rel = os.path.relpath(folder, self.root)
            for f in sorted(files):
                if f.startswith(_TMP):
                    continue
                try:
                    st = os.lstat(os.path.join(folder, f))
                except FileNotFoundError:
                    continue
                key = f if rel == "." else f"{rel}/{f}"
                yield key.replace(os.sep, "/"), st.st_size, max(0, int((now - st.st_mtime) * 1000))

    @_medium(writing=True)
    def refresh(self, keys: Iterable[str]) -> set[str]:
        gone = set()
        for key in keys:
            path = self._path(key)
            try:
                if not self._folder(path.parent):  # a link on the way: StoreCorrupt
                    gone.add(key)
                    continue
                os.utime(path, follow_symlinks=False)  # a link's own time, never its target's
            except (FileNotFoundError, NotADirectoryError):
                gone.add(key)
        return gone

    @_medium(writing=True)
    def delete(self, keys: Iterable[str], *, min_age_ms: MinAge | None = None) -> dict[str, int]:
        freed: dict[str, int] = {}
        folders: set[Path] = set()
        paths = {key: self._path(key) for key in keys}
        # every folder checked again, before anything is removed: one that became a link since this
        # process last looked is StoreCorrupt, and nothing is deleted through it
        there = {folder: self._folder(folder, fresh=True) for folder in {p.parent for p in paths.values()}}
        for key, path in paths.items():
            if not there[path.parent]:
                continue
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISDIR(st.st_mode):
                continue  # a folder where a key belongs: not the store's to remove
            if min_age_ms is None or not stat.S_ISREG(st.st_mode):  # a link: removed itself, never followed
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                freed[key] = st.st_size
                folders.add(path.parent)
                continue
            if (time.time() - st.st_mtime) * 1000 < age_limit(min_age_ms):
                continue
            tomb = path.parent / f"{_TMP}gc-{uuid.uuid4().hex}"
            try:
                os.rename(path, tomb)  # from here on a writer's refresh fails and it writes anew
            except FileNotFoundError:
                continue
            st = os.lstat(tomb)
            if (time.time() - st.st_mtime) * 1000 < age_limit(min_age_ms):  # refreshed just before the rename
                try:
                    os.link(tomb, path, follow_symlinks=False)
                except FileExistsError:
                    pass  # a writer already wrote it again
                os.unlink(tomb)
                folders.add(path.parent)
                continue
            os.unlink(tomb)
            freed[key] = st.st_size
            folders.add(path.parent)
        self._sync_all(folders)
        return freed

    @_medium(writing=False)
    def folder_age_ms(self, prefix: str) -> int:
        """Time in ms since the folder ``prefix`` or a folder under it last changed (an entry made,
        renamed or removed in it: its modification time), by this machine's clock; 0 when it is
        missing or a link (a link is not walked into)."""
        base = self._path(prefix)
        try:
            if not self._folder(base, fresh=True):
                return 0
        except StoreCorrupt:
            return 0
        newest = 0.0
        for folder, dirs, _ in os.walk(base):
            try:
                newest = max(newest, os.lstat(folder).st_mtime)
            except FileNotFoundError:
                continue
        return max(0, int((time.time() - newest) * 1000)) if newest else 0

    def _forget(self, folder: Path) -> None:
        """Forget that ``folder`` and the folders under it were seen real and durable (they were removed)."""
        with self._dirs_lock:
            self._real = {d for d in self._real if not d.is_relative_to(folder)}
            self._dirs = {d for d in self._dirs if not d.is_relative_to(folder)}

    @_medium(writing=True)
    def remove_empty_folder(self, prefix: str) -> bool:
        """Remove the folder ``prefix`` (under the root) and the folders under it, deepest first, if
        none holds a file -- not even a temporary one of a write in progress (each ``rmdir`` fails on
        a folder something was put in meanwhile, and the rest then stays) --, and make the removal
        durable (the parent folder fsynced). A link there is never followed nor removed. Returns
        True when the folder is gone. A writer that had made or seen one of them makes it again
        (:meth:`_write`)."""
        base = self._path(prefix)
        if base == self.root or not self._folder(base, fresh=True):  # a link: StoreCorrupt
            return not os.path.lexists(base)
        folders = []
        for folder, dirs, files in os.walk(base):
            if files or any(os.path.islink(os.path.join(folder, d)) for d in dirs):
                return False
            folders.append(folder)
        self._forget(base)
        for folder in reversed(folders):  # deepest first
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                continue
            except OSError:  # not empty any more (a writer is making the task again), or not ours
                return False
        _fsync(base.parent, base.parent == self.root)
        return True

    # -- writes -----------------------------------------------------------------------------

    @staticmethod
    def _link(tmp: Path, path: Path) -> bool:
        """Give the (synced) temporary file ``tmp`` the name ``path`` unless it exists; True if it did."""
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
        if os.path.lexists(path):
            return False
        os.rename(tmp, path)
        return True

    def _write(self, items: dict[str, bytes], swap: tuple[str, bytes, str | None] | None = None,
               then: dict[str, bytes] | None = None) -> tuple[set[str], str | None]:
        """Create the ``items`` that do not exist; then, if given, compare-and-swap ``swap = (key,
        data, expected)`` and, once it landed, link ``then`` without syncing their directories (see
        :meth:`publish`). Three waits for the disk in all (see the module docstring). Returns
        ``(keys of items created, the swapped key's new version, None if it had another version)``."""
        pending: list[Path] = []  # every temporary file written; those not renamed are removed at the end

        def temp(path: Path, data: bytes) -> Path:
            try:
                pending.append(self._write_temp(path.parent, data))
            except FileNotFoundError:
                # the folder went since this process made or saw it (a gc removes the empty folder
                # of a deleted task, :meth:`remove_empty_folder`): make it again
                self._forget(path.parent)
                self._folder(path.parent, create=True, fresh=True)
                pending.append(self._write_temp(path.parent, data))
            return pending[-1]

        paths = {k: self._path(k) for k in items}
        later = {self._path(k): data for k, data in (then or {}).items()}
        target = self._path(swap[0]) if swap is not None else None
        for folder in {p.parent for p in [*paths.values(), *later, *([target] if target is not None else [])]}:
            self._folder(folder, create=True)  # a link among them: StoreCorrupt before anything is written
        try:
            new = {k: temp(path, items[k]) for k, path in paths.items() if not os.path.lexists(path)}
            later_tmp = {path: temp(path, data) for path, data in later.items() if not os.path.lexists(path)}
            swap_tmp = temp(target, swap[1]) if swap is not None and target is not None else None
            self._sync_all(pending)
            created = {k for k, tmp in new.items() if self._link(tmp, paths[k])}
            # the folders of names that already existed too (another writer's link may not be durable
            # yet), and the parents of every folder written into that may be new
            folders = {path.parent for path in paths.values()}
            touched = folders | {tmp.parent for tmp in pending}
            parents = self._unknown_parents(touched)
            self._sync_all(folders | parents)
            with self._dirs_lock:
                self._dirs.update(touched - {self.root}, parents - {self.root})
            if swap is None or swap_tmp is None:
                return created, None
            version = self._swap_in(swap[0], swap[1], swap_tmp, swap[2])
            if version is not None:
                for path, tmp in later_tmp.items():
                    self._link(tmp, path)
            return created, version
        finally:
            for tmp in pending:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass

    def _swap_in(self, key: str, data: bytes, tmp: Path, expected: str | None) -> str | None:
        """The compare-and-swap itself: under the key's lock, rename ``tmp`` (``data``, already
        synced) over the key if its version is ``expected``, then fsync the folder. Returns the new
        version, or None when the key had another version (``tmp`` is left for the caller)."""
        target = self._path(key)
        with self._locked(key):
            current = self._read_bytes(key)
            if (None if current is None else _version(current)) != expected:
                return None
            os.replace(tmp, target)  # a link there is replaced itself, never followed
            _fsync(target.parent, target.parent == self.root)
        return _version(data)

    @_medium(writing=True)
    def create_many(self, items: dict[str, bytes]) -> set[str]:
        return self._write(items)[0]

    @_medium(writing=True)
    def publish(self, items: dict[str, bytes], key: str, data: bytes, expected: str | None,
                then: dict[str, bytes] | None = None) -> tuple[set[str], str | None]:
        return self._write(items, (key, data, expected), then)

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Hold the exclusive lock of ``key`` (in-process lock, then ``flock`` on its lock file)."""
        lock_path = self._path(f"locks/{key}.lock")
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        plock = _process_lock(str(lock_path))
        if not plock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise self._busy(key)
        try:
            self._folder(lock_path.parent, create=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)  # a link: ELOOP
            try:
                delay = 0.0005
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise self._busy(key) from None
                        time.sleep(delay)
                        delay = min(delay * 2, 0.02)
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        finally:
            plock.release()

    def _busy(self, key: str) -> StoreBusy:
        return StoreBusy(
            f"{self.root / key} stayed locked by another process for {self.busy_timeout_ms} ms",
            hint="another overnight process is updating this ref or lease; retry, or raise busy_timeout_ms",
        )

    def swap(self, key: str, data: bytes, expected: str | None) -> str | None:
        return self.publish({}, key, data, expected)[1]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class FileStore(KeyedStore):
    """:class:`~overnight.store.base.Store` in a directory (see the module docstring).

    The key-value algorithm (:class:`~overnight.store.keyed.KeyedStore`) on a directory; as on
    every keyed store, a task whose ``task`` record was written by a first commit that never
    reached its commit point (the process was killed between writing its records and swapping the
    ref) is no task, and the next first commit of that task replaces the leftover record
    (see :mod:`overnight.store.keyed`).

    Args:
        path: the store's directory; created when missing. An existing non-empty directory that is
            not an overnight store is refused.
        busy_timeout_ms: how long a ref or lease update waits for another process's lock (ms).

    Raises:
        ConfigError: the path is not a directory, cannot be created, or holds something else.
        StoreVersionError: the store was written by a newer overnight.
        StoreBusy: (from any write) a lock stayed held by another process past ``busy_timeout_ms``.
    """

    def __init__(self, path: str | os.PathLike, *, busy_timeout_ms: int = 10_000) -> None:
        self.path = Path(path)
        self._files = container = FileContainer(self.path, busy_timeout_ms=busy_timeout_ms)
        try:
            super().__init__(container, f"file://{self.path}")
        except BaseException:
            container.close()
            raise
