"""``overnight gc`` and ``overnight rm`` against real stores: what goes, what stays, and writers
running at the same time.

The checks do not trust gc's own bookkeeping: ``verify --all`` (an independent walk through
``load_checkpoint``) must find every remaining object referenced and every reference present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _tasks import plan_task
from test_store_conformance import BACKENDS

import overnight
from overnight import api
from overnight.codec import digest
from overnight.codec.canonical import dumps_sorted, loads
from overnight.errors import ConfigError, TaskBusy, TaskNotFound
from overnight.store import open_store
from overnight.store.base import CheckpointRow, Commit, ObjectRecord
from overnight.chain.read import load_head

LABEL = ["main"]


def big(label: str, i: int) -> bytes:
    """~40 KB, chunked (a tree of several chunks), different per label and i."""
    return b"".join(f"{label}:{i}:{k:06d}|".encode() for k in range(2600))


def make_task(task_id: str = "g", n: int = 10) -> overnight.Task:
    return plan_task(task_id, n, note, step="note", goal="notes with drafts", data={"notes": []})


def note(ctx, i):
    label = LABEL[0]
    ctx.state["notes"].append(f"{label}:{i}")
    ctx.write_text("scratch.txt", f"draft {label} {i}")  # overwritten at once: never referenced
    ctx.write_text("scratch.txt", f"final {label} {i}")
    ctx.write_artifact(f"big-{i % 3}.bin", big(label, i))
    return label


def run(store, task, branch: str = "main", label: str = "main", **kw):
    LABEL[0] = label
    return overnight.run(task, store, branch=branch, handle_signals=False, **kw)


def bad_head(store, task_id: str, branch: str) -> str:
    """Commit a head whose state blob does not exist: the next resume falls back past it."""
    head = store.get_ref(task_id, branch)
    rec = loads(store.get_checkpoint(head).body)
    rec.update(parent_id=head, seq=rec["seq"] + 1, created_at="2026-11-30T23:59:59.000000+00:00",
               state={"digest": "sha256:" + "ab" * 32, "size": 10})
    body = dumps_sorted(rec)
    row = CheckpointRow(digest.sha256(body), task_id, head, branch, rec["seq"], rec["created_at"], "bad", "step",
                        "injected", body, None, 0)
    store.commit(Commit(row, head))
    return row.checkpoint_id


def ids(store, task_id: str) -> set[str]:
    return {r.checkpoint_id for r in store.list_checkpoints(task_id)}


def scenario(store) -> dict:
    """A task with every kind of history: a fork, a rollback, a deleted branch, a head a fallback
    skipped, drafts overwritten inside steps; a second task sharing artifacts; loose garbage."""
    task = make_task("g")
    run(store, task, max_steps=6)  # plan + notes 0..4
    chain = sorted(store.list_checkpoints("g"), key=lambda r: r.seq)
    api.fork("g", chain[3].checkpoint_id, "B", store=store)
    run(store, task, "B", "B", max_steps=2)
    api.rollback("g", chain[4].checkpoint_id, store=store)
    run(store, task, max_steps=2)
    before_d = ids(store, "g")
    api.fork("g", chain[2].checkpoint_id, "D", store=store)
    run(store, task, "D", "D", max_steps=1)
    dangling = ids(store, "g") - before_d
    store.set_ref("g", "D", None, store.get_ref("g", "D"))  # branch D deleted: its history dangles
    dangling.add(bad_head(store, "g", "B"))
    result = run(store, task, "B", "B", max_steps=1)
    assert result.fallback is not None  # the bad head was skipped
    run(store, make_task("u", n=3), max_steps=5)  # shares big-0..2 with main's first notes
    garbage = [ObjectRecord(digest.sha256(b), "blob", len(b), "none", b) for b in (os.urandom(100), os.urandom(200))]
    store.put_objects(garbage)
    return {"task": task, "dangling": dangling, "garbage": {o.digest for o in garbage}}


@pytest.fixture(params=sorted(BACKENDS))
def store(request, tmp_path):
    s = BACKENDS[request.param](request, tmp_path)
    yield s
    s.close()


def snapshot(store) -> tuple[set[str], set[str]]:
    return {c for t in store.list_tasks() for c in ids(store, t.task_id)}, set(store.iter_object_digests())


@pytest.mark.slow
def test_gc_removes_exactly_the_dangling_and_unreferenced_and_every_branch_resumes(store):
    sc = scenario(store)
    heads = {b: store.get_ref("g", b) for b in ("main", "B")}
    notes = {b: load_head(store, "g", b)[0].state.data["notes"] for b in heads}
    before = snapshot(store)
    # S3 dates objects to the second (an age is never overstated, so one written within the last
    # second counts as younger than any grace): let the dry run and the real one see the same ages
    time.sleep(1.1)

    dry = api.gc(store=store, grace=0)
    assert snapshot(store) == before  # a dry run deletes nothing
    assert not dry.applied
    (g,) = [t for t in dry.tasks if t.task_id == "g"]
    assert set(g.dangling) == sc["dangling"] == set(g.deleted)
    assert dry.objects_deleted >= len(sc["garbage"]) + 2  # the garbage, the drafts (at least)

    rep = api.gc(store=store, apply=True, grace=0)
    assert rep.applied and rep.checkpoints_deleted == len(sc["dangling"])
    assert set(next(t for t in rep.tasks if t.task_id == "g").deleted) == sc["dangling"]
    assert rep.objects_deleted == dry.objects_deleted and rep.object_bytes == dry.object_bytes
    assert ids(store, "g") == before[0] - sc["dangling"] - ids(store, "u")
    assert store.missing_objects(sc["garbage"]) == sc["garbage"]
    check = api.verify(store=store, all_objects=True)
    assert check.ok, check.problems
    assert check.dangling_objects == 0  # nothing unreferenced is left ...
    assert check.checkpoints == len(snapshot(store)[0])  # ... and everything remaining verifies
    assert {b: store.get_ref("g", b) for b in heads} == heads

    again = api.gc(store=store, apply=True, grace=0)
    assert again.checkpoints_deleted == 0 and again.objects_deleted == 0

    for branch, label in (("main", "main"), ("B", "B")):
        result = run(store, sc["task"], branch, label)
        assert result.status == "complete" and result.fallback is None
        state = load_head(store, "g", branch)[0].state
        assert state.data["notes"][: len(notes[branch])] == notes[branch]
        assert api.cat("g", "big-0.bin", branch=branch, store=store) == big(label, 9)
    assert run(store, make_task("u", n=3)).status == "complete"
    assert api.verify(store=store, all_objects=True).ok


def test_gc_keeps_young_objects_and_honours_keep_last_older_than_and_task(tmp_path):
    store = open_store(f"sqlite://{tmp_path / 's.db'}")
    sc = scenario(store)
    rep = api.gc(store=store, apply=True)  # default grace: everything was written just now
    assert rep.objects_deleted == 0 and rep.objects_young == rep.objects_unreferenced > 0
    assert store.missing_objects(sc["garbage"]) == set()
    assert rep.checkpoints_deleted == len(sc["dangling"])  # checkpoints need no grace period

    # two deleted branches of two dangling checkpoints each (fork + step), in two tasks
    for task_id in ("g", "u"):
        for branch in ("tmp1", "tmp2"):
            api.fork(task_id, store.get_ref(task_id, "main"), branch, store=store)
            run(store, make_task(task_id, n=12), branch, branch, max_steps=1)
            store.set_ref(task_id, branch, None, store.get_ref(task_id, branch))
    dangling = {(t, b): {r.checkpoint_id for r in store.list_checkpoints(t) if r.branch == b}
                for t in ("g", "u") for b in ("tmp1", "tmp2")}
    assert len(dangling["g", "tmp1"]) == len(dangling["g", "tmp2"]) == 2
    assert len(dangling["u", "tmp1"]) == 1  # u is complete: the fork checkpoint only
    rep = api.gc(store=store, older_than="1h", apply=True, grace=0)
    assert rep.checkpoints_deleted == 0  # all younger than an hour
    rep = api.gc(store=store, keep_last=1, task_id="g", apply=True, grace=0)
    assert [t.task_id for t in rep.tasks] == ["g"]
    # the newest one is kept, and with it its parent (a chain is never cut); the older branch goes
    assert set(rep.tasks[0].deleted) == dangling["g", "tmp1"] and set(rep.tasks[0].kept) == dangling["g", "tmp2"]
    assert dangling["u", "tmp1"] | dangling["u", "tmp2"] <= ids(store, "u")  # another task is not touched
    assert api.verify(store=store).ok
    rep = api.gc(store=store, older_than="0s", apply=True, grace=0)
    assert rep.checkpoints_deleted == 4
    check = api.verify(store=store, all_objects=True)
    assert check.ok and check.dangling_objects == 0
    with pytest.raises(TaskNotFound):
        api.gc(store=store, task_id="nope")
    with pytest.raises(ConfigError):
        api.gc(store=store, older_than="soon")
    store.close()


# -- writers running at the same time ---------------------------------------------------------

WRITER = r"""
import sys
sys.path.insert(0, sys.argv[3])
import test_gc, overnight
test_gc.LABEL[0] = sys.argv[2]
store = overnight.open_store(sys.argv[1])
result = overnight.run(test_gc.make_task(sys.argv[4], n=int(sys.argv[5])), store, handle_signals=False)
print(result.status)
"""


def writer(url: str, label: str, task_id: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, url, label, str(Path(__file__).parent), task_id, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("backend", ["sqlite", "file", "postgres", "s3"])
@pytest.mark.slow
def test_a_commit_during_gc_keeps_the_old_objects_it_reuses(backend, request, tmp_path):
    """The race gc must survive, made deterministic: gc marks; then a writer process commits a
    checkpoint whose artifacts are *old unreferenced* objects (written by a task since removed,
    found again by deduplication -- a small blob and the chunks of a large one); then gc sweeps.
    The writer's commit refreshed them, so gc keeps them and the new checkpoint loads."""
    store = BACKENDS[backend](request, tmp_path)
    try:
        run(store, make_task("old", n=3))
        api.rm("old", store=store)  # default grace: its objects stay, unreferenced
        grace_s = 3.0 if backend == "s3" else 1.0
        reused = {o.digest for o in store.iter_object_stats()}
        time.sleep(grace_s + 1.5)  # now older than the grace period: gc would take them

        def during_mark(done: int, total: int) -> None:
            if done == total and not started:
                started.append(1)
                proc = writer(store.url, "main", "new", 3)  # writes what "old" wrote: dedup hits
                out, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, err

        started: list[int] = []
        run(store, make_task("bystander", n=1))  # so the mark phase has checkpoints to report on
        rep = api.gc(store=store, apply=True, grace=grace_s, on_progress=during_mark)
        assert started, "the writer never ran inside the mark phase"
        assert rep.objects_young > 0  # refreshed by the writer's commit, so kept
        loaded, fallback = load_head(store, "new", "main")
        assert fallback is None and loaded.artifacts["big-0.bin"].digest in reused
        assert api.cat("new", "big-2.bin", store=store) == big("main", 2)
        check = api.verify(store=store, all_objects=True)
        assert check.ok, check.problems
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite", "file"])
@pytest.mark.slow
def test_gc_in_a_loop_beside_a_running_task(backend, request, tmp_path):
    """A writer process runs a task whose artifacts are already in the store as old unreferenced
    objects (every one: small blobs, and the chunks of large ones), while gc deletes with a short
    grace period over and over: some are collected before the writer gets to them, the others are
    reused by its commits at any moment of a gc run. The task completes, and every checkpoint and
    object it needs is there."""
    from overnight.store.blobs import BlobWriter

    store = BACKENDS[backend](request, tmp_path)
    try:
        seed = BlobWriter(store)
        for i in range(16):
            seed.put(f"part {i % 3} v{i}".encode() * 2000)
            seed.put(f"note {i}".encode() * 50)
        store.put_objects(seed.objects.values())
        time.sleep(0.5)  # older than the grace period below
        (tmp_path / "slow_task.py").write_text(SLOW_TASK)
        proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, store.url, str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rounds = deleted = 0
        while proc.poll() is None:
            # a slow mark phase, so the writer commits between gc's mark and its sweep
            rep = api.gc(store=store, apply=True, grace=0.3, on_progress=lambda done, total: time.sleep(0.03))
            rounds += 1
            deleted += rep.objects_deleted
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        assert out.strip() == "complete"
        assert rounds >= 2 and deleted > 0  # gc really ran, and really deleted, during the task
        api.gc(store=store, apply=True, grace=0)
        check = api.verify(store=store, all_objects=True)
        assert check.ok and check.dangling_objects == 0, check.problems
        state = load_head(store, "slow", "main")[0].state
        assert state.data["n"] == 16
        for i in range(3):
            assert api.cat("slow", f"part-{i}", store=store) == f"part {i} v{15 - (15 - i) % 3}".encode() * 2000
    finally:
        store.close()


def test_gc_sweep_that_waits_for_the_lock_keeps_what_was_committed_meanwhile(tmp_path):
    """A task commits after gc's mark (so gc did not see its checkpoint), then another connection
    holds SQLite's write lock for longer than the grace period, so gc's sweep waits. The age gc
    keeps is measured once it holds the lock: the new task's objects (refreshed after T0 - grace)
    survive. Measured before the wait, the cutoff moved past them and they were deleted."""
    import sqlite3
    import threading

    url = f"sqlite://{tmp_path / 's.db'}"
    store = open_store(url)
    run(store, make_task("old", n=2))
    grace = 0.5
    locked = threading.Event()

    def hold_lock() -> None:
        db = sqlite3.connect(str(tmp_path / "s.db"), isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(grace * 4)
        db.execute("COMMIT")
        db.close()

    def during_mark(done: int, total: int) -> None:
        if done == total and not locked.is_set():
            other = open_store(url)
            try:
                run(other, make_task("new", n=2), label="new")  # committed after gc listed checkpoints
            finally:
                other.close()
            threading.Thread(target=hold_lock, daemon=True).start()
            locked.wait(10)

    api.gc(store=store, apply=True, grace=grace, on_progress=during_mark)
    assert locked.is_set()
    check = api.verify(store=store, all_objects=True)
    assert check.ok, check.problems
    assert api.cat("new", "big-1.bin", store=store) == big("new", 1)
    store.close()


SLOW_TASK = '''
import time
import overnight

task = overnight.Task("slow", goal="drafts", data={"n": 0})

@task.step
def plan(ctx):
    for i in range(16):
        ctx.add_step("work", i=i)

@task.step(planned=False)
def work(ctx, i):
    time.sleep(0.35)
    ctx.write_text("note", f"note {i}" * 50)
    ctx.write_text(f"part-{i % 3}", f"part {i % 3} v{i}" * 2000)  # chunked
    ctx.state["n"] += 1
'''

SLOW_WRITER = r"""
import sys
sys.path.insert(0, sys.argv[2])
import overnight, slow_task
print(overnight.run(slow_task.task, overnight.open_store(sys.argv[1]), handle_signals=False).status)
"""


# -- rm --------------------------------------------------------------------------------------


def cli(*args: str, cwd: Path, check: int | None = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=timeout, stdin=subprocess.DEVNULL)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_rm_deletes_the_task_and_only_what_it_alone_used(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    store = open_store(url)
    scenario(store)
    shared = load_head(store, "u", "main")[0].artifacts["big-0.bin"].digest
    store.close()
    no = cli("rm", "g", "--store", url, cwd=tmp_path, check=2)  # no terminal to confirm on
    assert "--yes" in no.stderr
    out = cli("rm", "g", "--yes", "--grace", "0", "--json", "--store", url, cwd=tmp_path)
    rep = json.loads(out.stdout)
    assert rep["task_id"] == "g" and rep["checkpoints"] > 10 and rep["objects_deleted"] > 10
    assert rep["objects_young"] == 0
    with open_store(url) as s:
        with pytest.raises(TaskNotFound):
            s.get_task("g")
        assert s.list_refs("g") == {} and s.list_checkpoints("g") == [] and s.journal("g") == []
        assert s.missing_objects([shared]) == set()  # task u still uses it
    check = api.verify(store=url, all_objects=True)
    assert check.ok and check.tasks == 1
    assert check.dangling_objects == 2  # only the loose garbage: rm collects what *the task* used
    assert cli("rm", "g", "--yes", "--store", url, cwd=tmp_path, check=2).stderr.count("no task 'g'") == 1


def test_rm_refuses_while_a_run_holds_the_task_unless_forced(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    (tmp_path / "hold.py").write_text(
        "import os, time, overnight\n"
        "task = overnight.Task('held', goal='g')\n"
        "@task.step\n"
        "def wait(ctx):\n"
        "    open('started', 'w').close()\n"
        "    while not os.path.exists('release'):\n"
        "        time.sleep(0.02)\n")
    proc = subprocess.Popen([sys.executable, "-m", "overnight", "run", "hold.py", "-q", "--store", url], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        busy = cli("rm", "held", "--yes", "--store", url, cwd=tmp_path, check=4)
        assert "busy" in busy.stderr and "--force" in busy.stderr
        with pytest.raises(TaskBusy):
            api.rm("held", store=url)
        assert api.rm("held", store=url, dry_run=True).checkpoints == 1  # a dry run may look
        cli("rm", "held", "--yes", "--force", "--store", url, cwd=tmp_path)
        (tmp_path / "release").touch()
        proc.wait(timeout=60)
        assert proc.returncode == 4  # its commit found the branch gone: it stops, and writes nothing
    finally:
        (tmp_path / "release").touch()
        proc.kill()
    with open_store(url) as s:
        assert [t.task_id for t in s.list_tasks()] == []


# -- the CLI ---------------------------------------------------------------------------------


def test_gc_cli_dry_run_by_default_json_and_apply(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    store = open_store(url)
    sc = scenario(store)
    before = snapshot(store)
    store.close()
    dry = cli("gc", "--grace", "0", "--store", url, cwd=tmp_path)
    assert "dry run" in dry.stderr and "would delete" in dry.stdout
    rep = json.loads(cli("gc", "--grace", "0", "--json", "--store", url, cwd=tmp_path).stdout)
    assert rep["applied"] is False and rep["dry_run"] is True and rep["checkpoints_would_delete"] == len(sc["dangling"])
    with open_store(url) as s:
        assert snapshot(s) == before
    done = json.loads(cli("gc", "--apply", "--grace", "0", "--json", "--store", url, cwd=tmp_path).stdout)
    assert done["applied"] is True and done["objects_deleted"] == rep["objects_would_delete"]
    assert done["checkpoints_deleted"] == len(sc["dangling"])
    cli("verify", "--all", "--store", url, cwd=tmp_path)
    bad = cli("gc", "--older-than", "tomorrow", "--store", url, cwd=tmp_path, check=2)
    assert "cannot read --older-than" in bad.stderr and "hint" in bad.stderr
