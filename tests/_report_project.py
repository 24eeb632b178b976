"""A one-step ``report`` task in a fresh project, the CLI run on it, and a store of LangGraph
threads, a task file of N small steps, and a head record damaged in place -- shared by the fresh-user
rounds' tests (test_ux_round33 to 35, test_round35_damage_words)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from _procs import cli

REPORT = '''
import overnight

task = overnight.Task("report", goal="write the quarterly report")


@task.step
def a(ctx):
    ctx.state["x"] = 1
'''


def report_project(tmp_path: Path) -> str:
    """A project with ``tasks/report.py``; returns the URL of a SQLite store in it (not made yet)."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "report.py").write_text(REPORT)
    (tmp_path / "overnight.toml").write_text("")
    return f"sqlite://{tmp_path / 'q.db'}"


def ok(tmp_path: Path, *args: str) -> str:
    """stdout of ``overnight ARGS`` run in ``tmp_path``, which must exit 0."""
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def lg_threads(tmp_path: Path, *turns: str) -> str:
    """A SQLite store of LangGraph threads: one turn of a one-node graph per thread id in
    ``turns`` (a thread named twice gets two); returns its URL."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    from overnight.adapters.langgraph import OvernightSaver

    url = f"sqlite://{tmp_path / 'lg.db'}"
    g = StateGraph(MessagesState)
    g.add_node("reply", lambda state: {"messages": [AIMessage("ok", id=f"m{len(state['messages'])}")]})
    g.add_edge(START, "reply")
    with OvernightSaver.from_url(url) as saver:
        app = g.compile(checkpointer=saver)
        for thread in turns:
            app.invoke({"messages": []}, {"configurable": {"thread_id": thread}})
    return url


def steps_source(task_id: str, steps: int) -> str:
    """The source of a task file: task ``task_id`` whose ``plan`` adds ``steps`` steps ``s(c)``,
    each setting ``ctx.state["n"]`` (one small checkpoint per step)."""
    return (f"import overnight\ntask = overnight.Task({task_id!r}, goal=\"{steps} small steps\")\n\n"
            "@task.step\ndef plan(ctx):\n"
            f"    for c in range({steps}):\n        ctx.add_step(\"s\", c=c)\n\n"
            "@task.step(planned=False)\ndef s(ctx, c):\n    ctx.state[\"n\"] = c\n")


def damage_head_record(db_path: Path, task_id: str) -> str:
    """Flip one byte of ``task_id``'s head record body in place (its ditto copy stays)."""
    db = sqlite3.connect(db_path, isolation_level=None)
    try:
        head = db.execute("SELECT checkpoint_id FROM refs WHERE task_id=? AND branch='main'", (task_id,)).fetchone()[0]
        body = bytes(db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0])
        db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (body[:-1] + bytes([body[-1] ^ 1]), head))
    finally:
        db.close()
    return head
