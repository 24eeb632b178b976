"""Object content checks in helper processes, for ``verify`` of a large store.

``verify`` checks records on its calling thread and object content (decompression, SHA-256) on a
pool. Threads share one GIL, and a content check is not pure C: store reads build rows, chunk
trees are walked in Python, and every small decompression or hash gives the GIL back and waits for
it again. So on a small machine the threads add little beside a busy calling thread. A helper
process has its own interpreter: it opens the same store read-only from its URL, checks the
batches of digests it is sent exactly as :meth:`~overnight.store.blobs.BlobReader.verify_many`
does on a thread (it *is* that call), and sends back, per batch, the size of each blob that
verified, every digest it verified on the way (chunks and chunk indexes, so the caller counts and
skips them as after a thread's check) and the original of each ditto copy it verified. What
failed is only left out: the caller checks it again itself, with the healing reader, which names
the fault or heals it (nothing a helper says is trusted beyond "these digests hashed right").

Protocol (private to this module): the parent writes the store URL, then pickled ``(batch id,
[digest, ...])`` frames to the child's stdin, ``None`` to stop; the child writes pickled ``(batch id, {digest: size},
[verified digest, ...], {copy key: original digest})`` frames to its stdout. A child that dies or
cannot open the store fails its pending batches (the caller re-checks them) and takes no more; so
does one that answers none of its pending batches for ``stall_s`` seconds (stopped, say), once the
caller waits for it (:meth:`Helper.result`): it is killed, and a warning names it.

Run as ``python -m overnight.verify.content_proc CONTEXT`` (the text naming the check in errors).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import TYPE_CHECKING, Any, BinaryIO

# what only the parent uses is imported where it is used: a helper starts importing no more than it runs
if TYPE_CHECKING:
    from concurrent.futures import Future

    from overnight.store.base import Store

BatchResult = tuple[dict[str, int], list[str], dict[str, str]]
"""``(size in bytes of each blob that verified, every digest verified, copy key -> original)``."""


def reopen_url(store: Store) -> str | None:
    """The URL a helper process opens ``store`` with (read-only), or None when it cannot be
    reopened elsewhere as the same store: an in-process store (``memory://``), a composed one
    (replicas, fault injection) or a remote object store (each helper would pay its own
    connection set-up to save little)."""
    def is_a(module: str, name: str) -> bool:  # a store of a class exists only once its module is
        found = sys.modules.get(module)  # imported: nothing is imported here just to compare types
        return found is not None and type(store) is getattr(found, name, None)

    if is_a("overnight.store.compose.tiered", "TieredStore"):  # what the CLI opens: helpers check its hot
        return reopen_url(store.hot)  # type: ignore[attr-defined]  # store; an object only archived is checked here
    if is_a("overnight.store.sqlite", "SQLiteStore"):
        return f"sqlite://{store.path.resolve()}"  # type: ignore[attr-defined]
    if is_a("overnight.store.file", "FileStore"):
        return f"file://{store.path.resolve()}"  # type: ignore[attr-defined]
    if is_a("overnight.store.postgres", "PostgresStore"):
        return store.url  # type: ignore[attr-defined]
    return None


class Helper:
    """One helper process checking batches of digests in the store at ``url``.

    :meth:`submit` returns a :class:`~concurrent.futures.Future` of a :data:`BatchResult`; a
    reader thread fulfils them in order, and :meth:`result` waits for one. When the process dies
    (or never opens the store), or :meth:`result` finds it stuck -- batches pending and none
    answered for ``stall_s`` seconds -- every pending and later future fails with
    :class:`HelperGone`, and :attr:`alive` turns False.

    Raises:
        OSError: the process could not be started.
    """

    def __init__(self, url: str, context: str, stall_s: float = 60.0) -> None:
        import subprocess
        import threading

        here = os.path.realpath(__file__)  # .../src/overnight/verify/content_proc.py
        src = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # where this overnight is imported from
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": src + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "overnight.verify.content_proc", context],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.alive = True
        try:  # the URL goes through the pipe, not the command line (`ps` shows a password in it)
            assert self.proc.stdin is not None
            pickle.dump(url, self.proc.stdin)
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self.alive = False
        self.stall_s = stall_s
        """Seconds without an answer, batches pending, after which the helper is stuck."""
        self._answered = time.monotonic()  # (monotonic s) its last answer, or work given while it had none
        self._next = 0
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="overnight-verify-helper", daemon=True)
        self._reader.start()

    @property
    def pending(self) -> int:
        """Batches sent and not answered yet."""
        return len(self._pending)

    def submit(self, digests: list[str]) -> Future:
        from concurrent.futures import Future

        future: Future = Future()
        with self._lock:
            if not self.alive:
                future.set_exception(HelperGone("the verify helper process is gone"))
                return future
            batch, self._next = self._next, self._next + 1
            if not self._pending:  # idle until now: the stall is counted from here
                self._answered = time.monotonic()
            self._pending[batch] = future
        try:
            assert self.proc.stdin is not None
            pickle.dump((batch, digests), self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
        except (OSError, ValueError):
            self._fail()
        return future

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while True:
                batch, sizes, verified, copies = pickle.load(out)
                with self._lock:  # (a batch failed meanwhile is no longer here: its answer is not taken)
                    future = self._pending.pop(batch)
                    self._answered = time.monotonic()
                future.set_result((sizes, verified, copies))
        except Exception:  # EOF (the process ended or died) or a garbled frame: fail what is left
            self._fail()

    def result(self, future: Future) -> BatchResult:
        """Wait for ``future``, one of this helper's batches, and return its result. When the
        helper answers none of its pending batches for :attr:`stall_s` seconds, it is declared
        stuck: killed (SIGKILL) and reaped, its pending batches failed (an answer it may still
        have sent is not taken), and a :class:`RuntimeWarning` names its pid and the stall.

        Raises:
            HelperGone: the process died, or was killed as stuck, before answering this batch.
        """
        from concurrent.futures import TimeoutError as Timeout

        while True:
            with self._lock:
                left = self._answered + self.stall_s - time.monotonic()
            try:
                return future.result(timeout=max(left, 0.0))
            except Timeout:
                self._kill_if_stuck()

    def _kill_if_stuck(self) -> None:
        import warnings

        with self._lock:  # declared stuck and its batches taken in one step: no answer is taken after
            if not self._pending or time.monotonic() - self._answered < self.stall_s:
                return
            self.alive = False
            pending, self._pending = self._pending, {}
        self.proc.kill()
        self.proc.wait()
        for future in pending.values():
            future.set_exception(HelperGone("the verify helper process was stuck"))
        warnings.warn(f"verify helper process {self.proc.pid} answered none of its {len(pending)} batch(es) for "
                      f"{self.stall_s:g} s (OVERNIGHT_VERIFY_HELPER_STALL_S): killed it; its batches are checked "
                      "in the verify process instead", RuntimeWarning, stacklevel=4)

    def _fail(self) -> None:
        with self._lock:
            self.alive = False
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(HelperGone("the verify helper process is gone"))

    def close(self) -> None:
        """Stop the process (after the batches sent) and wait for it."""
        try:
            assert self.proc.stdin is not None
            if self.alive:
                pickle.dump(None, self.proc.stdin)
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        import subprocess

        try:
            self.proc.wait(timeout=self.stall_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        self._fail()


class HelperGone(RuntimeError):
    """A helper process ended before answering (its batches are checked by the caller)."""


class _Recording(set):
    """A set that also lists what is added to it (the digests a batch verified)."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[str] = []

    def add(self, d: Any) -> None:
        if d not in self:
            self.added.append(d)
            super().add(d)

    def update(self, *others: Any) -> None:
        for other in others:
            for d in other:
                self.add(d)


def _serve(context: str, inp: BinaryIO, out: BinaryIO) -> None:
    from overnight.chain.ditto import CopyReader
    from overnight.store import open_url

    store = open_url(pickle.load(inp), read_only=True)
    verified = _Recording()
    reader = CopyReader(store, verified)
    try:
        while True:
            msg = pickle.load(inp)
            if msg is None:
                return
            batch, digests = msg
            sizes, _ = reader.verify_many(digests, context)
            added, verified.added = verified.added, []
            copies, reader.copy_of = reader.copy_of, {}
            pickle.dump((batch, sizes, added, copies), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
    finally:
        store.close()


def main(argv: list[str]) -> int:
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the frames' pipe
    try:
        _serve(argv[0], sys.stdin.buffer, out)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return 1
    except Exception:  # the store did not open, say: the caller checks the batches itself, and says
        return 2  # what is wrong with them (a traceback here would only interleave with its output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
