"""``file://``: a symbolic link planted inside the store is damage, never followed.

The threat model lets someone who can write the store damage or forge what is in it (verification
catches that), not make overnight read, write, rename or delete files *outside* it. A link planted
where the store keeps a folder (``objects/ab -> ~/somewhere``) or a file (a ref -> a file the user
owns) would do exactly that if followed. Everything here works on real stores on disk, planted
with real links, and runs the real CLI in real processes (``python -m overnight ...``); nothing is
mocked.

* a shard folder that is a link: a commit storing an object in it is refused (``StoreCorrupt``
  naming the folder, exit 3) and writes nothing in the folder it points to, nor touches a file
  there; a read never returns that file's bytes;
* a ref or checkpoint record that is a link to a copy of the genuine bytes outside the store reads
  as damage: the ref is ``StoreCorrupt`` naming its key (as a garbled ref is), the record is
  skipped (``verify`` exits 3, ``resume`` falls back); ``gc`` and ``rm`` leave the outside file alone;
* a folder of a task that is a link (``archives/<task>``, ``tasks/<task>/refs``): ``rm`` refuses
  and deletes nothing in the folder it points to;
* the store's root given as a link (``~/store -> /mnt/disk/store``) works end to end: the user
  named it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from overnight.codec import digest
from overnight.errors import StoreCorrupt
from overnight.store import layout
from overnight.store.base import CheckpointRow, Commit, ObjectRecord, TaskRow
from overnight.store.file import FileStore

from _procs import THREE_STEPS, cli


def _ok(proc: subprocess.CompletedProcess, *codes: int) -> None:
    """The command exited with one of ``codes`` and printed no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in codes, (proc.returncode, proc.stdout, proc.stderr)


def _row(task_id: str, parent: str | None, seq: int) -> CheckpointRow:
    body = json.dumps({"t": task_id, "seq": seq}).encode()
    return CheckpointRow(digest.sha256(body), task_id, parent, "main", seq, "2026-11-30T00:00:00+00:00", "s", "step",
                         None, body, None, 0)


def _obj(data: bytes) -> ObjectRecord:
    return ObjectRecord(digest.sha256(data), "blob", len(data), "none", data)


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time (ns)."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _project(tmp_path: Path) -> Path:
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "t5.py").write_text(THREE_STEPS)
    return cwd


@pytest.fixture
def complete(tmp_path) -> tuple[Path, Path, str]:
    """``(project, store root, url)``: task t5 run to completion in a ``file://`` store."""
    cwd = _project(tmp_path)
    root = tmp_path / "st"
    url = f"file://{root}"
    _ok(cli("run", "t5.py", "--store", url, cwd=cwd), 0)
    return cwd, root, url


# -- 1. a shard folder planted as a link -----------------------------------------------------------


def test_a_shard_folder_planted_as_a_link_is_never_written_into_nor_read_through(tmp_path):
    root, outside = tmp_path / "st", tmp_path / "outside"
    outside.mkdir()
    fresh, known = _obj(b"an object the next commit stores"), _obj(b"an object the user has outside")
    (outside / known.digest[9:]).write_bytes(layout.encode_object(known))  # a valid object file, not the store's
    os.utime(outside / known.digest[9:], ns=(10**18, 10**18))
    r0 = _row("t", None, 0)
    with FileStore(root) as store:
        store.commit(Commit(r0, None, [], [], None, TaskRow("t", "2026-11-30T00:00:00+00:00", "g", None, b"{}")))
    (root / "objects").mkdir(exist_ok=True)
    for o in (fresh, known):
        (root / "objects" / o.digest[7:9]).symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    with FileStore(root) as store:
        for o in (fresh, known):
            r1 = _row("t", r0.checkpoint_id, 1 + (o is known))
            with pytest.raises(StoreCorrupt) as err:
                store.commit(Commit(r1, r0.checkpoint_id, [o], [], None, None))
            assert f"objects/{o.digest[7:9]}" in err.value.message and "symbolic link" in err.value.message
            assert err.value.hint
            assert store.get_ref("t", "main") == r0.checkpoint_id  # nothing committed
            with pytest.raises(StoreCorrupt):
                store.put_objects([o])
        got = store.get_objects([known.digest, fresh.digest])
        assert all(g.data != known.data and g.kind == "unreadable" for g in got.values())  # damage, never its bytes
    assert _snapshot(outside) == before  # no file written there, none refreshed


def test_a_run_into_a_store_whose_shard_folders_are_links_stops_with_exit_3_and_writes_nothing_outside(tmp_path):
    cwd = _project(tmp_path)
    root, outside = tmp_path / "st", tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("the user's own file")
    FileStore(root).close()
    for folder in ("objects", "checkpoints"):
        (root / folder).mkdir()
        for i in range(256):
            (root / folder / f"{i:02x}").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    run = cli("run", "t5.py", "--store", f"file://{root}", cwd=cwd)
    _ok(run, 3)
    assert "symbolic link" in run.stderr and str(root / "objects") in run.stderr
    assert _snapshot(outside) == before


# -- 2. a ref or checkpoint record planted as a link to a file outside the store ------------------


def test_a_ref_planted_as_a_link_is_damage_and_the_outside_file_is_never_read_nor_deleted(complete, tmp_path):
    cwd, root, url = complete
    ref = root / "tasks" / "t5" / "refs" / "main"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "main").write_bytes(ref.read_bytes())  # the genuine ref's bytes: a followed link reads a valid ref
    ref.unlink()
    ref.symlink_to(outside / "main")
    before = _snapshot(outside)
    for cmd in (["status", "t5"], ["resume", "t5"]):
        proc = cli(*cmd, "--store", url, cwd=cwd)
        _ok(proc, 3)  # StoreCorrupt naming the ref, as for a ref that does not parse
        assert "tasks/t5/refs/main" in proc.stderr, (cmd, proc.stderr)
    checked = cli("verify", "t5", "--store", url, cwd=cwd)
    _ok(checked, 3)
    assert "tasks/t5/refs/main" in checked.stdout + checked.stderr
    for cmd in (["show", "t5"], ["ls"]):  # listed as invalid, the link not followed
        proc = cli(*cmd, "--store", url, cwd=cwd)
        _ok(proc, 0)
        assert "invalid" in proc.stdout, (cmd, proc.stdout)
    with FileStore(root) as store, pytest.raises(StoreCorrupt):
        store.get_ref("t5", "main")
    _ok(cli("gc", "--apply", "--grace", "0", "--store", url, cwd=cwd), 0, 3)
    _ok(cli("rm", "t5", "--yes", "--grace", "0", "--store", url, cwd=cwd), 0, 3)
    assert _snapshot(outside) == before


def test_a_checkpoint_record_planted_as_a_link_is_damage_and_the_outside_file_is_never_read_nor_deleted(
        complete, tmp_path):
    cwd, root, url = complete
    head = json.loads((root / "tasks" / "t5" / "refs" / "main").read_bytes())["checkpoint_id"]
    record = root / layout.checkpoint_key(head)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "record").write_bytes(record.read_bytes())  # the genuine record: a followed link verifies
    record.unlink()
    record.symlink_to(outside / "record")
    before = _snapshot(outside)
    with FileStore(root) as store:
        assert head not in {r.checkpoint_id for r in store.list_checkpoints("t5")}
    for cmd in (["verify", "t5"], ["verify", "--all"]):
        _ok(cli(*cmd, "--store", url, cwd=cwd), 3)  # the head's record is reported damaged
    for cmd in (["ls"], ["status", "t5"], ["show", "t5"], ["log", "t5"]):
        _ok(cli(*cmd, "--store", url, cwd=cwd), 0)
    _ok(cli("resume", "t5", "--store", url, cwd=cwd), 0)  # falls back past it (or heals it from its copy)
    assert _snapshot(outside) == before
    _ok(cli("gc", "--apply", "--grace", "0", "--store", url, cwd=cwd), 0)
    _ok(cli("rm", "t5", "--yes", "--grace", "0", "--store", url, cwd=cwd), 0)
    assert _snapshot(outside) == before


@pytest.mark.parametrize("folder", ["archives/t5", "tasks/t5/refs"])
def test_rm_deletes_nothing_through_a_task_folder_planted_as_a_link(complete, tmp_path, folder):
    """Before links were refused, ``rm`` deleted every file in the folder the link pointed to (with
    ``archives/<task>`` at any depth)."""
    cwd, root, url = complete
    outside = tmp_path / "outside"
    planted = root / folder
    if planted.exists():  # the refs: files a followed link reads as valid refs (copies of the genuine one)
        outside.mkdir()
        for name in ("main", "other"):
            (outside / name).write_bytes((planted / "main").read_bytes())
        (planted / "main").unlink()
        planted.rmdir()
    else:
        (outside / "sub").mkdir(parents=True)
        (outside / "notes.txt").write_text("the user's own file")
        (outside / "sub" / "deep.txt").write_text("another")
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    proc = cli("rm", "t5", "--yes", "--grace", "0", "--store", url, cwd=cwd)
    assert _snapshot(outside) == before, "rm deleted files outside the store"
    _ok(proc, 3)
    assert folder in proc.stderr and "symbolic link" in proc.stderr
    planted.unlink()  # what the hint says to do; then rm finishes
    _ok(cli("rm", "t5", "--yes", "--grace", "0", "--store", url, cwd=cwd), 0, 3)
    assert _snapshot(outside) == before


# -- 3. the root itself may be a link ---------------------------------------------------------------


def test_a_store_root_given_as_a_link_works_end_to_end(tmp_path):
    cwd = _project(tmp_path)
    real = tmp_path / "disk" / "store"
    real.mkdir(parents=True)
    link = tmp_path / "store"
    link.symlink_to(real, target_is_directory=True)
    url = f"file://{link}"
    _ok(cli("run", "t5.py", "--store", url, "--max-steps", "1", cwd=cwd), 75)
    resumed = cli("resume", "t5", "--store", url, cwd=cwd)
    _ok(resumed, 0)
    _ok(cli("verify", "--all", "--store", url, cwd=cwd), 0)
    listed = cli("ls", "--store", url, cwd=cwd)
    _ok(listed, 0)
    assert "t5" in listed.stdout and "complete" in listed.stdout
    assert (real / "overnight.json").is_file() and link.is_symlink()
    _ok(cli("gc", "--apply", "--grace", "0", "--store", url, cwd=cwd), 0)
    _ok(cli("rm", "t5", "--yes", "--grace", "0", "--store", url, cwd=cwd), 0)
    assert link.is_symlink() and (real / "overnight.json").is_file()
    # and from the library, in this process
    with FileStore(link) as store:
        r0 = _row("lib", None, 0)
        store.commit(Commit(r0, None, [_obj(b"x")], [], None, TaskRow("lib", "2026-11-30T00:00:00+00:00", "g",
                                                                         None, b"{}")))
        assert store.get_ref("lib", "main") == r0.checkpoint_id
