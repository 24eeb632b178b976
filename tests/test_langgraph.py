"""OvernightSaver (overnight as a LangGraph checkpointer).

* the PyPI ``langgraph-checkpoint-conformance`` suite, every one of its tests, against
  OvernightSaver on SQLite and on the real PostgreSQL server;
* a graph with an interrupt killed with SIGKILL between supersteps (a real child process) resumes
  to the same result as an uninterrupted run;
* a fork via ``update_state`` keeps both branches separate after a reload;
* the overnight tools (verify) see LangGraph threads; unchanged channels are not stored again;
* a value no codec covers is refused with an error naming the channel;
* the README's LangGraph example runs.
"""

from __future__ import annotations

import asyncio
import operator
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance.spec import (  # noqa: E402
    test_copy_thread,
    test_delete_for_runs,
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_prune,
    test_put,
    test_put_writes,
)
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, Interrupt, Send, interrupt  # noqa: E402

from overnight import api  # noqa: E402
from overnight.adapters.langgraph import OvernightSaver  # noqa: E402
from overnight.errors import EncodeError  # noqa: E402
from overnight.store import open_store  # noqa: E402

from _procs import env, wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

SUITE = [
    fn
    for module, name in (
        (test_put, "ALL_PUT_TESTS"),
        (test_put_writes, "ALL_PUT_WRITES_TESTS"),
        (test_get_tuple, "ALL_GET_TUPLE_TESTS"),
        (test_list, "ALL_LIST_TESTS"),
        (test_delete_thread, "ALL_DELETE_THREAD_TESTS"),
        (test_delete_for_runs, "ALL_DELETE_FOR_RUNS_TESTS"),
        (test_copy_thread, "ALL_COPY_THREAD_TESTS"),
        (test_prune, "ALL_PRUNE_TESTS"),
    )
    for fn in getattr(module, name)
]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """A fresh, empty store URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'lg.db'}"
    url, schema = request.getfixturevalue("pg_schema")
    return f"{url}?schema={schema}"


@pytest.mark.parametrize("spec", SUITE, ids=lambda fn: fn.__name__)
def test_conformance(spec, store_url):
    """One test of the upstream suite, on a fresh saver (as ``validate`` gives each capability)."""
    with OvernightSaver.from_url(store_url) as saver:
        asyncio.run(spec(saver))


def test_every_capability_is_detected(tmp_path):
    """The suite's own capability detection sees all eight capabilities implemented (none of its
    tests is skipped as 'not implemented')."""
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, DetectedCapabilities

    with OvernightSaver.from_url(f"sqlite://{tmp_path / 'lg.db'}") as saver:
        assert DetectedCapabilities.from_instance(saver).detected == ALL_CAPABILITIES


# -- graphs ------------------------------------------------------------------------------------


class Items(TypedDict):
    items: Annotated[list, operator.add]


def _approval_graph():
    """a -> b (interrupts for approval) -> c -> d."""
    def a(s): return {"items": ["a"]}
    def b(s): return {"items": [f"b:{interrupt('approve?')}"]}
    def c(s): return {"items": ["c"]}
    def d(s): return {"items": [f"d:{len(s['items'])}"]}
    g = StateGraph(Items)
    for fn in (a, b, c, d):
        g.add_node(fn.__name__, fn)
    g.add_edge(START, "a"); g.add_edge("a", "b"); g.add_edge("b", "c"); g.add_edge("c", "d"); g.add_edge("d", END)
    return g


def _run_to_end(saver, thread: str):
    app = _approval_graph().compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": thread}}
    first = app.invoke({"items": []}, cfg)
    assert "__interrupt__" in first
    return app.invoke(Command(resume="yes"), cfg)


CHILD = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    from test_langgraph import _approval_graph
    from overnight.adapters.langgraph import OvernightSaver
    from langgraph.types import Command

    def c_then_die(s):
        # the checkpoint after b is committed; die before c's superstep completes
        open({marker!r}, "w").write("c")
        time.sleep(60)
        return {{"items": ["c"]}}

    g = _approval_graph()
    g.nodes["c"].runnable.func = c_then_die if {die!r} else g.nodes["c"].runnable.func
    app = g.compile(checkpointer=OvernightSaver.from_url({url!r}))
    cfg = {{"configurable": {{"thread_id": "t"}}}}
    if sys.argv[1] == "start":
        app.invoke({{"items": []}}, cfg)
    else:
        app.invoke(Command(resume="yes"), cfg, durability={durability!r})
""")


def test_sigkill_between_supersteps_resumes_to_the_same_result(tmp_path):
    """Process 1 runs to the interrupt; process 2 resumes with the approval and is SIGKILLed in
    the superstep after it; this process (same graph, fresh saver) finishes the run: the final
    state equals an uninterrupted run's. ``durability="sync"``: each superstep's checkpoint is
    committed before the next one starts (LangGraph's ``"async"`` default commits it while the
    next superstep runs, so a kill may lose the newest superstep, as LangGraph documents)."""
    durability = "sync"
    url = f"sqlite://{tmp_path / 'lg.db'}"
    marker = tmp_path / "in-c"

    def child(mode: str, die: bool) -> subprocess.Popen:
        code = CHILD.format(tests=str(Path(__file__).parent), marker=str(marker), die=die, url=url,
                                durability=durability)
        return subprocess.Popen([sys.executable, "-c", code, mode], env=env(), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    p = child("start", False)
    assert p.wait(timeout=60) == 0, p.stderr.read().decode()
    p = child("resume", True)
    wait_for(marker.exists, timeout=60, what="the child to reach node c")
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=10) == -signal.SIGKILL

    with OvernightSaver.from_url(url) as saver:
        app = _approval_graph().compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "t"}}
        assert app.get_state(cfg).next == ("c",)  # b's superstep survived the kill
        resumed = app.invoke(None, cfg)
        with OvernightSaver.from_url(f"sqlite://{tmp_path / 'ref.db'}") as ref:
            assert resumed == _run_to_end(ref, "t")
        assert resumed == {"items": ["a", "b:yes", "c", "d:3"]}
    report = api.verify("langgraph:t", store=url)
    assert report.ok, report


def test_update_state_fork_keeps_both_branches_after_reload(tmp_path):
    url = f"sqlite://{tmp_path / 'lg.db'}"
    cfg = {"configurable": {"thread_id": "f"}}
    with OvernightSaver.from_url(url) as saver:
        done = _run_to_end(saver, "f")
        app = _approval_graph().compile(checkpointer=saver)
        # go back to the interrupt at b and answer differently: a fork from an older checkpoint
        at_b = next(s for s in app.get_state_history(cfg) if s.next == ("b",))
        forked = app.update_state(at_b.config, {"items": ["edited"]})
        alt = app.invoke(Command(resume="no"), forked)
    assert done == {"items": ["a", "b:yes", "c", "d:3"]}
    assert alt == {"items": ["a", "edited", "b:no", "c", "d:4"]}

    with OvernightSaver.from_url(url) as again:  # a new saver instance: nothing cached
        app = _approval_graph().compile(checkpointer=again)
        history = list(app.get_state_history(cfg))
        done_id = next(s for s in history if s.values.get("items") == done["items"]).config["configurable"]["checkpoint_id"]
        original = app.get_state({"configurable": {**cfg["configurable"], "checkpoint_id": done_id}})
        latest = app.get_state(cfg)
    assert original.values == done
    assert latest.values == alt  # the newest checkpoint is the fork's
    assert [s.values for s in history].count(done) == 1 and [s.values for s in history].count(alt) == 1
    # in overnight terms: the original history is branch main, the fork another branch
    rows = sorted(open_store(url).list_checkpoints("langgraph:f"), key=lambda r: r.seq)
    branch_of = {r.step: r.branch for r in rows}
    assert branch_of[done_id] == "main"
    assert branch_of[latest.config["configurable"]["checkpoint_id"]].startswith("main@")


def test_unchanged_channels_are_not_stored_again(tmp_path):
    """A second checkpoint that changes one small channel stores far less than the big one."""
    url = f"sqlite://{tmp_path / 'lg.db'}"
    big = os.urandom(100_000).hex()  # incompressible enough: ~100 KB stored
    with OvernightSaver.from_url(url) as saver:
        c1 = saver.put({"configurable": {"thread_id": "u", "checkpoint_ns": ""}},
                       _cp("1", {"big": big, "n": 1}, {"big": 1, "n": 1}), {}, {"big": 1, "n": 1})
        saver.put(c1, _cp("2", {"big": big, "n": 2}, {"big": 1, "n": 2}), {}, {"n": 2})
        rows = saver.store.list_checkpoints("langgraph:u")
        assert saver.get_tuple(c1).checkpoint["channel_values"]["big"] == big
    # (the second commit also carries ditto copies of the big value's chunk index, now shared: ~2 KB)
    assert rows[1].stored_bytes < 8_000 < rows[0].stored_bytes


def _cp(n: str, values, versions):
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    return generate_checkpoint(checkpoint_id=f"00000000-0000-6000-8000-00000000000{n}", channel_values=values,
                               channel_versions=versions)


def test_unsupported_value_is_refused_naming_the_channel(tmp_path):
    class Opaque:  # no codec covers it (and never pickle)
        pass

    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url) as saver:
        cfg = {"configurable": {"thread_id": "bad", "checkpoint_ns": ""}}
        with pytest.raises(EncodeError, match=r"channel 'scratch'") as err:
            saver.put(cfg, _cp("1", {"ok": [1], "scratch": {"k": Opaque()}}, {"ok": 1, "scratch": 1}), {},
                      {"ok": 1, "scratch": 1})
        assert err.value.task_id == "langgraph:bad"
        assert saver.get_tuple(cfg) is None  # nothing was written
        stored = saver.put(cfg, _cp("2", {"ok": [1]}, {"ok": 1}), {}, {"ok": 1})
        with pytest.raises(EncodeError, match=r"write to channel 'out'"):
            saver.put_writes(stored, [("out", Opaque())], "task-1")
        assert saver.get_tuple(stored).pending_writes == []


def test_docs_example_runs(tmp_path):
    """The README's LangGraph example, run as written (offline, fake chat model)."""
    text = (ROOT / "README.md").read_text().split("## Use with LangGraph", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verified" in out.stdout and "turns: 3" in out.stdout, out.stdout


def test_bench_langgraph_prints_both_savers(tmp_path):
    """``overnight bench langgraph`` runs both savers on the same turns (it asserts they end with
    the same transcript) and prints the table with the ratios."""
    out = subprocess.run([sys.executable, "-m", "overnight", "bench", "langgraph", "--turns", "6", "--dir",
                          str(tmp_path)], env=env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| overnight") or line.startswith("| LangGraph")]
    assert len(rows) == 2 and "| 1.000x |" in rows[1], out.stdout
    assert not any(tmp_path.iterdir())  # the temporary databases are removed


def test_messages_round_trip_through_a_new_saver(tmp_path):
    """LangChain messages (all kinds, with tool calls and usage) come back equal from another
    saver instance: stored by overnight's codec, not pickle."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    msgs = [SystemMessage("be brief"), HumanMessage("2+2?", id="h1"),
            AIMessage("", id="a1", tool_calls=[{"name": "add", "args": {"a": 2, "b": 2}, "id": "t1"}],
                      usage_metadata={"input_tokens": 3, "output_tokens": 5, "total_tokens": 8}),
            ToolMessage("4", tool_call_id="t1"), AIMessage("4 — ✓", id="a2", response_metadata={"model": "fake"})]
    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url) as saver:
        stored = saver.put({"configurable": {"thread_id": "m", "checkpoint_ns": ""}},
                           _cp("1", {"messages": msgs}, {"messages": 1}), {}, {"messages": 1})
        saver.put_writes(stored, [("messages", [AIMessage("late", id="a3")])], "task-1", "~__pregel_pull, chat")
        saver.put_writes(stored, [("__pregel_tasks", Send("chat", {"n": 1})),
                                  ("__interrupt__", (Interrupt("ok?", id="i1"),))], "task-2", "~__pregel_pull, ask")
    with OvernightSaver.from_url(url) as again:
        tup = again.get_tuple(stored)
    assert tup.checkpoint["channel_values"]["messages"] == msgs
    assert [type(m) for m in tup.checkpoint["channel_values"]["messages"]] == [type(m) for m in msgs]
    # in LangGraph's order (task path, task id, index; special channels have negative indexes)
    assert tup.pending_writes == [("task-2", "__interrupt__", (Interrupt("ok?", id="i1"),)),
                                  ("task-2", "__pregel_tasks", Send("chat", {"n": 1})),
                                  ("task-1", "messages", [AIMessage("late", id="a3")])]


def test_overnight_tools_work_on_threads(tmp_path):
    """``log`` lists a thread's LangGraph checkpoints; after ``prune`` and ``delete_thread``,
    ``gc`` reclaims what only they used, and what remains still loads and verifies."""
    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url) as saver:
        done_x = _run_to_end(saver, "x")
        done_y = _run_to_end(saver, "y")
        _run_to_end(saver, "z")
        ids = {t.config["configurable"]["checkpoint_id"] for t in saver.list({"configurable": {"thread_id": "x"}})}
        assert ids <= {e.row.step for e in api.log("langgraph:x", store=url)}
        before = sum(o.stored_bytes for o in saver.store.iter_object_stats())
        saver.prune(["x"])
        saver.delete_thread("z")
        report = api.gc(store=url, apply=True, grace=0)
        assert report.checkpoints_deleted == 0 and report.objects_deleted > 0  # prune deleted the records
        app = _approval_graph().compile(checkpointer=saver)
        assert app.get_state({"configurable": {"thread_id": "x"}}).values == done_x
        assert len(list(saver.list({"configurable": {"thread_id": "x"}}))) == 1
        assert app.get_state({"configurable": {"thread_id": "y"}}).values == done_y
        assert saver.get_tuple({"configurable": {"thread_id": "z"}}) is None
        # the objects left take less room (the file itself keeps its pages until a VACUUM, and its
        # WAL grows with gc's own writes, so the file size is not the measure)
        assert sum(o.stored_bytes for o in saver.store.iter_object_stats()) < before
    report = api.verify(store=url)
    assert report.ok, report


def test_delete_for_runs_in_the_middle_keeps_a_verifiable_chain(tmp_path):
    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url) as saver:
        cfg = {"configurable": {"thread_id": "r", "checkpoint_ns": ""}}
        for n, run in (("1", "run-a"), ("2", "run-b"), ("3", "run-a")):
            cfg = saver.put(cfg, _cp(n, {"n": int(n)}, {"n": int(n)}), {"run_id": run}, {"n": int(n)})
        saver.put_writes(cfg, [("n", 4)], "task-1")
        saver.delete_for_runs(["run-b"])
        left = list(saver.list({"configurable": {"thread_id": "r"}}))
        assert [t.checkpoint["channel_values"]["n"] for t in left] == [3, 1]
        assert left[0].pending_writes == [("task-1", "n", 4)]
    report = api.verify("langgraph:r", store=url)
    assert report.ok, report


def test_drift_report_names_a_changed_lock_file(tmp_path):
    """Every checkpoint records the world (installed distributions, lock files, Python,
    platform); ``drift`` compares it with now -- here a dependency pin edited after the run."""
    (tmp_path / "requirements.txt").write_text("langgraph==1.0\n")
    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url, project_root=tmp_path) as saver:
        _run_to_end(saver, "w")
        cfg = {"configurable": {"thread_id": "w"}}
        assert not saver.drift(cfg).drifted
        (tmp_path / "requirements.txt").write_text("langgraph==2.0\n")
        report = saver.drift(cfg)
    assert report.components() == ["deps"]
    assert [i.key for i in report.items] == ["lock file requirements.txt"]


# -- damage, concurrency and odd input (the QA report's defects) --------------------------------


def _echo_graph():
    from langchain_core.messages import AIMessage
    from langgraph.graph import MessagesState

    g = StateGraph(MessagesState)
    g.add_node("chat", lambda s: {"messages": [AIMessage("echo:" + s["messages"][-1].content)]})
    g.add_edge(START, "chat")
    return g


def _chat(url: str, thread: str, questions: str) -> None:
    from langchain_core.messages import HumanMessage

    with OvernightSaver.from_url(url) as saver:
        app = _echo_graph().compile(checkpointer=saver)
        for q in questions:
            app.invoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": thread}})


def _sql(url: str, statement: str) -> None:
    import sqlite3

    with sqlite3.connect(url[len("sqlite://"):]) as db:
        db.execute(statement)


def test_a_damaged_step_column_does_not_change_which_checkpoint_is_newest(tmp_path):
    """The store's ``step`` column is a copy outside the record's digest: overwriting the oldest
    record's with an id sorting after every real one changes nothing the saver returns."""
    from langchain_core.messages import HumanMessage

    url = f"sqlite://{tmp_path / 'lg.db'}"
    _chat(url, "t1", "abc")
    _sql(url, "update checkpoints set step='ffffffff-ffff-6fff-8fff-ffffffffffff' where seq=0")
    cfg = {"configurable": {"thread_id": "t1"}}
    with OvernightSaver.from_url(url) as saver:
        app = _echo_graph().compile(checkpointer=saver)
        assert [m.content for m in app.get_state(cfg).values["messages"]] == \
            ["a", "echo:a", "b", "echo:b", "c", "echo:c"]
        app.invoke({"messages": [HumanMessage("d")]}, cfg)
        assert len(app.get_state(cfg).values["messages"]) == 8
        assert all(not t.config["configurable"]["checkpoint_id"].startswith("ffffffff") for t in saver.list(cfg))


def test_a_missing_head_record_raises_naming_the_thread(tmp_path):
    """The branch ``main`` names a record that was deleted: no older checkpoint is served in its
    place (its pending writes would be lost); reading the thread raises ThreadCorrupt."""
    from overnight.errors import ThreadCorrupt

    url = f"sqlite://{tmp_path / 'lg.db'}"
    _chat(url, "t1", "abc")
    _sql(url, "delete from checkpoints where seq >= (select max(seq) - 1 from checkpoints)")
    cfg = {"configurable": {"thread_id": "t1"}}
    with OvernightSaver.from_url(url) as saver:
        for read in (lambda: saver.get_tuple(cfg), lambda: list(saver.list(cfg)),
                     lambda: saver.put_writes({"configurable": {**cfg["configurable"], "checkpoint_id": "x"}},
                                              [("a", 1)], "task-1")):
            with pytest.raises(ThreadCorrupt, match=r"LangGraph thread 't1': branch 'main' names checkpoint \w+, "
                                                    r"which is missing") as err:
                read()
            assert err.value.thread_id == "t1" and err.value.task_id == "langgraph:t1"
            assert "overnight verify langgraph:t1" in err.value.hint


def test_a_damaged_record_or_blob_raises_naming_the_thread(tmp_path):
    """A record body edited in place, and a channel blob removed from the store: each read raises
    ThreadCorrupt naming the thread, the checkpoint (and the missing object), with a hint."""
    from overnight.errors import ThreadCorrupt
    from overnight.chain.integrity import load_checkpoint

    url = f"sqlite://{tmp_path / 'lg.db'}"
    _chat(url, "t1", "ab")
    _chat(url, "t2", "ab")
    cfg = {"configurable": {"thread_id": "t1"}}
    with OvernightSaver.from_url(url) as saver:
        rows = sorted(saver.store.list_checkpoints("langgraph:t1"), key=lambda r: r.seq)
        old = saver.get_tuple({"configurable": {"thread_id": "t2"}})
        message_blob = load_checkpoint(saver.store, saver.store.get_ref("langgraph:t2", "main")) \
            .artifacts["channel/messages"].digest
    _sql(url, f"update checkpoints set body=cast(replace(body, 'langgraph', 'langgraf') as blob) "
              f"where checkpoint_id='{rows[1].checkpoint_id}'")
    with OvernightSaver.from_url(url) as saver, pytest.raises(ThreadCorrupt, match=r"LangGraph thread 't1': checkpoint "
                                                                                    r"\w+ failed verification") as err:
        saver.get_tuple(cfg)
    assert err.value.checkpoint_id == rows[1].checkpoint_id and err.value.hint
    with OvernightSaver.from_url(url) as saver:
        digests = {d for d in saver.store.iter_object_digests()}
    assert old is not None and message_blob in digests
    _sql(url, f"delete from objects where digest='{message_blob}'")
    with OvernightSaver.from_url(url) as saver, pytest.raises(ThreadCorrupt, match=r"LangGraph thread 't2'") as err:
        saver.get_tuple(old.config)
    assert err.value.object_digest == message_blob and "overnight verify langgraph:t2" in err.value.hint


def test_an_unknown_stored_type_names_the_thread(tmp_path, monkeypatch):
    """A value whose class is not importable when read back raises UnknownTypeError naming the
    thread's task."""
    from overnight.errors import UnknownTypeError

    (tmp_path / "lgfix_shapes.py").write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Box:\n"
                                             "    n: int\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lgfix_shapes

    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url) as saver:
        stored = saver.put({"configurable": {"thread_id": "u", "checkpoint_ns": ""}},
                           _cp("1", {"box": lgfix_shapes.Box(1)}, {"box": 1}), {}, {"box": 1})
    monkeypatch.delitem(sys.modules, "lgfix_shapes")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    with OvernightSaver.from_url(url) as saver, pytest.raises(UnknownTypeError, match=r"thread 'u'") as err:
        saver.get_tuple(stored)
    assert err.value.task_id == "langgraph:u" and err.value.hint


WRITER = textwrap.dedent("""
    import os, sys
    from overnight.adapters.langgraph import OvernightSaver
    url, n, go, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    with OvernightSaver.from_url(url) as saver:
        saver.get_tuple({"configurable": {"thread_id": "T"}})  # the index is built before the race starts
        open(go + "." + n, "w").close()
        while not os.path.exists(go):
            pass
        for target in targets:
            cfg = {"configurable": {"thread_id": "T", "checkpoint_ns": "", "checkpoint_id": target}}
            saver.put_writes(cfg, [("x", "from-" + n)], "task-" + n)
    print("acknowledged")
""")


def test_concurrent_put_writes_from_processes_keep_every_acknowledged_write(store_url, tmp_path):
    """Four processes write at the same instant to the same two checkpoints: one no longer at
    its branch's head (each writer starts a side branch), then the head (compare-and-swap on the
    branch). Every write acknowledged by a returning ``put_writes`` is read back, on SQLite and
    PostgreSQL, and the thread still verifies."""
    with OvernightSaver.from_url(store_url) as saver:
        c1 = saver.put({"configurable": {"thread_id": "T", "checkpoint_ns": ""}}, _cp("1", {"x": 1}, {"x": 1}), {},
                       {"x": 1})
        c2 = saver.put(c1, _cp("2", {"x": 2}, {"x": 2}), {}, {"x": 2})
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, store_url, str(n), str(go),
                               c1["configurable"]["checkpoint_id"], c2["configurable"]["checkpoint_id"]],
                              env=env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    wait_for(lambda: all((tmp_path / f"go.{n}").exists() or procs[n].poll() is not None for n in range(4)),
             timeout=60, what="the writers to be ready")
    go.touch()
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 and out.strip() == "acknowledged" for p, (out, _) in zip(procs, outs)), outs
    with OvernightSaver.from_url(store_url) as saver:
        for cfg in (c1, c2):
            got = saver.get_tuple(cfg)
            assert sorted(got.pending_writes) == [(f"task-{n}", "x", f"from-{n}") for n in range(4)]
        # a later write to the older one carries all of them on
        saver.put_writes(c1, [("x", "late")], "task-9")
        assert len(saver.get_tuple(c1).pending_writes) == 5
    report = api.verify("langgraph:T", store=store_url)
    assert report.ok, report


def test_a_thread_id_that_is_not_valid_text_round_trips(tmp_path):
    """A thread id with a lone surrogate is stored under a hashed task id and read back as given;
    a namespace or checkpoint id like it is refused before anything is written."""
    from overnight.errors import ConfigError

    url = f"sqlite://{tmp_path / 'lg.db'}"
    bad = "bad\ud800"
    with OvernightSaver.from_url(url) as saver:
        stored = saver.put({"configurable": {"thread_id": bad, "checkpoint_ns": ""}}, _cp("1", {"x": 1}, {"x": 1}), {},
                           {"x": 1})
        saver.put_writes(stored, [("x", 2)], "task-1")
        assert saver.task_id(bad).startswith("langgraph:sha256-") and saver.task_id(bad) != saver.task_id("bad\ud801")
    with OvernightSaver.from_url(url) as saver:
        got = saver.get_tuple({"configurable": {"thread_id": bad}})
        assert got.config["configurable"]["thread_id"] == bad and got.pending_writes == [("task-1", "x", 2)]
        assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == [bad]
        for conf in ({"thread_id": "ok", "checkpoint_ns": "ns\udc80"}, {"thread_id": "ok", "checkpoint_ns": ""}):
            cp = _cp("2", {"x": 1}, {"x": 1})
            if not conf["checkpoint_ns"]:
                cp["id"] = "id\udc80"
            with pytest.raises(ConfigError, match=r"thread 'ok': checkpoint (namespace|id) .* not valid Unicode"):
                saver.put({"configurable": conf}, cp, {}, {"x": 1})
        assert saver.get_tuple({"configurable": {"thread_id": "ok"}}) is None
    report = api.verify(saver.task_id(bad), store=url)
    assert report.ok, report


def test_writes_before_their_checkpoint_are_refused_or_stored_at_once(tmp_path):
    """``put_writes`` before its checkpoint's ``put``: a value no codec covers is refused by
    ``put_writes`` itself (nothing stored); good writes are durable when it returns -- a saver in
    another process that then stores the checkpoint returns them with it."""
    class Opaque:
        pass

    url = f"sqlite://{tmp_path / 'lg.db'}"
    cp = _cp("1", {"a": 1}, {"a": 1})
    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cp["id"]}}
    with OvernightSaver.from_url(url) as saver:
        with pytest.raises(EncodeError, match=r"write to channel 'a'"):
            saver.put_writes(cfg, [("a", Opaque())], "task-1")
        assert saver.store.list_checkpoints("langgraph:t") == []
        saver.put_writes(cfg, [("a", 2)], "task-1")
        saver.put_writes(cfg, [("a", 3)], "task-2")
        assert saver.get_tuple(cfg) is None  # no checkpoint yet: nothing to return
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_langgraph import _cp
        from overnight.adapters.langgraph import OvernightSaver
        with OvernightSaver.from_url({url!r}) as saver:
            cfg = {{"configurable": {{"thread_id": "t", "checkpoint_ns": ""}}}}
            saver.put(cfg, _cp("1", {{"a": 1}}, {{"a": 1}}), {{}}, {{"a": 1}})
    """)
    out = subprocess.run([sys.executable, "-c", code], env=env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    with OvernightSaver.from_url(url) as saver:
        got = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert got.checkpoint["channel_values"] == {"a": 1}
        assert got.pending_writes == [("task-1", "a", 2), ("task-2", "a", 3)]
        assert [t.config for t in saver.list(None)] == [got.config]
        saver.put_writes(cfg, [("a", 4)], "task-3")
        assert [w[0] for w in saver.get_tuple(cfg).pending_writes] == ["task-1", "task-2", "task-3"]
    report = api.verify("langgraph:t", store=url)
    assert report.ok, report


def test_prune_keeps_writes_whose_checkpoint_is_not_stored_yet(tmp_path):
    """``prune`` and ``delete_for_runs`` rewrite the thread; writes that arrived before their
    checkpoint survive it and come back with the checkpoint once it is stored."""
    url = f"sqlite://{tmp_path / 'lg.db'}"
    with OvernightSaver.from_url(url) as saver:
        cfg = {"configurable": {"thread_id": "p", "checkpoint_ns": ""}}
        for n in "12":
            cfg = saver.put(cfg, _cp(n, {"n": int(n)}, {"n": int(n)}), {"run_id": f"run-{n}"}, {"n": int(n)})
        early = {"configurable": {**cfg["configurable"], "checkpoint_id": _cp("3", {}, {})["id"]}}
        saver.put_writes(early, [("n", 30)], "task-3")
        saver.prune(["p"])
        saver.delete_for_runs(["run-1"])
        assert [t.checkpoint["channel_values"]["n"] for t in saver.list({"configurable": {"thread_id": "p"}})] == [2]
        saver.put(cfg, _cp("3", {"n": 3}, {"n": 3}), {"run_id": "run-3"}, {"n": 3})
        assert saver.get_tuple(early).pending_writes == [("task-3", "n", 30)]
    report = api.verify("langgraph:p", store=url)
    assert report.ok, report
