"""The task most tests need: a planning step that adds ``n`` steps of one function.

``plan_task("t", 8, work)`` is the task

    @task.step
    def plan(ctx):
        for i in range(8):
            ctx.add_step("work", i=i)

    @task.step(planned=False)
    def work(ctx, i): ...     # the function passed in

so each test states only what its added step does.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import overnight


def plan_task(task_id: str, n: int | Iterable[Any], work: Callable[..., Any], *, step: str = "work", arg: str = "i",
              goal: str = "a plan that adds steps", setup: Callable[[Any], None] | None = None,
              **task_kw: Any) -> overnight.Task:
    """A task ``task_id`` whose one planned step ``plan`` adds ``n`` steps ``step(arg=0..n-1)``.

    Args:
        n: how many steps (``arg`` 0 to n-1), or the values of ``arg`` themselves.
        work: the added step's function, called as ``work(ctx, **{arg: i})``; registered as
            ``step`` with ``planned=False``.
        setup: called with the planning step's ``ctx`` after the steps are added (e.g. to seed
            ``ctx.state``).
        task_kw: passed to :class:`overnight.Task` (``data``, ``expected_span``, ``level``, ...).
    """
    task = overnight.Task(task_id, goal=goal, **task_kw)

    @task.step
    def plan(ctx):
        for i in (range(n) if isinstance(n, int) else n):
            ctx.add_step(step, **{arg: i})
        if setup is not None:
            setup(ctx)

    task.step(work, name=step, planned=False)
    return task
