"""One claimed task, run in its own process: ``python -m overnight.fleet.child STORE TASK TOKEN TTL_MS WORKER_PID``.

The worker starts this for every claim, so a task that crashes, leaks or is killed never takes
the worker down. The child dies with its worker (``PR_SET_PDEATHSIG``: a worker that is killed
takes its sessions with it, as a machine that goes away would), heartbeats the claim every third
of the TTL (the runner heartbeats the task lease), and writes the task's next status itself,
fenced by the claim token:

* the run completes -> ``complete``; a step fails after its retries (or drift aborts) -> ``failed``;
* ``overnight cancel`` -> the runner stops at the next step boundary -> ``cancelled``;
* SIGTERM from the worker (graceful stop) -> the step in flight commits -> ``queued`` again;
* the code cannot be imported -> ``failed (cannot import ...)``;
* the claim or the task lease was taken over -> nothing (the taker owns the task now).

Exit status 0 when the status was written (or the claim was lost); anything else -- a kill, a
crash, a store that went away -- is a *death*, which the worker counts
(:meth:`~overnight.store.queue_sql.SqlQueue.record_death`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import traceback
from typing import Any

EXIT_STORE_GONE = 75
EXIT_STOPPED = 76
"""A session's exit status when the worker stopped it before its runner started (a SIGTERM while
it imported the code): the task is queued again, and the death is not counted against it."""


_SAID = {"step_retry": "retrying {step}: {detail}", "drift": "drift: {detail}", "plan": "plan changed: {detail}",
         "stop_requested": "{detail}"}
"""Run events a session writes to the worker's log (stderr), as ``overnight run`` shows them."""


def _say(task_id: str, text: str) -> None:
    """``task TASK_ID: TEXT`` on stderr (the worker's), each line of ``text`` prefixed."""
    import time

    now = time.strftime("%H:%M:%S")
    sys.stderr.write("".join(f"{now} task {task_id}: {line}\n" for line in text.splitlines() or [""]))
    sys.stderr.flush()


def _log_steps(task_id: str) -> None:
    """``ctx.log`` of the task's steps (INFO and up) into the worker's log as ``overnight run``
    shows them, named by task: a session starts with no logging set up (the fork server is a new
    interpreter), so without this only warnings would reach stderr, unlabelled."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s task {task_id}: %(step)s: %(message)s", "%H:%M:%S",
                                           defaults={"step": "-"}))
    log = logging.getLogger("overnight.task")
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


def forked(argv: list[str]) -> None:
    """Entry point in a process forked by the worker's fork server (modules already imported):
    a session of its own (a Ctrl-C in the terminal reaches only the worker), then :func:`main`."""
    os.setsid()
    _run_and_exit(argv)


def _run_and_exit(argv: list[str]) -> None:
    """:func:`main`, then exit the process with its status (1 and the traceback on stderr for a
    crash: a death the worker counts)."""
    _stop_before_start()
    try:
        code = main(argv)
    except Exception:  # noqa: BLE001 - a crash is a death the worker counts; say why on stderr
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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


def main(argv: list[str]) -> int:
    store_url, task_id, token, ttl_ms, worker_pid = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    _die_with_parent(worker_pid)
    _log_steps(task_id)
    from overnight.errors import (LeaseLost, OvernightError, StaleHead, StepFailed, StoreBusy, StoreError,
                                  TaskBusy)
    from overnight.runtime.runner import Runner
    from overnight.store.leases import now_ms
    from overnight.store.queue import ClaimLost
    from overnight.store.queue_open import queue_for

    try:
        qstore = _open(store_url)
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
            q.release(task_id, token, not_before_ms=now_ms() + ttl_ms)
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
        return finish("complete")
    if cancelled.is_set():
        return finish("cancelled")
    try:  # interrupted (graceful stop) or stopped: queued again
        q.release(task_id, token)
    except StoreError:
        return EXIT_STORE_GONE
    return 0


if __name__ == "__main__":
    _run_and_exit(sys.argv[1:])
