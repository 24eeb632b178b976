"""Done pages read and verified as they are used (issue 14, target 4).

A head loaded with ``lazy_done`` reads none of its done pages: the state document it verified names
them by digest, and each is read, hashed and schema-checked the first time an entry of it is used.
What a user relies on: such a load costs the same however long the history is; a damaged page it
never touches does not stop it; a damaged page it does touch raises instead of being used; ``verify``
still checks every page; and a writer continuing from it keeps the stored pages as they are.
"""

from __future__ import annotations

import sqlite3

import pytest

import overnight
from overnight.chain.ditto import ditto_key
from overnight.chain.integrity import DoneList, load_checkpoint
from overnight.chain.read import load_head
from overnight.chain.records import DONE_PAGE, event
from overnight.chain.write import ChainWriter
from overnight.codec.canonical import loads
from overnight.errors import IntegrityError
from overnight.store import open_store
from overnight.verify.fsck import verify_store

STEPS = 2 * DONE_PAGE + 10  # three done pages: two full, one partly filled


def _long_task(task_id: str, steps: int = STEPS) -> overnight.Task:
    task = overnight.Task(task_id, goal="a long chain of small steps", level="session")

    @task.step
    def plan(ctx):
        ctx.add_step("work", position="end", i=0)

    @task.step(planned=False)
    def work(ctx, i):
        ctx.state["n"] = i
        if i + 2 < steps:
            ctx.add_step("work", position="end", i=i + 1)
        return i

    return task


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    """A SQLite store holding a complete task of :data:`STEPS` steps (copied per test)."""
    path = tmp_path_factory.mktemp("done-pages") / "s.db"
    result = overnight.run(_long_task("long"), f"sqlite://{path}", handle_signals=False)
    assert result.status == "complete" and result.done == STEPS
    return path


@pytest.fixture
def url(long_store, tmp_path):
    copy = tmp_path / "s.db"
    with sqlite3.connect(long_store) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    return f"sqlite://{copy}"


def test_a_lazy_load_reads_no_done_page_and_gives_the_same_entries(url):
    with open_store(url) as s:
        eager, _ = load_head(s, "long")
        lazy, fallback = load_head(s, "long", lazy_done=True)
        assert fallback is None and lazy.id == eager.id
        assert lazy.done_pages.loaded() == [] and len(lazy.done_pages) == 3
        done = lazy.state_tree["done"]
        assert isinstance(done, DoneList) and len(done) == STEPS  # the count, from the verified state
        assert lazy.done_pages.loaded() == []
        assert done[-1]["name"] == eager.state_tree["done"][-1]["name"]
        assert len(lazy.done_pages.loaded()) == 1  # the last entry's page only
        assert list(done) == eager.state_tree["done"]
        assert list(reversed(done)) == eager.state_tree["done"][::-1]
        assert done[DONE_PAGE - 2 : DONE_PAGE + 2] == eager.state_tree["done"][DONE_PAGE - 2 : DONE_PAGE + 2]
        assert lazy.state.done == eager.state.done


def _remove(url: str, digest: str) -> None:
    """Delete an object and its ditto copy (nothing can heal it)."""
    with sqlite3.connect(url.removeprefix("sqlite://")) as db:
        gone = db.execute("DELETE FROM objects WHERE digest IN (?, ?)", (digest, ditto_key(digest))).rowcount
    assert gone == 2


def test_a_damaged_done_page_is_not_read_until_used_then_refused_and_verify_reports_it(url):
    with open_store(url) as s:
        head, _ = load_head(s, "long")
        page0 = head.done_pages.refs[0].digest
    _remove(url, page0)
    with open_store(url) as s:
        lazy, fallback = load_head(s, "long", lazy_done=True)
        assert fallback is None and lazy.id == head.id  # the page was not needed: no fallback
        assert lazy.doc.done.count == STEPS and lazy.state_tree["task"]["id"] == "long"
        done = lazy.state_tree["done"]
        assert done[-1]["name"] == head.state_tree["done"][-1]["name"]  # the other pages serve
        with pytest.raises(IntegrityError) as caught:
            done[0]  # used: refused, not returned
        assert caught.value.checkpoint_id == head.id and "done page 0" in caught.value.message
        with pytest.raises(IntegrityError):
            list(done)
        # a load that verifies every page falls back past it, as before
        eager, fallback = load_head(s, "long")
        assert fallback is not None and eager.id != head.id
        assert page0 not in {p.digest for p in eager.done_pages.refs}
        report = verify_store(s, ["long"])
        assert any(p.checkpoint_id == head.id and (p.object == page0 or "done page 0" in p.detail)
                   for p in report.problems), report.problems


def test_a_resume_reads_every_done_page_before_its_first_step(url):
    """The runner's memo look-up of a step key and its drift check read every done entry, so it
    verifies every page before its session: a damaged one is never used -- it falls back."""
    with open_store(url) as s:
        head, _ = load_head(s, "long")
    task = _long_task("long")  # with one more planned step, so the complete task has one to run

    @task.step
    def finish(ctx):
        return "done"

    _remove(url, head.done_pages.refs[1].digest)
    result = overnight.run(task, url, handle_signals=False)
    assert result.fallback is not None and result.status == "complete"


def test_a_writer_continuing_a_lazy_load_keeps_the_stored_pages(url):
    with open_store(url) as s:
        lazy, _ = load_head(s, "long", lazy_done=True)
        stored = [r.digest for r in lazy.done_pages.refs]
        chain = ChainWriter(s, "long", "main", key=None, session_id="t", session_n=lazy.record.session.n)
        chain.start_from(lazy, None)
        state = lazy.state_tree
        extra = {**state["done"][-1], "name": "extra", "seq": lazy.record.seq + 1}
        cid = chain.commit({**state, "done": state["done"] + [extra]}, event("drift", detail="test"),
                           fingerprint=loads(lazy.row.body)["fingerprint"])
        assert [p.ref["digest"] for p in lazy.done_pages.loaded()] == [stored[-1]]  # full pages: not read
        after = load_checkpoint(s, cid)  # every page verified
        assert [r.digest for r in after.done_pages.refs][:2] == stored[:2]
        assert [d["name"] for d in after.state_tree["done"]] == [d["name"] for d in lazy.state_tree["done"]] + ["extra"]
        # nothing appended: every page (the partly filled one too) is kept by reference
        again = chain.commit(after.state_tree, event("drift", detail="again"),
                             fingerprint=loads(lazy.row.body)["fingerprint"])
        assert load_checkpoint(s, again).done_pages.refs == after.done_pages.refs


def test_a_lazy_load_reads_as_much_whatever_the_history(url, tmp_path):
    """The objects a lazy load reads do not grow with the done list (what its time follows, and
    a count that machine load does not perturb): at 3 done pages, one more than at 1 -- the list of
    the middle pages' references (record format 3), one object however many pages it names."""
    short = tmp_path / "short.db"
    overnight.run(_long_task("short", steps=5), f"sqlite://{short}", handle_signals=False)
    reads = {}
    for name, u in (("short", f"sqlite://{short}"), ("long", url)):
        with open_store(u) as s:
            seen: set[str] = set()
            load_head(s, name, lazy_done=True, verified=seen)
            reads[name] = len(seen)
    assert reads["long"] == reads["short"] + 1, reads
