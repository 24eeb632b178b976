"""``file://`` faults: a kill -9 inside a new task's first commit, and records whose members have the
wrong type.

Everything here works on real ``file://`` stores on disk, damaged by editing their files, and runs
the real CLI in real processes (``python -m overnight ...``); nothing is mocked.

* A process killed after its first commit wrote the task's records but before it swapped the ref
  (the commit point) leaves ``tasks/<T>/task`` and a ref without a checkpoint (``checkpoint_id``
  null, only fenced by the lease). That is "no task yet" -- what SQLite, which writes the task row
  and the first checkpoint in one transaction, leaves -- so the next ``overnight run`` starts the
  task, and ``resume`` says to run it.
* A header or ref with a member of the wrong type (a non-string ``checkpoint_id``, a string ``seq``,
  an integer ``created_at``, a ref whose ``checkpoint_id`` or ``branch`` is not a string, an object
  claiming 2**70 bytes, a lease whose token is text) is damage, handled like a record that does not
  parse: never a traceback.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from overnight.errors import TaskNotFound
from overnight.store import layout
from overnight.store.base import ArchiveRow, CallRecord, CheckpointRow, Commit, TaskRow
from overnight.store.file import FileStore

from _procs import CLI, THREE_STEPS, cli, env

# Runs the real CLI (``python -m overnight ARGS``) in this process, SIGKILLing it at a chosen
# instant of the first commit of task t5 (argv[1]):
#   task-linked: right after the task record got its name (the checkpoint record and the ref may
#                not have theirs yet);
#   ref-swap:    just before the ref is renamed onto a checkpoint (the commit point: every record
#                of the commit written and durable, the ref not moved).
KILLER = r'''
import os, signal, sys, runpy

mode = sys.argv[1]
real_replace, real_link = os.replace, os.link


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def replace(src, dst, *args, **kwargs):
    if mode == "ref-swap" and os.fspath(dst).endswith("/tasks/t5/refs/main"):
        with open(src, "rb") as fh:
            if b'"checkpoint_id":"' in fh.read():  # not the lease's fence raise (checkpoint_id null)
                die()
    return real_replace(src, dst, *args, **kwargs)


def link(src, dst, *args, **kwargs):
    out = real_link(src, dst, *args, **kwargs)
    if mode == "task-linked" and os.fspath(dst).endswith("/tasks/t5/task"):
        die()
    return out


os.replace, os.link = replace, link
sys.argv = ["overnight", *sys.argv[2:]]
runpy.run_module("overnight", run_name="__main__", alter_sys=True)
'''


def _ok(proc: subprocess.CompletedProcess, *codes: int) -> None:
    """The command exited with one of ``codes`` and printed no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in codes, (proc.returncode, proc.stdout, proc.stderr)


def _project(tmp_path: Path) -> Path:
    (tmp_path / "t5.py").write_text(THREE_STEPS)
    return tmp_path


# -- bug 1: killed inside the first commit -------------------------------------------------------


@pytest.mark.parametrize("when", ["task-linked", "ref-swap"])
def test_a_run_killed_inside_its_first_commit_is_started_by_the_next_run(tmp_path, when):
    cwd = _project(tmp_path)
    root = tmp_path / "st"
    url = f"file://{root}"
    (cwd / "killer.py").write_text(KILLER)
    killed = subprocess.run([sys.executable, "killer.py", when, "run", "t5.py", "--store", url], cwd=cwd, env=env(),
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the kill landed where it was aimed: the task record is there, no ref names a checkpoint
    leftover = (root / "tasks" / "t5" / "task").read_bytes()
    ref = json.loads((root / "tasks" / "t5" / "refs" / "main").read_bytes())
    assert ref["checkpoint_id"] is None and ref["fence"] >= 1

    resumed = cli("resume", "t5", "--store", url, cwd=cwd)
    _ok(resumed, 2)
    assert "overnight run t5.py" in resumed.stderr and "no branch" not in resumed.stderr
    _ok(cli("ls", "--store", url, cwd=cwd), 0)
    if when == "ref-swap":  # `overnight rm` removes what is left (an rm killed near its end leaves the same)
        _ok(cli("rm", "t5", "--yes", "--store", url, cwd=cwd), 0)
        assert not (root / "tasks" / "t5").exists() or not any((root / "tasks" / "t5").rglob("task"))

    run = cli("run", "t5.py", "--store", url, cwd=cwd)
    _ok(run, 0)
    assert "created task t5" in run.stderr
    _ok(cli("verify", "t5", "--store", url, cwd=cwd), 0)
    listed = cli("ls", "--store", url, cwd=cwd)
    _ok(listed, 0)
    assert "t5" in listed.stdout and "complete" in listed.stdout
    _ok(cli("resume", "t5", "--store", url, cwd=cwd), 0)
    # the registration is the one of the run that committed, not the interrupted run's leftover
    assert (root / "tasks" / "t5" / "task").read_bytes() != leftover


def _row(task_id: str, seq: int = 0, parent: str | None = None, extra: str = "") -> CheckpointRow:
    from overnight.codec import digest

    body = json.dumps({"t": task_id, "seq": seq, "parent": parent, "x": extra}).encode()
    return CheckpointRow(digest.sha256(body), task_id, parent, "main", seq, "2026-11-30T00:00:00+00:00", "s", "step",
                         None, body, None, 0)


def test_the_records_of_an_interrupted_first_commit_are_no_task_and_the_next_commit_replaces_them(tmp_path):
    """The state the kill leaves, written directly: a lease's fence on the ref, the task and
    checkpoint records of the first commit, no ref move."""
    root = tmp_path / "st"
    with FileStore(root) as store:
        lease = store.acquire_lease("t", "main", "h1", "{}", 60_000)
        old_task = TaskRow("t", "2026-11-30T00:00:00+00:00", "old goal", "old.py:task", b"{}")
        lost = _row("t", extra="the interrupted run's")
        store._c.create_many({layout.task_key("t"): layout.encode_task(old_task),
                              layout.checkpoint_key(lost.checkpoint_id): layout.encode_checkpoint(lost, 0, [])})
        assert json.loads((root / "tasks" / "t" / "refs" / "main").read_bytes())["checkpoint_id"] is None
        with pytest.raises(TaskNotFound) as err:
            store.get_task("t")
        assert "overnight run old.py:task" in (err.value.hint or "")
        assert store.list_tasks() == [] and store.list_refs("t") == {} and store.list_checkpoints("t") == []

        new_task = TaskRow("t", "2026-11-30T00:00:05+00:00", "new goal", "new.py:task", b"{}")
        first = _row("t")
        store.commit(Commit(first, None, [], [], lease, new_task))
        assert store.get_task("t") == new_task
        assert [t.task_id for t in store.list_tasks()] == ["t"]
        assert store.get_ref("t", "main") == first.checkpoint_id
    # a task whose every branch was deleted stays a task (its index remembers the old heads)
    with FileStore(root) as store:
        store.set_ref("t", "main", None, first.checkpoint_id)
        assert store.get_task("t") == new_task


# -- bug 2: members of the wrong type -------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A file:// store holding t5, complete, plus another complete task."""
    cwd = _project(tmp_path_factory.mktemp("pristine"))
    (cwd / "other.py").write_text(THREE_STEPS.replace('"t5"', '"other"'))
    for f in ("t5.py", "other.py"):
        _ok(cli("run", f, "--store", f"file://{cwd / 'st'}", cwd=cwd), 0)
    return cwd


def _copy(pristine: Path, tmp_path: Path) -> tuple[Path, str]:
    shutil.copytree(pristine, tmp_path / "p")
    return tmp_path / "p", f"file://{tmp_path / 'p' / 'st'}"


def _head_record(root: Path) -> Path:
    cid = json.loads((root / "tasks" / "t5" / "refs" / "main").read_bytes())["checkpoint_id"]
    return root / layout.checkpoint_key(cid)


def _edit_header(path: Path, **members) -> None:
    head, _, rest = path.read_bytes().partition(b"\n")
    fields = json.loads(head)
    fields.update(members)
    path.write_bytes(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode() + b"\n" + rest)


def _edit_ref(root: Path, **members) -> None:
    path = root / "tasks" / "t5" / "refs" / "main"
    ref = json.loads(path.read_bytes())
    ref.update(members)
    path.write_text(json.dumps(ref, sort_keys=True, separators=(",", ":")))


@pytest.mark.parametrize("members", [{"checkpoint_id": 5}, {"seq": "2"}, {"created_at": 12}],
                         ids=["checkpoint_id-int", "seq-str", "created_at-int"])
def test_a_checkpoint_header_with_a_member_of_the_wrong_type_is_a_damaged_record(pristine, tmp_path, members):
    cwd, url = _copy(pristine, tmp_path)
    _edit_header(_head_record(cwd / "st"), **members)
    listed = cli("ls", "--store", url, cwd=cwd)
    _ok(listed, 0)
    assert "t5" in listed.stdout and "other" in listed.stdout
    for cmd in (["status", "t5"], ["show", "t5"], ["log", "t5"]):
        _ok(cli(*cmd, "--store", url, cwd=cwd), 0)
    for cmd in (["verify", "t5"], ["verify", "--all"]):
        _ok(cli(*cmd, "--store", url, cwd=cwd), 3)  # the damaged record is reported
    _ok(cli("verify", "other", "--store", url, cwd=cwd), 0)
    _ok(cli("resume", "t5", "--store", url, cwd=cwd), 0)  # falls back past it (or heals it from its copy)


@pytest.mark.parametrize("members", [{"created_at": 12}, {"goal": None}, {"task_id": ["t5"]}],
                         ids=["created_at-int", "goal-null", "task_id-list"])
def test_verify_all_reports_a_task_record_with_a_member_of_the_wrong_type(pristine, tmp_path, members):
    """``verify t5`` refuses the record (StoreCorrupt naming its key); ``verify --all``, whose
    listing of the tasks leaves that record out, reports it too and exits 3."""
    cwd, url = _copy(pristine, tmp_path)
    _edit_header(cwd / "st" / "tasks" / "t5" / "task", **members)
    one = cli("verify", "t5", "--store", url, cwd=cwd)
    _ok(one, 3)
    assert "tasks/t5/task" in one.stderr
    every = cli("verify", "--all", "--store", url, cwd=cwd)
    _ok(every, 3)
    assert "tasks/t5/task" in every.stdout and "other: main ok" in every.stdout, every.stdout
    _ok(cli("verify", "other", "--store", url, cwd=cwd), 0)


def test_a_journal_row_with_a_member_of_the_wrong_type_is_a_damaged_record(pristine, tmp_path):
    cwd, url = _copy(pristine, tmp_path)
    path = _head_record(cwd / "st")
    journal = json.loads(path.read_bytes().partition(b"\n")[0])["journal"]
    assert journal
    journal[0]["seq"] = "3"
    _edit_header(path, journal=journal)
    _ok(cli("ls", "--store", url, cwd=cwd), 0)
    _ok(cli("show", "t5", "--store", url, cwd=cwd), 0)
    _ok(cli("verify", "t5", "--store", url, cwd=cwd), 3)


@pytest.mark.parametrize("members", [{"checkpoint_id": 7}, {"branch": ["main"]}, {"branch": 1}],
                         ids=["checkpoint_id-int", "branch-list", "branch-int"])
def test_a_ref_with_a_member_of_the_wrong_type_is_store_corrupt_naming_it(pristine, tmp_path, members):
    """Reading the branch is StoreCorrupt naming the ref; listings show the task as ``invalid``
    and go on; ``verify`` reports the ref as a problem (exit 3)."""
    cwd, url = _copy(pristine, tmp_path)
    _edit_ref(cwd / "st", **members)
    for cmd in (["status", "t5"], ["resume", "t5"]):
        proc = cli(*cmd, "--store", url, cwd=cwd)
        _ok(proc, 3)  # StoreCorrupt, as for a ref that does not parse
        assert "tasks/t5/refs/main" in proc.stderr and "wrong type" in proc.stderr
    for cmd in (["verify", "t5"], ["verify", "--all"]):
        proc = cli(*cmd, "--store", url, cwd=cwd)
        _ok(proc, 3)
        assert "tasks/t5/refs/main" in proc.stdout + proc.stderr and "wrong type" in proc.stdout + proc.stderr
    for cmd in (["ls"], ["show", "t5"]):
        proc = cli(*cmd, "--store", url, cwd=cwd)
        _ok(proc, 0)
        assert "invalid" in proc.stdout, (cmd, proc.stdout)
    listed = cli("ls", "--store", url, cwd=cwd)
    assert "other" in listed.stdout  # the other task is still listed
    _ok(cli("status", "other", "--store", url, cwd=cwd), 0)


def test_an_object_claiming_2_to_the_70_bytes_is_a_damaged_object(pristine, tmp_path):
    cwd, url = _copy(pristine, tmp_path)
    root = cwd / "st"
    damaged = [p for p in sorted((root / "objects").rglob("*")) if p.is_file()]
    for p in damaged:
        _edit_header(p, size=2**70)
    _ok(cli("ls", "--store", url, cwd=cwd), 0)
    for cmd in (["status", "t5"], ["verify", "t5"], ["verify", "--all"]):
        _ok(cli(*cmd, "--store", url, cwd=cwd), 3)
    _ok(cli("show", "t5", "--store", url, cwd=cwd), 0)
    with FileStore(root) as store:  # read as a record whose header does not parse
        digests = [f"sha256:{p.parent.name}{p.name}" for p in damaged]
        assert {o.kind for o in store.get_objects(digests).values()} == {"unreadable"}


def test_a_lease_with_a_member_of_the_wrong_type_reads_as_no_lease(pristine, tmp_path):
    cwd, url = _copy(pristine, tmp_path)
    path = cwd / "st" / "tasks" / "t5" / "leases" / "main"
    lease = json.loads(path.read_bytes())
    lease["token"] = "1"
    path.write_text(json.dumps(lease, sort_keys=True, separators=(",", ":")))
    _ok(cli("run", "t5.py", "--store", url, cwd=cwd), 0)
    _ok(cli("ls", "--store", url, cwd=cwd), 0)
    _ok(cli("verify", "t5", "--store", url, cwd=cwd), 0)


def test_call_and_archive_records_with_a_member_of_the_wrong_type_are_left_out(tmp_path):
    root = tmp_path / "st"
    with FileStore(root) as store:
        first = _row("t")
        store.commit(Commit(first, None, [], [], None, TaskRow("t", "2026-11-30T00:00:00+00:00", "g", None, b"{}")))
        calls = [CallRecord("t", "sha256:" + "a" * 64, seq, "sha256:" + str(seq) * 64, "m", b"{}", 1, 1, 1.0,
                            f"2026-11-30T00:00:0{seq}+00:00") for seq in (0, 1)]
        archives = [ArchiveRow("sha256:" + str(n) * 64, "t", f"2026-11-30T00:00:0{n}+00:00", "file:///cold", b"m")
                    for n in (1, 2)]
        for call in calls:
            store.record_call(call)
        for row in archives:
            store.put_archive(row)
        _edit_header(root / layout.call_key(calls[1]), created_at=3)
        _edit_header(root / layout.archive_key("t", archives[1].archive_id), created_at=None)
        assert store.calls("t") == [calls[0]]
        assert store.list_archives("t") == [archives[0]] and store.list_archives() == [archives[0]]


def test_a_task_record_naming_another_task_than_its_folder_is_damage(tmp_path):
    """A ``task`` record rewritten to name another task must not show that task with this one's
    history, nor hide this one silently: it is left out of listings, reading it by id is
    StoreCorrupt, and ``verify --all`` reports it."""
    cwd = _project(tmp_path)
    url = f"file://{tmp_path / 'st'}"
    _ok(cli("run", "t5.py", "--store", url, cwd=cwd), 0)
    key = tmp_path / "st" / "tasks" / "t5" / "task"
    key.write_bytes(key.read_bytes().replace(b'"t5"', b'"t6"'))
    listed = cli("ls", "--store", url, cwd=cwd)
    assert "t6" not in listed.stdout
    _ok(cli("show", "t5", "--store", url, cwd=cwd), 3)
    checked = cli("verify", "--all", "--store", url, cwd=cwd)
    _ok(checked, 3)
    assert "names task 't6'" in checked.stdout + checked.stderr


def test_planted_index_names_and_sparse_records_are_damage_not_crashes(tmp_path):
    """A file named ``%ZZ`` planted in a task's index (no name overnight writes) is no traceback:
    listings and gc ignore it, ``verify --all`` reports it; a sparse 4 GB file planted as a ref reads
    as damage without allocating its size."""
    import resource

    cwd = _project(tmp_path)
    url = f"file://{tmp_path / 'st'}"
    _ok(cli("run", "t5.py", "--store", url, cwd=cwd), 0)
    (tmp_path / "st" / "tasks" / "t5" / "checkpoints" / "%ZZ").write_bytes(b"x\n")
    for args in (["ls"], ["show", "t5"], ["gc", "--apply"]):
        _ok(cli(*args, "--store", url, cwd=cwd), 0)
    checked = cli("verify", "--all", "--store", url, cwd=cwd)
    _ok(checked, 3)
    assert "%ZZ" in checked.stdout + checked.stderr
    ref = tmp_path / "st" / "tasks" / "t5" / "refs" / "main"
    ref.unlink()
    with open(ref, "wb") as fh:
        fh.truncate(4 << 30)  # no disk blocks
    limit = 1 << 30  # the command would need 4 GB to read it whole
    listed = subprocess.run([*CLI, "show", "t5", "--store", url], cwd=cwd, env=env(), capture_output=True, text=True,
                            timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    _ok(listed, 0)  # shown as invalid, its 4 GB never read
    assert "invalid" in listed.stdout
    status = subprocess.run([*CLI, "status", "t5", "--store", url], cwd=cwd, env=env(), capture_output=True,
                            text=True, timeout=120,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    _ok(status, 3)
    assert "refs/main" in status.stderr
