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
yet, as in a transactional store; the task's next first commit replaces it (:meth:`FileStore.commit`).

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
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from overnight.store import layout
from overnight.store.base import Commit, MinAge, TaskRow, age_limit
from overnight.errors import ConfigError, DecodeError, StoreBusy, TaskNotFound
from overnight.store.keyed import KeyedStore
from overnight.store.refusal import os_refusal, refusals

_F = TypeVar("_F", bound=Callable[..., Any])

_TMP = ".tmp-"
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}

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


def _fsync(path: Path) -> None:
    """``fsync`` a file or a directory, by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _medium(*, writing: bool) -> Callable[[_F], _F]:
    """A container method whose ``OSError`` from the disk (full, read-only, permission denied, a
    folder gone) is raised as the typed :class:`~overnight.errors.StoreError` (see
    :mod:`overnight.store.refusal`), never as a raw traceback."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def call(self: "FileContainer", *args: Any, **kwargs: Any) -> Any:
            with refusals(str(self.root), writing=writing):
                return fn(self, *args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


class FileContainer:
    """A directory as a :class:`~overnight.store.keyed.Container` (see the module docstring).

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
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="overnight-file")
        self._opened = False
        try:
            self._sync_all({d.parent for d in self._mkdir(root)})
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
        """Create ``path`` and its missing parents; returns the folders created, outermost first.
        Their entries are not durable yet (:meth:`_unknown_parents`)."""
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
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return tmp

    def _sync_all(self, paths: Iterable[Path]) -> None:
        """``fsync`` every file or directory in ``paths``, side by side (the first on this thread, the
        others on the pool): the file system commits them together, so the batch waits about as
        long as one."""
        first, *rest = list(paths) or [None]
        futures = [self._pool.submit(_fsync, p) for p in rest]
        try:
            if first is not None:
                _fsync(first)
        finally:
            wait(futures)
        for f in futures:
            f.result()

    # -- reads ------------------------------------------------------------------------------

    def _read_bytes(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    @_medium(writing=False)
    def read(self, key: str) -> tuple[bytes, str] | None:
        data = self._read_bytes(key)
        return None if data is None else (data, _version(data))

    @_medium(writing=False)
    def read_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(dict.fromkeys(keys))
        found = self._pool.map(self._read_bytes, keys) if len(keys) > 16 else map(self._read_bytes, keys)
        return {k: d for k, d in zip(keys, found) if d is not None}

    @_medium(writing=False)
    def exists_many(self, keys: Iterable[str]) -> set[str]:
        return {k for k in keys if self._path(k).is_file()}

    @_medium(writing=False)
    def list(self, prefix: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._path(prefix)) if not n.startswith(_TMP))
        except (FileNotFoundError, NotADirectoryError):
            return []

    @_medium(writing=False)
    def occupied(self, prefix: str) -> bool:
        """Does the folder ``prefix`` hold a key or a sub-folder (temporary files aside)? Stops at
        the first one: no listing of a large folder."""
        try:
            with os.scandir(self._path(prefix)) as entries:
                return any(not e.name.startswith(_TMP) for e in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def size(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.root):
            for f in files:
                try:
                    total += os.stat(os.path.join(folder, f)).st_size
                except FileNotFoundError:
                    continue
        return total

    def stats(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        base = self._path(prefix)
        now = time.time()
        for folder, dirs, files in os.walk(base):
            dirs.sort()
            rel = os.path.relpath(folder, self.root)
            for f in sorted(files):
                if f.startswith(_TMP):
                    continue
                try:
                    st = os.stat(os.path.join(folder, f))
                except FileNotFoundError:
                    continue
                key = f if rel == "." else f"{rel}/{f}"
                yield key.replace(os.sep, "/"), st.st_size, max(0, int((now - st.st_mtime) * 1000))

    @_medium(writing=True)
    def refresh(self, keys: Iterable[str]) -> set[str]:
        gone = set()
        for key in keys:
            try:
                os.utime(self._path(key))
            except FileNotFoundError:
                gone.add(key)
        return gone

    @_medium(writing=True)
    def delete(self, keys: Iterable[str], *, min_age_ms: MinAge | None = None) -> dict[str, int]:
        freed: dict[str, int] = {}
        folders: set[Path] = set()
        for key in dict.fromkeys(keys):
            path = self._path(key)
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if min_age_ms is None:
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
            st = os.stat(tomb)
            if (time.time() - st.st_mtime) * 1000 < age_limit(min_age_ms):  # refreshed just before the rename
                try:
                    os.link(tomb, path)
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
        if path.exists():
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
            self._mkdir(path.parent)
            pending.append(self._write_temp(path.parent, data))
            return pending[-1]

        paths = {k: self._path(k) for k in items}
        later = {self._path(k): data for k, data in (then or {}).items()}
        try:
            new = {k: temp(path, items[k]) for k, path in paths.items() if not path.exists()}
            later_tmp = {path: temp(path, data) for path, data in later.items() if not path.exists()}
            swap_tmp = temp(self._path(swap[0]), swap[1]) if swap is not None else None
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
            os.replace(tmp, target)
            _fsync(target.parent)
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
            self._mkdir(lock_path.parent)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
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

    On top of the key-value algorithm (:class:`~overnight.store.keyed.KeyedStore`), it hides a
    task whose ``task`` record was written by a first commit that never reached its commit point
    (the process was killed between writing its records and swapping the ref): no ref names a
    checkpoint of it and its index is empty. SQLite writes the task row and its first checkpoint in
    one transaction, so there such a task does not exist either; the next first commit of that
    task replaces the leftover record (:meth:`commit`).

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

    # -- tasks whose first commit never landed ------------------------------------------------

    def _ever_committed(self, task_id: str) -> bool:
        """Has a ref of the task ever named a checkpoint? True when its index has an entry (a
        commit or ref move indexes the ref's old value before moving it) or a ref names one now --
        or a ref cannot be read (damage: the task stays visible, so verification reports it)."""
        if self._files.occupied(layout.index_dir(task_id)):
            return True
        folder = layout.refs_dir(task_id)
        for data in self._c.read_many([f"{folder}/{n}" for n in self._c.list(folder)]).values():
            try:
                if layout.decode_ref(data)["checkpoint_id"] is not None:
                    return True
            except DecodeError:
                return True
        return False

    def _never_committed(self, task_id: str, data: bytes) -> TaskNotFound:
        """The error for a task whose ``task`` record (``data``) a first commit wrote before it was
        interrupted: the hint says how to start it (again)."""
        try:
            entry = layout.decode_task(data).entry
        except DecodeError:
            entry = None
        again = (f"`overnight run {shlex.quote(entry)} --store {shlex.quote(self.url)}`" if entry else
                 "run its code again (`overnight run FILE.py`)")
        return TaskNotFound(
            f"task {task_id!r} in {self.url} has no checkpoint: the run that created it was stopped before its "
            "first commit completed, so nothing of it was kept", task_id=task_id,
            hint=f"start it with {again}; `overnight ls` lists the tasks")

    def get_task(self, task_id: str) -> TaskRow:
        """The task's registration.

        Raises:
            TaskNotFound: no such task -- or only the ``task`` record of a first commit that never
                completed (no checkpoint of the task was ever committed): the hint says to run it.
            StoreCorrupt: its record is unreadable (a member of the wrong type included); the
                message names the record's key.
        """
        key = layout.task_key(task_id)
        got = self._c.read(key)
        if got is None:
            raise TaskNotFound(f"no task {task_id!r} in {self.url}", task_id=task_id,
                               hint="`overnight ls` lists the tasks")
        if not self._ever_committed(task_id):
            raise self._never_committed(task_id, got[0])
        return self._decoded(layout.decode_task, key, got[0])

    def list_tasks(self) -> list[TaskRow]:
        """Every task, oldest first (by ``created_at``, then id). A task record that is unreadable
        (a member of the wrong type included), or that a first commit wrote without ever completing
        (see :meth:`get_task`), is left out."""
        keys = [f"tasks/{n}/task" for n in self._c.list("tasks")]
        tasks = []
        for data in self._c.read_many(keys).values():
            try:
                row = layout.decode_task(data)
            except DecodeError:
                continue
            if self._ever_committed(row.task_id):
                tasks.append(row)
        return sorted(tasks, key=lambda t: (t.created_at, t.task_id.encode("utf-8", "surrogatepass")))

    def commit(self, commit: Commit) -> int:
        """Commit a checkpoint (:meth:`overnight.store.base.ChainStore.commit`). A first commit
        (``commit.task`` set) that finds the ``task`` record an interrupted first commit left --
        no checkpoint of the task committed -- replaces that record with its own before writing
        (compare-and-swap; the record is otherwise written once), so the task's registration is
        the one of the commit that created it, as in a transactional store.

        Returns the bytes the commit added.

        Raises:
            StaleHead, LeaseLost, ParentGone, SchemaError: as every store (nothing is committed).
            StoreBusy: a lock stayed held by another process.
        """
        if commit.task is not None:
            self._replace_leftover_task(commit)
        return super().commit(commit)

    def _replace_leftover_task(self, commit: Commit) -> None:
        """Put the record of ``commit.task`` in place of a ``task`` record no committed checkpoint
        backs -- only when the commit can land (its expected head is the ref's, its lease holds),
        so that a commit refused for a stale head or a lost lease writes nothing here either."""
        task = commit.task
        assert task is not None
        key = layout.task_key(task.task_id)
        got = self._c.read(key)
        data = layout.encode_task(task)
        if got is None or got[0] == data or self._ever_committed(task.task_id):
            return
        current, fence, _ = self._read_ref(commit.checkpoint.task_id, commit.checkpoint.branch)
        if current != commit.expected_head:
            return  # the commit fails with StaleHead
        if commit.lease is not None:
            self._check_lease(commit.lease, fence)  # LeaseLost, as the commit would raise it
        self._c.swap(key, data, got[1])  # None: another writer replaced it a moment ago; its record stands
