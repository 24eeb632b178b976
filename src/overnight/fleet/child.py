"""One claimed task, run in its own process: ``python -m overnight.fleet.child STORE TASK TOKEN TTL_MS WORKER_PID``.

The worker starts this for every claim, so a task that crashes, leaks or is killed never takes
the worker down. The child dies with its worker (``PR_SET_PDEATHSIG``: a worker that is killed
takes its sessions with it, as a machine that goes away would), heartbeats the claim every third
of the TTL (the runner heartbeats the task lease), and writes the task's next status itself,
fenced by the claim token:

* the run completes -> ``complete`` (reason ``already complete when claimed: nothing to run`` when
  its verified head had nothing left to do); a step fails after its retries (or drift aborts) -> ``failed``;
* ``overnight cancel`` -> the runner stops at the next step boundary -> ``cancelled``;
* SIGTERM from the worker (graceful stop) -> the step in flight commits -> ``queued`` again;
* the code cannot be imported -> ``failed (cannot import ...)``;
* the claim or the task lease was taken over -> nothing (the taker owns the task now).

Exit status 0 when the status was written (or the claim was lost); anything else -- a kill, a
crash, a store that went away -- is a *death*, which the worker counts
(:meth:`~overnight.store.queue_sql.SqlQueue.record_death`).

A worker with a fork server (the default) keeps its session processes and hands each one task
after another (:func:`serve`, as a Celery prefork pool does): the store's connection, PostgreSQL's
server-side plans and the task's imported code then serve the next task too, instead of a process
start, a new connection and an import per task. A session still runs one task at a time, so a
task that crashes or is killed takes only its own session down. Between two tasks the session puts
back what the task may have changed in the process (:class:`_World`) and drops the project's
modules, so the next task imports its code anew (:class:`_TaskModules`); it retires
(:data:`EXIT_RETIRED`) instead of running another task once an installed module it imported has
changed on disk. A reused session never runs code older than what a fresh process would import.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

EXIT_STORE_GONE = 75
EXIT_STOPPED = 76
"""A session's exit status when the worker stopped it before its runner started (a SIGTERM while
it imported the code): the task is queued again, and the death is not counted against it."""
EXIT_RETIRED = 77
"""A reused session's exit status when it was handed a task but will not run it: the file of an
installed module it imported earlier changed on disk (an upgrade). It exits before acknowledging
the task; the worker hands the same claim to a fresh session (not a death)."""


_SAID = {"step_retry": "retrying {step}: {detail}", "drift": "drift: {detail}", "plan": "plan changed: {detail}",
         "stop_requested": "the worker's stop reached this session ({detail})"}
"""Run events a session writes to the worker's log (stderr), as ``overnight run`` shows them. A stop
is the worker's (its Ctrl-C or SIGTERM, passed on to each session as SIGTERM): said so, so a
Ctrl-C on the worker does not read as an unexplained SIGTERM."""


def _say(task_id: str, text: str) -> None:
    """``task TASK_ID: TEXT`` on stderr (the worker's), each line of ``text`` prefixed."""
    now = time.strftime("%H:%M:%S")
    sys.stderr.write("".join(f"{now} task {task_id}: {line}\n" for line in text.splitlines() or [""]))
    sys.stderr.flush()


def _log_steps(task_id: str) -> None:
    """``ctx.log`` of the task's steps (INFO and up) into the worker's log as ``overnight run``
    shows them, named by task: a session starts with no logging set up (the fork server is a new
    interpreter), so without this only warnings would reach stderr, unlabelled. A reused session
    drops the handler after the task (:meth:`_World.restore`)."""
    import logging

    log = logging.getLogger("overnight.task")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s task {task_id}: %(step)s: %(message)s", "%H:%M:%S",
                                           defaults={"step": "-"}))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _die_with_parent(worker_pid: int) -> None:
    """SIGKILL this process when its parent (the worker, or the worker's fork server, which exits
    with the worker) dies; exit now if the worker is already gone."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        os.kill(worker_pid, 0)
    except ProcessLookupError:
        os._exit(EXIT_STORE_GONE)  # the worker died before we got here
    if os.getppid() != parent:
        os._exit(EXIT_STORE_GONE)


def _stop_before_start() -> None:
    """Until the runner installs its own handlers (a graceful first signal, an abandoning second),
    SIGTERM/SIGINT end the session with :data:`EXIT_STOPPED`: nothing of it is committed yet, and
    a stop is not a death of the task."""
    def stopped(signum: int, frame: Any) -> None:
        os._exit(EXIT_STOPPED)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)


class _TaskModules:
    """The modules a session imported after it started (the tasks' code and what it imports).

    After every task, the project's own modules among them are dropped from ``sys.modules``, so
    the next task imports its code anew, as a fresh process would: a file edited while a task ran,
    two task files of the same name in different folders, a module whose top level sets
    environment variables (``load_dotenv()``) all behave as with a process per task. Project code:
    a ``.py`` file under the project root, not overnight's, found through the project root itself
    or a folder the task's loading added to ``sys.path`` -- not through a ``sys.path`` entry the
    session started with that lies inside the project (``vendor/``, ``src/`` of an editable
    install, ``.venv``): those are installed code, whose C extensions cannot be imported twice.

    The files of installed modules are recorded with their ``(mtime_ns, size)``; one that changes
    on disk (an upgrade, an edit of an editable install) makes :meth:`changed` name it, and the
    session retires. A file modified while the task that first imported it ran counts as changed."""

    def __init__(self) -> None:
        from overnight.runtime.task_code import project_root

        self._before = set(sys.modules)
        self._root = os.path.realpath(str(project_root()))
        self._installed = {os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
        self._installed |= {real for real in (os.path.realpath(p or ".") for p in sys.path if isinstance(p, str))
                            if real.startswith(self._root + os.sep)}  # vendored or src/ folders on the path
        self._seen: dict[str, tuple[int, int] | None] = {}
        self._task_start_ns = time.time_ns()

    @staticmethod
    def _stat(path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _project_code(self, name: str, path: Any) -> bool:
        if not isinstance(path, str) or not path.endswith((".py", ".pyc")) or name.split(".")[0] == "overnight":
            return False
        real = os.path.realpath(path)
        parts = real.split(os.sep)
        return (real.startswith(self._root + os.sep) and "site-packages" not in parts and "dist-packages" not in parts
                and not any(real.startswith(p + os.sep) for p in self._installed))

    def task_starts(self) -> None:
        """Mark when the next task starts (files of installed modules modified after it are changed)."""
        self._task_start_ns = time.time_ns()

    def forget(self) -> None:
        """Drop the project's modules imported since the session started, and their classes'
        registrations; record the others' files."""
        import importlib

        from overnight.codec.registry import forget_modules

        dropped = set()
        for name, module in list(sys.modules.items()):
            if name in self._before:
                continue
            path = getattr(module, "__file__", None)
            if self._project_code(name, path):
                del sys.modules[name]
                dropped.add(name)
            elif isinstance(path, str) and path not in self._seen:
                stat = self._stat(path)
                # modified while this task ran: maybe after it was imported -- treat it as changed
                self._seen[path] = None if stat is not None and stat[0] >= self._task_start_ns else stat
        forget_modules(dropped)  # the next task registers its own
        importlib.invalidate_caches()

    def changed(self) -> str | None:
        """The first recorded file that changed (or went away) since it was recorded, else None."""
        for path, stat in self._seen.items():
            if stat is None or self._stat(path) != stat:
                return path
        return None


def _catchable() -> list[signal.Signals]:
    return [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


class _World:
    """What a task may change in its session's process, as the session started: environment
    variables (and the time zone read from ``TZ``), current directory, ``sys.path``, umask, signal
    handlers (and no pending alarm or interval timer), warnings filters, the ``decimal`` context,
    the garbage collector's switch and thresholds, the recursion limit, ``logging.disable`` and
    the handlers of the loggers that existed (loggers made since lose theirs -- the project's code,
    imported anew, adds them again -- except ``NullHandler``s). :meth:`restore` puts it back after
    a task. Threads a task started, and other globals of installed modules, are not put back."""

    def __init__(self) -> None:
        import decimal
        import gc
        import logging
        import warnings

        self.env, self.cwd, self.path = dict(os.environ), os.getcwd(), list(sys.path)
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.handlers = {s: signal.getsignal(s) for s in _catchable()}
        self.warnings = list(warnings.filters)
        self.decimal = decimal.getcontext().copy()
        self.gc = (gc.isenabled(), gc.get_threshold())
        self.recursion = sys.getrecursionlimit()
        self.log_disable = logging.root.manager.disable
        self.loggers = {name: list(lg.handlers) for name, lg in logging.root.manager.loggerDict.items()
                        if isinstance(lg, logging.Logger)}
        self.root = (list(logging.root.handlers), logging.root.level)

    def restore(self) -> bool:
        """Put it back. False when the session cannot go on: its directory is gone."""
        import decimal
        import gc
        import logging
        import warnings

        signal.alarm(0)
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            signal.setitimer(timer, 0)
        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                try:
                    signal.signal(sig, handler)
                except (OSError, ValueError, TypeError):
                    pass
        os.umask(self.umask)
        if os.environ != self.env:
            tz = os.environ.get("TZ")
            os.environ.clear()
            os.environ.update(self.env)
            if tz != self.env.get("TZ"):
                time.tzset()
        sys.path[:] = self.path
        warnings.filters[:] = self.warnings
        warnings._filters_mutated()  # type: ignore[attr-defined]  # the module's own cache of them
        decimal.setcontext(self.decimal.copy())
        (gc.enable if self.gc[0] else gc.disable)()
        gc.set_threshold(*self.gc[1])
        sys.setrecursionlimit(self.recursion)
        logging.disable(self.log_disable)
        for name, lg in list(logging.root.manager.loggerDict.items()):
            if not isinstance(lg, logging.Logger):
                continue
            kept = self.loggers.get(name)
            if kept is None:  # made since the session started: the code that adds its handlers runs again
                kept = [h for h in lg.handlers if isinstance(h, logging.NullHandler)]
            for h in lg.handlers:
                if h not in kept:
                    h.close()
            lg.handlers[:] = kept
        for h in logging.root.handlers:
            if h not in self.root[0]:
                h.close()
        logging.root.handlers[:] = self.root[0]
        logging.root.setLevel(self.root[1])
        try:
            if os.getcwd() == self.cwd:
                return True
        except OSError:  # the task removed its current directory
            pass
        try:
            os.chdir(self.cwd)
        except OSError:
            return False
        return True


def serve(conn: Any, store_url: str, worker_pid: int, session_tasks: int) -> None:
    """Entry point of a reusable session forked by the worker's fork server: run the tasks the
    worker sends over ``conn`` one after another, at most ``session_tasks``, then exit 0.

    Protocol (a :func:`multiprocessing.Pipe`): the worker sends an ``argv`` list for :func:`main`
    (without the store and worker pid) or None (exit); the session answers ``"run"`` when it takes
    the task, then ``(0, more)`` when the task ended with status 0 (``more``: it waits for another)
    -- any other outcome ends the process with that status, which the worker reads as it reads a
    one-task session's. A closed pipe (the worker died) ends it too. Between two tasks it puts
    back its :class:`_World` and drops the project's modules (:class:`_TaskModules`).
    """
    os.setsid()  # its own session: a Ctrl-C in the terminal reaches only the worker
    _die_with_parent(worker_pid)
    _stop_before_start()
    world = _World()
    modules = _TaskModules()
    from overnight.errors import StoreError

    try:  # connected before the first task arrives: a claimed task starts at once
        store = _open(store_url)
    except StoreError:
        store = None  # tried again when a task comes
    for n in range(session_tasks):
        try:
            argv = conn.recv()
        except (EOFError, OSError):
            argv = None
        if argv is None:
            _exit(0)
        changed = modules.changed()
        if changed is not None:  # before the acknowledgement: the worker gives the claim to a fresh session
            _say(argv[0], f"{changed} changed since this session (pid {os.getpid()}) imported it; a fresh "
                 "session runs the task")
            _exit(EXIT_RETIRED)
        conn.send("run")
        modules.task_starts()
        try:
            if store is None:
                try:
                    store = _open(store_url)
                except StoreError:
                    _exit(EXIT_STORE_GONE)
            code = main([store_url, *argv, str(worker_pid)], store=store)
        except BaseException:  # noqa: BLE001 - a crash (SystemExit in a step too) is a death the worker counts
            traceback.print_exc()
            code = 1
        if code != 0:
            _exit(code)
        modules.forget()
        more = world.restore() and n + 1 < session_tasks
        try:
            conn.send((0, more))
        except OSError:
            _exit(0)
    _exit(0)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_and_exit(argv: list[str]) -> None:
    """:func:`main`, then exit the process with its status (1 and the traceback on stderr for a
    crash: a death the worker counts)."""
    _stop_before_start()
    try:
        _die_with_parent(int(argv[4]))
        code = main(argv)
    except Exception:  # noqa: BLE001 - a crash is a death the worker counts; say why on stderr
        traceback.print_exc()
        code = 1
    _exit(code)


def _verified_spec(store, task_id: str) -> tuple[dict | None, str | None]:  # type: ignore[no-untyped-def]
    """``(spec of the verified head, None)`` for a task that has checkpoints, ``(None, None)`` for a
    new one, ``(None, why)`` when its head cannot be verified."""
    from overnight.chain.integrity import signing_key_from_env
    from overnight.chain.read import load_head
    from overnight.errors import NotFound, OvernightError

    try:
        if store.get_ref(task_id, "main") is None:
            return None, None  # a new task: its first checkpoint records the row's entry and params
        loaded, _ = load_head(store, task_id, "main", key=signing_key_from_env(), deep=False)
    except NotFound:
        return None, None
    except OvernightError as exc:
        return None, f"cannot verify its head to check its code location and params: {exc.message}"
    spec = loaded.state_tree["task"]["spec"]
    return (spec if isinstance(spec, dict) else {}), None


def _load(entry: str, task_id: str, params: dict, spec: dict | None):  # type: ignore[no-untyped-def]
    """The task a claim runs. A task with checkpoints runs the code and params its verified head's
    spec records: the queue row (covered by no digest) must name the same location
    (``EntryMismatch`` otherwise, before anything is imported) and the same params; a new task
    runs the row's entry, which must lie in the project (``CodeLocationRefused``) and name a
    task or a task factory."""
    from overnight.codec.canonical import to_tree
    from overnight.errors import ConfigError
    from overnight.runtime.task_code import load_stored_task

    if spec is None:
        task = load_stored_task(task_id, recorded=entry, verified=None, spec={"params": to_tree(params, "task params")})
    else:
        recorded = spec.get("params", {})
        if recorded != (to_tree(params, "task params") if params else {}):
            raise ConfigError("the queue row's params differ from those its verified checkpoints record; not "
                              "running it with unverified params", task_id=task_id)
        verified = spec.get("entry") if isinstance(spec.get("entry"), str) else None
        task = load_stored_task(task_id, recorded=entry, verified=verified, spec=spec)
    if task is None:
        raise ConfigError("no code location recorded", task_id=task_id)
    return task


def _open(store_url: str):  # type: ignore[no-untyped-def]
    """The worker's store; on PostgreSQL without the catalog check of its tables, which the worker
    made when it opened the same schema (the schema version is still checked)."""
    from overnight.store import open_store

    if store_url.split("://", 1)[0].lower() in ("postgresql", "postgres"):
        from overnight.store.postgres import PostgresStore

        return PostgresStore(store_url, check_shape=False)
    return open_store(store_url)


def main(argv: list[str], store: Any = None) -> int:
    """Run one claimed task: ``argv`` is ``[STORE_URL, TASK_ID, CLAIM_TOKEN, TTL_MS, WORKER_PID]``;
    ``store``: that store already open (a reused session's), else it is opened here. Returns the
    process's exit status (see the module docstring)."""
    store_url, task_id, token, ttl_ms = argv[0], argv[1], int(argv[2]), int(argv[3])
    _log_steps(task_id)
    from overnight.errors import (LeaseLost, OvernightError, StaleHead, StepFailed, StoreBusy, StoreError,
                                  TaskBusy)
    from overnight.runtime.runner import Runner
    from overnight.store.queue import ALREADY_COMPLETE, ClaimLost
    from overnight.store.queue_open import queue_for

    try:
        qstore = store if store is not None else _open(store_url)
        q = queue_for(qstore)
        row = q.get(task_id)
    except StoreError:
        return EXIT_STORE_GONE
    if row is None or row.claim_token != token or row.status != "running":
        return 0  # taken over before we started
    try:
        q.heartbeat(task_id, token, ttl_ms, pid=os.getpid())
    except ClaimLost:
        return 0

    cancelled, lost, stop = threading.Event(), threading.Event(), threading.Event()
    box: dict[str, Any] = {}  # the runner, once built: the heartbeat asks it to stop

    def ask_stop() -> None:
        runner = box.get("runner")
        if runner is not None:
            runner.stop_requested = True

    def beat() -> None:  # from before the code is imported: a slow import keeps the claim alive
        while not stop.wait(ttl_ms / 3000):
            try:
                if q.heartbeat(task_id, token, ttl_ms):
                    cancelled.set()
                    ask_stop()
            except ClaimLost:
                lost.set()
                ask_stop()
                return
            except (StoreError, StoreBusy):
                continue  # the store is away: the claim expires by itself if it stays away

    hb = threading.Thread(target=beat, name="overnight-claim", daemon=True)
    hb.start()

    def on_cancel() -> None:
        cancelled.set()
        ask_stop()

    # PostgreSQL pushes `overnight cancel` (LISTEN/NOTIFY, set up on a thread): once it is alive,
    # no query after every step
    watch = q.watch_cancel(task_id, on_cancel)

    def finish(status: str, reason: str | None = None) -> int:
        stop.set()
        if watch is not None:
            watch.close()
        try:
            q.finish(task_id, token, status, reason)
            return 0
        except StoreError:
            return EXIT_STORE_GONE

    spec, unverifiable = _verified_spec(qstore, task_id)
    if unverifiable is not None:
        return finish("failed", unverifiable)
    try:
        task = _load(row.entry, task_id, row.params, spec)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the task's, not the worker's
        why = exc.message if isinstance(exc, OvernightError) else f"{type(exc).__name__}: {exc}"
        return finish("failed", f"cannot import {row.entry} in {os.getcwd()}: {why} (run the worker in the project "
                      f"directory the task was submitted from, then `overnight retry {task_id}`)")

    def at_step_end(ev: Any) -> None:  # `overnight cancel` takes effect at the next step boundary
        if ev.kind in _SAID:  # into the worker's log, named by task: sessions of one worker share it
            _say(task_id, _SAID[ev.kind].format(step=ev.step, detail=getattr(ev, "detail", None) or ""))
        if ev.kind == "step_end" and not cancelled.is_set() and not (watch is not None and watch.alive):
            try:
                if q.cancel_requested(task_id, token):
                    cancelled.set()
                    ask_stop()
            except (StoreError, StoreBusy):
                pass  # the heartbeat asks again

    runner = box["runner"] = Runner(task, qstore, lease_ttl_ms=ttl_ms, handle_signals=True,
                                    on_event=at_step_end)
    if cancelled.is_set() or lost.is_set():
        runner.stop_requested = True
    try:
        result = runner.run()
    except (LeaseLost, StaleHead, ClaimLost):
        return 0  # another worker took the task over: it owns the status now
    except TaskBusy:
        stop.set()
        try:
            # a lease later by the clock claims are judged by (PostgreSQL: the server's), not this machine's
            q.release(task_id, token, not_before_ms=q.clock_ms() + ttl_ms)
        except StoreError:
            return EXIT_STORE_GONE
        return 0
    except StepFailed as exc:
        stop.set()
        cause = exc.__cause__ or exc
        _say(task_id, "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)).rstrip())
        return finish("failed", exc.message)
    except StoreError:
        return EXIT_STORE_GONE  # nothing half-done is committed; the worker retries later
    except OvernightError as exc:
        stop.set()
        return finish("failed", f"{type(exc).__name__}: {exc.message}")
    finally:
        stop.set()
        if watch is not None:
            watch.close()
    if lost.is_set():
        return 0
    if result.status == "complete":
        # nothing was left to do (a run outside the queue completed it since it was submitted): said so
        idle = not result.created and result.steps_run == 0 and result.steps_reused == 0
        return finish("complete", ALREADY_COMPLETE if idle else None)
    if cancelled.is_set():
        return finish("cancelled")
    try:  # interrupted (graceful stop) or stopped: queued again
        q.release(task_id, token)
    except StoreError:
        return EXIT_STORE_GONE
    return 0


if __name__ == "__main__":
    _run_and_exit(sys.argv[1:])
