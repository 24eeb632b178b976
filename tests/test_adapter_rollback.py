"""A ref moved back is a rollback for the adapters too: the Agents SDK session, the LangGraph
checkpointer and the MCP coding tools refuse to serve (and build on) an older head while the
store holds newer records of its branch -- with and without a signing key -- as ``overnight
resume`` does. Real SQLite stores; the ref moved with the store's own API, as another writer of
the store would."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from overnight.errors import RollbackDetected
from overnight.store import open_store

KEY = "adapter-signing-key"


def _move_back(url: str, task_id: str, steps: int) -> str:
    """Point ``task_id``'s main ref ``steps`` commits back; returns the checkpoint it names now."""
    with open_store(url) as s:
        head = s.get_ref(task_id, "main")
        rows = {r.checkpoint_id: r for r in s.list_checkpoints(task_id)}
        target = head
        for _ in range(steps):
            target = rows[target].parent_id
        s.set_ref(task_id, "main", target, head)
    return target


@pytest.fixture(params=[False, True], ids=["nokey", "key"])
def signed(request, monkeypatch, tmp_path):
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(tmp_path / "state"))  # this machine's high-water file
    if request.param:
        monkeypatch.setenv("OVERNIGHT_SIGNING_KEY", KEY)
    else:
        monkeypatch.delenv("OVERNIGHT_SIGNING_KEY", raising=False)
    return request.param


def test_an_agents_session_refuses_a_ref_moved_back(tmp_path, signed):
    from overnight.adapters.openai_agents import OvernightSession, session_task_id

    url = f"sqlite://{tmp_path / 's.db'}"
    with OvernightSession("chat", store=url) as session:
        for i in range(4):
            asyncio.run(session.add_items([{"role": "user", "content": f"turn {i}"}]))
    _move_back(url, session_task_id("chat"), 2)
    with OvernightSession("chat", store=url) as again:
        with pytest.raises(RollbackDetected):
            asyncio.run(again.get_items())
        with pytest.raises(RollbackDetected):  # nothing is built on the older head either
            asyncio.run(again.add_items([{"role": "user", "content": "late"}]))


def test_a_langgraph_thread_refuses_a_ref_moved_back(tmp_path, signed):
    from langgraph.graph import START, MessagesState, StateGraph

    from overnight.adapters.langgraph import OvernightSaver

    def reply(state):
        return {"messages": [("ai", f"reply {len(state['messages'])}")]}

    g = StateGraph(MessagesState)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    url = f"sqlite://{tmp_path / 'lg.db'}"
    cfg = {"configurable": {"thread_id": "t"}}
    with OvernightSaver.from_url(url) as saver:
        app = g.compile(checkpointer=saver)
        for i in range(3):
            app.invoke({"messages": [("user", f"hi {i}")]}, cfg)
        task_id = next(t.task_id for t in saver.store.list_tasks())
    _move_back(url, task_id, 3)
    with OvernightSaver.from_url(url) as saver:
        app = g.compile(checkpointer=saver)
        with pytest.raises(RollbackDetected):
            app.get_state(cfg)


def test_the_mcp_tools_refuse_a_ref_moved_back(tmp_path, signed):
    from overnight.mcp.tasks import CodingTasks

    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "README.md").write_text("# proj\n")
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit",
                                                             "-qm", "initial"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    url = f"sqlite://{tmp_path / 's.db'}"
    with CodingTasks(url, project=repo) as t:
        cp = t.start("Document the parser", plan=["a", "b", "c"])
        for step in ("a", "b", "c"):
            t.checkpoint(cp.task_id, done=[step])
    _move_back(url, cp.task_id, 2)
    with CodingTasks(url, project=repo) as t, pytest.raises(RollbackDetected):
        t.resume(cp.task_id)


def test_a_writer_moving_on_is_not_a_rollback(tmp_path, signed):
    """Two sessions on one store: the other's commits are the branch moving on, never reported."""
    from overnight.adapters.openai_agents import OvernightSession

    url = f"sqlite://{tmp_path / 's.db'}"
    with OvernightSession("chat", store=url) as a, OvernightSession("chat", store=url) as b:
        for i in range(5):
            asyncio.run(a.add_items([{"role": "user", "content": f"a {i}"}]))
            asyncio.run(b.add_items([{"role": "user", "content": f"b {i}"}]))
        assert len(asyncio.run(a.get_items())) == 10 == len(asyncio.run(b.get_items()))
