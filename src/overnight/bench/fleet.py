"""``overnight bench fleet``: the queue and its workers under load, next to DBOS's queue.

Workload: ``tasks`` tasks of ``steps`` steps (each step returns a small dict and sleeps
``step_ms``), run by ``workers`` worker processes (``concurrency`` sessions each) on one store.
Measured, in one run on one server:

* **tasks/s** and **step commits/s**: from the workers' start to the last task complete (the
  tasks are submitted before; every task also commits its plan step);
* **claim latency** p50/p99 (ms): each successful claim transaction, as the workers time it;
* **takeover** (s): one task with slow steps, two workers; SIGKILL the one running it; time from
  the kill until a step of the task runs in another process (bounded by the lease, ``lease_s``).

DBOS (``pip install dbos``) runs the same workload on the same PostgreSQL server: a workflow of
``steps`` ``@DBOS.step`` calls, enqueued ``tasks`` times on a queue with ``worker_concurrency``
equal to ``concurrency``, ``workers`` DBOS processes (distinct executor ids), its system tables in
their own schema (:mod:`overnight.bench.fleet_dbos`). Its time runs from the first enqueue to the
last workflow ``SUCCESS``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from overnight.errors import BenchFailed

TASK_FILE = '''
import os, time
import overnight

task = overnight.Task("bench", goal="fleet benchmark", level="durable")

@task.step
def plan(ctx):
    for i in range(int(ctx.params["steps"])):
        ctx.add_step("work", i=i)

@task.step(planned=False)
def work(ctx, i: int):
    log = os.environ.get("BENCH_SIDE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{ctx.task_id} {i} {os.getpid()} {time.time()}\\n")
    time.sleep(float(ctx.params["step_ms"]) / 1000)
    return {"i": i}
'''


@dataclass
class FleetResult:
    """One system's figures (see the module docstring); ``None`` where not measured."""

    system: str
    store: str
    workers: int
    concurrency: int
    tasks: int
    steps: int
    seconds: float
    tasks_per_s: float
    step_commits_per_s: float
    claim_p50_ms: float | None = None
    claim_p99_ms: float | None = None
    takeover_s: float | None = None
    lease_s: float | None = None
    notes: list[str] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


def _env(extra: dict[str, str]) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("OVERNIGHT_STORE", None)
    src = str(Path(__file__).resolve().parents[2])
    e["PYTHONPATH"] = os.pathsep.join([src, e.get("PYTHONPATH", "")])
    e.update(extra)
    return e


def _workers(project: Path, store: str, n: int, concurrency: int, lease_s: float, extra: dict[str, str],
             *args: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "overnight", "worker", "--store", store, "--concurrency",
                              str(concurrency), "--lease", str(lease_s), "--worker-id", f"bench-{i}", *args],
                             cwd=project, env=_env(extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(n)]


def run_overnight(store: str, *, workers: int, concurrency: int, tasks: int, steps: int, step_ms: float,
                  lease_s: float, project: Path, takeover: bool = True, session_tasks: int = 100) -> FleetResult:
    """The overnight side: submit, run to completion, then (``takeover``) the takeover probe.
    ``session_tasks``: the workers' ``--session-tasks``."""
    from overnight import api
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    (project / "bench_task.py").write_text(TASK_FILE)
    (project / "overnight.toml").write_text("")
    here = os.getcwd()
    os.chdir(project)
    try:
        for t in range(tasks):
            api.submit("bench_task.py", store=store, task_id=f"b{t:04d}", params={"steps": steps, "step_ms": step_ms})
    finally:
        os.chdir(here)
    stats = project / "worker-stats.jsonl"
    t0 = time.perf_counter()
    procs = _workers(project, store, workers, concurrency, lease_s, {"OVERNIGHT_WORKER_STATS": str(stats)},
                     "--idle-exit", "1", "--session-tasks", str(session_tasks))
    s = open_store(store)
    try:
        q = queue_for(s)
        while True:
            rows = q.list()
            if sum(r.status == "complete" for r in rows) >= tasks:
                break
            if all(p.poll() is not None for p in procs):
                raise BenchFailed(f"workers exited with {sum(r.status == 'complete' for r in rows)}/{tasks} done")
            time.sleep(0.05)
        end_ms = time.time() * 1000
        with_startup = time.perf_counter() - t0
        seconds = (end_ms - min(r.claimed_ms for r in rows if r.claimed_ms)) / 1000  # from the first claim
    finally:
        s.close()
    for p in procs:
        p.wait(timeout=120)
    claims = [ms for line in stats.read_text().splitlines() for ms in json.loads(line)["claim_ms"]]
    took = takeover_probe(store, project=project, lease_s=lease_s) if takeover else None
    return FleetResult("overnight", store.split("://", 1)[0], workers, concurrency, tasks, steps, round(seconds, 2),
                       round(tasks / seconds, 2), round(tasks * (steps + 1) / seconds, 1), _pct(claims, 0.5),
                       _pct(claims, 0.99), took, lease_s,
                       ["each task in a session process (forked from a fork server with overnight imported"
                        + (", reused for the worker's next task, --session-tasks "
                           f"{session_tasks})" if session_tasks > 1 else "; a fresh one per task, --session-tasks 1)"),
                        "every step a verified checkpoint (digest, fingerprint, journal row)", f"timed from the first claim to the last task complete ({round(with_startup, 1)} s from the workers' "
                        "start, Python and fork-server start-up included)"])


def takeover_probe(store: str, *, project: Path, lease_s: float) -> float:
    """SIGKILL the worker running a slow task; seconds until a step of it runs in another process."""
    from overnight import api

    side = project / "takeover.log"
    here = os.getcwd()
    os.chdir(project)
    try:
        api.submit("bench_task.py", store=store, task_id="takeover", params={"steps": 400, "step_ms": 100})
    finally:
        os.chdir(here)
    extra = {"BENCH_SIDE_LOG": str(side)}
    first = _workers(project, store, 1, 1, lease_s, extra)[0]

    def lines() -> list[list[str]]:
        return [ln.split() for ln in side.read_text().splitlines()] if side.exists() else []

    deadline = time.monotonic() + 120
    while len(lines()) < 3:
        if time.monotonic() > deadline:
            raise BenchFailed("the takeover task did not start")
        time.sleep(0.05)
    second = _workers(project, store, 1, 1, lease_s, extra, "--worker-id", "bench-taker")[0]
    time.sleep(1.0)  # the second worker is up and polling
    pids = {ln[2] for ln in lines()}
    first.send_signal(signal.SIGKILL)
    killed = time.time()
    first.wait()
    try:
        while True:
            new = [ln for ln in lines() if ln[2] not in pids and float(ln[3]) > killed]
            if new:
                return round(float(new[0][3]) - killed, 2)
            if time.time() - killed > lease_s * 3 + 60:
                raise BenchFailed("no takeover")
            time.sleep(0.02)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait()


def run_dbos(pg_url: str, *, workers: int, concurrency: int, tasks: int, steps: int, step_ms: float) -> FleetResult:
    """DBOS's queue on the same server: ``workers`` processes of :mod:`overnight.bench.fleet_dbos`,
    every one launched before the first workflow is enqueued (as overnight's workers are started
    before they claim)."""
    import psycopg

    schema = f"dbos_bench_{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "overnight.bench.fleet_dbos"]
    args = [pg_url, schema, str(steps), str(concurrency), str(step_ms)]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="overnight-bench-dbos-") as ready:
        def start(index: int, enqueue: int) -> None:
            procs.append(subprocess.Popen([*cmd, "worker", *args, str(index), str(enqueue), ready], env=_env({}),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def wait_ready(n: int, deadline: float) -> None:
            while len(list(Path(ready).glob("ready-*"))) < n:
                if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    raise BenchFailed("DBOS did not start")
                time.sleep(0.05)

        try:
            deadline = time.monotonic() + 180
            start(0, tasks)  # it creates the schema (its first launch), then waits for the others
            wait_ready(1, deadline)
            for i in range(1, workers):
                start(i, 0)
            wait_ready(workers, deadline)
            (Path(ready) / "go").touch()
            with psycopg.connect(pg_url, autocommit=True) as conn:
                def count(where: str) -> int:
                    try:
                        return conn.execute(f'SELECT count(*) FROM "{schema}".workflow_status WHERE {where}').fetchone()[0]
                    except psycopg.Error:
                        return 0

                while count("status = 'SUCCESS' AND queue_name = 'bench'") < tasks:
                    if time.monotonic() > deadline + 600:
                        raise BenchFailed("DBOS did not finish")
                    time.sleep(0.05)
                first, last = conn.execute(f'SELECT min(created_at), max(updated_at) FROM "{schema}".workflow_status'
                                           ).fetchone()
                seconds = (last - first) / 1000
        finally:
            for p in procs:
                p.send_signal(signal.SIGKILL)
                p.wait()
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return FleetResult("dbos", "postgresql", workers, concurrency, tasks, steps, round(seconds, 2),
                       round(tasks / seconds, 2), round(tasks * steps / seconds, 1),
                       notes=["workflows run as threads of the worker processes; every process launched before the "
                              "first enqueue; timed from the first enqueue to the last SUCCESS"])


def run_fleet_bench(*, postgres: str | None, sqlite: bool, workers: int, concurrency: int, tasks: int, steps: int,
                    step_ms: float, lease_s: float, dbos: bool, rounds: int = 1,
                    session_tasks: int = 100) -> list[FleetResult]:
    """Every system in one run; PostgreSQL schemas are fresh and dropped afterwards.

    ``rounds`` > 1: each system runs that many times, interleaved (overnight and DBOS take turns
    going first on PostgreSQL), and each figure is the median over the rounds -- on a shared
    machine the load drifts between two runs; the takeover probe runs in the first round only."""
    runs: dict[tuple[str, str], list[FleetResult]] = {}
    with tempfile.TemporaryDirectory(prefix="overnight-bench-fleet-") as tmp:
        for r in range(rounds):
            jobs = []
            if sqlite:
                proj = Path(tmp) / f"sqlite{r}"
                proj.mkdir()
                jobs.append(lambda proj=proj: run_overnight(
                    f"sqlite://{proj / 'q.db'}", workers=workers, concurrency=concurrency, tasks=tasks, steps=steps,
                    step_ms=step_ms, lease_s=lease_s, project=proj, takeover=r == 0, session_tasks=session_tasks))
            pg = []
            if postgres:
                proj = Path(tmp) / f"postgres{r}"
                proj.mkdir()
                pg.append(lambda proj=proj: _on_postgres(postgres, proj, workers=workers, concurrency=concurrency,
                                                         tasks=tasks, steps=steps, step_ms=step_ms, lease_s=lease_s,
                                                         takeover=r == 0, session_tasks=session_tasks))
                if dbos:
                    pg.append(lambda: run_dbos(postgres, workers=workers, concurrency=concurrency, tasks=tasks,
                                               steps=steps, step_ms=step_ms))
            for job in jobs + (pg[::-1] if r % 2 else pg):
                res = job()
                runs.setdefault((res.system, res.store), []).append(res)
    return [_median(rs) for rs in runs.values()]


def cpu_per_step(postgres: str, *, steps: int, dbos: bool, rounds: int = 1) -> list[dict[str, Any]]:
    """CPU ms per step commit, client and PostgreSQL, of one overnight task and (``dbos``) one DBOS
    workflow of ``steps`` steps, each in its own process (:mod:`overnight.bench.fleet_cpu`);
    ``rounds`` > 1: the median of each figure over interleaved rounds. Raises BenchFailed."""
    systems = ["overnight", *(["dbos"] if dbos else [])]
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="overnight-bench-fleet-cpu-") as tmp:
        (Path(tmp) / "bench_task.py").write_text(TASK_FILE)
        (Path(tmp) / "overnight.toml").write_text("")
        for r in range(rounds):
            for system in systems[::-1] if r % 2 else systems:
                res = subprocess.run([sys.executable, "-m", "overnight.bench.fleet_cpu", system, postgres, str(steps),
                                      tmp], env=_env({}), capture_output=True, text=True, timeout=600)
                if res.returncode != 0 or not res.stdout.strip():
                    raise BenchFailed(f"CPU probe of {system} failed: {res.stderr.strip()[-500:]}")
                got[system].append(json.loads(res.stdout.strip().splitlines()[-1]))
    out = []
    for system, rs in got.items():
        def med(key: str) -> float:
            values = sorted(r[key] for r in rs)
            return values[len(values) // 2]
        out.append({"system": system, "steps": rs[0]["steps"], "rounds": len(rs),
                    **{k: med(k) for k in ("client_ms_per_step", "postgres_ms_per_step", "cpu_ms_per_step")}})
    return out


def cpu_markdown(rows: list[dict[str, Any]]) -> str:
    """The :func:`cpu_per_step` table, with each system's total against DBOS's."""
    base = next((r["cpu_ms_per_step"] for r in rows if r["system"] == "dbos"), None)
    lines = ["| system | steps (one task / workflow) | client CPU ms/step | PostgreSQL CPU ms/step | CPU ms/step | "
             "vs DBOS (lower is better) |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['cpu_ms_per_step'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['system']} | {r['steps']} | {r['client_ms_per_step']} | {r['postgres_ms_per_step']} | "
                     f"{r['cpu_ms_per_step']} | {ratio} |")
    return "\n".join(lines) + "\n"


def _on_postgres(postgres: str, proj: Path, **kw: Any) -> FleetResult:
    import psycopg

    schema = f"overnight_bench_{uuid.uuid4().hex[:8]}"
    try:
        return run_overnight(f"{postgres}?schema={schema}", project=proj, **kw)
    finally:
        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _median(rs: list[FleetResult]) -> FleetResult:
    """One system's rounds as one result: the median of each figure (the takeover: the first)."""
    if len(rs) == 1:
        return rs[0]

    def med(values: list[float | None]) -> float | None:
        got = sorted(v for v in values if v is not None)
        n = len(got)
        if not n:
            return None
        return got[n // 2] if n % 2 else round((got[n // 2 - 1] + got[n // 2]) / 2, 2)

    first = rs[0]
    return FleetResult(
        first.system, first.store, first.workers, first.concurrency, first.tasks, first.steps,
        med([r.seconds for r in rs]), med([r.tasks_per_s for r in rs]), med([r.step_commits_per_s for r in rs]),
        med([r.claim_p50_ms for r in rs]), med([r.claim_p99_ms for r in rs]), first.takeover_s, first.lease_s,
        [*first.notes, f"median of {len(rs)} interleaved rounds (step commits/s: "
                       f"{', '.join(str(r.step_commits_per_s) for r in rs)})"])


def markdown(results: list[FleetResult], load: str) -> str:
    """The table (step commits/s also as a ratio to DBOS's, when it ran), the load and each system's notes."""
    base = next((r.step_commits_per_s for r in results if r.system == "dbos"), None)
    head = ("| system | store | workers x conc. | tasks x steps | seconds | tasks/s | step commits/s | vs DBOS | "
            "claim p50 ms | claim p99 ms | takeover s (lease) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = "".join(
        f"| {r.system} | {r.store} | {r.workers} x {r.concurrency} | {r.tasks} x {r.steps} | {r.seconds} | "
        f"{r.tasks_per_s} | {r.step_commits_per_s} | {f'{r.step_commits_per_s / base:.2f}x' if base else '-'} | "
        f"{r.claim_p50_ms if r.claim_p50_ms is not None else '-'} | "
        f"{r.claim_p99_ms if r.claim_p99_ms is not None else '-'} | "
        + (f"{r.takeover_s} ({r.lease_s:g})" if r.takeover_s is not None else "-") + " |\n" for r in results)
    notes = "".join(f"- {r.system} ({r.store}): {'; '.join(r.notes)}\n" for r in results if r.notes)
    counted = ("\nstep commits/s counts every checkpoint an overnight task commits (its plan step and its "
               "steps: tasks x (steps + 1)) and every DBOS step (tasks x steps)\n")
    return head + rows + counted + f"\nLoad (uptime) at the start: {load}\n\n" + notes


def plot(results: list[FleetResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = [f"{r.system}\n{r.store}" for r in results]
    ax.bar(names, [r.step_commits_per_s for r in results], color=["#3465a4" if r.system == "overnight" else "#888"
                                                                  for r in results])
    ax.set_ylabel("step commits / s")
    ax.set_title("overnight bench fleet (same run, same server)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def to_json(results: list[FleetResult], load: str) -> dict[str, Any]:
    return {"load": load, "results": [asdict(r) for r in results]}


__all__ = ["FleetResult", "cpu_markdown", "cpu_per_step", "markdown", "plot", "run_fleet_bench", "to_json"]
