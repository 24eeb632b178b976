"""CPU per step commit, in one process, next to DBOS: ``python -m overnight.bench.fleet_cpu
overnight|dbos PG_URL STEPS PROJECT`` prints one JSON line.

The fleet benchmark's wall-clock figures move with the machine's load (2 shared cores); the CPU
each step costs -- in the client and in every PostgreSQL process together (backends, WAL writer,
checkpointer: ``/proc/PID/stat`` of every process named ``postgres`` on this host) -- does much
less, and bounds what two cores can commit per second once they are the limit. Measured over one
run of STEPS steps after start-up:

* **overnight**: a task of STEPS steps submitted to a fresh schema, claimed, and run by the same
  code a worker's session runs (:func:`overnight.fleet.child.main`, in this process: store open,
  claim heartbeat, code import, lease, every step's verified checkpoint, the final status), so the
  session's start-up is counted and the fork server's fork is not;
* **dbos**: one ``@DBOS.workflow`` of STEPS ``@DBOS.step`` calls run in this process after
  ``DBOS.launch()`` and a warm-up workflow of 3 steps.

Each step returns a small dict and sleeps not at all. PostgreSQL's CPU is the whole server's: run
it on an otherwise idle server.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
import uuid


def postgres_cpu_s() -> float:
    """CPU seconds (user + system) of every process named ``postgres`` on this host, with those of
    its children that ended (a backend whose connection closed is counted in the postmaster's)."""
    total = 0
    for proc in glob.glob("/proc/[0-9]*"):
        try:
            with open(proc + "/comm") as f:
                if not f.read().startswith("postgres"):
                    continue
            with open(proc + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def _overnight(pg_url: str, schema: str, steps: int, project: str) -> tuple[int, float]:
    from overnight import api
    from overnight.fleet import child
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    url = f"{pg_url}?schema={schema}"
    os.chdir(project)
    api.submit("bench_task.py", store=url, task_id="cpu", params={"steps": steps, "step_ms": 0})
    s = open_store(url)
    try:
        row = queue_for(s).claim("fleet-cpu", ["default"], 30_000)
    finally:
        s.close()
    started = time.process_time(), postgres_cpu_s()
    if child.main([url, "cpu", str(row.claim_token), "30000", str(os.getpid())]) != 0:
        raise SystemExit("the session failed")
    return steps + 1, started  # the plan step commits too


def _dbos(pg_url: str, schema: str, steps: int) -> tuple[int, float]:
    from dbos import DBOS

    DBOS(config={"name": "overnight-bench-fleet-cpu", "system_database_url": pg_url, "dbos_system_schema": schema,
                 "log_level": "ERROR", "application_version": "bench"})

    from overnight.bench.fleet_dbos import bench_workflow

    task = bench_workflow(0)
    DBOS.launch()
    task(3)
    started = time.process_time(), postgres_cpu_s()
    task(steps)
    return steps, started


def main(argv: list[str]) -> None:
    system, pg_url, steps, project = argv[0], argv[1], int(argv[2]), argv[3]
    schema = f"fleet_cpu_{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    try:
        n, (cpu0, pg0) = _overnight(pg_url, schema, steps, project) if system == "overnight" else \
            _dbos(pg_url, schema, steps)
        client, server = time.process_time() - cpu0, postgres_cpu_s() - pg0
    finally:
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(json.dumps({"system": system, "steps": n, "client_ms_per_step": round(client * 1000 / n, 2),
                      "postgres_ms_per_step": round(server * 1000 / n, 2),
                      "cpu_ms_per_step": round((client + server) * 1000 / n, 2),
                      "wall_s": round(time.perf_counter() - t0, 2)}), flush=True)
    os._exit(0)  # DBOS's threads do not stop by themselves


if __name__ == "__main__":
    main(sys.argv[1:])
