"""OvernightSession: the OpenAI Agents SDK session protocol on overnight stores.

Real stores (SQLite files, a directory store, the local PostgreSQL), real threads and real
processes; the agent run uses the SDK's own offline ``ScriptedModel``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, set_tracing_disabled  # noqa: E402
from agents.memory import Session, SessionSettings  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message  # noqa: E402

from _procs import env, wait_for  # noqa: E402
from overnight.adapters.openai_agents import OvernightSession, session_task_id  # noqa: E402
from overnight.api import log, rollback  # noqa: E402
from overnight.errors import ConfigError, EncodeError, SessionCorrupt  # noqa: E402
from overnight.runtime.session import summary_tokens  # noqa: E402
from overnight.store import open_store  # noqa: E402
from overnight.store.sqlite import SQLiteStore  # noqa: E402

set_tracing_disabled(True)

ROOT = Path(__file__).resolve().parents[1]


def msg(role: str, text: str) -> dict[str, str]:
    return {"role": role, "content": text}


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(params=["sqlite", "file", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/agents.db"
    if request.param == "file":
        return f"file://{tmp_path}/store"
    url, schema = request.getfixturevalue("pg_schema")
    return f"{url}?schema={schema}"


def test_protocol_order_limit_pop_clear_and_reopen(store_url):
    s = OvernightSession("chat-1", store=store_url)
    assert isinstance(s, Session)
    assert run(s.get_items()) == [] and run(s.pop_item()) is None
    first = [msg("user", "Hi"), msg("assistant", "Hello!")]
    second = [msg("user", "Weather?"), {"type": "function_call", "call_id": "c1", "name": "weather",
                                        "arguments": "{\"city\":\"Oslo\"}"},
              {"type": "function_call_output", "call_id": "c1", "output": "rain"}, msg("assistant", "Rain.")]
    run(s.add_items(first))
    run(s.add_items(second))
    assert run(s.get_items()) == first + second
    assert run(s.get_items(limit=2)) == second[-2:]
    assert run(s.get_items(limit=100)) == first + second
    assert run(s.get_items(limit=0)) == []
    assert run(OvernightSession("chat-1", store=store_url, session_settings=SessionSettings(limit=3)).get_items()) \
        == second[-3:]
    assert run(s.pop_item()) == msg("assistant", "Rain.")
    other = OvernightSession("chat-1", store=store_url)  # a new object sees what the first wrote
    assert run(other.get_items()) == first + second[:-1]
    assert run(OvernightSession("chat-2", store=store_url).get_items()) == []  # sessions are separate
    run(other.clear_session())
    assert run(s.get_items()) == [] and run(s.pop_item()) is None
    run(s.add_items([msg("user", "again")]))
    assert run(other.get_items()) == [msg("user", "again")]
    s.close()
    other.close()


def test_history_is_checkpoints_and_every_change_verifies(tmp_path):
    url = f"sqlite://{tmp_path}/a.db"
    with OvernightSession("user 42/ä", store=url) as s:  # not a valid task id: hashed
        run(s.add_items([msg("user", "a"), msg("user", "b")]))
        run(s.pop_item())
        run(s.clear_session())
        assert s.task_id == session_task_id("user 42/ä") and re.fullmatch(r"agents\.[0-9a-f]{40}", s.task_id)
    entries = [e.row for e in reversed(log(s.task_id, store=url))]
    assert [e.step for e in entries] == ["add_items", "pop_item", "clear_session"]
    out = subprocess.run([sys.executable, "-m", "overnight", "verify", s.task_id, "--store", url],
                         capture_output=True, text=True, env=env(), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    first = entries[0]
    with OvernightSession("user 42/ä", store=url) as s:
        assert run(s.get_items_at(first.checkpoint_id)) == [msg("user", "a"), msg("user", "b")]


def test_reopen_from_another_process(tmp_path):
    url = f"sqlite://{tmp_path}/a.db"
    code = ("import asyncio, json, sys\n"
            "from overnight.adapters.openai_agents import OvernightSession\n"
            "s = OvernightSession('shared', store=sys.argv[1])\n"
            "print(json.dumps(asyncio.run(s.get_items())))\n"
            "asyncio.run(s.add_items([{'role': 'assistant', 'content': 'from the child'}]))\n")
    with OvernightSession("shared", store=url) as s:
        run(s.add_items([msg("user", "from the parent"), msg("user", "€ \u2028 \ud800 😀")]))
        out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env(), timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [msg("user", "from the parent"), msg("user", "€ \u2028 \ud800 😀")]
        assert run(s.get_items(limit=1)) == [msg("assistant", "from the child")]


def test_order_kept_when_timestamps_collide(tmp_path, monkeypatch):
    # every checkpoint and item gets the same timestamp; order must still be insertion order,
    # and identical items (stored once, by digest) keep their own positions
    import overnight.chain.write as chain

    monkeypatch.setattr(chain, "utc_now", lambda: "2026-01-01T00:00:00.000000+00:00")
    stamp = "2026-01-01T00:00:00Z"
    with OvernightSession("same-time", store=f"sqlite://{tmp_path}/a.db") as s:
        expected = []
        for i in range(30):
            batch = [{"role": "user", "content": f"m{i}", "created_at": stamp}, msg("assistant", "ok")]
            run(s.add_items(batch))
            expected += batch
        assert run(s.get_items()) == expected
        assert run(s.pop_item()) == msg("assistant", "ok")
        assert run(s.pop_item()) == {"role": "user", "content": "m29", "created_at": stamp}
        assert run(OvernightSession("same-time", store=f"sqlite://{tmp_path}/a.db").get_items()) == expected[:-2]


def _pop_all(session: OvernightSession, into: list, errors: list) -> None:
    async def loop() -> None:
        while (item := await session.pop_item()) is not None:
            into.append(item["content"])
            # as an agent does between turns: a session whose cached head is current commits at once,
            # so without a pause one thread can win every race and the pops never overlap
            await asyncio.sleep(random.uniform(0, 0.01))
    try:
        asyncio.run(loop())
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize("shared, medium", [(True, "sqlite"), (False, "sqlite"), (False, "postgres")],
                         ids=["one-object", "object-per-thread", "postgres"])
def test_eight_threads_pop_each_item_exactly_once(request, tmp_path, shared, medium):
    if medium == "postgres":
        server, schema = request.getfixturevalue("pg_schema")
        url = f"{server}?schema={schema}"
    else:
        url = f"sqlite://{tmp_path}/a.db"
    n = 96
    with OvernightSession("busy", store=url) as s:
        run(s.add_items([msg("user", f"item {i}") for i in range(n)]))
    sessions = [OvernightSession("busy", store=url)] * 8 if shared else [OvernightSession("busy", store=url) for _ in range(8)]
    got: list[list[str]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_pop_all, args=(sessions[i], got[i], errors)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    popped = [x for g in got for x in g]
    assert len(popped) == n and set(popped) == {f"item {i}" for i in range(n)}  # none twice, none lost
    for g in got:  # each thread saw the newest item first
        assert g == sorted(g, key=lambda x: -int(x.split()[1]))
    assert sum(1 for g in got if g) >= 2  # the pops did run concurrently
    assert run(OvernightSession("busy", store=url).get_items()) == []
    for x in set(map(id, sessions)):
        next(s for s in sessions if id(s) == x).close()


@pytest.mark.slow
def test_two_processes_pop_each_item_exactly_once(tmp_path):
    url = f"sqlite://{tmp_path}/a.db"
    n = 80
    with OvernightSession("procs", store=url) as s:
        run(s.add_items([msg("user", f"item {i}") for i in range(n)]))
    # each pops, then works a little (0-20 ms) before the next pop, as an agent does between turns:
    # in a tight loop the process whose copy of the head is current wins nearly every race
    code = ("import asyncio, json, random, sys, time\n"
            "from pathlib import Path\n"
            "from overnight.adapters.openai_agents import OvernightSession\n"
            "s = OvernightSession('procs', store=sys.argv[1])\n"
            "Path(sys.argv[2] + '.ready').touch()\n"
            "while not Path(sys.argv[2]).exists():\n"
            "    time.sleep(0.005)\n"
            "async def main():\n"
            "    got = []\n"
            "    while (item := await s.pop_item()) is not None:\n"
            "        got.append(item['content'])\n"
            "        await asyncio.sleep(random.uniform(0, 0.02))\n"
            "    print(json.dumps(got))\n"
            "asyncio.run(main())\n")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", code, url, f"{go}{k}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env()) for k in range(2)]
    wait_for(lambda: all(Path(f"{go}{k}.ready").exists() for k in range(2)), 120, what="both processes ready")
    for k in range(2):  # start both at once: they pop concurrently
        Path(f"{go}{k}").touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    got = [json.loads(o[0]) for o in outs]
    popped = [x for g in got for x in g]
    assert len(popped) == n and set(popped) == {f"item {i}" for i in range(n)}  # none twice, none lost
    assert all(got), [len(g) for g in got]  # both processes did pop


def test_concurrent_adds_lose_nothing(tmp_path):
    url = f"sqlite://{tmp_path}/a.db"
    errors: list[BaseException] = []

    def add(k: int) -> None:
        try:
            s = OvernightSession("adds", store=url)
            for i in range(10):
                run(s.add_items([msg("user", f"{k}-{i}")]))
            s.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    items = [i["content"] for i in run(OvernightSession("adds", store=url).get_items())]
    assert sorted(items) == sorted(f"{k}-{i}" for k in range(4) for i in range(10))
    for k in range(4):  # each writer's items in the order it added them
        mine = [x for x in items if x.startswith(f"{k}-")]
        assert mine == [f"{k}-{i}" for i in range(10)]



class _FirstCommitLandsBetween(SQLiteStore):
    """A real SQLite store whose first ``get_task`` lets another session's first commit land
    before it answers: the window between a first use's ref read (no ref yet) and its task read,
    held open."""

    def __init__(self, path: Path, other: OvernightSession) -> None:
        super().__init__(path)
        self.other, self.fired = other, False

    def get_task(self, task_id):
        if not self.fired:
            self.fired = True
            run(self.other.add_items([msg("user", "theirs")]))
        return super().get_task(task_id)


def test_first_use_while_another_writer_creates_the_session(tmp_path):
    # the first commit of another writer lands between this one's ref read and its task read
    db = tmp_path / "a.db"
    with OvernightSession("raced", store=f"sqlite://{db}") as other:
        store = _FirstCommitLandsBetween(db, other)
        with OvernightSession("raced", store=store) as s:
            run(s.add_items([msg("user", "mine")]))
            assert store.fired
            assert [i["content"] for i in run(s.get_items())] == ["theirs", "mine"]
        store.close()
    # a session task whose branch is really gone is still refused, naming the branch
    store = open_store(f"sqlite://{db}")
    task = session_task_id("raced")
    store.set_ref(task, "main", None, store.get_ref(task, "main"))
    with pytest.raises(ConfigError, match="has no branch 'main'"):
        run(OvernightSession("raced", store=store).get_items())
    store.close()


def _first_use(s: OvernightSession, k: int) -> None:
    """One writer's first use of a session others are creating: writer 0 adds at once, the
    others read until they see it -- each read a first use racing writer 0's first commit (the
    Session protocol's ``get_items`` is ``_get_items`` run in a worker thread; called directly, a
    read takes microseconds and the race is probed thousands of times a round) -- then add."""
    if k:
        while not s._get_items(None):
            pass
    run(s.add_items([msg("user", f"{k}")]))


def test_concurrent_first_uses_lose_nothing(tmp_path):
    # rounds of 3 threads, each with its own store object, using a new session at once (the first
    # round also on a new store); before the fix a reader that saw no ref, then the task, raised
    rounds, n = 40, 3
    url = f"sqlite://{tmp_path}/a.db"
    stores = [open_store(url) for _ in range(n)]
    for r in range(rounds):
        errors: list[BaseException] = []
        barrier = threading.Barrier(n)

        def use(k: int) -> None:
            try:
                s = OvernightSession(f"first-{r}", store=stores[k])
                barrier.wait(60)
                _first_use(s, k)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=use, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, (r, errors)
        items = run(OvernightSession(f"first-{r}", store=stores[0]).get_items())
        assert items[0]["content"] == "0" and sorted(i["content"] for i in items) == [str(k) for k in range(n)]
    for store in stores:
        store.close()


def test_concurrent_first_uses_in_processes(tmp_path):
    # the same across 2 processes, meeting at a file barrier every round (round 0 on a new store)
    rounds, n = 30, 2
    url = f"sqlite://{tmp_path}/a.db"
    code = ("import asyncio, os, sys\n"
            "from overnight.adapters.openai_agents import OvernightSession\n"
            "from overnight.store import open_store\n"
            "url, d, k, rounds, n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])\n"
            "store = open_store(url)\n"
            "def one(r):\n"
            "    s = OvernightSession(f'first-{r}', store=store)\n"
            "    open(f'{d}/ready-{r}-{k}', 'w').close()\n"
            "    while not all(os.path.exists(f'{d}/ready-{r}-{j}') for j in range(n)):\n"
            "        if os.path.exists(f'{d}/failed'):\n"  # the other process failed: do not wait for it
            "            sys.exit('the other process failed')\n"
            "        os.sched_yield()\n"
            "    while k and not s._get_items(None):\n"  # as _first_use
            "        pass\n"
            "    asyncio.run(s.add_items([{'role': 'user', 'content': str(k)}]))\n"
            "try:\n"
            "    for r in range(rounds):\n"
            "        one(r)\n"
            "except BaseException:\n"
            "    open(f'{d}/failed', 'w').close()\n"
            "    raise\n"
            "store.close()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, url, str(tmp_path), str(k), str(rounds), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
             for k in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    with open_store(url) as store:
        for r in range(rounds):
            items = run(OvernightSession(f"first-{r}", store=store).get_items())
            assert items[0]["content"] == "0" and sorted(i["content"] for i in items) == [str(k) for k in range(n)]


def _damage_object(db: Path, digest: str) -> None:
    conn = sqlite3.connect(db)
    with conn:
        row = conn.execute("SELECT size FROM objects WHERE digest=?", (digest,)).fetchone()
        conn.execute("UPDATE objects SET codec='none', data=? WHERE digest=?", (b"x" * row[0], digest))
    conn.close()


def test_corrupted_item_is_a_typed_error_naming_the_session(tmp_path):
    db = tmp_path / "a.db"
    with OvernightSession("fragile", store=f"sqlite://{db}") as s:
        run(s.add_items([msg("user", "keep me"), msg("user", "damage me"), msg("user", "last")]))
    store = open_store(f"sqlite://{db}")
    from overnight.chain.integrity import load_checkpoint

    head = load_checkpoint(store, store.get_ref(s.task_id, "main"))
    target = head.artifacts["items/000000000002"].digest
    store.close()
    _damage_object(db, target)
    with OvernightSession("fragile", store=f"sqlite://{db}") as fresh:
        with pytest.raises(SessionCorrupt) as err:
            run(fresh.get_items())
        assert err.value.session_id == "fragile" and "'fragile'" in str(err.value)
        assert err.value.object_digest == target
        assert run(fresh.get_items(limit=1)) == [msg("user", "last")]  # the intact newest item still reads
        assert run(fresh.pop_item()) == msg("user", "last")
        with pytest.raises(SessionCorrupt):
            run(fresh.pop_item())  # the damaged one is never returned, nor silently dropped
        with pytest.raises(SessionCorrupt):
            run(fresh.get_items())


def test_corrupted_head_checkpoint_is_a_typed_error(tmp_path):
    db = tmp_path / "a.db"
    with OvernightSession("fragile", store=f"sqlite://{db}") as s:
        run(s.add_items([msg("user", "a")]))
        run(s.add_items([msg("user", "b")]))
    conn = sqlite3.connect(db)
    with conn:
        head = conn.execute("SELECT checkpoint_id FROM refs WHERE task_id=?", (s.task_id,)).fetchone()[0]
        parent = conn.execute("SELECT parent_id FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0]
        body = conn.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0]
        conn.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (bytes(body).replace(b'"seq":1', b'"seq":7'), head))
        from overnight.chain.ditto import ditto_key  # and its ditto copy: nothing to heal from
        conn.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),))
    conn.close()
    with OvernightSession("fragile", store=f"sqlite://{db}") as fresh:
        for op in (fresh.get_items(), fresh.pop_item(), fresh.add_items([msg("user", "c")])):
            with pytest.raises(SessionCorrupt) as err:
                run(op)
            assert err.value.checkpoint_id == head and "'fragile'" in str(err.value)
    rollback(s.task_id, parent, store=f"sqlite://{db}")  # what the error's hint says to do
    assert run(OvernightSession("fragile", store=f"sqlite://{db}").get_items()) == [msg("user", "a")]


def test_a_session_object_sees_what_another_writer_committed_since(tmp_path):
    # each object works from its copy of the head it last wrote; a change by another object or
    # process (the branch ref moved) is loaded, verified and seen by the next operation
    url = f"sqlite://{tmp_path}/a.db"
    code = ("import asyncio, sys\n"
            "from overnight.adapters.openai_agents import OvernightSession\n"
            "s = OvernightSession('shared', store=sys.argv[1])\n"
            "asyncio.run(s.pop_item())\n"
            "asyncio.run(s.add_items([{'role': 'user', 'content': 'child'}]))\n")
    with OvernightSession("shared", store=url) as a, OvernightSession("shared", store=url) as b:
        run(a.add_items([msg("user", "a1"), msg("user", "a2")]))
        assert run(b.get_items()) == [msg("user", "a1"), msg("user", "a2")]
        run(b.add_items([msg("user", "b1")]))
        assert run(a.get_items()) == [msg("user", "a1"), msg("user", "a2"), msg("user", "b1")]
        run(a.add_items([msg("user", "a3")]))  # appended after b's item, not over it
        out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env(), timeout=60)
        assert out.returncode == 0, out.stderr
        expected = [msg("user", "a1"), msg("user", "a2"), msg("user", "b1"), msg("user", "child")]
        assert run(a.get_items()) == expected and run(b.get_items()) == expected
        assert run(a.pop_item()) == msg("user", "child") and run(b.pop_item()) == msg("user", "b1")
        got = run(a.get_items())
        got[0]["content"] = "changed by the caller"  # every read returns new values
        assert run(a.get_items()) == [msg("user", "a1"), msg("user", "a2")]


def test_a_corrupted_new_head_is_refused_by_an_object_that_wrote_the_old_one(tmp_path):
    db = tmp_path / "a.db"
    url = f"sqlite://{db}"
    with OvernightSession("fragile", store=url) as a, OvernightSession("fragile", store=url) as b:
        run(a.add_items([msg("user", "a")]))
        run(b.add_items([msg("user", "b")]))  # the ref moved past what `a` wrote
        conn = sqlite3.connect(db)
        with conn:
            head = conn.execute("SELECT checkpoint_id FROM refs WHERE task_id=?", (a.task_id,)).fetchone()[0]
            body = conn.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0]
            conn.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?",
                         (bytes(body).replace(b'"seq":1', b'"seq":7'), head))
            from overnight.chain.ditto import ditto_key
            conn.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),))
        conn.close()
        for op in (a.get_items, a.pop_item, lambda: a.add_items([msg("user", "c")])):
            with pytest.raises(SessionCorrupt) as err:
                run(op())
            assert err.value.checkpoint_id == head
        # `b` wrote that head: it still has its own copy and serves it, nothing damaged is read
        assert run(b.get_items()) == [msg("user", "a"), msg("user", "b")]


def test_unencodable_item_refused_and_foreign_task_refused(tmp_path):
    url = f"sqlite://{tmp_path}/a.db"
    with OvernightSession("typed", store=url) as s:
        with pytest.raises(EncodeError) as err:
            run(s.add_items([msg("user", "ok"), {"role": "user", "content": threading.Lock()}]))
        assert "items[1]" in str(err.value)
        assert run(s.get_items()) == []  # nothing of the batch was stored
    import overnight

    task = overnight.Task("agents.taken", goal="not a session", expected_span="1h")

    @task.step
    def only(ctx):
        return 1

    overnight.run(task, url)
    with pytest.raises(ConfigError, match="not the Agents SDK session"):
        run(OvernightSession("taken", store=url).get_items())


@pytest.mark.parametrize("window", [256, 1000])
def test_compaction_keeps_newest_verbatim_summary_fits_history_stays(tmp_path, window):
    url = f"sqlite://{tmp_path}/a.db"
    with OvernightSession("long", store=url, max_context_tokens=window) as s:
        added = []
        for i in range(40):
            batch = [msg("user", f"Question {i}: what does step {i} of the plan need? It needs care and time."),
                     msg("assistant", f"Answer {i}: step {i} needs the report of step {i - 1}, checked twice.")]
            run(s.add_items(batch))
            added += batch
            items = run(s.get_items())
            assert sum(s.count(x) for x in items) < s.budget.compact_at  # never left over the threshold
        items = run(s.get_items())
        summary, rest = items[0], items[1:]
        assert summary["role"] == "system" and summary["content"].startswith("Summary of the earlier conversation")
        assert s.count(summary) <= summary_tokens(window)
        assert rest == added[-len(rest):] and len(rest) >= 2  # the newest items, verbatim
        entries = [e.row for e in reversed(log(s.task_id, store=url))]
        compactions = [e for e in entries if e.event == "compaction"]
        assert compactions
        # the checkpoint before the first compaction still holds the uncompacted history
        before = entries[entries.index(compactions[0]) - 1]
        assert run(s.get_items_at(before.checkpoint_id)) == added[:len(run(s.get_items_at(before.checkpoint_id)))]
        assert len(run(s.get_items_at(before.checkpoint_id))) > len(rest)
        assert open_store(url).calls(s.task_id)  # the summary calls are in the call journal


def test_compaction_never_keeps_a_tool_output_without_its_call(tmp_path):
    with OvernightSession("tools", store=f"sqlite://{tmp_path}/a.db", max_context_tokens=300) as s:
        for i in range(12):
            run(s.add_items([
                msg("user", f"Look up record {i} in the ledger, please, and tell me what it says."),
                {"type": "function_call", "call_id": f"c{i}", "name": "lookup", "arguments": json.dumps({"n": i})},
                {"type": "function_call_output", "call_id": f"c{i}", "output": f"record {i}: " + "data " * 10},
            ]))
            items = run(s.get_items())
            calls = {x["call_id"] for x in items if x.get("type") == "function_call"}
            assert all(x["call_id"] in calls for x in items if x.get("type") == "function_call_output")
        assert items[0]["content"].startswith("Summary of the earlier conversation")  # it did compact


def test_compaction_keeps_a_newest_tool_output_with_its_call(tmp_path):
    with OvernightSession("big-tool", store=f"sqlite://{tmp_path}/a.db", max_context_tokens=300) as s:
        run(s.add_items([msg("user", f"Question {i} about the ledger, in a few words.") for i in range(6)]))
        run(s.add_items([{"type": "function_call", "call_id": "c9", "name": "lookup", "arguments": "{}"},
                         {"type": "function_call_output", "call_id": "c9", "output": "row " * 150}]))
        items = run(s.get_items())
        assert items[0]["content"].startswith("Summary of the earlier conversation")
        assert [x.get("type") for x in items[-2:]] == ["function_call", "function_call_output"]


def test_agents_runner_two_turns_with_an_offline_model(tmp_path):
    seen: list[list] = []

    def reply(call):
        seen.append(list(call.input))
        said = [x["content"] for x in call.input if x.get("role") == "user"]
        if len(said) == 1:
            return [assistant_message("Noted: the code word is heron.")]
        remembered = [x for x in call.input if x.get("role") == "assistant"]
        return [assistant_message("The code word was heron." if remembered else "I don't know.")]

    agent = Agent(name="a", instructions="Be brief.",
                  model=ScriptedModel([ModelStep.respond(reply), ModelStep.respond(reply)]))
    url = f"sqlite://{tmp_path}/a.db"

    async def conversation() -> str:
        s = OvernightSession("runner", store=url)
        await Runner.run(agent, "The code word is heron.", session=s)
        s.close()
        s = OvernightSession("runner", store=url)  # a new object: the history comes from the store
        result = await Runner.run(agent, "What was the code word?", session=s)
        s.close()
        return result.final_output

    assert run(conversation()) == "The code word was heron."
    assert [x.get("content") for x in seen[1] if x.get("role") == "user"] == [
        "The code word is heron.", "What was the code word?"]
    items = run(OvernightSession("runner", store=url).get_items())
    assert [x.get("role") for x in items] == ["user", "assistant", "user", "assistant"]


def test_docs_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text().split("## Use with the OpenAI Agents SDK", 1)[1]
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, env=env(),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["You are Ada.", "4 items in agents.user-42"]


def test_bench_compares_both_sessions_on_the_same_conversation(tmp_path):
    from overnight.bench.agents_session import run_session_bench

    result = run_session_bench(turns=30, message_bytes=50, directory=tmp_path)
    assert set(result.ms) == {"OvernightSession", "SQLiteSession"}
    assert all(v > 0 for ms in result.ms.values() for v in ms.values())
    assert {n: set(ms) for n, ms in result.cpu_ms.items()} == {n: set(ms) for n, ms in result.ms.items()}
    table = result.markdown()
    assert "| pop_item |" in table and "| bytes on disk at the end |" in table
    assert not list(tmp_path.iterdir())  # its files are removed
