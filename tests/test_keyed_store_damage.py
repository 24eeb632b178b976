"""One damaged entry of a ``file://`` or ``s3://`` store is damage of that entry, not of the store.

Real stores on disk (and moto's S3 server), damaged by planting files and links where the layout
keeps a task's refs, index and record; the real CLI in real processes; nothing is mocked but the S3
client's answer about an object's size.

* A ref folder planted as a link, a ref of garbage bytes, an index entry with a name overnight never
  writes or with garbage bytes, an index folder or a task folder planted as a link, a garbage task
  record: ``ls`` lists the other tasks (and the damaged one, if it can, as ``invalid``), ``verify
  --all`` reports each entry by its key and checks every other task (exit 3), and ``gc --apply``
  refuses naming the entry and deletes nothing -- it cannot know what the entry keeps alive (a
  name overnight never writes hides nothing: gc runs and leaves it).
* An S3 object larger than any record is damage, its body never downloaded (as ``file://``).
* ``gc --apply`` killed between deleting records and their index entries leaks no record.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from overnight.errors import StoreCorrupt
from overnight.store import layout
from overnight.store.file import FileStore

from _procs import THREE_STEPS, cli, env


def _ok(proc: subprocess.CompletedProcess, *codes: int) -> None:
    """The command exited with one of ``codes`` and printed no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in codes, (proc.returncode, proc.stdout, proc.stderr)


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (links not followed; lock files left out: gc takes no locks)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and "locks" not in p.parts}


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory) -> Path:
    """A project with a ``file://`` store ``st`` holding t5 and t6, both complete; t6's artifact
    differs, so each task has objects only it needs."""
    base = tmp_path_factory.mktemp("keyed-damage")
    (base / "t5.py").write_text(THREE_STEPS)
    (base / "t6.py").write_text(THREE_STEPS.replace('"t5"', '"t6"').replace('"hello"', '"hello from t6"'))
    for f in ("t5.py", "t6.py"):
        _ok(cli("run", f, "--store", f"file://{base / 'st'}", cwd=base), 0)
    return base


def _plant(root: Path, outside: Path, what: str) -> str:
    """Damage task t5 of the store at ``root`` (``outside``: where a planted link points); returns
    the text the error or problem names the entry by."""
    task = root / "tasks" / "t5"
    if what == "refs-folder-link":
        shutil.move(task / "refs", outside / "refs")
        (task / "refs").symlink_to(outside / "refs")
        return "tasks/t5/refs"
    if what == "ref-garbage":
        (task / "refs" / "main").write_bytes(b"\x00\xffgarbage")
        return "tasks/t5/refs/main"
    if what == "index-bad-name":
        (task / "checkpoints" / "%ZZbad").write_bytes(b"")
        return "tasks/t5/checkpoints/%ZZbad"
    if what == "index-hashed-garbage":
        (task / "checkpoints" / ("~" + "0" * 64)).write_bytes(b"\xff\xfe")
        return "tasks/t5/checkpoints/~" + "0" * 64
    if what == "index-folder-link":
        shutil.move(task / "checkpoints", outside / "checkpoints")
        (task / "checkpoints").symlink_to(outside / "checkpoints")
        return "tasks/t5/checkpoints"
    if what == "task-folder-link":
        shutil.move(task, outside / "t5")
        task.symlink_to(outside / "t5")
        return "tasks/t5"
    assert what == "task-record-garbage"
    (task / "task").write_bytes(b"\x00garbage")
    return "tasks/t5/task"


PLANTS = ["refs-folder-link", "ref-garbage", "index-bad-name", "index-hashed-garbage", "index-folder-link",
          "task-folder-link", "task-record-garbage"]


@pytest.mark.slow  # real CLI processes
@pytest.mark.parametrize("what", PLANTS)
def test_one_damaged_entry_is_reported_by_verify_all_the_others_are_listed_and_checked_and_gc_deletes_nothing(
        two_tasks, tmp_path, what):
    cwd = tmp_path / "project"
    shutil.copytree(two_tasks, cwd, symlinks=True)
    root, outside = cwd / "st", tmp_path / "outside"
    outside.mkdir()
    url = f"file://{root}"
    entry = _plant(root, outside, what)

    listed = cli("ls", "--store", url, cwd=cwd)
    _ok(listed, 0)
    t6 = next(line for line in listed.stdout.splitlines() if line.startswith("t6 "))
    assert "complete" in t6 and "3/3" in t6, listed.stdout
    t5 = [line for line in listed.stdout.splitlines() if line.startswith("t5 ")]
    if what in ("refs-folder-link", "ref-garbage"):  # listed, as damaged: its head cannot be read
        assert t5 and "invalid" in t5[0], listed.stdout

    checked = cli("verify", "--all", "--store", url, cwd=cwd)
    _ok(checked, 3)
    assert "t6: main ok" in checked.stdout, checked.stdout
    assert entry in checked.stdout, checked.stdout

    before = {**_files(root), **_files(outside)}
    collected = cli("gc", "--apply", "--grace", "0", "--store", url, cwd=cwd)
    if what == "index-bad-name":  # no name overnight writes: it hides nothing, gc runs (and leaves it)
        _ok(collected, 0)
    else:  # it may hide what keeps checkpoints and objects alive: gc refuses, naming it
        _ok(collected, 3)
        assert "gc deletes nothing" in collected.stderr and entry in collected.stderr, collected.stderr
    assert {**_files(root), **_files(outside)} == before  # nothing deleted, in the store or through a link


def test_a_damaged_ref_is_listed_with_a_placeholder_naming_its_key_and_reading_it_still_refuses(two_tasks, tmp_path):
    root = tmp_path / "st"
    shutil.copytree(two_tasks / "st", root, symlinks=True)
    (root / "tasks" / "t5" / "refs" / "main").write_bytes(b"not a ref")
    with FileStore(root) as store:
        refs = store.list_refs("t5")
        assert list(refs) == ["main"] and "tasks/t5/refs/main" in refs["main"].damage
        assert [t.task_id for t in store.list_tasks()] == ["t5", "t6"]
        assert len(store.list_checkpoints("t5")) == 4  # its index still lists its history
        with pytest.raises(StoreCorrupt, match="tasks/t5/refs/main"):
            store.get_ref("t5", "main")
        with pytest.raises(StoreCorrupt, match="tasks/t5/refs/main"):  # a damaged ref may name any of them
            store.delete_checkpoints([r.checkpoint_id for r in store.list_checkpoints("t5")])
        assert len(store.list_checkpoints("t5")) == 4
        assert any("tasks/t5/refs/main" in line for line in store.damaged_entries())


@pytest.mark.slow  # real CLI processes
def test_rm_beside_a_task_no_listing_shows_deletes_the_task_but_no_object(two_tasks, tmp_path):
    """t5's record is garbage, so t5 is listed nowhere; the objects t6 shares with it are still
    t5's: ``rm t6`` removes t6 and keeps every object (``gc`` takes them once t5 is repaired)."""
    cwd = tmp_path / "project"
    shutil.copytree(two_tasks, cwd, symlinks=True)
    root = cwd / "st"
    url = f"file://{root}"
    (root / "tasks" / "t5" / "task").write_bytes(b"\x00garbage")
    objects = {p for p in (root / "objects").rglob("*") if p.is_file()}
    _ok(cli("rm", "t6", "--yes", "--grace", "0", "--store", url, cwd=cwd), 0)
    assert not (root / "tasks" / "t6" / "task").exists()
    assert {p for p in (root / "objects").rglob("*") if p.is_file()} == objects


@pytest.mark.slow  # an S3 server, real CLI processes
def test_a_garbage_ref_on_s3_is_reported_and_the_other_tasks_are_listed_and_checked(s3_endpoint, tmp_path):
    import uuid

    import boto3

    from conftest import S3_BUCKET

    prefix = f"damage-{uuid.uuid4().hex[:8]}"
    url = f"s3://{S3_BUCKET}/{prefix}?endpoint_url={s3_endpoint}"
    (tmp_path / "t5.py").write_text(THREE_STEPS)
    (tmp_path / "t6.py").write_text(THREE_STEPS.replace('"t5"', '"t6"'))
    for f in ("t5.py", "t6.py"):
        _ok(cli("run", f, "--store", url, cwd=tmp_path), 0)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/tasks/t5/refs/main", Body=b"\x00\xffgarbage")
    listed = cli("ls", "--store", url, cwd=tmp_path)
    _ok(listed, 0)
    assert any(line.startswith("t6 ") and "complete" in line for line in listed.stdout.splitlines()), listed.stdout
    assert any(line.startswith("t5 ") and "invalid" in line for line in listed.stdout.splitlines()), listed.stdout
    checked = cli("verify", "--all", "--store", url, cwd=tmp_path)
    _ok(checked, 3)
    assert "t6: main ok" in checked.stdout and "tasks/t5/refs/main" in checked.stdout, checked.stdout
    collected = cli("gc", "--apply", "--grace", "0", "--store", url, cwd=tmp_path)
    _ok(collected, 3)
    assert "tasks/t5/refs/main" in collected.stderr, collected.stderr


# -- S3: an oversized object is damage, its body never read -------------------------------------


class _Huge:
    """A boto3 S3 client whose ``get_object`` says every object is 4 GB and whose body must not be read."""

    def __init__(self, client) -> None:
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def get_object(self, **kwargs):
        r = self._client.get_object(**kwargs)
        r["Body"].close()
        r["ContentLength"] = 4 << 30

        class Body:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def close(self):
                pass

            def read(self, *args):
                raise AssertionError("the body of a 4 GB object was read")

        r["Body"] = Body()
        return r


@pytest.mark.slow  # an S3 server
def test_an_s3_object_larger_than_any_record_is_damage_and_its_body_is_never_read(s3_endpoint):
    import uuid

    from overnight.codec import digest
    from overnight.store.base import ObjectRecord
    from overnight.store.s3 import S3Store

    from conftest import S3_BUCKET

    store = S3Store(f"s3://{S3_BUCKET}/huge-{uuid.uuid4().hex[:8]}?endpoint_url={s3_endpoint}")
    try:
        data = b"an object"
        d = digest.sha256(data)
        store.put_objects([ObjectRecord(d, "blob", len(data), "none", data)])
        assert store.get_objects([d])[d].data == data
        store._c.client = _Huge(store._c.client)
        got = store.get_objects([d])[d]  # as file:// reads a sparse 4 GB plant
        assert got.kind == "unreadable" and got.data == layout.DAMAGED
        assert store._c.read(layout.META_KEY) == (layout.DAMAGED, store._c.read(layout.META_KEY)[1])
    finally:
        store.close()


def test_file_and_s3_share_one_bound_on_what_they_read():
    from overnight.codec.compress import MAX_SIZE
    from overnight.store import file

    assert layout.MAX_KEY_BYTES >= MAX_SIZE and file._PLANTED is layout.DAMAGED
    assert not hasattr(file, "_MAX_FILE")


# -- gc --apply killed midway -------------------------------------------------------------------

# Runs the real CLI (``python -m overnight ARGS``) in this process, SIGKILLing it at the first
# unlink of a checkpoint record (argv[1] == "record": ``<root>/checkpoints/...``) or of an index
# entry (argv[1] == "index": ``<root>/tasks/t5/checkpoints/...``) -- gc deleting dangling checkpoints.
GC_KILLER = r'''
import os, signal, sys, runpy

mode, root = sys.argv[1], sys.argv[2]
real_unlink = os.unlink


def unlink(path, *args, **kwargs):
    p = os.fspath(path)
    if (mode == "record" and p.startswith(root + "/checkpoints/")) or \
            (mode == "index" and p.startswith(root + "/tasks/t5/checkpoints/")):
        os.kill(os.getpid(), signal.SIGKILL)
    return real_unlink(path, *args, **kwargs)


os.unlink = unlink
sys.argv = ["overnight", *sys.argv[3:]]
runpy.run_module("overnight", run_name="__main__", alter_sys=True)
'''


@pytest.mark.slow  # real CLI processes
@pytest.mark.parametrize("kill_at", ["record", "index"])
def test_gc_apply_killed_while_deleting_checkpoints_leaks_no_record_and_the_next_gc_finishes(two_tasks, tmp_path,
                                                                                               kill_at):
    cwd = tmp_path / "project"
    shutil.copytree(two_tasks, cwd, symlinks=True)
    root = cwd / "st"
    url = f"file://{root}"
    with FileStore(root) as store:
        main = store.list_checkpoints("t5")
        first = min(main, key=lambda r: r.seq).checkpoint_id
    _ok(cli("fork", "t5", "--at", first, "--branch", "side", "--store", url, cwd=cwd), 0)
    _ok(cli("resume", "t5", "--branch", "side", "--store", url, cwd=cwd), 0)
    with FileStore(root) as store:
        side = store.get_ref("t5", "side")
        store.set_ref("t5", "side", None, side)  # the branch deleted: its checkpoints are dangling
        dangling = {r.checkpoint_id for r in store.list_checkpoints("t5")} - {r.checkpoint_id for r in main}
    assert len(dangling) >= 2
    records = {c: root / layout.checkpoint_key(c) for c in dangling}
    assert all(p.exists() for p in records.values())

    (cwd / "killer.py").write_text(GC_KILLER)
    killed = subprocess.run([sys.executable, "killer.py", kill_at, str(root), "gc", "--apply", "--grace", "0",
                             "--store", url], cwd=cwd, env=env(), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    _ok(cli("gc", "--apply", "--grace", "0", "--store", url, cwd=cwd), 0)
    assert [c for c, p in records.items() if p.exists()] == []  # no record left that nothing lists
    with FileStore(root) as store:
        assert {r.checkpoint_id for r in store.list_checkpoints("t5")} == {r.checkpoint_id for r in main}
    _ok(cli("verify", "--all", "--store", url, cwd=cwd), 0)
