"""``overnight submit / worker / workers / retry / cancel``: the queue and its workers.

Registered on the main app by :func:`register` (one line in :mod:`overnight.cli.app`).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Optional

import typer

from overnight.cli import render
from overnight.errors import ConfigError, OvernightError
from overnight.units import human_duration

StoreOpt = typer.Option(None, "--store", "-s", envvar="OVERNIGHT_STORE",
                        help="Store holding the queue: sqlite://PATH (workers on this machine) or "
                        "postgresql://HOST/DB?schema=NAME (workers on many). Default: sqlite://.overnight/overnight.db.")


def _store(url: Optional[str]) -> str:
    from overnight.store import default_store_url

    return url or default_store_url()


def _fail(exc: OvernightError) -> None:
    from overnight.cli.common import fail as fail

    fail(exc)


TaskIdOpt = typer.Option(None, "--id", metavar="ID", help="Task id (default: the definition's id, plus a short digest of the params "
                         "when there are any).")
ParamsOpt = typer.Option(None, "--params", metavar="JSON", help="Parameters as a JSON object (ctx.params in every step; "
                         "part of the task's fingerprint).")
ParamOpt = typer.Option([], "--param", metavar="K=V", help="One parameter (VALUE as JSON, else a string); repeatable.")


_JSON_NUMBER = re.compile(r"\s*-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?\s*")
"""A JSON number (RFC 8259): a ``--param`` value that is one is never taken as a string."""


def _not_json(name: str) -> None:
    """``json.loads``' ``parse_constant``: ``NaN``, ``Infinity`` and ``-Infinity``, which Python
    reads but JSON does not have, are not JSON here either."""
    raise ConfigError(f"{name} is not JSON")  # a ValueError: json.loads passes it on


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object whose keys are all different: ``{"n": 2, "n": 3}`` would silently keep 3."""
    out = dict(pairs)
    if len(out) != len(pairs):
        repeated = sorted({k for k, _ in pairs if sum(1 for x, _ in pairs if x == k) > 1})
        raise ConfigError(f"repeated key {', '.join(map(repr, repeated))}")  # a ValueError: reported as not JSON
    return out


def parse_params(params: Optional[str], param: list[str]) -> dict:
    """The parameters of ``--params JSON`` and each ``--param K=V`` (V as JSON, else a string;
    later ones win), as one JSON object.

    Raises:
        ConfigError: ``--params`` is not a JSON object, or a ``--param`` is not ``K=V``.
    """
    out: dict = {}
    if params:
        try:
            out = json.loads(params, parse_constant=_not_json, object_pairs_hook=_no_repeated_keys)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"--params is not JSON: {exc}", hint="--params '{\"n\": 3}'") from exc
        if not isinstance(out, dict):
            raise ConfigError("--params must be a JSON object", hint="--params '{\"n\": 3}'")
    for kv in param:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise ConfigError(f"--param {kv!r} is not KEY=VALUE", hint="--param topic=storage, --param n=3")
        try:
            out[key] = json.loads(value, parse_constant=_not_json)  # NaN, Infinity: not JSON, so strings
        except RecursionError as exc:
            raise ConfigError(f"--param {key}: nests too deeply") from exc
        except ValueError as exc:
            if _JSON_NUMBER.fullmatch(value):  # a number Python will not read (5,000 digits): not a string
                raise ConfigError(f"--param {key}: {exc}", hint=f"pass it as a string: --param '{key}=\"...\"'") from exc
            out[key] = value  # a bare word is a string
    return out


def submit(
    entry: str = typer.Argument(..., metavar="FILE.py[:TASK] | MODULE:ATTR",
                                help="The task definition: a file inside the project, or a module."),
    store: Optional[str] = StoreOpt,
    task_id: Optional[str] = TaskIdOpt,
    params: Optional[str] = ParamsOpt,
    param: list[str] = ParamOpt,
    queue: str = typer.Option("default", "--queue", help="Queue name (workers choose theirs with --queue)."),
    priority: int = typer.Option(0, "--priority", help="Higher runs first; equal priorities in submission order."),
    not_before: Optional[str] = typer.Option(None, "--not-before", metavar="TIME",
                                             help="Not before: ISO 8601 (UTC unless it has an offset), +45s / +30m / +2h "
                                             "(from now by the store's clock; the unit is required), or Unix "
                                             "seconds."),
    idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key", metavar="KEY",
                                                  help="A second submit of the same request (task id, code, params, queue, "
                                                  "priority) with the same key returns the first task; another "
                                                  "request under that key is refused (exit 2)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the task id, one line (also when it was "
                               "submitted already), for scripts: id=$(overnight submit -q FILE.py). --json wins."),
) -> None:
    """Queue a task for the workers (`overnight worker`). The definition is imported once here to
    check it (exit 2 if it is not a task); workers import it from the same place in their own
    checkout: a file relative to the project root, or MODULE:ATTR.

    Example: overnight submit examples/report.py --param topic=storage --priority 5"""
    from overnight import api
    from overnight.cli.common import check_python_entry, noting_store_further_up

    try:
        with noting_store_further_up(store):
            check_python_entry(entry, "submit")
            row, created = api.submit(entry, store=store, task_id=task_id, params=parse_params(params, param),
                                      queue=queue, priority=priority, not_before=not_before,
                                      idempotency_key=idempotency_key)
    except OvernightError as exc:
        _fail(exc)
    if as_json:
        render.print_json({**row.to_dict(), "created": created})
        return
    if quiet:  # as given to `overnight status` / `cancel`: the id itself, no markup, no wrapping
        import sys

        sys.stdout.write(f"{row.task_id}\n")
        return
    if not created and row.status == "complete":
        render.out.print(f"{render.esc(row.task_id, one_line=True)}: already complete, nothing to queue")
        return
    what = "queued" if created else f"already submitted ({row.status})"
    ahead = row.not_before_ms - api.clock_ms(store=store) if row.status == "queued" and row.not_before_ms else 0
    render.out.print(f"{render.esc(row.task_id)} {what}: queue {render.esc(row.queue)}, priority {row.priority}, "
                     f"code {render.esc(row.entry)}" + (f"; starts in {human_duration(ahead)}" if ahead > 1000 else ""))


def worker(
    store: Optional[str] = StoreOpt,
    queue: list[str] = typer.Option(["default"], "--queue", metavar="NAME", help="Queue to claim from; repeatable."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="Tasks run at once (one child process each)."),
    max_tasks: Optional[int] = typer.Option(None, "--max-tasks", min=1, help="Exit 0 after claiming N tasks and "
                                            "finishing them."),
    idle_exit: Optional[float] = typer.Option(None, "--idle-exit", metavar="SECONDS",
                                              help="Exit 0 after this long with nothing to run -- and nothing "
                                              "coming: it waits for a retry due within a lease and for a "
                                              "killed worker's claim to run out, then runs that task; a task due later it names as it exits."),
    worker_id: Optional[str] = typer.Option(None, "--worker-id", metavar="ID", help="Name in `overnight workers` "
                                            "(default HOST-PID)."),
    lease: float = typer.Option(30.0, "--lease", metavar="SECONDS", help="Lease of a claimed task; renewed every "
                                "third of it. Another worker takes a task over when its lease expires."),
    max_deaths: int = typer.Option(3, "--max-deaths", min=1, help="Park a task `failed` after N sessions died in "
                                   "a row without a new checkpoint."),
    backoff: float = typer.Option(2.0, "--backoff", metavar="SECONDS", help="First retry delay after a session "
                                  "died; doubles per death."),
    session_tasks: int = typer.Option(100, "--session-tasks", min=1, metavar="N", help="Tasks a session process "
                                      "runs one after another (keeping its store connection) before a fresh one "
                                      "replaces it; 1: a fresh process for every task."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Log only problems (a task failed or parked, the store "
                               "unreachable), not each claim and each task's end."),
) -> None:
    """Run queued tasks, one at a time per session process, and take over tasks whose holder died.

    A session process runs one task at a time, so a task that crashes or is killed takes only its
    own session down; it then runs the worker's next task (up to --session-tasks), with what the
    task changed in the process put back (environment, directory, sys.path, signal handlers) and
    the project's code imported anew; it is replaced by a fresh one when an installed package it
    imported changed on disk.

    Logs one line on stderr per claim (and takeover) and per task's end (complete, queued again,
    failed with its reason). Start it in the project directory the tasks were submitted from:
    their code is looked up there (a task whose code is not found is parked `failed`; fix it, then
    `overnight retry TASK_ID`); started without --store in a project's subfolder while the project's
    store is further up, it refuses (exit 2) and names the folder to start it in. Ctrl-C / SIGTERM
    once: each task finishes its step in flight, commits, is queued again; the worker exits 0.
    Twice: steps in flight are abandoned (nothing of them is committed). An unreachable store is retried; the exit is non-zero only on a
    configuration error (exit 2)."""
    import logging

    from overnight.fleet.worker import LOG, Worker

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.WARNING if quiet else logging.INFO)
    LOG.propagate = False

    try:
        _not_in_a_subfolder(store)
        code = Worker(_store(store), queues=queue, concurrency=concurrency, max_tasks=max_tasks,
                      idle_exit_s=idle_exit, worker_id=worker_id, lease_ms=int(lease * 1000),
                      max_deaths=max_deaths, backoff_s=backoff, session_tasks=session_tasks).run()
    except OvernightError as exc:
        _fail(exc)
    raise typer.Exit(code)


def _not_in_a_subfolder(store: str | None) -> None:
    """Refuse a worker started without a store in a project's subfolder while the project's store
    is further up: it would poll a new, empty queue and exit idle, and with that store named
    (``--store``) it would look the tasks' code up from the subfolder and park them ``failed``.

    Raises:
        ConfigError: naming the store further up and the folder to start the worker in (exit 2).
    """
    from overnight.store import default_store_url, exists
    from overnight.store.task_location import project_further_up

    url = default_store_url()
    found = None if store is not None or exists(url) else project_further_up(url)
    if found is not None:
        up, folder = found
        raise ConfigError(f"no store here; the project's store is further up, at {up}",
                          hint=f"start the worker in {folder}: `cd {shlex.quote(str(folder))} && overnight worker` "
                               "(a worker looks the tasks' code up from the folder it runs in); to start a new "
                               "store here instead, pass --store sqlite://.overnight/overnight.db")


def workers(store: Optional[str] = StoreOpt,
            show_all: bool = typer.Option(False, "--all", "-a", help="Also workers that stopped or went silent."),
            as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout.")) -> None:
    """List live workers: id, host, pid, state, tasks held (as of its last heartbeat), started, last
    heartbeat. --all adds the ones that exited cleanly (`stopped`), those on this machine whose
    process no longer runs (`dead`: killed -- seen at once, by its pid) and those whose last
    heartbeat is older than 90 s (`silent`: killed, or their machine gone). Such a worker runs
    nothing: its held reads `—` with the count its last heartbeat recorded, and its tasks are taken
    over once their claims expire. --json has the same rows and `state` (and the one the worker last
    wrote, `recorded_state`; `held` as its last heartbeat recorded it; `alive`: false for a stopped,
    dead or silent worker)."""
    from overnight import api

    try:
        rows = api.workers(store=store)
        now = api.clock_ms(store=store)  # starts and heartbeats are written by the store's clock
    except OvernightError as exc:
        _fail(exc)
    from overnight.store.leases import now_ms
    from overnight.store.queue import SILENT_AFTER_MS, worker_process_gone

    offset = now_ms() - now  # this machine's clock minus the store's: a pid's start is by this machine's

    def state(w: Any) -> str:
        if w.state == "stopped":
            return w.state
        if worker_process_gone(w, offset):
            return "dead"
        return "silent" if now - w.heartbeat_ms > SILENT_AFTER_MS else w.state

    states = {id(w): state(w) for w in rows}  # one pid check per worker

    def alive(w: Any) -> bool:
        return states[id(w)] not in ("stopped", "dead", "silent")

    def held(w: Any) -> str:
        if alive(w):
            return f"{w.held}/{w.concurrency}"
        # a gone worker runs nothing: its count is the one its last heartbeat wrote, not what it holds now
        return "—" if w.state == "stopped" or not w.held else f"— (last seen {w.held}/{w.concurrency})"

    shown = rows if show_all else [w for w in rows if alive(w)]
    if as_json:
        render.print_json([{**r.to_dict(), "state": states[id(r)], "recorded_state": r.state, "alive": alive(r)}
                           for r in shown])
        return
    if not shown:
        render.err.print("no worker has registered in this store yet (`overnight worker` starts one)" if not rows else
                         f"no live worker ({len(rows)} stopped, dead or silent: `overnight workers --all` lists them)")
        return
    render.table(None, ["worker", "host", "pid", "state", "held", "started", "heartbeat"],
                 [(w.worker_id, w.host, w.pid, states[id(w)], held(w),
                   f"{human_duration(now - w.started_ms)} ago", f"{human_duration(now - w.heartbeat_ms)} ago")
                  for w in shown])


def retry(task_id: str = typer.Argument(..., metavar="TASK_ID"), store: Optional[str] = StoreOpt) -> None:
    """Queue a failed (or cancelled) task again; its death count starts over. A failed task is
    queued to start now; a cancelled one that never started keeps its `submit --not-before` time
    (it says "queued (starts in ...)"). A task already complete -- also one a failed or cancelled
    row stands for that `overnight run` / `resume` has since finished here: its row is settled
    complete -- and one queued or running are left as they are: it says so ("already complete,
    nothing to queue") and exits 0, as `overnight cancel` of a finished task does."""
    from overnight import api

    try:
        before = api.queue_row(task_id, store=store)  # to say "already queued" (the retry itself is one UPDATE)
        row = api.retry(task_id, store=store)
        ahead = row.not_before_ms - api.clock_ms(store=store) if row.status == "queued" and row.not_before_ms else 0
    except OvernightError as exc:
        _fail(exc)
    what = f"queued (starts in {human_duration(ahead)})" if ahead > 1000 else "queued"  # as `ls` says it
    if row.status != "queued" or (before is not None and before.status == "queued"):
        what = f"already {what if row.status == 'queued' else row.status}, nothing to queue"
    render.out.print(f"{render.esc(task_id, one_line=True)}: {what}")


def cancel(task_id: str = typer.Argument(..., metavar="TASK_ID"), store: Optional[str] = StoreOpt) -> None:
    """Cancel a task: a queued one at once; a running one stops at its next step boundary
    (ctx.should_stop turns true) and is marked cancelled."""
    from overnight import api

    try:
        before = api.queue_row(task_id, store=store)  # to say "already cancelled"
        row = api.cancel(task_id, store=store)
    except OvernightError as exc:
        _fail(exc)
    again = before is not None and before.status == row.status
    render.out.print(f"{render.esc(task_id, one_line=True)}: " + (
        "cancel requested (stops at the next step boundary)" if row.status == "running" else
        "cancelled" if row.status == "cancelled" and not again else f"already {row.status}, nothing to cancel"))


def bench_fleet(
    workers_n: int = typer.Option(4, "--workers", min=1, help="Worker processes per system."),
    tasks: int = typer.Option(40, "--tasks", min=1, help="Tasks (DBOS: workflows) per system."),
    steps: int = typer.Option(15, "--steps", min=1, help="Steps per task."),
    concurrency: int = typer.Option(2, "--concurrency", min=1, help="Tasks run at once per worker."),
    step_ms: float = typer.Option(0.0, "--step-ms", min=0, help="Time each step sleeps (ms)."),
    lease: float = typer.Option(3.0, "--lease", help="Lease (s) of the overnight workers; bounds the takeover time."),
    session_tasks: int = typer.Option(100, "--session-tasks", min=1, metavar="N", help="The overnight workers' "
                                      "--session-tasks (1: a fresh session process per task)."),
    rounds: int = typer.Option(1, "--rounds", min=1, help="Run each system this many times, interleaved; "
                               "report medians (a shared machine's load drifts between runs)."),
    postgres: str = typer.Option("postgresql://postgres@127.0.0.1:5432/test", "--postgres",
                                 help="PostgreSQL server (fresh schemas, dropped afterwards)."),
    no_postgres: bool = typer.Option(False, "--no-postgres", help="SQLite only."),
    no_sqlite: bool = typer.Option(False, "--no-sqlite", help="PostgreSQL only."),
    no_dbos: bool = typer.Option(False, "--no-dbos", help="Leave DBOS out (the `bench` extra installs it)."),
    cpu_steps: int = typer.Option(300, "--cpu-steps", min=0, help="Also measure CPU ms per step commit (client "
                                  "and PostgreSQL) of one task / one DBOS workflow of this many steps, in one "
                                  "process each -- steadier than wall time on a loaded machine (0: skip)."),
    out: Optional[str] = typer.Option(None, "--out", help="Directory for fleet.md, fleet.json and fleet.png."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable JSON on stdout."),
) -> None:
    """Workers under load: tasks/s, step commits/s, claim latency p50/p99, takeover time after
    SIGKILL -- overnight on SQLite and PostgreSQL, next to DBOS's queue running the same workload
    on the same PostgreSQL server in the same run; then CPU per step commit of each (--cpu-steps)."""
    import os
    from pathlib import Path

    from overnight.bench.fleet import cpu_markdown, cpu_per_step, markdown, plot, run_fleet_bench, to_json

    load = os.popen("uptime").read().strip()
    cpu: list[dict] = []
    try:
        results = run_fleet_bench(postgres=None if no_postgres else postgres, sqlite=not no_sqlite,
                                  workers=workers_n, concurrency=concurrency, tasks=tasks, steps=steps,
                                  step_ms=step_ms, lease_s=lease, dbos=not no_dbos and not no_postgres,
                                  rounds=rounds, session_tasks=session_tasks)
        if cpu_steps and not no_postgres:
            cpu = cpu_per_step(postgres, steps=cpu_steps, dbos=not no_dbos, rounds=rounds)
    except ImportError as exc:
        from overnight.cli.common import need_extra as _need_extra

        _need_extra(exc, "bench")
    except OvernightError as exc:
        _fail(exc)
    text = markdown(results, load) + (f"\nCPU per step commit (PostgreSQL):\n\n{cpu_markdown(cpu)}" if cpu else "")
    doc = {**to_json(results, load), "cpu_per_step": cpu}
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "fleet.md").write_text(text)
        (d / "fleet.json").write_text(json.dumps(doc, indent=2))
        plot(results, d / "fleet.png")
    if as_json:
        render.print_json(doc)
        return
    render.out.print(text, markup=False)


def register(app: typer.Typer, bench_app: typer.Typer | None = None) -> None:
    """Add the queue commands to ``app`` (and ``fleet`` to ``overnight bench``)."""
    app.command()(submit)
    app.command()(worker)
    app.command()(workers)
    app.command()(retry)
    app.command()(cancel)
    if bench_app is not None:
        bench_app.command("fleet")(bench_fleet)
