"""The worker: claim runnable tasks and run each in a session process of its own (``overnight worker``).

A session process runs one task at a time and is reused for the worker's next task (at most
``session_tasks``; :func:`overnight.fleet.child.serve`), so a task that crashes or is killed takes
only its own session down.

Loop (every ``poll_s``): reap children that exited (a non-zero exit or a signal is a *death*:
counted, the task queued again after a backoff or parked ``failed`` at ``max_deaths``); claim
while fewer than ``concurrency`` children run (a claim that took over a stalled task counts the
previous holder's death first); heartbeat the worker row every third of the lease; exit after
``max_tasks`` claims or ``idle_exit_s`` without work.

Signals are handled here and only here: the first SIGTERM/SIGINT stops claiming and passes SIGTERM
to every child (each finishes its step in flight, commits, queues its task again and exits);
the worker exits 0 once they are gone. A second one passes a second SIGTERM (the runner abandons
the step in flight; nothing of it is committed). Children run in their own session, so a Ctrl-C
in the terminal reaches only the worker.

A store that is unreachable (PostgreSQL restarting, the network gone) is retried with a backoff
(at most 10 s); the worker exits non-zero only on a configuration error.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from overnight.errors import ConfigError, OvernightError
from overnight.store import open_store
from overnight.store.leases import DEFAULT_TTL_MS, now_ms
from overnight.store.queue import SILENT_AFTER_MS, QueuedTask, QueueRowInvalid, WorkerRow, worker_process_gone
from overnight.units import human_duration
from overnight.store.queue_open import queue_for

EXIT_STORE_GONE = 75
"""A session's exit status when the store became unreachable (:mod:`overnight.fleet.child`): the
task is queued again, and the death is not counted against it."""

EXIT_STOPPED = 76
"""A session's exit status when the worker's stop reached it before its runner started: the task
is queued again at once, and the death is not counted against it."""

EXIT_RETIRED = 77
"""A reused session's exit status when it will not run the task it was handed (code it imported
changed on disk; :mod:`overnight.fleet.child`): a fresh session runs that claim."""

DEFAULT_SESSION_TASKS = 100
"""Tasks a session process runs one after another before a fresh one replaces it (as Celery's
``worker_max_tasks_per_child`` bounds what one process can accumulate: leaked memory, threads,
file descriptors)."""

LOG = logging.getLogger("overnight.worker")


def _without_password(url: str) -> str:
    """``url`` for a log line: a password in it replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    auth, at, host = rest.partition("@")
    if sep and at and ":" in auth and "/" not in auth:
        return f"{scheme}://{auth.split(':', 1)[0]}:***@{host}"
    return url


def _status(code: int | None) -> str:
    """A process's exit status for a log line: ``killed by signal 9``, ``exited with status 1``."""
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"


_NO_QUEUE = ("file", "s3", "memory")
"""Store URL schemes without a queue (:func:`~overnight.store.queue_open.queue_for` returns None
for the stores they open)."""


def _no_queue(url: str) -> ConfigError:
    return ConfigError(f"store {url} has no queue; workers need sqlite:// or postgresql://",
                       hint="pass --store sqlite://PATH (workers on this machine) or --store "
                       "postgresql://HOST/DB?schema=NAME (workers on many)")


def _check_queue_kind(url: str) -> None:
    """Refuse a store URL whose kind has no queue before anything starts (nothing logged, no
    session started, no store folder made).

    Raises:
        ConfigError: ``file://``, ``s3://`` or ``memory://``."""
    scheme, sep, _ = str(url).partition("://")
    if sep and scheme.lower() in _NO_QUEUE:
        raise _no_queue(url)


class _Session:
    """A session process from the fork server (:func:`overnight.fleet.child.serve`) that runs this
    worker's tasks one at a time, with the ``Popen`` methods the worker uses for the one it runs."""

    def __init__(self, ctx: Any, store_url: str, session_tasks: int, *, fresh: bool = False) -> None:
        from overnight.fleet.child import serve

        self.conn, theirs = ctx.Pipe()
        self._p = ctx.Process(target=serve, args=(theirs, store_url, os.getpid(), session_tasks), daemon=False)
        self._p.start()
        theirs.close()
        self.pid = self._p.pid
        self.fresh = fresh
        """Started for the task it is handed first (it connects to the store before it takes it);
        else it was waiting for work when it was handed one."""
        self.runs = 0
        """Tasks handed to it, the one it runs included."""
        self.taken = False
        """It acknowledged the task it was handed last (it exits before that only to retire)."""
        self.more = True
        """It will take another task after this one."""
        self.reported = False
        """It said how the task it was handed last ended (an exit without that is a death, status 0 too)."""
        self.handed = 0.0
        """When (``time.monotonic()``) it was handed its last task."""
        self._eof = False

    def hand(self, argv: list[str]) -> bool:
        """Send it a task (:func:`~overnight.fleet.child.main`'s ``argv`` after the store URL, without
        the worker pid). False if it is gone."""
        if self._p.exitcode is not None or not self.more:
            return False
        try:
            self.conn.send(argv)
        except OSError:
            return False
        self.runs += 1
        self.fresh = self.fresh and self.runs == 1
        self.taken = self.reported = False
        self.handed = time.monotonic()
        return True

    def poll(self) -> int | None:
        """The status of the task it runs: 0 once it said the task ended that way (it then waits
        for the next one), else its exit status once it exited; None while the task runs."""
        while not self._eof:
            try:
                if not self.conn.poll():
                    break
                msg = self.conn.recv()
            except (EOFError, OSError):
                self._eof = True
                break
            if msg == "run":
                self.taken = True
            else:
                code, self.more = msg
                self.reported = True
                return int(code)
        return self._p.exitcode

    def waitables(self) -> list[Any]:
        """What becomes readable when :meth:`poll` may have news: its pipe (until it closed) and its
        exit sentinel."""
        return [self._p.sentinel] if self._eof else [self.conn, self._p.sentinel]

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        self._p.kill()

    def close(self) -> None:
        """Tell it to exit (an idle session)."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.conn.close()


@dataclass
class _Child:
    task: QueuedTask
    proc: Any
    """A :class:`_Session`, or the ``subprocess.Popen`` of a one-task session."""
    exit_fd: int | None = None
    """Readable once a one-task session exited (a pidfd), for :meth:`Worker._pause`."""


@dataclass
class WorkerStats:
    """What a worker did: ``claimed`` tasks, ``takeovers`` among them, child ``deaths`` seen,
    ``parked`` tasks; ``claim_ms`` the latency of every successful claim."""

    claimed: int = 0
    takeovers: int = 0
    deaths: int = 0
    parked: int = 0
    claim_ms: list[float] = field(default_factory=list)


class Worker:
    """One worker process. See the module docstring.

    Args:
        store_url: the store holding the queue (``sqlite://...`` or ``postgresql://...``).
        queues: queue names to claim from (default ``["default"]``).
        concurrency: children at most.
        max_tasks: exit after this many claims (and their children) -- None: no limit.
        idle_exit_s: exit after this long with nothing running, nothing to claim and nothing
            coming (a retry due within a lease, a dead worker's claim running out: :meth:`_coming`).
        worker_id: a name for ``overnight workers`` (default ``HOST-PID``): 1-200 printable
            characters (ConfigError otherwise: it goes into log lines and the workers table).
        lease_ms: claim and task-lease TTL (heartbeat every third of it).
        max_deaths: deaths in a row without a new checkpoint before a task is parked ``failed``.
        backoff_s: first retry delay after a death (doubles per death, at most 10 min).
        fork_server: start sessions from a fork server that has overnight imported (default);
            False: a fresh ``python -m overnight.fleet.child`` for every task.
        session_tasks: with the fork server, tasks a session process runs one after another
            before it exits and a fresh one takes its place (1: a fresh process for every task).
    """

    def __init__(self, store_url: str, *, queues: list[str] | None = None, concurrency: int = 1,
                 max_tasks: int | None = None, idle_exit_s: float | None = None, worker_id: str | None = None,
                 lease_ms: int = DEFAULT_TTL_MS, max_deaths: int = 3, backoff_s: float = 2.0,
                 poll_s: float = 0.2, python: str | None = None, fork_server: bool = True,
                 session_tasks: int = DEFAULT_SESSION_TASKS) -> None:
        if concurrency < 1:
            raise ConfigError(f"--concurrency must be at least 1, got {concurrency}")
        if lease_ms < 300:
            raise ConfigError(f"--lease must be at least 0.3 s, got {lease_ms} ms")
        if session_tasks < 1:
            raise ConfigError(f"--session-tasks must be at least 1, got {session_tasks}")
        _check_queue_kind(store_url)
        self.store_url = store_url
        self.queues = list(queues or ["default"])
        self.concurrency = concurrency
        self.max_tasks = max_tasks
        self.idle_exit_s = idle_exit_s
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        if not (0 < len(self.worker_id) <= 200 and self.worker_id.isprintable() and self.worker_id.strip()
                and self.worker_id.encode("utf-8", "replace").decode("utf-8") == self.worker_id):
            raise ConfigError(f"worker id {self.worker_id!r} is not a name: 1-200 printable characters, not only "
                              "spaces, no control characters or lone surrogates",
                              hint="pass --worker-id NAME (the default, HOST-PID, is one)")
        self.lease_ms = lease_ms
        self.max_deaths = max_deaths
        self.backoff_s = backoff_s
        self.poll_s = poll_s
        self.python = python or sys.executable
        self.fork_server = fork_server
        self.session_tasks = session_tasks
        self._idle: list[_Session] = []
        self._mp: Any = None
        self._again = False
        self._said_waiting = False  # --idle-exit's wait for work coming is logged once
        self.stats = WorkerStats()
        self._children: dict[str, _Child] = {}
        self._signals = 0
        self._store: Any = None
        self._queue: Any = None
        self._started_ms = 0  # set by the store's clock when the row is first written (register_worker)

    # -- store, with reconnects -------------------------------------------------------------------
    def _coming(self) -> str | None:
        """What this worker could claim soon although nothing is claimable now (``--idle-exit``
        waits for it), or None: a task of its queues queued to start within a lease's length (a
        retry's backoff); a running task whose claim ran out within a lease's length (its task
        lease, renewed with the claim, runs out moments later); or one claimed by a worker that is gone -- stopped, silent
        (:data:`~overnight.store.queue.SILENT_AFTER_MS`), or on this machine with its process no
        longer running (:func:`~overnight.store.queue.worker_process_gone`). A task claimed by a live
        worker is that worker's, not work coming."""
        q = self._q()
        now = q.clock_ms()  # the clock claims and worker heartbeats are set by
        offset = now_ms() - now  # this machine's clock minus it, for process_gone
        mine = [t for t in q.list() if t.queue in self.queues]
        soon = [t for t in mine if t.status == "queued" and t.not_before_ms <= now + self.lease_ms]
        if soon:
            first = soon[0]
            held = self._store.read_lease(first.task_id, "main") if self._store is not None else None
            if held is not None and held.holder_id and held.expires_at_ms > max(now, first.not_before_ms):
                return (f"task {first.task_id} starts once the task lease of a run outside the queue expires, "
                        f"in {human_duration(held.expires_at_ms - now)}")
            return f"task {first.task_id} starts in {human_duration(max(0, first.not_before_ms - now))}"
        workers = {w.worker_id: w for w in q.workers()}
        for t in mine:
            if t.status != "running" or t.worker_id == self.worker_id:
                continue
            expires = t.claim_expires_ms or 0
            if now - self.lease_ms < expires <= now:  # not one a live `overnight run` keeps from the queue for good
                return f"task {t.task_id}'s claim ran out; its task lease runs out next"
            if expires <= now:
                continue
            w = workers.get(t.worker_id or "")
            if w is None or w.state == "stopped" or now - w.heartbeat_ms > SILENT_AFTER_MS \
                    or worker_process_gone(w, offset):
                return f"task {t.task_id}'s claim by gone worker {t.worker_id} runs out in {human_duration(expires - now)}"
        return None

    def _later(self) -> str:
        """``"; task T is queued to start in 2 h"`` for the first task of this worker's queues due
        after what :meth:`_coming` waits for (a ``--not-before`` beyond a lease), so an
        ``--idle-exit`` that leaves it says that a worker must be running then; ``""`` when none is."""
        q = self._q()
        now = q.clock_ms()
        later = [t for t in q.list() if t.queue in self.queues and t.status == "queued"]
        if not later:
            return ""
        first = min(later, key=lambda t: t.not_before_ms)
        more = f" (and {len(later) - 1} more)" if len(later) > 1 else ""
        return (f"; task {first.task_id} is queued to start in {human_duration(max(0, first.not_before_ms - now))}"
                f"{more}: a worker must be running then")

    def _q(self) -> Any:
        if self._queue is None:
            self._store = open_store(self.store_url)
            q = queue_for(self._store)
            if q is None:
                self._store.close()
                self._store = None
                raise _no_queue(self.store_url)
            self._queue = q
        return self._queue

    def _drop_store(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        self._store = self._queue = None

    # -- signals ---------------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        name = signal.Signals(signum).name
        if self._signals == 1:
            LOG.warning("%s: %s, then exiting (signal again to abandon the steps in flight)", name,
                        f"letting {len(self._children)} session(s) finish the step in flight and commit"
                        if self._children else "claiming nothing more")
        elif self._signals == 2:
            LOG.warning("%s again: abandoning the steps in flight (nothing of them is committed)", name)
        for child in self._children.values():
            self._forward(child, 1)

    def _forward(self, child: _Child, times: int | None = None) -> None:
        """Send a session the worker's stop: SIGTERM ``times`` times (default: as many as the worker
        got, at most 2 -- the first lets the step in flight commit, the second abandons it)."""
        for _ in range(min(self._signals, 2) if times is None else times):
            try:
                child.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                return

    @property
    def stopping(self) -> bool:
        return self._signals > 0

    # -- children ----------------------------------------------------------------------------------
    def _spawn(self, task: QueuedTask, fresh: bool = False) -> None:
        """Start ``task`` in an idle session (unless ``fresh``), else in a new one."""
        argv = [task.task_id, str(task.claim_token), str(self.lease_ms)]
        if not self.fork_server:
            proc: Any = subprocess.Popen([self.python, "-m", "overnight.fleet.child", self.store_url, *argv,
                                          str(os.getpid())], start_new_session=True, stdin=subprocess.DEVNULL)
        else:
            while self._idle and not fresh:
                proc = self._idle.pop()
                if proc.hand(argv):
                    break
                proc.close()
            else:
                proc = _Session(self._context(), self.store_url, self.session_tasks, fresh=True)
                proc.hand(argv)
        self._children[task.task_id] = _Child(task, proc)

    def _context(self) -> Any:
        """A ``forkserver`` multiprocessing context with overnight already imported: a session
        starts in milliseconds instead of a Python start-up, from a clean process (not a fork of
        this one, whose threads and connections a child must not inherit)."""
        if self._mp is None:
            import multiprocessing

            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["overnight.fleet._forkserver_guard", "overnight.fleet.child",
                                        "overnight.runtime.runner", "overnight.api", "overnight.store.sqlite",
                                        "overnight.store.postgres", "overnight.store.queue_sqlite",
                                        "overnight.store.queue_postgres", "overnight.fleet._warm"])
            self._mp = ctx
        return self._mp

    def _reap(self) -> None:
        for session in [s for s in self._idle if s.poll() is not None]:  # died while it waited for work
            self._idle.remove(session)
            session.close()
            LOG.warning("idle session %d exited (%s)", session.pid, _status(session.poll()))
        for task_id, child in list(self._children.items()):
            code = child.proc.poll()
            if code is None and isinstance(child.proc, _Session) and not child.proc.taken:
                # a session that does not take its task (stopped with SIGSTOP, say) is killed, and the task
                # runs in another; one that waited for work answers at once, a new one connects first
                limit = self.lease_ms / 1000 if child.proc.fresh else max(self.lease_ms / 3000, 1.0)
                if time.monotonic() - child.proc.handed > limit:
                    LOG.warning("session %d did not take task %s within %.0f s; killing it", child.proc.pid, task_id,
                                limit)
                    child.proc.kill()
                continue
            if code is None:
                continue
            del self._children[task_id]
            if child.exit_fd is not None:
                os.close(child.exit_fd)
            session = child.proc if isinstance(child.proc, _Session) else None
            if session is not None and code == 0 and session.more:
                self._idle.append(session)  # it waits for the next task
            elif session is not None:
                session.close()
            if session is not None and not session.taken and (code == EXIT_RETIRED or not session.fresh):
                # a session that never took the task: it retired (an installed module it imported changed
                # on disk), or it died or stopped while it waited for work -- not the task's death; a new
                # session runs the claim
                if not self.stopping:
                    self._spawn(child.task, fresh=True)
                    continue
                self._store_retry(lambda q: q.release(child.task.task_id, child.task.claim_token))
                continue
            if code == 0 and (session is None or session.reported):
                self._said_done(task_id, child.task.claim_token)
                continue
            if code == 0:  # the process ended without saying how the task did (os._exit(0) in a step)
                self._death(child.task, "session exited with status 0 before its task ended")
                continue
            if code == EXIT_STORE_GONE:  # the store went away under the session: not the task's fault
                self._store_retry(lambda q: q.release(child.task.task_id, child.task.claim_token,
                                                      not_before_ms=q.clock_ms() + int(self.backoff_s * 1000)))
                continue
            if code == EXIT_STOPPED or (code == -signal.SIGTERM and self.stopping):
                # the worker's own stop reached it while it started: nothing committed, not a death
                self._store_retry(lambda q: q.release(child.task.task_id, child.task.claim_token))
                continue
            self._death(child.task, f"session {_status(code)}")

    def _top_up(self) -> None:
        """Start sessions until ``concurrency`` of them run a task or wait for one: a claimed task
        never waits for a process start-up (the first ones wait for the fork server's: ~2 s,
        overnight and the tokenizer), which another worker that is ready could spend running it."""
        while self.fork_server and len(self._idle) + len(self._children) < self.concurrency:
            self._idle.append(_Session(self._context(), self.store_url, self.session_tasks))

    def _said_done(self, task_id: str, claim_token: int) -> None:
        """Log how a session that exited 0 left its task (the queue row's status and reason); when
        another claim has replaced this worker's (its lease ran out and another worker took the task:
        the session stopped at the fencing token), say that, not the new claim's ``running``."""
        try:
            row = self._q().get(task_id)
        except OvernightError:
            return  # only a progress line: the store being away is logged where it matters
        if row is None:
            self._said_removed(task_id)
        elif row.claim_token != claim_token:
            LOG.warning("task %s: this worker's lease ran out and %s claimed it (fencing token %d, ours %d); "
                        "its session here stopped at the fence, committing nothing after it", task_id,
                        row.worker_id or "another worker", row.claim_token, claim_token)
        else:
            self.stats.parked += row.status == "failed"  # a step failed for good, or its code cannot be imported
            LOG.log(logging.WARNING if row.status == "failed" else logging.INFO, "task %s %s%s", task_id, row.status,
                    f": {row.reason}" if row.reason and row.status == "failed" else "")

    def _said_removed(self, task_id: str) -> None:
        """Log that a task this worker ran is gone from the store (``overnight rm --force`` while it
        ran): its session stopped at the lost lease, and there is no queue row left to update."""
        LOG.warning("task %s was removed from the store while it ran (`overnight rm`): its session stopped; "
                    "no queue row left, nothing more runs for it", task_id)

    def _store_retry(self, fn: Any) -> Any:
        """``fn(queue)``, retried with a backoff while the store is unreachable (not after a second
        signal: then the claim expires by itself)."""
        delay = 0.5
        while True:
            try:
                return fn(self._q())
            except ConfigError:
                raise
            except OvernightError as exc:
                if self._signals > 1:
                    return None
                LOG.warning("store unavailable (%s); retrying in %.1f s", exc, delay)
                self._drop_store()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _death(self, task: QueuedTask, reason: str) -> None:
        self.stats.deaths += 1
        delay = 0.5
        while True:
            try:
                q = self._q()
                q.expire_dead_lease(task.task_id)  # the child is gone: its task lease need not run out
                head = q.store.get_ref(task.task_id, "main")
                status = q.record_death(task, head, reason, base_s=self.backoff_s, max_deaths=self.max_deaths)
                if status == "failed":
                    self.stats.parked += 1
                    LOG.warning("task %s parked failed after %s", task.task_id, reason)
                elif status == "" and q.get(task.task_id) is None:  # the claim is lost: its row is gone
                    self._said_removed(task.task_id)
                elif status == "queued":
                    row = q.get(task.task_id)
                    LOG.warning("task %s: %s (death %s of %d in a row); queued again%s", task.task_id, reason,
                                row.deaths if row else "?", self.max_deaths,
                                f" in {human_duration(row.not_before_ms - q.clock_ms())}" if row else "")
                return
            except ConfigError:
                raise
            except OvernightError as exc:
                if self._signals > 1:
                    return  # abandoning: the claim expires by itself
                LOG.warning("store unavailable recording a death (%s); retrying", exc)
                self._drop_store()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _pause(self) -> None:
        """Wait ``poll_s``, or less: until a session exits when every slot is busy (its slot is
        claimed again at once instead of idling out the rest of the poll; ``overnight bench fleet``)."""
        if len(self._children) < self.concurrency:
            time.sleep(self.poll_s)
            return
        ready: list[Any] = []
        for child in self._children.values():
            if isinstance(child.proc, _Session):
                ready += child.proc.waitables()
                continue
            if child.exit_fd is None:
                try:
                    child.exit_fd = os.pidfd_open(child.proc.pid)
                except (AttributeError, OSError):  # no pidfd (not Linux 5.3+): poll
                    time.sleep(self.poll_s)
                    return
            ready.append(child.exit_fd)
        multiprocessing.connection.wait(ready, timeout=self.poll_s)

    # -- the loop ----------------------------------------------------------------------------------
    def _beat(self, state: str = "running") -> None:
        row = WorkerRow(self.worker_id, socket.gethostname(), os.getpid(), self._started_ms, 0, self.queues,
                        self.concurrency, len(self._children), state)
        self._q().worker_beat(row)  # sets the heartbeat (and a start of 0) by the store's clock
        self._started_ms = row.started_ms

    def _parked(self, error: QueueRowInvalid) -> None:
        """A claim parked a queue row that does not decode (edited outside overnight) and went on."""
        self.stats.parked += 1
        LOG.warning("%s: parked failed (%s)", error.message, error.hint)

    def _claim(self) -> QueuedTask | None:
        t0 = time.perf_counter()
        task = self._q().claim(self.worker_id, self.queues, self.lease_ms, on_parked=self._parked)
        if task is None:
            return None
        self.stats.claim_ms.append((time.perf_counter() - t0) * 1000)
        self.stats.claimed += 1
        if task.taken_over:  # its previous holder died or stalled: that is a death of the task
            LOG.warning("task %s: its holder %s stopped heartbeating; taking it over", task.task_id,
                        task.previous_worker or "?")
            self.stats.takeovers += 1
            head = self._q().store.get_ref(task.task_id, "main")
            if self._q().record_death(task, head, f"holder {task.previous_worker or '?'} stopped heartbeating",
                                      base_s=0.0, max_deaths=self.max_deaths) == "failed":
                self.stats.parked += 1
                return None
            self._again = True  # queued again without delay (base 0): claim it (or another) at once
            return None
        LOG.info("claimed task %s", task.task_id)
        return task

    def _id_free(self) -> None:
        """Register this worker's row, refusing a ``worker_id`` that a live worker uses
        (``overnight workers`` would show one row for two workers, and each would overwrite the
        other's). Live: not ``stopped``, a heartbeat within the lease, and on this host a process
        that still runs. Atomic (:meth:`~overnight.store.queue_sql.SqlQueue.register_worker`): of
        two workers started at once with one id, one is refused.

        Raises:
            ConfigError: the id is in use (the message names its host and pid).
        """
        here = socket.gethostname()

        def live(w: WorkerRow, now: int) -> bool:
            if w.state == "stopped" or now - w.heartbeat_ms > self.lease_ms or (w.host, w.pid) == (here, os.getpid()):
                return False
            if w.host == here:
                try:
                    os.kill(w.pid, 0)
                except ProcessLookupError:
                    return False  # that worker died on this host
                except PermissionError:
                    pass
            return True

        try:
            q = self._q()
            row = WorkerRow(self.worker_id, here, os.getpid(), self._started_ms, 0, self.queues, self.concurrency, 0,
                            "running")
            held = q.register_worker(row, live)
            self._started_ms = row.started_ms  # by the store's clock once registered (else still 0)
            now = q.clock_ms()
        except ConfigError:
            raise  # a store without a queue, a bad URL: before anything starts or is logged
        except OvernightError:
            return  # the store is away: the loop retries it; the check is a courtesy
        if held is not None:
            raise ConfigError(f"worker id {self.worker_id!r} is in use by pid {held.pid} on {held.host} (heartbeat "
                              f"{max(0, now - held.heartbeat_ms) / 1000:.0f} s ago)",
                              hint="give each worker its own --worker-id (the default, HOST-PID, is unique)")

    def run(self) -> int:
        """Run until stopped, ``max_tasks`` or ``idle_exit_s``. Returns the exit status (0).

        Raises:
            ConfigError: ``worker_id`` is used by a live worker (:meth:`_id_free`)."""
        self._id_free()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._top_up()  # before the first claim
        LOG.info("worker %s: claiming from queue %s on %s (lease %.0f s, %d task(s) at once)", self.worker_id,
                 ", ".join(self.queues), _without_password(self.store_url), self.lease_ms / 1000,
                 self.concurrency)
        idle_since = time.monotonic()
        next_beat = 0.0
        delay = 0.5
        try:
            while True:
                held = len(self._children)
                self._reap()
                if len(self._children) != held:
                    next_beat = 0.0  # `overnight workers` shows the tasks held as they change
                if self.stopping and not self._children:
                    break
                done = self.max_tasks is not None and self.stats.claimed - self.stats.takeovers >= self.max_tasks
                if done and not self._children:
                    break
                if not self.stopping and not done:
                    self._top_up()
                try:
                    if time.monotonic() >= next_beat:
                        self._beat("stopping" if self.stopping else "running")
                        next_beat = time.monotonic() + self.lease_ms / 3000
                    claimed = None
                    if not self.stopping and not done and len(self._children) < self.concurrency:
                        claimed = self._claim()
                        if claimed is not None and self.stopping:  # the signal came during the claim
                            self._q().release(claimed.task_id, claimed.claim_token)
                        elif claimed is not None:
                            self._spawn(claimed)
                            next_beat = 0.0
                            if self.stopping:  # ... or while the session started: pass it on
                                self._forward(self._children[claimed.task_id])
                    delay = 0.5
                except ConfigError:
                    raise
                except OvernightError as exc:
                    LOG.warning("store unavailable (%s); retrying in %.1f s", exc, delay)
                    self._drop_store()
                    time.sleep(delay)
                    delay = min(delay * 2, 10.0)
                    continue
                if self._children or claimed is not None:
                    idle_since = time.monotonic()
                elif self.idle_exit_s is not None and time.monotonic() - idle_since >= self.idle_exit_s:
                    waiting = self._coming()
                    if waiting is None:
                        LOG.info("nothing to run for %.0f s (--idle-exit): exiting%s", self.idle_exit_s,
                                 self._later())
                        break
                    if not self._said_waiting:
                        LOG.info("--idle-exit waits: %s", waiting)
                        self._said_waiting = True
                if claimed is None and not self._again:
                    self._pause()
                self._again = False
        finally:
            for child in self._children.values():  # only on an error in the loop itself
                child.proc.kill()
            for session in self._idle:
                session.close()
            self._idle.clear()
            try:
                self._beat("stopped")
            except OvernightError:
                pass
            LOG.info("worker %s stopped (%d task(s) claimed%s, %d session death(s), %d parked)", self.worker_id,
                     self.stats.claimed - self.stats.takeovers,  # a takeover queues the task again, then claims it
                     f", {self.stats.takeovers} taken over from a dead holder" if self.stats.takeovers else "",
                     self.stats.deaths, self.stats.parked)
            self._drop_store()
            stats_path = os.environ.get("OVERNIGHT_WORKER_STATS")  # `overnight bench fleet` reads these
            if stats_path:
                import json

                with open(stats_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"worker_id": self.worker_id, **self.stats.__dict__}) + "\n")
            for sig, handler in old.items():  # last: a signal during the clean-up is the worker's own
                signal.signal(sig, handler)
        return 0


__all__ = ["Worker", "WorkerStats"]
