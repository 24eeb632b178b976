"""``overnight bench ui``: render time of the dashboard's two heavy pages on local SQLite.

Builds a store with ``tasks`` small tasks (a plan and two steps each) and one task whose chain
has ``checkpoints`` checkpoints, then times, through the ASGI app itself (no network, no
browser: the server's share of a page load), the tasks page (``/``) and the task page
(``/task?id=long``, first page of the timeline) -- the median of ``repeat`` requests after one
warm-up request, whose time is reported too (the first render verifies every head; later ones
reuse what was verified, by checkpoint id). Target (issue 17): under 300 ms each.

Baselines, measured in the same run on the same store: ``api.ls`` (``overnight ls``: one line
per task) for the tasks page and ``api.show`` (``overnight show``: the whole chain, every
record verified) for the task page.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from overnight import api
from overnight.runtime.runner import Runner
from overnight.runtime.task import Task
from overnight.store.sqlite import SQLiteStore


def _get(app: Any, path: str, query: str = "") -> tuple[int, bytes]:
    """One GET through the ASGI app: ``(status, body)``."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8765")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8765)}
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return out["status"], out["body"]


def _times(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """``(first, median of the next repeat)`` wall times in ms."""
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1000
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1000)
    return first, statistics.median(runs)


@dataclass
class UiBench:
    """Result of :func:`run_ui_bench` (times in ms)."""

    tasks: int
    checkpoints: int
    build_s: float
    tasks_first_ms: float
    tasks_ms: float
    ls_ms: float
    task_first_ms: float
    task_ms: float
    show_ms: float
    tasks_bytes: int
    task_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}

    def markdown(self) -> str:
        return "\n".join([
            f"overnight ui render times, local SQLite: {self.tasks} tasks + one task of {self.checkpoints} "
            f"checkpoints (built in {self.build_s:.0f} s); median of the warm requests, first request apart",
            "",
            "| page | first request ms | median ms | baseline | baseline ms | page / baseline | target |",
            "|---|---:|---:|---|---:|---:|---|",
            f"| tasks (`/`, {self.tasks + 1} tasks, {self.tasks_bytes // 1024} KB HTML) | {self.tasks_first_ms:.0f} | "
            f"{self.tasks_ms:.0f} | `overnight ls` (api.ls) | {self.ls_ms:.0f} | {self.tasks_ms / self.ls_ms:.2f}x | "
            f"< 300 ms: {'yes' if self.tasks_ms < 300 else 'NO'} |",
            f"| task (`/task`, {self.checkpoints} checkpoints, page 1, {self.task_bytes // 1024} KB HTML) | "
            f"{self.task_first_ms:.0f} | {self.task_ms:.0f} | `overnight show` (api.show) | {self.show_ms:.0f} | "
            f"{self.task_ms / self.show_ms:.2f}x | < 300 ms: {'yes' if self.task_ms < 300 else 'NO'} |",
        ])


def _build(path: Path, tasks: int, checkpoints: int) -> None:
    # deps=[one package]: fingerprinting every installed distribution costs ~1-3 s per task start
    # (reading each one's metadata), which would make the build, not the pages, the benchmark
    store = SQLiteStore(path)
    try:
        for n in range(tasks):
            task = Task(f"t{n:05d}", goal=f"small task {n}", level="session", deps=["pydantic"])

            @task.step
            def plan(ctx):
                ctx.add_step("write", i=0)
                ctx.add_step("write", i=1)

            @task.step(planned=False)
            def write(ctx, i):
                ctx.write_text(f"out-{i}.txt", f"task output {i}\n")

            Runner(task, store, handle_signals=False).run()
        long = Task("long", goal=f"a chain of {checkpoints} checkpoints", level="session", deps=["pydantic"])

        @long.step
        def plan_long(ctx):
            for i in range(checkpoints - 2):
                ctx.add_step("note", i=i)

        @long.step(planned=False)
        def note(ctx, i):
            ctx.state["n"] = i
            ctx.write_text("notes.txt", f"note {i}\n")

        Runner(long, store, handle_signals=False).run()
    finally:
        store.close()


def run_ui_bench(tasks: int = 1000, checkpoints: int = 5000, repeat: int = 7,
                 directory: Path | None = None) -> UiBench:
    """Build the store, then time the pages and their baselines; see the module docstring."""
    from overnight.web.app import create_app

    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-ui-", dir=base) as tmp:
        path = Path(tmp) / "store.db"
        t0 = time.perf_counter()
        _build(path, tasks, checkpoints)
        build_s = time.perf_counter() - t0
        url = f"sqlite://{path}"
        app = create_app(url, read_only=True)
        status, body = _get(app, "/")
        assert status == 200, body[:500]
        tasks_bytes = len(body)
        status, body = _get(app, "/task", "id=long")
        assert status == 200, body[:500]
        task_bytes = len(body)
        app2 = create_app(url, read_only=True)  # fresh: the first request verifies every head
        tasks_first, tasks_ms = _times(lambda: _get(app2, "/"), repeat)
        task_first, task_ms = _times(lambda: _get(app2, "/task", "id=long"), repeat)
        with api.reading(url) as s:
            _, ls_ms = _times(lambda: api.ls(store=s), repeat)
            _, show_ms = _times(lambda: api.show("long", store=s), max(1, repeat // 2))
        return UiBench(tasks, checkpoints, build_s, tasks_first, tasks_ms, ls_ms, task_first, task_ms, show_ms,
                       tasks_bytes, task_bytes)
