"""A DBOS worker process for ``overnight bench fleet`` (the baseline): ``python -m
overnight.bench.fleet_dbos worker PG_URL SCHEMA STEPS CONCURRENCY STEP_MS INDEX ENQUEUE READY_DIR``.

A workflow of STEPS ``@DBOS.step`` calls (each sleeps STEP_MS and returns a small dict, as the
overnight bench task does) on a queue ``bench`` with ``worker_concurrency=CONCURRENCY``; process
INDEX is executor ``dbos-INDEX``. Once launched it creates ``READY_DIR/ready-INDEX``; a process
with ENQUEUE > 0 then waits for ``READY_DIR/go`` (the bench creates it when every process is
ready, so all serve the queue from the first workflow on, as overnight's workers do) and enqueues
ENQUEUE workflows; every process serves the queue until killed. DBOS's system tables live in
SCHEMA on the same server as overnight's.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def bench_workflow(step_ms: float):  # type: ignore[no-untyped-def]
    """Register the benchmark's workflow with DBOS (call after ``DBOS(config=...)``, before
    ``DBOS.launch()``) and return it: ``task(n)`` runs ``n`` ``@DBOS.step`` calls, each sleeping
    ``step_ms`` ms and returning a small dict, as the overnight bench task's steps do."""
    from dbos import DBOS

    @DBOS.step()
    def work(i: int) -> dict:
        if step_ms:
            time.sleep(step_ms / 1000)
        return {"i": i}

    @DBOS.workflow()
    def task(n: int) -> int:
        for i in range(n):
            work(i)
        return n

    return task


def main(argv: list[str]) -> None:
    from dbos import DBOS

    url, schema, steps, concurrency, step_ms, index, enqueue, ready_dir = argv
    DBOS(config={"name": "overnight-bench-fleet", "system_database_url": url, "dbos_system_schema": schema,
                 "executor_id": f"dbos-{index}", "log_level": "ERROR", "application_version": "bench"})
    task = bench_workflow(float(step_ms))
    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=int(concurrency), polling_interval_sec=0.05)
    (Path(ready_dir) / f"ready-{index}").touch()
    while int(enqueue) and not (Path(ready_dir) / "go").exists():
        time.sleep(0.01)
    for _ in range(int(enqueue)):
        queue.enqueue(task, int(steps))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[2:])
