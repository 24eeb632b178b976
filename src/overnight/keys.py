"""What this machine and user keep *outside* every store: the keys and marks a store's writer
cannot see or change.

* The **signing key** (``$OVERNIGHT_SIGNING_KEY``): HMAC-SHA256 over every checkpoint record.
* The **environment key**: what declared environment values are digested with (``env=`` /
  ``ctx.env``), so that a reader of the store cannot guess a value back by trying a dictionary.
  It is the signing key when one is set, else a random 32-byte key in a per-user file created on
  first use with mode 0600 (:func:`env_key_path`: ``$OVERNIGHT_ENV_KEY_FILE``, else
  ``$XDG_CONFIG_HOME/overnight/env.key``, else ``~/.config/overnight/env.key``).
* The **high-water file** (:class:`HighWater`): the newest signed head this machine has seen per
  store, task and branch (``$OVERNIGHT_STATE_DIR/high-water.json``, else
  ``$XDG_STATE_HOME/overnight/``, else ``~/.local/state/overnight/``), so a branch ref moved back to
  an older -- validly signed -- checkpoint is caught even when the newer records were deleted from
  the store (:mod:`overnight.chain.rollback`).

None of this is ever written into a store. A machine without the environment key of the machine
that recorded a digest cannot compare it: drift reports the value as ``cannot compare``
(:mod:`overnight.verify.fingerprint`), never as changed.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from overnight.errors import ConfigError

ENV_KEY_BYTES = 32
"""Bytes of a generated per-user environment key (256 bits)."""


def signing_key_from_env() -> bytes | None:
    """``$OVERNIGHT_SIGNING_KEY`` as bytes (UTF-8), or None when unset or empty."""
    key = os.environ.get("OVERNIGHT_SIGNING_KEY")
    return key.encode("utf-8") if key else None


def _home_dir(env: str, xdg: str, fallback: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    base = os.environ.get(xdg)
    return (Path(base).expanduser() if base else Path.home() / fallback) / "overnight"


def env_key_path() -> Path:
    """Where the per-user environment key lives (it may not exist yet)."""
    if os.environ.get("OVERNIGHT_ENV_KEY_FILE"):
        return Path(os.environ["OVERNIGHT_ENV_KEY_FILE"]).expanduser()
    return _home_dir("", "XDG_CONFIG_HOME", ".config") / "env.key"


def state_dir() -> Path:
    """The per-user state folder holding the high-water file."""
    return _home_dir("OVERNIGHT_STATE_DIR", "XDG_STATE_HOME", ".local/state")


@dataclass(frozen=True)
class EnvKey:
    """A key for environment digests: its bytes and a short public id (the first 16 hex digits
    of HMAC-SHA256(key, "overnight.env-key-id"): names the key in a digest without revealing it)."""

    key: bytes
    key_id: str
    source: str  # "signing key" | the key file's path


def read_cache_file(path: Path, max_bytes: int) -> Any:
    """The JSON document in a cache file of the per-user state folder, or None when there is none
    that can be trusted to be one: missing, not a regular file (a FIFO, a device, a folder -- opened
    without blocking, links followed), larger than ``max_bytes``, unreadable, not UTF-8 JSON, or
    nested too deep to parse. Never raises: a cache's loss only costs a recomputation."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        parts, size = [], 0
        while size <= max_bytes and (part := os.read(fd, max_bytes + 1 - size)):
            parts.append(part)
            size += len(part)
        if size > max_bytes:
            return None
        return json.loads(b"".join(parts).decode("utf-8"))
    except (OSError, ValueError, RecursionError, MemoryError):
        return None
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; best effort (some file systems refuse a folder's fsync)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file_atomic(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically replace the file ``path`` with ``data`` (bytes): written to a new temporary file in
    the same folder, then renamed over ``path``, so a reader sees the old file or the new one, never
    a partly written one.

    The temporary file's name (``.<name>.<pid>.<thread id>.<16 random hex>.tmp``) is created with
    ``O_EXCL``, so no other thread or process -- nor a later one reusing this pid -- ever writes
    through it: concurrent writers each rename a whole file of their own, and the last rename wins.
    With ``durable`` (the default) the temporary file is fsynced before the rename and the folder
    after it, so once this returns a crash or power cut keeps the new file. ``mode``: the new file's
    permission bits, less the umask. The folder must exist. The first write of ``path`` in a process
    removes the temporary files killed writers left beside it (:func:`sweep_temp_files`).

    Raises:
        OSError: the file could not be written or renamed (``path`` is then unchanged, and the
            temporary file is removed).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:  # pragma: no cover - 64 random bits collided
            continue
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(path.parent)
    if (path.parent, path.name) not in _swept:
        _swept.add((path.parent, path.name))
        sweep_temp_files(path)


_swept: set[tuple[Path, str]] = set()
"""The files whose leftover temporaries this process has swept (once per file per process)."""

STALE_TEMP_S = 3600.0
"""Age (seconds, by mtime) past which a leftover temporary of :func:`write_file_atomic` whose
writer process is gone is removed: a writer holds one for well under a second, so an hour leaves
room for a stopped (SIGSTOP) or swapped-out writer and for clock steps."""


def sweep_temp_files(path: Path, *, older_than_s: float = STALE_TEMP_S) -> list[Path]:
    """Remove the temporary files a killed :func:`write_file_atomic` left beside ``path``
    (``.<name>.<pid>.<thread id>.<16 hex>.tmp``): each a regular file (links and folders of that
    name are left alone), last modified more than ``older_than_s`` seconds ago, whose writer's pid
    is no process on this machine. ``write_file_atomic`` calls it once per file per process.
    Returns the removed paths; raises nothing (what cannot be listed or removed stays)."""
    prefix, removed = f".{path.name}.", []
    now = time.time()
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        parts = name[len(prefix):-len(".tmp")].split(".")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or len(parts[2]) != 16:
            continue
        tmp = path.parent / name
        try:
            st = os.lstat(tmp)
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < older_than_s or _process_exists(int(parts[0])):
                continue
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            continue
    return removed


def _process_exists(pid: int) -> bool:
    """Whether ``pid`` is a process on this machine (another user's counts; a pid too large for
    the system is none)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):
        return False
    return True


def write_cache_file(path: Path, doc: Any) -> None:
    """Atomically replace ``path`` (in the per-user state folder, created mode 0700) with ``doc`` as
    compact JSON, mode 0600 (:func:`write_file_atomic`, a temporary name of this writer's own) --
    for caches, whose loss only costs the next process a recomputation: an ``OSError`` is ignored,
    and nothing is fsynced."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_file_atomic(path, json.dumps(doc, separators=(",", ":")).encode("utf-8"), durable=False)
    except OSError:
        pass


STATE_LOCK_S = 10.0
"""How long (s) a writer of a per-user state file waits for another process's lock on it before it
gives up (and writes nothing: as for a state folder that cannot be written)."""


@contextmanager
def state_file_lock(path: Path, wait_s: float = STATE_LOCK_S) -> Iterator[bool]:
    """Hold the exclusive ``flock`` guarding the per-user state file ``path`` (on its sibling
    ``.lock`` file, mode 0600, created when missing, opened without following a link and without
    blocking); yields True while it is held, False -- do not write -- when a link or anything but a
    regular file is there (a planted FIFO never hangs a writer), or another process held the lock
    ``wait_s`` seconds (a stopped process). Where ``flock`` is unsupported (an ``OSError`` from it)
    it yields True unlocked.

    Raises:
        OSError: the lock file cannot be opened (a state folder that cannot be written; a link there).
    """
    fd = os.open(path.with_name(path.name + ".lock"),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        held = stat.S_ISREG(os.fstat(fd).st_mode)
        deadline = time.monotonic() + wait_s
        while held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another writer holds it: wait, but not forever
                held = time.monotonic() <= deadline
                time.sleep(0.002)
            except OSError:  # pragma: no cover - a file system without flock
                break
        yield held  # closing the descriptor releases the lock
    finally:
        os.close(fd)


def _env_key(key: bytes, source: str) -> EnvKey:
    kid = hmac.new(key, b"overnight.env-key-id", hashlib.sha256).hexdigest()[:16]
    return EnvKey(key, kid, source)


def env_key(*, create: bool) -> EnvKey | None:
    """The environment key: the signing key when set, else the per-user key file's, created
    (``create=True``, 32 random bytes, mode 0600, its folder 0700) when missing. Returns None when
    there is none and ``create`` is False.

    Raises:
        OSError: the key file cannot be read or created (its path is in the message).
    """
    signing = signing_key_from_env()
    if signing is not None:
        return _env_key(signing, "signing key")
    path = env_key_path()
    cached = _loaded.get(str(path))
    if cached is not None:
        return cached
    try:
        found = _loaded[str(path)] = _env_key(bytes.fromhex(path.read_text("ascii").strip()), str(path))
        return found
    except FileNotFoundError:
        if not create:
            return None
    except ValueError:
        raise ConfigError(f"environment key file {path} does not hold a hex key",
                          hint="delete it to make a new one (digests recorded with the old key then read "
                          "`cannot compare`)") from None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(ENV_KEY_BYTES) + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # first writer wins: two processes creating it at once agree on one key
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    found = _loaded[str(path)] = _env_key(bytes.fromhex(path.read_text("ascii").strip()), str(path))
    return found


_loaded: dict[str, EnvKey] = {}
"""Environment keys read from their files in this process, by path (read once per process)."""


# --- high-water marks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """The newest signed head seen of one branch: its checkpoint id, ``seq``, the task's
    incarnation (the random salt in its signed spec: a task deleted and created again under the
    same id is another incarnation, whose marks start afresh), ``created_at`` (the head's signed
    RFC 3339 UTC time; ``""`` in marks written before it was kept) and ``retired``: the
    incarnations this branch's mark was at before (newest first, at most
    :data:`MAX_RETIRED`) -- an incarnation once replaced never comes back but by a replay."""

    checkpoint_id: str
    seq: int
    incarnation: str
    created_at: str = ""
    retired: tuple[str, ...] = ()


MAX_RETIRED = 16
"""Incarnations a mark remembers as replaced (each a 32-hex salt)."""


MAX_HIGH_WATER_BYTES = 16 << 20
"""A high-water file larger than this (bytes) is not read (~150 bytes a branch: ~100,000 branches)."""


class HighWater:
    """The per-machine high-water file: ``{store: {task: {branch: {"checkpoint_id", "seq"}}}}``
    (JSON, mode 0600), updated under an exclusive ``flock`` by read-modify-write and an atomic
    rename (:func:`write_file_atomic`: a temporary file of the writer's own), so threads and
    processes writing at once all keep their marks. It is not fsynced: every signed commit raises
    its mark, and two fsyncs (file and folder) would cost each one ~0.35-0.45 ms more on a 2-core
    VM's disk (~40 % of a SQLite commit). It is a mark, not a log: losing it (a new machine, a
    deleted file, the last updates before a power cut) weakens rollback detection to an older mark
    or to what the store's own records show -- a mark behind the store's head is never a false
    alarm -- and nothing else."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "high-water.json"

    def _read(self) -> dict[str, Any]:
        # missing, damaged or not a regular file (a planted FIFO or device is opened without
        # blocking and not read): no marks, as for a new machine
        data = read_cache_file(self.path, MAX_HIGH_WATER_BYTES)
        return data if isinstance(data, dict) else {}

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any] | None]:
        """The marks to change (written back afterwards), or None: the lock is not a regular file
        or stays taken (:func:`state_file_lock`) -- then nothing is written."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with state_file_lock(self.path) as held:
            if not held:
                yield None
                return
            data = self._read()
            yield data
            # not durable (class docstring): a power cut can only leave an older mark, never a torn one
            write_file_atomic(self.path, json.dumps(data, sort_keys=True, ensure_ascii=True).encode("utf-8"),
                              durable=False)

    def get(self, store: str, task_id: str, branch: str) -> Mark | None:
        """The mark of ``store``/``task_id``/``branch``, or None."""
        m = self._read().get(store, {}).get(task_id, {}).get(branch)
        if isinstance(m, dict) and isinstance(m.get("checkpoint_id"), str) and isinstance(m.get("seq"), int):
            retired = m.get("retired")
            return Mark(m["checkpoint_id"], m["seq"], str(m.get("incarnation", "")), str(m.get("created_at", "")),
                        tuple(r for r in retired if isinstance(r, str))[:MAX_RETIRED] if isinstance(retired, list)
                        else ())
        return None

    def raise_to(self, store: str, task_id: str, branch: str, mark: Mark, *, force: bool = False) -> None:
        """Record ``mark`` unless a mark with a higher ``seq`` is there (``force``: always -- this
        machine wrote ``mark`` itself, or the user accepted a rollback). A mark of another
        incarnation replaces the old one, whose incarnation goes to the front of ``retired``
        (``mark.retired`` is not read: the file's own list is kept)."""
        try:
            with self._locked() as data:
                if data is None:  # a planted lock, or one held too long: detection as without a mark
                    return
                branches = data.setdefault(store, {}).setdefault(task_id, {})
                old = branches.get(branch)
                if not isinstance(old, dict):
                    old = {}
                retired = [r for r in old.get("retired", []) if isinstance(r, str)] \
                    if isinstance(old.get("retired"), list) else []
                was = old.get("incarnation")
                if isinstance(was, str) and was and was != mark.incarnation:
                    retired.insert(0, was)
                retired = list(dict.fromkeys(r for r in retired if r != mark.incarnation))[:MAX_RETIRED]
                if (force or not isinstance(old.get("seq"), int) or was != mark.incarnation
                        or old["seq"] <= mark.seq):
                    branches[branch] = {"checkpoint_id": mark.checkpoint_id, "seq": mark.seq,
                                        "incarnation": mark.incarnation, "created_at": mark.created_at,
                                        **({"retired": retired} if retired else {})}
        except OSError:
            pass  # a read-only home: detection falls back to what the store's records show


__all__ = ["EnvKey", "HighWater", "Mark", "env_key", "env_key_path", "signing_key_from_env", "state_dir",
           "state_file_lock", "write_file_atomic"]
