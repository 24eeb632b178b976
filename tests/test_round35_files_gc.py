"""Round 35: files overnight keeps outside a store written safely, and ``gc`` sweeping what killed
runs left.

* The high-water file (:class:`overnight.keys.HighWater`) and the project's current-task pointer
  (:func:`overnight.mcp.tasks.write_pointer`) are replaced through a temporary file of the writer's
  own (never one named by the pid alone, which two threads -- or a process reusing a pid -- share),
  fsynced before the rename with the folder fsynced after it, and removed when the write fails
  (:func:`overnight.keys.write_file_atomic`).
* ``gc --task T`` sweeps T's leftovers (unlisted records older than the grace, index entries naming
  no record) as a whole-store gc does -- T's only.
* A killed ``rm T`` on ``file://`` leaves no ghost: ``ls`` and ``gc`` do not show the task, a repeated
  ``rm T`` finishes it, and the next whole-store ``gc`` removes the empty task folder (and a task
  record no checkpoint backs) once older than the grace.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _tasks import plan_task

import overnight
from overnight import api
from overnight.errors import TaskNotFound
from overnight.keys import HighWater, Mark
from overnight.mcp import tasks as mcp_tasks
from overnight.mcp.tasks import POINTER, write_pointer
from overnight.ops.gc import collect
from overnight.store import layout
from overnight.store.file import FileStore


# -- 1. the high-water file and the current-task pointer ----------------------------------------


def _stray(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_many_threads_raising_high_water_marks_keep_every_mark_and_leave_no_temporary_file(tmp_path):
    hw = HighWater(tmp_path / "state" / "high-water.json")
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def raiser(w: int) -> None:
        try:
            barrier.wait(10)
            for i in range(25):
                hw.raise_to("file:///s", f"t{w}", "main", Mark(f"sha256:{w}-{i}", i, "inc"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=raiser, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for w in range(8):
        assert hw.get("file:///s", f"t{w}", "main") == Mark(f"sha256:{w}-24", 24, "inc")
    json.loads(hw.path.read_text("utf-8"))
    assert _stray(hw.path.parent) == []


def test_a_failed_high_water_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Before: the temporary file named by the pid stayed behind when the rename failed (and the
    next process with that pid wrote through it)."""
    hw = HighWater(tmp_path / "state" / "high-water.json")
    hw.raise_to("s", "t", "main", Mark("sha256:a", 1, "inc"))

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    hw.raise_to("s", "t", "main", Mark("sha256:b", 2, "inc"))  # a read-only or full disk: not an error
    monkeypatch.undo()
    assert hw.get("s", "t", "main") == Mark("sha256:a", 1, "inc")
    assert _stray(hw.path.parent) == []


def _record_syncs(monkeypatch) -> list[tuple[str, str]]:
    """Record ``("fsync", path)`` and ``("replace", dst)`` in order (fds named through /proc)."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = "?"
        events.append(("fsync", name))
        return real_fsync(fd)

    def replace(src, dst, *a, **kw):
        events.append(("replace", os.fspath(dst)))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def _durable(events: list[tuple[str, str]], path: Path) -> None:
    """The write of ``path``: its temporary file fsynced, then renamed over it, then its folder fsynced."""
    folder = str(path.parent.resolve())
    at = events.index(("replace", str(path)))
    before = [name for kind, name in events[:at] if kind == "fsync"]
    after = [name for kind, name in events[at + 1:] if kind == "fsync"]
    assert any(os.path.dirname(n) == folder and os.path.basename(n).startswith(f".{path.name}.")
               and ".tmp" in n for n in before), events
    assert folder in after, events


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
def test_a_high_water_mark_is_renamed_into_place_without_an_fsync(tmp_path, monkeypatch):
    """Every signed commit raises its mark: the write is atomic (a rename of a whole file of its
    own), but not fsynced -- two fsyncs would add ~40 % to a commit, and a power cut can only
    leave an older mark (``HighWater``'s docstring)."""
    hw = HighWater(tmp_path / "state" / "high-water.json")
    hw.path.parent.mkdir(parents=True)
    events = _record_syncs(monkeypatch)
    hw.raise_to("s", "t", "main", Mark("sha256:a", 1, "inc"))
    monkeypatch.undo()
    assert not [e for e in events if e[0] == "fsync"], events
    assert [e[0] for e in events if e[0] == "replace"] == ["replace"], events
    assert hw.get("s", "t", "main") == Mark("sha256:a", 1, "inc")


def _project(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "project"
    root.mkdir()
    return root, f"sqlite://{root / '.overnight' / 'overnight.db'}"  # inside the project: nothing confirmed


def test_many_threads_writing_the_pointer_leave_one_whole_pointer_and_no_temporary_file(tmp_path):
    """Before: every thread wrote ``.current-task.<pid>.tmp``, so one thread's rename took another's
    half-written file and the other's rename failed (FileNotFoundError)."""
    root, store = _project(tmp_path)
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def writer(w: int) -> None:
        try:
            barrier.wait(10)
            for i in range(40):
                write_pointer(root, f"task-{w}-{i}", "main", store)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    doc = json.loads((root / POINTER).read_text("utf-8"))
    assert doc["task_id"].endswith("-39") and doc["branch"] == "main"
    assert _stray(root / POINTER.parent) == []


def test_a_failed_pointer_write_raises_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    root, store = _project(tmp_path)
    write_pointer(root, "first", "main", store)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_pointer(root, "second", "main", store)
    monkeypatch.undo()
    assert json.loads((root / POINTER).read_text("utf-8"))["task_id"] == "first"
    assert _stray(root / POINTER.parent) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fds through /proc")
def test_the_pointer_is_fsynced_before_and_after_its_rename(tmp_path, monkeypatch):
    root, store = _project(tmp_path)
    (root / POINTER.parent).mkdir()
    events = _record_syncs(monkeypatch)
    write_pointer(root, "t", "main", store)
    monkeypatch.undo()
    _durable(events, (root / POINTER).resolve())


def test_confirmations_still_use_a_private_durable_file(tmp_path, monkeypatch):
    """``confirm_pointer`` now writes through the same helper: mode 0600, nothing left behind."""
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(tmp_path / "state"))
    root, _ = _project(tmp_path)
    outside = f"sqlite://{tmp_path / 'elsewhere' / 'overnight.db'}"
    write_pointer(root, "t", "main", outside)
    assert mcp_tasks.pointer_confirmed([root], "t", outside)
    path = tmp_path / "state" / mcp_tasks.CONFIRMED_FILE
    assert (path.stat().st_mode & 0o777) == 0o600
    assert _stray(path.parent) == []


HW_CHILD = r'''
import os, sys
from pathlib import Path
from overnight.keys import HighWater, Mark
hw = HighWater(Path(sys.argv[1]))
w = sys.argv[2]
for i in range(1, 100000):
    hw.raise_to("s", "t" + w, "main", Mark("sha256:" + w, i, "inc"))
'''


def test_processes_killed_while_raising_marks_leave_a_whole_file(tmp_path):
    """Real processes raising marks side by side, SIGKILLed mid-way: the file is whole JSON holding a
    mark of each, and a later write goes through (a killed writer's temporary file, if any, has a
    name no later writer uses)."""
    path = tmp_path / "state" / "high-water.json"
    procs = [subprocess.Popen([sys.executable, "-c", HW_CHILD, str(path), str(w)]) for w in range(4)]
    time.sleep(1.0)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(30)
    hw = HighWater(path)
    doc = json.loads(path.read_text("utf-8"))
    assert set(doc["s"]) == {f"t{w}" for w in range(4)}
    hw.raise_to("s", "t0", "main", Mark("sha256:new", 10**6, "inc"))
    assert hw.get("s", "t0", "main") == Mark("sha256:new", 10**6, "inc")


# -- 2. gc --task sweeps that task's leftovers -----------------------------------------------------


def _work(ctx, i):
    ctx.state["n"] = ctx.state.get("n", 0) + 1
    ctx.write_text("part", f"{i} " * 50)


def _two_tasks(store, names: tuple[str, str] = ("a", "b")) -> None:
    for t in names:
        assert overnight.run(plan_task(t, 3, _work, data={"n": 0}), store, handle_signals=False).status == "complete"


def _plant(store, task_id: str, tag: str) -> tuple[str, str]:
    """What a killed commit and a killed delete leave in ``task_id``: a checkpoint record no index entry
    or ref names, and an index entry naming no record. Returns ``(record id, entry key)``."""
    head = store.get_checkpoint(store.get_ref(task_id, "main"))
    record = "sha256:" + (tag * 64)[:64]
    row = dataclasses.replace(head, checkpoint_id=record, parent_id=head.checkpoint_id, seq=head.seq + 1)
    gone = "sha256:" + ("e" + tag) * 32
    store._c.create_many({layout.checkpoint_key(record): layout.encode_checkpoint(row, 0, []),
                          **store._index_entries(task_id, [gone])})
    if isinstance(store, FileStore):  # written an hour ago: past the grace, however long gc takes
        old = time.time() - 3600
        os.utime(store.path / layout.checkpoint_key(record), (old, old))
    return record, layout.index_key(task_id, gone)


def _left(store, record: str, entry: str) -> tuple[bool, bool]:
    return (bool(store._c.exists_many([layout.checkpoint_key(record)])), bool(store._c.exists_many([entry])))


def _check_gc_task_sweeps_only_its_leftovers(store) -> None:
    _two_tasks(store)
    ra, ea = _plant(store, "a", "1")
    rb, eb = _plant(store, "b", "2")
    dry = collect(store, task_id="a", grace_s=0)
    assert (dry.leftover_records, dry.leftover_entries) == (1, 1) and dry.leftover_bytes > 0
    assert _left(store, ra, ea) == (True, True)
    rep = collect(store, task_id="a", apply=True, grace_s=0)
    assert (rep.leftover_records, rep.leftover_entries) == (1, 1) and rep.leftover_bytes == dry.leftover_bytes
    assert _left(store, ra, ea) == (False, False)
    assert _left(store, rb, eb) == (True, True), "gc --task a swept task b's leftovers"
    assert (collect(store, task_id="a", grace_s=0).leftover_records,) == (0,)
    rep = collect(store, task_id="b", apply=True, grace_s=0)
    assert (rep.leftover_records, rep.leftover_entries) == (1, 1)
    assert _left(store, rb, eb) == (False, False)
    check = api.verify(store=store, all_objects=True)
    assert check.ok and not check.problems, check.problems
    for t in ("a", "b"):
        assert len(store.list_checkpoints(t)) >= 4


def test_gc_task_sweeps_that_tasks_leftovers_only_file(tmp_path):
    """Before: ``gc --task a`` reported and removed no leftover at all (only a whole-store gc did)."""
    store = FileStore(tmp_path / "s")
    try:
        _check_gc_task_sweeps_only_its_leftovers(store)
    finally:
        store.close()


def _aged_s3(monkeypatch) -> None:
    """Every S3 key an hour older than the server says (S3 keeps a key's time to the second, and a
    loaded machine's gc may take longer than the wait): past a grace of 0 for certain."""
    from overnight.store import s3

    real = s3._age_ms
    monkeypatch.setattr(s3, "_age_ms", lambda now, modified: real(now, modified) + 3_600_000)


def test_gc_task_sweeps_that_tasks_leftovers_only_s3(request, monkeypatch):
    import uuid

    from conftest import S3_BUCKET
    from overnight.store import open_store

    endpoint = request.getfixturevalue("s3_endpoint")
    store = open_store(f"s3://{S3_BUCKET}/r35-{uuid.uuid4().hex}?endpoint_url={endpoint}")
    _aged_s3(monkeypatch)
    try:
        _check_gc_task_sweeps_only_its_leftovers(store)
    finally:
        store.close()


def test_gc_task_keeps_its_young_leftovers_and_reads_no_other_tasks_records(tmp_path, monkeypatch):
    store = FileStore(tmp_path / "s")
    try:
        _two_tasks(store)
        ra, ea = _plant(store, "a", "3")
        rb, eb = _plant(store, "b", "4")
        os.utime(tmp_path / "s" / layout.checkpoint_key(ra))  # a's written just now: a commit in flight
        # only the unnamed records are read to learn their task, never the listed ones
        read: list[str] = []
        real = store._c.read_many

        def read_many(keys):
            keys = list(keys)
            read.extend(k for k in keys if k.startswith("checkpoints/"))
            return real(keys)

        monkeypatch.setattr(store._c, "read_many", read_many)
        records, entries = store.leftovers("a")
        monkeypatch.undo()
        assert set(records) == {ra} and set(entries) == {ea}
        assert sorted(read) == sorted([layout.checkpoint_key(ra), layout.checkpoint_key(rb)])
        rep = collect(store, task_id="a", apply=True, grace_s=3600)  # a's record is young: a commit in flight
        assert (rep.leftover_records, rep.leftover_entries) == (0, 1)
        assert _left(store, ra, ea) == (True, False) and _left(store, rb, eb) == (True, True)
        rep = subprocess.run([sys.executable, "-m", "overnight", "gc", "--task", "b", "--grace", "1h", "--apply",
                              "--json", "--store", f"file://{tmp_path / 's'}"], capture_output=True, text=True,
                             env=_env(), timeout=120)
        assert rep.returncode == 0, rep.stderr
        out = json.loads(rep.stdout)
        assert (out["leftover_records"], out["leftover_entries"]) == (1, 1), out
        assert _left(store, rb, eb) == (False, False) and _left(store, ra, ea) == (True, False)
    finally:
        store.close()


def _env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("OVERNIGHT_STORE", None)
    e["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), e.get("PYTHONPATH", "")])
    return e


# -- 3. a killed rm leaves no ghost, and gc removes the empty task folder ---------------------------


# the child: rm of task ``t``, SIGKILLed by itself right after its K-th removal of a file in the store
RM_KILLER = r'''
import os, signal, sys
root, k = os.path.realpath(sys.argv[1]), int(sys.argv[2])
count = [0]
real_unlink = os.unlink

def unlink(path, *a, **kw):
    real_unlink(path, *a, **kw)
    p = os.path.realpath(os.fspath(path))
    name = os.path.basename(p)
    if p.startswith(root + os.sep) and (not name.startswith(".tmp-") or name.startswith(".tmp-gc-")):
        count[0] += 1
        if count[0] >= k > 0:
            os.kill(os.getpid(), signal.SIGKILL)

os.unlink = unlink
from overnight import api
from overnight.store.file import FileStore
store = FileStore(root)
api.rm("t", store=store, grace=0)
print(count[0])
'''


def _build_two(root: Path) -> None:
    store = FileStore(root)
    try:
        _two_tasks(store, ("t", "u"))
    finally:
        store.close()


def _listed(store) -> list[str]:
    return [t.task_id for t in api.ls(store=store)]


@pytest.mark.slow
def test_rm_killed_after_each_removal_leaves_no_ghost_and_gc_removes_the_task_folder(tmp_path):
    """Before: even a completed ``rm`` left ``tasks/t/`` (empty folders) for good, and one killed after
    its refs and index went left ``tasks/t/task`` (and its lease) until ``rm t`` ran again: no gc
    ever removed them. Now: wherever the kill lands, ``ls`` and ``gc`` show ``t`` only while it still
    has its index (a task ``rm`` can finish), ``rm t`` again finishes it (or says there is no such
    task), and the next whole-store gc removes the folder; ``u`` is untouched."""
    base = tmp_path / "base"
    _build_two(base)
    probe = tmp_path / "probe"
    import shutil

    shutil.copytree(base, probe)
    out = subprocess.run([sys.executable, "-c", RM_KILLER, str(probe), "0"], capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    total = int(out.stdout.split()[-1])  # the removals of an uninterrupted rm
    landed = 0
    for k in range(1, total + 1):
        root = tmp_path / f"k{k}"
        shutil.copytree(base, root)
        out = subprocess.run([sys.executable, "-c", RM_KILLER, str(root), str(k)], capture_output=True, text=True,
                             env=_env(), timeout=120)
        landed += out.returncode == -signal.SIGKILL
        store = FileStore(root)
        try:
            has_index = any((root / "tasks" / "t" / "checkpoints").glob("*"))
            listed = _listed(store)
            assert ("t" in listed) == has_index, (k, listed)
            assert "t" not in [t.task_id for t in collect(store, grace_s=0).tasks] or has_index
            try:
                api.rm("t", store=store, grace=0, force=True)
            except TaskNotFound:
                assert not (root / "tasks" / "t" / "task").exists()
            assert _listed(store) == ["u"]
            rep = collect(store, apply=True, grace_s=0)
            assert not (root / "tasks" / "t").exists(), (k, sorted(p.name for p in (root / "tasks" / "t").rglob("*")))
            assert rep.leftover_tasks == 1, (k, rep)
            assert (root / "tasks" / "u").is_dir() and _listed(store) == ["u"]
            check = api.verify(store=store, all_objects=True)
            assert check.ok and not [p for p in check.problems if not p.dangling], check.problems
            assert collect(store, grace_s=0).leftover_tasks == 0
        finally:
            store.close()
        shutil.rmtree(root)
    assert landed >= total - 1


def test_gc_removes_the_empty_folder_a_completed_rm_leaves_once_past_grace(tmp_path):
    """Before: ``tasks/t/`` with its empty ``checkpoints``, ``refs``, ``leases`` folders stayed after
    ``rm t`` and after every gc."""
    root = tmp_path / "s"
    _build_two(root)
    store = FileStore(root)
    try:
        api.rm("t", store=store, grace=0)
        assert (root / "tasks" / "t").is_dir() and not [p for p in (root / "tasks" / "t").rglob("*") if p.is_file()]
        collect(store, apply=True, grace_s=3600)
        assert (root / "tasks" / "t").is_dir()  # just emptied: within the grace
        old = time.time() - 7200
        for d in (root / "tasks" / "t").rglob("*"):
            os.utime(d, (old, old))
        os.utime(root / "tasks" / "t", (old, old))
        dry = collect(store, grace_s=3600)
        assert (root / "tasks" / "t").is_dir()  # dry run: nothing removed
        shown = subprocess.run([sys.executable, "-m", "overnight", "gc", "--store", f"file://{root}"],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "1 folder(s) of removed tasks would delete" in shown.stdout, \
            shown.stdout + shown.stderr  # the plain output says it too, not only --json
        rep = collect(store, apply=True, grace_s=3600)
        assert not (root / "tasks" / "t").exists() and rep.leftover_tasks == 1 and dry.leftover_tasks == 1
        # this process saw the folders before gc removed them: running t again makes them anew
        assert overnight.run(plan_task("t", 2, _work, data={"n": 0}), store, handle_signals=False).status == "complete"
        assert sorted(_listed(store)) == ["t", "u"]
        assert api.verify(store=store, all_objects=True).ok
    finally:
        store.close()


def test_gc_keeps_a_task_folder_a_worker_or_a_first_commit_is_filling(tmp_path):
    """No ref or index yet, but a young ``task`` record (a first commit in flight), or a lease a
    live process holds (a worker starting): the folder stays; a call record keeps it too."""
    root = tmp_path / "s"
    _build_two(root)
    store = FileStore(root)
    try:
        api.rm("t", store=store, grace=0)
        task = store._c.read(layout.task_key("u"))[0]
        row = dataclasses.replace(layout.decode_task(task), task_id="t")
        store._c.create_many({layout.task_key("t"): layout.encode_task(row)})  # written just now
        assert collect(store, apply=True, grace_s=3600).leftover_tasks == 0
        assert (root / layout.task_key("t")).exists()
        lease = store.acquire_lease("t", "main", "holder-1", json.dumps({"pid": os.getpid()}), 600_000)
        store._c.delete([layout.ref_key("t", "main")])  # the fence the lease raised: keep only the lease
        old = time.time() - 7200
        for p in [root / "tasks" / "t", *(root / "tasks" / "t").rglob("*")]:
            os.utime(p, (old, old))
        assert store.read_lease("t", "main") is not None
        assert collect(store, apply=True, grace_s=3600).leftover_tasks == 0, "a held lease's folder was removed"
        store.release_lease(lease)
        for p in [root / "tasks" / "t", *(root / "tasks" / "t").rglob("*")]:
            os.utime(p, (old, old))
        assert collect(store, apply=True, grace_s=3600).leftover_tasks == 1
        assert not (root / "tasks" / "t").exists()
        assert sorted(_listed(store)) == ["u"]
    finally:
        store.close()


def test_gc_removes_what_a_killed_rm_left_on_s3(request, monkeypatch):
    """On ``s3://`` (no folders) the ``task`` record and released lease a killed ``rm`` left go too."""
    import uuid

    from conftest import S3_BUCKET
    from overnight.store import open_store

    endpoint = request.getfixturevalue("s3_endpoint")
    store = open_store(f"s3://{S3_BUCKET}/r35-{uuid.uuid4().hex}?endpoint_url={endpoint}")
    try:
        _two_tasks(store)
        lease = store.acquire_lease("a", "main", "holder-1", "{}", 600_000)
        store.release_lease(lease)
        task = store._c.read(layout.task_key("a"))
        api.rm("a", store=store, grace=0)
        store._c.create_many({layout.task_key("a"): task[0]})  # the rm killed before its last delete
        store._c.swap(layout.lease_key("a", "main"), layout.encode_lease(dataclasses.replace(
            lease, holder_id="", holder="", expires_at_ms=0)), None)
        assert _listed(store) == ["b"]
        _aged_s3(monkeypatch)
        dry = collect(store, grace_s=0)
        assert store._c.exists_many([layout.task_key("a")])
        rep = collect(store, apply=True, grace_s=0)
        assert not store._c.exists_many([layout.task_key("a"), layout.lease_key("a", "main")])
        assert dry.leftover_tasks == 1 and rep.leftover_tasks == 1
        assert _listed(store) == ["b"] and collect(store, grace_s=0).leftover_tasks == 0
    finally:
        store.close()


_PLANTED = r"""
import os, sys
from pathlib import Path
from overnight.keys import HighWater, Mark
hw = HighWater(Path(sys.argv[1]))
print(hw.get("s", "t", "main"))
hw.raise_to("s", "t", "main", Mark("sha256:a", 1, ""))
print("raised")
"""


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "directory", "lock-fifo", "lock-link"])
def test_a_thing_planted_at_the_high_water_file_never_hangs_a_commit(tmp_path, plant):
    """Attacker: a FIFO (or a link to /dev/zero) at ``high-water.json`` or its ``.lock`` hung every
    signed commit forever, SIGTERM included; a folder there raised IsADirectoryError from a resume;
    a link at the lock file made the writer create a file where it points."""
    state = tmp_path / "state"
    state.mkdir()
    path = state / "high-water.json"
    outside = tmp_path / "outside"
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "dev-zero":
        path.symlink_to("/dev/zero")
    elif plant == "directory":
        path.mkdir()
    elif plant == "lock-fifo":
        os.mkfifo(state / "high-water.json.lock")
    else:
        (state / "high-water.json.lock").symlink_to(outside)
    r = subprocess.run([sys.executable, "-c", _PLANTED, str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "None" and "raised" in r.stdout, r.stderr
    assert not outside.exists()  # the link was not followed


def test_the_further_up_hint_names_the_folder_a_one_part_store_path_starts_from(tmp_path, monkeypatch):
    """Attacker: for ``sqlite://state.db`` the hint said to run in the store's grandparent folder."""
    from overnight.store.task_location import further_up_hint

    (tmp_path / "proj" / "sub" / "deep").mkdir(parents=True)
    (tmp_path / "proj" / "state.db").write_bytes(b"")
    monkeypatch.chdir(tmp_path / "proj" / "sub" / "deep")
    hint = further_up_hint("sqlite://state.db")
    assert hint is not None and f"run the command in {tmp_path / 'proj'}," in hint, hint
