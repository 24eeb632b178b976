"""The file backend and the key-value layer it shares with S3: layout on disk, names, fencing races."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from overnight.codec import digest
from overnight.errors import ConfigError, LeaseLost, StoreBusy, StoreVersionError
from overnight.store import layout, open_store
from overnight.store.base import CheckpointRow, Commit, ObjectRecord, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.store.file import FileContainer, FileStore
from overnight.store.keyed import KeyedStore


def _row(task_id, parent, seq, extra=""):
    body = json.dumps({"t": task_id, "seq": seq, "x": extra}).encode()
    return CheckpointRow(digest.sha256(body), task_id, parent, "main", seq, "2026-11-30T00:00:00+00:00", "s", "step",
                         None, body, None, 0)


def _task(task_id):
    return TaskRow(task_id, "2026-11-30T00:00:00+00:00", "goal", None, b"{}")


def test_layout_on_disk_can_be_checked_by_hand(tmp_path):
    """What docs/FORMAT.md ("File layout") promises: sha256sum of the payload after line 1."""
    root = tmp_path / "store"
    with FileStore(root) as store:
        w = BlobWriter(store)
        text = ("overnight " * 800).encode()  # one blob (<= 16 KiB) that compresses: codec zstd
        d = w.put(text)
        r0 = _row("api-report", None, 0)
        store.commit(Commit(r0, None, list(w.objects.values()), [], None, _task("api-report")))
        assert BlobReader(store).get(d) == text
    assert json.loads((root / "overnight.json").read_bytes()) == {"kind": "overnight-store", "layout": 2}
    hexd = d.split(":")[1]
    record = (root / "objects" / hexd[:2] / hexd[2:]).read_bytes()
    header, _, payload = record.partition(b"\n")
    assert json.loads(header) == {"codec": "zstd", "kind": "blob", "size": len(text)}
    assert hashlib.sha256(zstandard.ZstdDecompressor().decompress(payload)).hexdigest() == hexd
    cp_hex = r0.checkpoint_id.split(":")[1]
    header, _, body = (root / "checkpoints" / cp_hex[:2] / cp_hex[2:]).read_bytes().partition(b"\n")
    assert hashlib.sha256(body).hexdigest() == cp_hex
    assert json.loads(header)["task_id"] == "api-report"
    ref = json.loads((root / "tasks" / "api-report" / "refs" / "main").read_bytes())
    assert ref["checkpoint_id"] == r0.checkpoint_id
    assert (root / "tasks" / "api-report" / "checkpoints" / layout.name(r0.checkpoint_id)).read_bytes() == \
        r0.checkpoint_id.encode()
    assert (root / "tasks" / "api-report" / "task").exists()
    assert not [p for p in root.rglob(".tmp-*")]  # no temporary file left behind


def test_leftover_temporary_files_are_ignored(tmp_path):
    root = tmp_path / "store"
    FileStore(root).close()
    (root / "tasks").mkdir()
    (root / "tasks" / ".tmp-deadbeef").write_bytes(b"half a record")  # a writer killed mid-write
    with FileStore(root) as store:
        assert store.list_tasks() == []


def test_a_directory_that_is_not_a_store_is_refused(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ConfigError, match="not an overnight store"):
        open_store(f"file://{tmp_path / 'photos'}")
    (tmp_path / "afile").write_bytes(b"x")
    with pytest.raises(ConfigError):
        open_store(f"file://{tmp_path / 'afile'}")


def test_a_store_from_a_newer_overnight_is_refused(tmp_path):
    root = tmp_path / "store"
    FileStore(root).close()
    (root / "overnight.json").write_bytes(b'{"kind":"overnight-store","layout":99}')
    with pytest.raises(StoreVersionError, match="layout version 99"):
        FileStore(root)


def test_a_lock_held_by_another_process_gives_store_busy(tmp_path):
    root = tmp_path / "store"
    store = FileStore(root, busy_timeout_ms=200)
    lock = root / "locks" / layout.ref_key("t", "main")
    lock = lock.with_name(lock.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusy, match="stayed locked"):
            store.commit(Commit(_row("t", None, 0), None, [], [], None, _task("t")))
    finally:
        holder.kill()
        holder.wait()
    store.commit(Commit(_row("t", None, 0), None, [], [], None, _task("t")))  # free again: works
    store.close()
    assert fcntl  # the module under test relies on it


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_names_are_injective_safe_and_case_insensitive_distinct(a, b):
    na, nb = layout.name(a), layout.name(b)
    for n in (na, nb):
        assert n and n not in (".", "..") and "/" not in n and "\x00" not in n and not n.startswith(".")
        assert len(n.encode()) <= 255
        assert n.isascii()
        if not n.startswith("~"):
            assert layout.unname(n) == (a if n == na else b)
    if a != b:
        assert na.lower() != nb.lower()  # distinct even on a case-insensitive share


def test_names_of_odd_strings():
    assert layout.name("main") == "main"
    assert layout.name("Main") == "%4Dain"
    assert layout.name("..") == "%2E."
    assert layout.name("") == "%" and layout.unname("%") == ""
    assert layout.name("\ud800") == "%ED%A0%80" and layout.unname("%ED%A0%80") == "\ud800"
    assert layout.name("x" * 200).startswith("~")


class _Interleave:
    """A real FileContainer that runs ``hook`` once, right after the first read of ``key``.

    It lets a test put another writer's action at an exact point inside a commit (here: between
    the commit's lease check and its ref swap), deterministically.
    """

    def __init__(self, inner: FileContainer, key: str, hook) -> None:
        self.inner, self.key, self.hook = inner, key, hook

    def read(self, key):
        got = self.inner.read(key)
        if key == self.key and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return got

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_takeover_between_lease_check_and_ref_swap_fences_the_old_holder(tmp_path):
    """The ref's fence: the new holder's acquisition changes the ref, so the old holder's swap
    fails and it learns it lost the lease -- even though its lease check had passed."""
    root = tmp_path / "store"
    other = FileStore(root)
    r0 = _row("t", None, 0)
    old = other.acquire_lease("t", "main", "old", "{}", 1)
    other.commit(Commit(r0, None, [], [], old, _task("t")))
    taken = []

    def take_over():
        import time

        time.sleep(0.005)
        taken.append(other.acquire_lease("t", "main", "new", "{}", 60_000))

    container = _Interleave(FileContainer(root), layout.lease_key("t", "main"), take_over)
    store = KeyedStore(container, f"file://{root}")
    with pytest.raises(LeaseLost):
        store.commit(Commit(_row("t", r0.checkpoint_id, 1, "old"), r0.checkpoint_id, [], [], old))
    assert taken and store.get_ref("t", "main") == r0.checkpoint_id
    other.commit(Commit(_row("t", r0.checkpoint_id, 1, "new"), r0.checkpoint_id, [], [], taken[0]))
    assert [r.seq for r in other.list_checkpoints("t")] == [0, 1]
    store.close()
    other.close()


def test_an_object_is_never_overwritten_even_by_a_concurrent_writer(tmp_path):
    root = tmp_path / "store"
    stores = [FileStore(root) for _ in range(4)]
    d = digest.sha256(b"truth")
    import threading

    barrier = threading.Barrier(4)

    def put(i):
        barrier.wait()
        stores[i].put_objects([ObjectRecord(d, "blob", 5, "none", b"truth" if i == 0 else b"lies!")])

    threads = [threading.Thread(target=put, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = stores[0].get_objects([d])[d].data
    assert data in (b"truth", b"lies!")  # one writer won whole; nothing torn or mixed
    for i in range(4):
        stores[i].put_objects([ObjectRecord(d, "blob", 5, "none", b"other")])
        assert stores[i].get_objects([d])[d].data == data
        stores[i].close()
    assert len(os.listdir(root / "objects" / d[7:9])) == 1


def test_a_layout_1_store_is_upgraded_when_opened(tmp_path):
    """Layout 2 only adds keys and the refresh rule: the marker is rewritten, nothing else."""
    root = tmp_path / "store"
    with FileStore(root) as store:
        store.put_objects([ObjectRecord(digest.sha256(b"kept"), "blob", 4, "none", b"kept")])
    (root / "overnight.json").write_bytes(b'{"kind":"overnight-store","layout":1}')
    with FileStore(root) as store:
        assert store.get_objects([digest.sha256(b"kept")])[digest.sha256(b"kept")].data == b"kept"
    assert json.loads((root / "overnight.json").read_bytes())["layout"] == 2


def test_delete_with_a_minimum_age_keeps_a_file_refreshed_at_the_last_instant(tmp_path, monkeypatch):
    """gc's delete renames the file away first, then reads its age: a writer's refresh that lands
    just before the rename is seen, and the file is put back."""
    import time

    c = FileContainer(tmp_path / "c")
    key = "objects/ab/" + "c" * 62
    c.create_many({key: b"payload", key[:-1] + "d": b"old"})
    path = tmp_path / "c" / key
    hour_ago = time.time() - 3600
    for p in (path, path.with_name(path.name[:-1] + "d")):
        os.utime(p, (hour_ago, hour_ago))
    real_rename = os.rename

    def refresh_then_rename(src, dst):
        if str(src) == str(path):
            os.utime(src)  # a commit refreshes the object in the instant before gc's rename
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", refresh_then_rename)
    freed = c.delete([key, key[:-1] + "d"], min_age_ms=60_000)
    assert list(freed) == [key[:-1] + "d"]
    assert path.read_bytes() == b"payload"
    assert not [n for n in os.listdir(path.parent) if n.startswith(".tmp-")]
    assert c.refresh([key, "objects/ab/" + "e" * 62]) == {"objects/ab/" + "e" * 62}


def test_garbled_records_name_their_key_and_a_garbled_lease_does_not_block(tmp_path):
    import overnight
    from overnight.errors import StoreCorrupt
    from overnight.store import open_store

    url = f"file://{tmp_path / 'st'}"
    task = overnight.Task("g", goal="g")

    @task.step
    def a(ctx):
        return 1

    @task.step
    def b(ctx):
        return 2

    overnight.run(task, url, max_steps=1)
    leases = list((tmp_path / "st").rglob("leases/*"))
    assert leases
    for f in leases:
        f.write_bytes(b"\x00garbage")
    assert overnight.run(task, url).status == "complete"  # a lease only coordinates: taken over
    refs = list((tmp_path / "st").rglob("refs/*"))
    refs[0].write_bytes(b"{not json")
    key = refs[0].relative_to(tmp_path / "st").as_posix()
    with open_store(url) as s:
        # the damaged ref is listed (one bad entry does not end a listing), with a head no checkpoint has
        (branch, head), = s.list_refs("g").items()
        assert key in head.damage
        with pytest.raises(StoreCorrupt) as err:  # reading it names its key
            s.get_ref("g", branch)
    assert key in err.value.message and err.value.hint
