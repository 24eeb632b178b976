"""A session's hold on its task: the lease with its heartbeat, and the stop signals.

:class:`LeaseKeeper` takes the lease on ``(task, branch)``, renews it from a daemon thread every
third of its TTL, remembers a takeover (:class:`~overnight.errors.LeaseLost`: the next commit
raises it, and the session is asked to stop), and releases it without ever hiding the error that
ended the run. :class:`StopSignals` turns SIGINT/SIGTERM into a stop request: the first lets the
step in flight finish and commit, a second abandons a running step function (:class:`Abandon`).
"""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Any, Callable

from overnight.errors import DriftAbort, EncodeError, LeaseLost, OvernightError, StepFailed, StoreBusy
from overnight.store.base import Lease, LeaseStore
from overnight.store.leases import Holder


class Abandon(BaseException):
    """Raised inside a running step function by a second stop signal (never caught by a step's
    ``except Exception``); the step leaves no trace and runs again on resume."""


class LeaseKeeper:
    """The lease of one session on ``(task_id, branch)``.

    Args:
        store: where the lease lives (the primary of a replicated task).
        task_id, branch: what is held.
        ttl_ms: lease time to live; renewed every ``ttl_ms / 3``.
        on_lost: called (from the heartbeat thread) when another holder took the lease over.

    Attributes:
        lease: the current lease (None before :meth:`acquire` and after :meth:`release`).
        lost: the takeover, once seen.
    """

    def __init__(self, store: LeaseStore, task_id: str, branch: str, ttl_ms: int,
                 on_lost: Callable[[LeaseLost], None]) -> None:
        self.store, self.task_id, self.branch, self.ttl_ms = store, task_id, branch, ttl_ms
        self.on_lost = on_lost
        self.lease: Lease | None = None
        self.lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> Lease:
        """Take the lease and start the heartbeat. Raises :class:`~overnight.errors.TaskBusy`."""
        holder = Holder.current()
        self.lease = self.store.acquire_lease(self.task_id, self.branch, holder.id, holder.to_json(), self.ttl_ms)
        self._thread = threading.Thread(target=self._heartbeat, name="overnight-lease", daemon=True)
        self._thread.start()
        return self.lease

    def check(self) -> Lease | None:
        """The lease to fence a commit with. Raises the :class:`~overnight.errors.LeaseLost` seen."""
        if self.lost is not None:
            raise self.lost
        return self.lease

    def _heartbeat(self) -> None:
        interval = self.ttl_ms / 3000
        while not self._stop.wait(interval):
            lease = self.lease
            if lease is None:
                return
            try:
                self.lease = self.store.renew_lease(lease, self.ttl_ms)
            except LeaseLost as exc:
                self.lost = exc
                self.on_lost(exc)
                return
            except (StoreBusy, OvernightError):
                continue

    def release(self, first: BaseException | None) -> None:
        """Stop the heartbeat and give the lease up without hiding anything: a release that fails
        never replaces the error that ended the run (``first``, which gains a note naming the
        second), and after a run that ended well it is a warning -- the lease expires by itself
        after its TTL. A run that failed for good (:func:`failure_reason`) leaves ``failed: REASON``
        in the released lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        lease, self.lease = self.lease, None
        if lease is None:
            return
        try:  # a step that failed for good, or drift the policy aborts on: `overnight ls` says failed (reason)
            reason = failure_reason(first)
            if reason is not None:
                self.store.release_lease(lease, f"failed: {reason}")
            else:
                self.store.release_lease(lease)
        except Exception as exc:  # noqa: BLE001 - reported, never raised over the run's outcome
            why = exc.message if isinstance(exc, OvernightError) else str(exc)
            detail = (f"releasing the lease on task {self.task_id!r} (branch {self.branch!r}) also failed "
                      f"({type(exc).__name__}: {why}); it expires by itself within {self.ttl_ms} ms")
            if first is not None:
                first.add_note(detail)
                if isinstance(first, OvernightError) and first.hint is not None:
                    first.hint += f"\n  also: {detail}"
            else:
                warnings.warn(detail, RuntimeWarning, stacklevel=3)


def failure_reason(first: BaseException | None) -> str | None:
    """Why a run failed for good -- what running it again unchanged fails on again, so status,
    ``ls`` and the dashboard say ``failed (REASON)`` rather than ``interrupted`` -- or None: a step
    that raised after its retries (:class:`~overnight.errors.StepFailed`, its message), drift the
    policy aborts on (:class:`~overnight.errors.DriftAbort`) or a value a step produced that cannot
    be stored (:class:`~overnight.errors.EncodeError`), each as ``TYPE: message``. A worker parks
    a task ``failed`` for the same errors."""
    if isinstance(first, StepFailed):
        return first.message
    if isinstance(first, (DriftAbort, EncodeError)):
        return f"{type(first).__name__}: {first.message}"
    return None


class StopSignals:
    """SIGINT/SIGTERM as stop requests for one session (installed in the main thread only).

    Args:
        on_stop: called with ``(signal name, count)`` on every signal; it decides what to report.
        in_step: whether a step function is running now (a second signal abandons only that).
    """

    def __init__(self, on_stop: Callable[[str, int], None], in_step: Callable[[], bool]) -> None:
        self.on_stop, self.in_step = on_stop, in_step
        self.count = 0
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.on_stop(signal.Signals(signum).name, self.count)
        if self.count > 1 and self.in_step():
            raise Abandon()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}
