"""``overnight gc --apply`` killed part-way on a ``file://`` store (real processes, SIGKILL).

What a user may expect of an interrupted gc: nothing referenced is lost (every head loads and
verifies, ``verify --all`` finds no damage), and the next ``gc --apply`` finishes the job -- it
frees what the killed one would have freed, and leaves no checkpoint record that no listing shows
(leaked: no later gc would ever find it) and no index entry naming a record that is gone.

The kill is aimed two ways: a child process that SIGKILLs itself right after its K-th file removal
in the store (every K from the first removal to the last, spread over the run), and the CLI killed
from outside after increasing delays.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _tasks import plan_task

import overnight
from overnight import api
from overnight.chain.read import load_head
from overnight.store import layout
from overnight.store.file import FileStore

pytestmark = pytest.mark.slow  # kill loops: child processes, a verify and a gc per kill point

N = 24  # steps per branch


def _work(ctx, i):
    ctx.state["n"] = ctx.state.get("n", 0) + 1
    ctx.write_text(f"part-{i % 4}", f"{i} " * 300)
    ctx.write_text("note", f"note {i} {os.urandom(4).hex()}")


def _task():
    return plan_task("g", N, _work, data={"n": 0})


def build(root: Path) -> dict:
    """A task ``g`` whose branch ``B`` (forked early, run to the end) was deleted: its history and
    the objects only it needed are garbage; branch ``main`` stays."""
    store = FileStore(root)
    try:
        task = _task()
        assert overnight.run(task, store, handle_signals=False).status == "complete"
        chain = sorted(store.list_checkpoints("g"), key=lambda r: r.seq)
        api.fork("g", chain[2].checkpoint_id, "B", store=store)
        assert overnight.run(task, store, branch="B", handle_signals=False).status == "complete"
        store.set_ref("g", "B", None, store.get_ref("g", "B"))  # branch B deleted: its history dangles
        return {"main": store.get_ref("g", "main"), "listed": ids(store)}
    finally:
        store.close()


def ids(store) -> set[str]:
    return {r.checkpoint_id for t in store.list_tasks() for r in store.list_checkpoints(t.task_id)}


def record_files(root: Path) -> set[str]:
    """Ids of the checkpoint records under ``checkpoints/`` (read from the records themselves)."""
    out = set()
    for p in (root / "checkpoints").rglob("*"):
        if p.is_file() and not p.name.startswith(".tmp-"):
            out.add(layout.decode_checkpoint(p.read_bytes())[0].checkpoint_id)
    return out


def index_names(root: Path) -> dict[str, list[str]]:
    """``task folder -> names in its checkpoint index``."""
    return {t.name: sorted(n.name for n in (t / "checkpoints").iterdir() if not n.name.startswith(".tmp-"))
            for t in (root / "tasks").iterdir() if (t / "checkpoints").is_dir()}


def object_files(root: Path) -> set[str]:
    return {f"sha256:{p.parent.name}{p.name}" for p in (root / "objects").rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("gc-killed")
    src = base / "store"
    info = build(src)
    # what an uninterrupted gc leaves
    clean = base / "clean"
    shutil.copytree(src, clean)
    store = FileStore(clean)
    try:
        rep = api.gc(store=store, apply=True, grace=0)
        assert rep.checkpoints_deleted >= N - 2 and rep.objects_deleted > 0
        info["after"] = ids(store)
    finally:
        store.close()
    info["records_after"] = record_files(clean)
    info["objects_after"] = object_files(clean)
    assert info["records_after"] == info["after"]
    info["src"] = src
    return info


# the child: gc --apply on the store, SIGKILLed by itself right after its K-th removal of a file there
KILLER = r'''
import os, signal, sys
root, k = os.path.realpath(sys.argv[1]), int(sys.argv[2])
count = [0]
real_unlink = os.unlink

def unlink(path, *a, **kw):
    real_unlink(path, *a, **kw)
    p = os.path.realpath(os.fspath(path))
    name = os.path.basename(p)
    # removals of records, index entries and objects (an object goes through a ".tmp-gc-" name)
    if p.startswith(root + os.sep) and (not name.startswith(".tmp-") or name.startswith(".tmp-gc-")):
        count[0] += 1
        if count[0] >= k:
            os.kill(os.getpid(), signal.SIGKILL)

os.unlink = unlink
from overnight import api
from overnight.store.file import FileStore
store = FileStore(root)
rep = api.gc(store=store, apply=True, grace=0)
print("finished", rep.checkpoints_deleted, rep.objects_deleted)
'''


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("OVERNIGHT_STORE", None)
    e["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), e.get("PYTHONPATH", "")])
    return e


def loose_object_problem(p) -> bool:
    """A problem ``verify --all`` reports on an unreferenced object (no task, no checkpoint)."""
    return p.check == "object" and p.task_id is None and p.checkpoint_id is None


def check_after_kill(root: Path, built: dict) -> None:
    """The checks after a killed gc: nothing referenced lost, no damage (warnings on unreferenced
    objects a kill inside the object sweep left are allowed: see the test of that below); then a
    second gc finishes the job exactly."""
    store = FileStore(root)
    try:
        assert store.get_ref("g", "main") == built["main"]
        loaded = load_head(store, "g", "main")
        assert loaded[0].state.data["n"] == N
        check = api.verify(store=store, all_objects=True)
        problems = [p for p in check.problems if not (loose_object_problem(p) and p.dangling)]
        assert not problems, problems  # not even warnings on dangling records (a parent deleted first)
        assert set(check.heads["g"].values()) == {"ok"}
        assert not store.damaged_entries()

        api.gc(store=store, apply=True, grace=0)
        assert ids(store) == built["after"]
        assert record_files(root) == built["records_after"], "checkpoint records left that no listing shows"
        names = index_names(root)
        for folder, entries in names.items():
            assert entries, f"an empty index folder is left for {folder}"
            for n in entries:
                cid = layout.unname(n) if not n.startswith("~") else (root / "tasks" / folder / "checkpoints" / n).read_text()
                assert cid in built["records_after"], f"index entry {folder}/{n} names no record"
        assert object_files(root) == built["objects_after"]
        check = api.verify(store=store, all_objects=True)
        assert check.ok and not check.problems and check.dangling_objects == 0, check.problems
    finally:
        store.close()


def _removals(built: dict, tmp_path: Path) -> int:
    """How many files an uninterrupted gc removes (counted by the child with an unreachable K)."""
    root = tmp_path / "count"
    shutil.copytree(built["src"], root)
    out = subprocess.run([sys.executable, "-c", KILLER.replace("count[0] >= k", "count[0] >= k > 0"), str(root), "0"],
                         capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    before = len(record_files(built["src"])) + len(object_files(built["src"]))
    return before - len(record_files(root)) - len(object_files(root)) + (len(built["listed"]) - len(built["after"]))


def test_gc_killed_after_each_removal_loses_nothing_and_the_next_gc_finishes(built, tmp_path):
    total = _removals(built, tmp_path)
    assert total > 2 * (N - 2)
    # every removal among the checkpoint records and index entries (the first 2 * dangling), then a spread
    dangling = len(built["listed"]) - len(built["after"])
    ks = sorted(set(range(1, 2 * dangling + 2)))  # kills inside the object sweep: the test below
    landed = 0
    for k in ks:
        root = tmp_path / f"k{k}"
        shutil.copytree(built["src"], root)
        out = subprocess.run([sys.executable, "-c", KILLER, str(root), str(k)], capture_output=True, text=True,
                             env=_env(), timeout=120)
        if out.returncode == -signal.SIGKILL:
            landed += 1
        else:
            assert out.returncode == 0, out.stderr
        check_after_kill(root, built)
        shutil.rmtree(root)
    assert landed >= len(ks) - 2


def test_gc_cli_killed_at_increasing_delays(built, tmp_path):
    """``overnight gc --apply`` SIGKILLed from outside after 0.2 s, 0.3 s, ...: whatever moment the kill
    lands on, the checks of :func:`check_after_kill` hold."""
    delay, mid = 0.2, 0
    for attempt in range(12):
        root = tmp_path / f"d{attempt}"
        shutil.copytree(built["src"], root)
        proc = subprocess.Popen([sys.executable, "-m", "overnight", "gc", "--apply", "--grace", "0", "--store",
                                 f"file://{root}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=_env(), stdin=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        left = len(record_files(root))
        if len(built["records_after"]) < left < len(built["listed"]) or 0 < len(index_names(root)["g"]) - len(built["after"]) < len(built["listed"]) - len(built["after"]):
            mid += 1
        check_after_kill(root, built)
        shutil.rmtree(root)
        delay += 0.1
    print(f"kills that landed among the checkpoint deletions: {mid} of 12")


def test_gc_killed_inside_the_object_sweep_leaves_only_warnings_on_loose_objects(built, tmp_path):
    """gc deletes unreferenced objects in digest order, so a kill inside that sweep can leave an
    unreferenced tree, chunk index or ditto copy whose parts are gone. ``verify --all`` says so as a
    warning (nothing references it: no damage) naming the next gc, which removes it -- not as damage."""
    total = _removals(built, tmp_path)
    dangling = len(built["listed"]) - len(built["after"])
    warned = 0
    for k in range(2 * dangling + 2, total, max(1, (total - 2 * dangling) // 6)):
        root = tmp_path / f"o{k}"
        shutil.copytree(built["src"], root)
        subprocess.run([sys.executable, "-c", KILLER, str(root), str(k)], capture_output=True, env=_env(), timeout=120)
        store = FileStore(root)
        try:
            check = api.verify(store=store, all_objects=True)
        finally:
            store.close()
        loose = [p for p in check.problems if loose_object_problem(p)]
        assert check.ok and all(p.dangling and "interrupted gc" in p.detail for p in loose), check.problems
        warned += bool(loose)
        check_after_kill(root, built)  # the rest holds, and the next gc cleans up
        shutil.rmtree(root)
    assert warned, "no kill left a loose object with a missing part: the sweep was not interrupted where it matters"


def test_gc_removes_records_no_index_entry_lists_once_past_grace(built, tmp_path):
    """Records whose index entries went first (a delete by an older version killed midway, or a
    commit killed before its ref swap) are listed nowhere: gc removes them once older than its grace
    period, keeps the young ones (a commit in flight), and never a record a ref or a kept
    checkpoint reaches."""
    root = tmp_path / "unindexed"
    shutil.copytree(built["src"], root)
    doomed = sorted(built["listed"] - built["after"])
    for c in doomed:  # the old order: index entries first, then killed
        os.unlink(root / layout.index_key("g", c))
    young = doomed[0]
    os.utime(root / layout.checkpoint_key(young))  # written just now (copytree kept the fixture's time)
    for c in doomed[1:]:  # written an hour ago
        os.utime(root / layout.checkpoint_key(c), (time.time() - 3600, time.time() - 3600))
    store = FileStore(root)
    try:
        dry = api.gc(store=store, grace=60)
        assert dry.leftover_records == len(doomed) - 1 and dry.checkpoints_deleted == 0
        rep = api.gc(store=store, apply=True, grace=60)
        assert rep.leftover_records == len(doomed) - 1 and rep.leftover_bytes > 0
        assert record_files(root) == built["records_after"] | {young}
        assert load_head(store, "g", "main")[0].state.data["n"] == N
        dry = subprocess.run([sys.executable, "-m", "overnight", "gc", "--grace", "0", "--json", "--store",
                              f"file://{root}"], capture_output=True, text=True, env=_env(), timeout=120)
        assert dry.returncode == 0 and json.loads(dry.stdout)["leftover_records"] == 1, dry.stderr
        text = subprocess.run([sys.executable, "-m", "overnight", "gc", "--grace", "0", "--store", f"file://{root}"],
                              capture_output=True, text=True, env=_env(), timeout=120).stdout
        assert "1 unlisted checkpoint record(s) would delete" in text, text
        rep = api.gc(store=store, apply=True, grace=0)
        assert rep.leftover_records == 1
        assert record_files(root) == built["records_after"]
        check = api.verify(store=store, all_objects=True)
        assert check.ok and not check.problems, check.problems
    finally:
        store.close()
