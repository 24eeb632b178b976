"""Done pages read and verified as they are used (issue 14, target 4).

A head loaded with ``lazy_done`` reads none of its done pages: the state document it verified names
them by digest, and each is read, hashed and schema-checked the first time an entry of it is used.
What a user relies on: such a load costs the same however long the history is; a damaged page it
never touches does not stop it; a damaged page it does touch raises instead of being used; ``verify``
still checks every page; and a writer continuing from it keeps the stored pages as they are.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

import overnight
from overnight.api import resume as api_resume
from overnight.chain.ditto import ditto_key
from overnight.chain.integrity import DoneList, load_checkpoint
from overnight.chain.read import load_head
from overnight.chain.records import DONE_PAGE, event
from overnight.chain.write import ChainWriter
from overnight.codec.canonical import loads
from overnight.errors import IntegrityError
from overnight.store import open_store
from overnight.store.sqlite import SQLiteStore
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


def test_a_resume_falls_back_past_a_lost_done_page_it_would_not_read(url):
    """The runner reads no done page it does not use (its look-ups go by the pages' index), but it
    checks that every page is stored before its session (one query): a page that is gone, and
    that no ditto copy heals, makes it fall back as a full load would."""
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
    a count that machine load does not perturb): as many at 3 done pages as at 1 -- the list of
    the middle pages' references (record format 3), which grows with the chain, is read when a
    middle page is first used, not by the load."""
    short = tmp_path / "short.db"
    overnight.run(_long_task("short", steps=5), f"sqlite://{short}", handle_signals=False)
    reads = {}
    for name, u in (("short", f"sqlite://{short}"), ("long", url)):
        with open_store(u) as s:
            seen: set[str] = set()
            load_head(s, name, lazy_done=True, verified=seen)
            reads[name] = len(seen)
    assert reads["long"] == reads["short"], reads


class CountingStore(SQLiteStore):
    """A real SQLite store that notes the digest of every object read from it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list[str] = []

    def get_objects(self, digests):
        got = super().get_objects(digests)
        self.read.extend(got)
        return got


def _growing_task(task_id: str) -> overnight.Task:
    """A task one step ahead of itself (the to-do list stays one entry long), each step looking
    up an earlier step's output by name, as a pipeline does."""
    task = overnight.Task(task_id, goal="a chain that keeps growing", level="durable")

    @task.step
    def plan(ctx):
        ctx.add_step("work", position="end", i=0)

    @task.step(planned=False)
    def work(ctx, i):
        ctx.state["n"] = i
        ctx.add_step("work", position="end", i=i + 1)
        return ctx.outputs["plan"] if i else None

    return task


def _done_pages_read_by_a_resume(tmp_path, steps: int) -> tuple[int, int]:
    """``(done pages, of them read)`` by a resume that runs one step (commit included) after
    ``steps`` committed ones."""
    path = tmp_path / f"grow-{steps}.db"
    overnight.run(_growing_task("grow"), f"sqlite://{path}", max_steps=steps, handle_signals=False)
    with open_store(f"sqlite://{path}") as s:
        head, _ = load_head(s, "grow")
        pages = {r.digest for r in head.done_pages.refs}
    store = CountingStore(str(path))
    result = overnight.run(_growing_task("grow"), store, max_steps=1, handle_signals=False)
    assert result.steps_run == 1 and result.done == steps + 1
    return len(pages), len(pages & set(store.read))


def _resume_with_one_more_step(url: str):  # type: ignore[no-untyped-def]
    """Resume task ``long`` with a step added after its plan; it must fall back past a damaged page
    (``fallback`` set) and complete. Returns the run's result."""
    task = _long_task("long")

    @task.step
    def finish(ctx):
        return "done"

    result = overnight.run(task, url, handle_signals=False)
    assert result.fallback is not None and result.status == "complete"
    return result


def test_a_resume_checks_every_done_page_before_its_first_step(tmp_path):
    """The memo look-up and the drift check go by the pages' index, and a commit keeps the stored
    pages by reference: so before its session a resume reads every done page and checks it
    against its index -- nothing is built on a page it has not verified."""
    short = _done_pages_read_by_a_resume(tmp_path, 10)
    long = _done_pages_read_by_a_resume(tmp_path, 4 * DONE_PAGE + 10)
    assert short == (1, 1) and long == (5, 5), long


@pytest.mark.parametrize("checked_before", [False, True])
def test_a_resume_does_not_build_on_a_damaged_middle_done_page(url, checked_before):
    """A page listed in the state's middle page list, damaged and with no ditto copy to heal it:
    the resume falls back past it instead of committing new checkpoints that name it -- also when
    this machine checked the page before (then it is hashed, not parsed)."""
    from overnight.chain.checked import check_done_pages
    from overnight.store.blobs import BlobReader

    with open_store(url) as s:
        head, _ = load_head(s, "long")
        middle = head.done_pages.refs[1].digest
        if checked_before:
            lazy, _ = load_head(s, "long", lazy_done=True)
            check_done_pages(lazy, BlobReader(s), "long", "main")
    with sqlite3.connect(url.removeprefix("sqlite://")) as db:
        db.execute("DELETE FROM objects WHERE digest = ?", (ditto_key(middle),))
        assert db.execute("UPDATE objects SET data = zeroblob(length(data)) WHERE digest = ?", (middle,)).rowcount
    _resume_with_one_more_step(url)
    with open_store(url) as s:
        new_head, fallback = load_head(s, "long")
        assert fallback is None and middle not in {r.digest for r in new_head.done_pages.refs}


def test_a_damaged_middle_page_list_is_read_when_used_and_a_resume_does_not_build_on_it(url):
    """The list of the middle pages' references grows with the chain, so a lazy load reads it when
    a middle page is first used, not before: damaged (no ditto copy to heal it), the lazy load
    still serves the head and the last page, a middle page is refused, a full load and ``verify``
    find it, and a resume falls back past it and completes."""
    with open_store(url) as s:
        head, _ = load_head(s, "long")
        listed = head.doc.done.middle.digest
    with sqlite3.connect(url.removeprefix("sqlite://")) as db:
        db.execute("DELETE FROM objects WHERE digest = ?", (ditto_key(listed),))
        assert db.execute("UPDATE objects SET data = zeroblob(length(data)) WHERE digest = ?", (listed,)).rowcount
    with open_store(url) as s:
        lazy, fallback = load_head(s, "long", lazy_done=True)
        assert fallback is None and lazy.id == head.id and len(lazy.done_pages) == 3
        done = lazy.state_tree["done"]
        assert len(done) == STEPS and done[-1] == head.state_tree["done"][-1]  # inline pages serve
        with pytest.raises(IntegrityError) as caught:
            done[DONE_PAGE]  # the middle page: its reference is in the damaged list
        assert caught.value.checkpoint_id == head.id and "page list" in caught.value.message
        eager, fallback = load_head(s, "long")
        assert fallback is not None and eager.id != head.id
        assert any(p.checkpoint_id == head.id for p in verify_store(s, ["long"]).problems)
    result = _resume_with_one_more_step(url)
    assert any(c.checkpoint_id == head.id for c in result.fallback.skipped)
    with open_store(url) as s:  # the steps run again re-stored the list's bytes: intact again
        new_head, fallback = load_head(s, "long")
        assert fallback is None and new_head.id != head.id


def test_a_resume_from_a_lazy_load_says_it_healed_the_middle_page_list(url):
    """The middle page list, damaged with its ditto copy intact, is read (and healed) by the runner
    after a lazy load (what ``overnight resume`` hands it): the resume still says it self-healed,
    as when the load itself read the list."""
    from overnight.runtime.runner import Runner

    with open_store(url) as s:
        head, _ = load_head(s, "long")
        listed = head.doc.done.middle.digest
    with sqlite3.connect(url.removeprefix("sqlite://")) as db:
        assert db.execute("UPDATE objects SET data = zeroblob(length(data)) WHERE digest = ?", (listed,)).rowcount
    events = []
    with open_store(url) as s:
        known: set[str] = set()
        loaded, fallback = load_head(s, "long", lazy_done=True, deep=False, verified=known)
        assert loaded.healed == ()  # the list is not read by the load
        Runner(_long_task("long"), s, handle_signals=False, max_steps=0, on_event=events.append,
               head=(loaded, fallback, known)).run()
    resume = next(e for e in events if e.kind == "resume")
    assert listed[7:19] in (resume.detail or ""), resume.detail


def test_the_drift_check_by_summary_reports_what_reading_every_entry_reports(tmp_path, monkeypatch):
    """A done page's summary stands for its entries: the drift check reads no entry when nothing
    a step read changed, and the report is the one the entries give either way."""
    from overnight.runtime.drift_decision import report_for
    from overnight.verify.fingerprint import world

    data = tmp_path / "input.txt"
    data.write_text("one")
    monkeypatch.setenv("OVERNIGHT_TEST_VAR", "a")
    task = overnight.Task("reads", goal="steps that read a file and a variable", level="durable",
                          env=["OVERNIGHT_TEST_VAR"], deps=[])

    @task.step
    def plan(ctx):
        for i in range(DONE_PAGE + 5):
            ctx.add_step("work", position="end", i=i)

    @task.step(planned=False)
    def work(ctx, i):
        return (ctx.read_input_text(str(data)) if i % 7 == 0 else "") + (ctx.env("OVERNIGHT_TEST_VAR") if i % 5 == 0 else "")

    url = f"sqlite://{tmp_path / 'r.db'}"
    overnight.run(task, url, handle_signals=False)

    def reports():
        from overnight.runtime.drift_decision import world_spec

        with open_store(url) as s:
            lazy, _ = load_head(s, "reads", lazy_done=True)
            eager, _ = load_head(s, "reads")
            salt = bytes.fromhex(eager.state_tree["task"]["spec"]["salt"])
            now = world(world_spec(task, salt))
            by_summary = report_for(lazy, lazy.state_tree, task, now, salt)
            read = len(lazy.done_pages.loaded())
            by_entries = report_for(eager, eager.state_tree, task, now, salt)
            return by_summary, by_entries, read

    by_summary, by_entries, read = reports()
    assert read == 0 and by_summary.items == by_entries.items
    assert [i for i in by_summary.items if not i.warning] == []  # (the model is not given here: a warning)
    data.write_text("two")
    monkeypatch.setenv("OVERNIGHT_TEST_VAR", "b")
    by_summary, by_entries, read = reports()
    assert read == 2 and by_summary.items == by_entries.items  # something differs: the entries name the steps
    assert {i.component for i in by_summary.items if not i.warning} == {"inputs", "env"}
    assert sorted(s for i in by_summary.items for s in i.steps) == sorted(
        [f"work[i={i}]" for i in range(0, DONE_PAGE + 5, 7)] + [f"work[i={i}]" for i in range(0, DONE_PAGE + 5, 5)])


def _child_with_state(s, head, doc, blobs=()) -> str:
    """Commit, as the head's child, a checkpoint whose state document is ``doc`` (built by hand:
    digests valid, canonical bytes; no signing key), with ``blobs`` (bytes) stored alongside."""
    from overnight.codec import digest
    from overnight.codec.canonical import dumps, dumps_sorted
    from overnight.store.base import CheckpointRow, Commit
    from overnight.store.blobs import BlobWriter

    writer = BlobWriter(s)
    for blob in blobs:
        writer.put(blob)
    raw = dumps(doc)
    record = {**loads(head.row.body), "parent_id": head.id, "seq": head.record.seq + 1,
              "state": {"digest": writer.put(raw), "size": len(raw)}}
    body = dumps_sorted(record)
    row = CheckpointRow(digest.sha256(body), head.row.task_id, head.id, "main", head.record.seq + 1,
                        record["created_at"], "forged", "drift", None, body, None, 0)
    s.commit(Commit(row, s.get_ref(head.row.task_id, "main"), writer.commit_objects(), []))
    return row.checkpoint_id


def test_a_done_page_index_is_checked_against_its_page(url):
    """The index rides on the verified state document, and is itself checked against the page
    whenever the page is read: an index that does not say what its page holds fails the load that
    reads it (and ``verify``); a format-4 document without one does not load at all."""
    from overnight.errors import SchemaError
    from overnight.store.blobs import BlobReader

    with open_store(url) as s:
        head, _ = load_head(s, "long")
        doc = loads(BlobReader(s).get(head.record.state.digest))
        first, last = doc["done"]["pages"]
        assert len(last["names"]) == 8 * head.done_pages.size(len(head.done_pages) - 1)
        wrong = {**last, "names": last["names"][8:] + last["names"][:8]}  # the right tags, out of order
        forged = _child_with_state(s, head, {**doc, "done": {**doc["done"], "pages": [first, wrong]}})
        lazy = load_checkpoint(s, forged, lazy_done=True)  # the page is not read: nothing to check yet
        with pytest.raises(SchemaError, match="index"):
            list(lazy.state_tree["done"])
        with pytest.raises(SchemaError, match="index"):
            load_checkpoint(s, forged)
        assert any(p.checkpoint_id == forged for p in verify_store(s, ["long"]).problems)
        bare = {**last, "names": None, "summary": None}
        with pytest.raises(SchemaError, match="without its index"):
            load_checkpoint(s, _child_with_state(s, head, {**doc, "done": {**doc["done"], "pages": [first, bare]}}),
                            lazy_done=True)


@pytest.mark.parametrize("which", ["first", "last"])
def test_a_resume_falls_back_past_a_damaged_done_page_it_reads_at_start(url, which):
    """Damaged bytes (not a lost object) are found when a page is read: the start of a session
    reads the last page (its first commit extends it) and the first (``plan``'s entry, for the plan
    check); either damaged, it falls back as a full load would, and the task completes."""
    with open_store(url) as s:
        head, _ = load_head(s, "long")
        ref = head.done_pages.refs[0 if which == "first" else -1]
    with sqlite3.connect(url.removeprefix("sqlite://")) as db:
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(ref.digest),))  # no copy to heal from
        assert db.execute("UPDATE objects SET data=?, codec='none' WHERE digest=?",
                          (b"[]", ref.digest)).rowcount == 1
    result = _resume_with_one_more_step(url)
    assert any(s.checkpoint_id == head.id for s in result.fallback.skipped)


# --- memory: a load is freed when it is dropped ---------------------------------------------------


@pytest.mark.parametrize("lazy", [False, True])
def test_a_dropped_load_is_freed_without_the_cycle_collector(url, lazy):
    """A loaded head holds no reference cycle (its pages, the closures that read them): with the
    cyclic garbage collector off, dropping it frees it at once -- a process that loads many heads
    (``verify``, a session reloading after another writer) does not keep them until a collection,
    and a collection has no thousands of page entries to walk."""
    import gc
    import weakref

    with open_store(url) as store:
        gc.collect()
        enabled = gc.isenabled()
        gc.disable()
        try:
            loaded, _ = load_head(store, "long", "main", lazy_done=lazy)
            pages = list(loaded.done_pages)  # every page read (the lazy ones now)
            assert len(pages) == 3 and sum(len(p.tree) for p in pages) == STEPS
            refs = [weakref.ref(loaded), weakref.ref(loaded.done_pages), *(weakref.ref(p) for p in pages)]
            del loaded, pages
            assert [r() is None for r in refs] == [True] * len(refs)
        finally:
            if enabled:
                gc.enable()



# --- what a resume checks again: pages this machine checked before are hashed, not parsed --------


class _CountingAdapter:
    """A done-page schema that counts the pages (or appended parts of pages) it validates."""

    def __init__(self, adapter):
        self.adapter, self.calls = adapter, 0

    def validate_python(self, tree):
        self.calls += 1
        return self.adapter.validate_python(tree)


def _parsed_by_the_check(url: str, monkeypatch) -> int:
    """How many done pages the check before a resume's first step parses and validates, on the
    branch head of task ``grow`` loaded as ``overnight resume`` loads it (done pages lazily)."""
    from overnight.chain import integrity
    from overnight.chain.checked import check_done_pages
    from overnight.store.blobs import BlobReader

    counting = _CountingAdapter(integrity._DONE_PAGE)
    monkeypatch.setattr(integrity, "_DONE_PAGE", counting)
    with open_store(url) as s:
        head, _ = load_head(s, "grow", lazy_done=True)
        check_done_pages(head, BlobReader(s), "grow", "main")
    monkeypatch.setattr(integrity, "_DONE_PAGE", counting.adapter)
    return counting.calls


@pytest.fixture
def grown(tmp_path, monkeypatch):
    """A task of five done pages (``grow``, code in a file so ``overnight.resume`` finds it), and
    this test's own state folder (the cache of checked pages starts empty)."""
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grow_task.py").write_text(
        "import overnight\n"
        "task = overnight.Task('grow', goal='a chain that keeps growing', level='durable')\n\n"
        "@task.step\ndef plan(ctx):\n    ctx.add_step('work', position='end', i=0)\n\n"
        "@task.step(planned=False)\ndef work(ctx, i):\n    ctx.state['n'] = i\n"
        "    ctx.add_step('work', position='end', i=i + 1)\n    return i\n")
    url = f"sqlite://{tmp_path / 'g.db'}"
    made = subprocess.run([sys.executable, "-m", "overnight", "run", "grow_task.py", "--store", url, "--quiet",
                           "--max-steps", str(4 * DONE_PAGE + 10)], cwd=tmp_path, capture_output=True, text=True)
    assert made.returncode == 75, made.stderr  # stopped at --max-steps, the code location recorded
    monkeypatch.syspath_prepend(str(tmp_path))
    import grow_task

    yield url, grow_task.task
    sys.modules.pop("grow_task", None)


def test_a_second_resume_parses_only_the_done_pages_this_machine_has_not_checked(grown, monkeypatch):
    """Whether a page matches its index depends on its reference alone (digest and index): once
    checked on this machine, a later resume hashes that page (it is still read: a damaged page is
    not built on) without parsing it again -- only the last page, which each commit extends."""
    from overnight.chain.checked import cache_path

    url, task = grown
    assert not cache_path("grow", "main").exists()
    assert _parsed_by_the_check(url, monkeypatch) == 5 and cache_path("grow", "main").exists()
    assert _parsed_by_the_check(url, monkeypatch) == 0  # the same head: every reference checked before
    store = CountingStore(url.removeprefix("sqlite://"))
    with open_store(url) as s:
        head, _ = load_head(s, "grow")
        pages = {r.digest for r in head.done_pages.refs}
    result = api_resume("grow", store=store, max_steps=1)
    assert result.fallback is None and result.steps_run == 1
    assert pages <= set(store.read)  # every page still read (and hashed) before the first step
    assert _parsed_by_the_check(url, monkeypatch) == 1  # the last page, extended by that commit


def test_a_forged_index_is_found_however_warm_the_cache(grown, monkeypatch):
    """A middle page list rewritten with a wrong index (rehashed, no signing key) is refused by the
    resume even after this machine checked the real one: its references are other bytes."""
    from overnight.codec import digest
    from overnight.codec.canonical import dumps
    from overnight.store.blobs import BlobReader

    url, task = grown
    assert _parsed_by_the_check(url, monkeypatch) == 5
    with open_store(url) as s:
        head, _ = load_head(s, "grow")
        doc = loads(BlobReader(s).get(head.record.state.digest))
        middle = loads(BlobReader(s).get(doc["done"]["middle"]["digest"]))
        middle[0] = {**middle[0], "names": middle[0]["names"][8:] + middle[0]["names"][:8]}  # right tags, wrong order
        raw = dumps(middle)
        listed = {"digest": digest.sha256(raw), "size": len(raw)}
        forged = _child_with_state(s, head, {**doc, "done": {**doc["done"], "middle": listed}}, blobs=[raw])
    result = api_resume("grow", store=url, max_steps=1)
    assert result.fallback is not None and any(c.checkpoint_id == forged for c in result.fallback.skipped)
    assert result.steps_run == 1


def test_a_page_checked_as_the_last_is_not_taken_for_a_full_middle_page(grown, monkeypatch):
    """The cache vouches for a page against its reference, not for where a head puts it: a forged
    child (rehashed, no signing key) whose middle page list names an earlier head's last page --
    checked on this machine, genuine, 10 entries -- where 64 belong is refused as a cold machine
    refuses it, and nothing is built on it."""
    from overnight.codec import digest
    from overnight.codec.canonical import dumps
    from overnight.store.blobs import BlobReader

    url, task = grown
    with open_store(url) as s:
        before, _ = load_head(s, "grow")
        short = loads(BlobReader(s).get(before.record.state.digest))["done"]["pages"][1]  # the last page then
    assert _parsed_by_the_check(url, monkeypatch) == 5  # every reference of that head checked and cached
    assert api_resume("grow", store=url, max_steps=1).steps_run == 1  # the last page grows: another page
    with open_store(url) as s:
        head, _ = load_head(s, "grow")
        doc = loads(BlobReader(s).get(head.record.state.digest))
        middle = loads(BlobReader(s).get(doc["done"]["middle"]["digest"]))
        assert short["digest"] not in {r["digest"] for r in [*middle, *doc["done"]["pages"]]}
        middle[-1] = short
        raw = dumps(middle)
        listed = {"digest": digest.sha256(raw), "size": len(raw)}
        forged = _child_with_state(s, head, {**doc, "done": {**doc["done"], "middle": listed}}, blobs=[raw])
    result = api_resume("grow", store=url, max_steps=1)
    assert result.fallback is not None and any(c.checkpoint_id == forged for c in result.fallback.skipped)
    with open_store(url) as s:
        assert load_head(s, "grow")[1] is None  # the new head does not build on the forgery


@pytest.mark.parametrize("plant", ["fifo", "device", "deep", "huge", "folder"])
def test_a_hostile_cache_file_is_no_cache(grown, monkeypatch, plant):
    """The cache file is in the user's own folder, but whatever stands there -- a FIFO (which would
    block an open), a link to an endless device, JSON nested too deep to parse, a file over the
    size cap, a folder -- means every page is checked in full, at once and without an error."""
    import os

    from overnight.chain.checked import MAX_CACHE_BYTES, cache_path

    url, _ = grown
    path = cache_path("grow", "main")
    path.parent.mkdir(parents=True, exist_ok=True)
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "device":
        path.symlink_to("/dev/zero")
    elif plant == "deep":
        path.write_text("[" * 200_000)
    elif plant == "huge":
        with open(path, "wb") as f:
            f.truncate(MAX_CACHE_BYTES + 1)
    else:
        path.mkdir()
    assert _parsed_by_the_check(url, monkeypatch) == 5


@pytest.mark.parametrize("cache", ["garbage", "other format"])
def test_a_damaged_cache_of_checked_pages_means_every_page_is_checked_again(grown, monkeypatch, cache):
    """The cache is an optimisation: unreadable or of another format, every page is parsed and
    checked, and the file is written again for the next resume."""
    from overnight.chain.checked import cache_path

    url, _ = grown
    path = cache_path("grow", "main")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\x00{not json" if cache == "garbage" else '{"format": 99, "state_format": 4, "refs": []}')
    assert _parsed_by_the_check(url, monkeypatch) == 5
    assert _parsed_by_the_check(url, monkeypatch) == 0  # written again: the next resume uses it
