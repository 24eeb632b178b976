"""Chaos: workers and their sessions SIGKILLed at random while a queue of tasks runs, on
PostgreSQL (4 workers, as if on 4 machines) and on SQLite (2 workers). Real processes, a real
server; every step appends to a side-effect log, and the stored chains are checked at the end."""

from __future__ import annotations

import collections
import random
import signal
import time
from pathlib import Path

import pytest

from _fleet import chain_check, cli, descendants, project, queue_rows, sessions_of, side_log, start_worker, stop


def _chaos(tmp_path: Path, store: str, *, tasks: int, steps: int, workers: int, concurrency: int,
           kill_every: float, budget_s: float) -> dict:
    import os

    from overnight import api

    project(tmp_path)
    ids = []
    here = os.getcwd()
    os.chdir(tmp_path)  # the project root: submit records tasks/chaos.py relative to it
    try:
        for t in range(tasks):
            row, created = api.submit("tasks/chaos.py", store=store, task_id=f"c{t:02d}",
                                      params={"steps": steps, "sleep": 0.2, "tag": "t" * (t % 7)})
            assert created
            ids.append(row.task_id)
    finally:
        os.chdir(here)
    args = ("--concurrency", str(concurrency), "--lease", "2", "--backoff", "0.2", "--max-deaths", "50")
    procs = {f"w{i}": start_worker(tmp_path, store, *args, "--worker-id", f"w{i}", name=f"w{i}")
             for i in range(workers)}
    ids_of = {name: name for name in procs}  # slot -> the worker id running in it
    rng = random.Random(13)
    kills = {"workers": 0, "children": 0, "sessions": 0}
    started = time.monotonic()
    n = workers
    try:
        while True:
            rows = queue_rows(store)
            if all(rows[i].status == "complete" for i in ids):
                break
            assert time.monotonic() - started < budget_s, collections.Counter(r.status for r in rows.values())
            time.sleep(kill_every * rng.uniform(0.6, 1.4))
            busy = [nm for nm in sorted(procs) if sessions_of(store, ids_of[nm])]
            name = rng.choice(busy if busy and rng.random() < 0.8 else sorted(procs))  # mostly kill work in flight
            victim = procs[name]
            kids = [p for p in sessions_of(store, ids_of[name]) if p in descendants(victim.pid)]
            if kids and rng.random() < 0.4:  # only one task's session
                import os

                try:
                    os.kill(rng.choice(kids), signal.SIGKILL)
                    kills["children"] += 1
                    kills["sessions"] += 1
                except ProcessLookupError:
                    pass
                continue
            stop(victim)  # the worker and (dying with it) its sessions
            kills["workers"] += 1
            kills["sessions"] += len(kids)
            n += 1
            procs[name] = start_worker(tmp_path, store, *args, "--worker-id", f"w{n}", name=f"w{n}")
            ids_of[name] = f"w{n}"
    finally:
        for p in procs.values():
            stop(p, signal.SIGTERM)
    log = side_log(tmp_path)
    counts = collections.Counter((t, i) for t, i, _ in log)
    for t in ids:  # every step ran
        assert all(counts[(t, i)] >= 1 for i in range(steps)), t
    wasted = sum(c - 1 for c in counts.values())
    assert wasted <= kills["sessions"], (wasted, kills)  # at most the step in flight per killed session
    for k, t in enumerate(ids):
        got = chain_check(store, t)  # linear, no checkpoint committed twice
        assert got["state"] == {f"w{i}": i * i + k % 7 for i in range(steps)}  # = an uninterrupted run
        assert len(got["done"]) == steps + 1
    res = cli(tmp_path, "verify", "--all", "--store", store)
    assert res.returncode == 0, res.stdout + res.stderr
    return {"kills": kills, "wasted": wasted, "tasks": tasks, "seconds": round(time.monotonic() - started, 1)}


@pytest.mark.slow
def test_chaos_postgres_4_workers(tmp_path: Path, pg_schema) -> None:
    url, schema = pg_schema
    figures = _chaos(tmp_path, f"{url}?schema={schema}", tasks=40, steps=15, workers=4, concurrency=2,
                     kill_every=3.0, budget_s=170)
    print("chaos postgres:", figures)
    assert figures["kills"]["workers"] + figures["kills"]["children"] >= 3 and figures["kills"]["sessions"] >= 1


@pytest.mark.slow
def test_chaos_sqlite_2_workers(tmp_path: Path) -> None:
    figures = _chaos(tmp_path, f"sqlite://{tmp_path / 'q.db'}", tasks=10, steps=8, workers=2, concurrency=2,
                     kill_every=2.5, budget_s=150)
    print("chaos sqlite:", figures)
    assert figures["kills"]["workers"] + figures["kills"]["children"] >= 2 and figures["kills"]["sessions"] >= 1
