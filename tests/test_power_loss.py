"""Power loss, not just process death: writes that were not fsynced are really lost.

``kill -9`` (``tests/test_crash.py``) cannot show whether a commit reached the disk: the OS page
cache survives the process. Here the store runs under ``tests/power_loss/shim.c``, an
``LD_PRELOAD`` library (built with the system C compiler when the tests start) that records what a
power cut would keep -- a file's bytes as of its last ``fsync``/``fdatasync``, a directory's names as
of its last sync -- and after a ``kill -9`` at a random moment the store's directory is rebuilt
from that record alone: unsynced data, renames, links and new names whose directory was not synced
afterwards are gone (see the shim's header for the model). Then every commit the run acknowledged
(its ``step_end`` event, emitted after the commit returned) must be on the branch, the head must
load without a fallback, and ``verify`` must find the store intact. SQLite and ``file://``.

The runs are forked from one worker process (``tests/power_loss/worker.py``) that imported
overnight once. The number of cuts per medium is ``$OVERNIGHT_POWER_CUTS`` (default 3).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _procs import env, read_events, wait_for
from conftest import _unavailable

from overnight.store import open_store
from overnight.chain.read import load_head
from overnight.verify.fsck import verify_store

HERE = Path(__file__).parent / "power_loss"
CUTS = int(os.environ.get("OVERNIGHT_POWER_CUTS", "3"))
STEPS = 4 * CUTS + 4  # each kill comes after 1-6 steps of its run: the task outlasts the kills


@pytest.fixture(scope="session")
def shim(tmp_path_factory) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        _unavailable("a C compiler on Linux (to build the power-cut shim)", "no cc/gcc found")
    out = tmp_path_factory.mktemp("shim") / "power_cut.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(HERE / "shim.c"), "-ldl"], check=True,
                   capture_output=True, timeout=120)
    return out


class Worker:
    """``tests/power_loss/worker.py`` under the shim: runs the task in forked children."""

    def __init__(self, shim: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "worker.py")], env={**env(), "LD_PRELOAD": str(shim)},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the power-cut worker died (exit {self.proc.wait()})"
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="session")
def worker(shim):
    w = Worker(shim)
    yield w
    w.close()


class Disk:
    """A directory on a disk that can lose power: processes of ``worker`` write to it, ``cut()``
    keeps only what they synced, ``sync_all()`` is the ``sync`` after a reboot (or at the start)."""

    def __init__(self, worker: Worker, base: Path) -> None:
        self.worker = worker
        self.root = Path(os.path.realpath(base / "disk"))
        self.shadow = base / "shadow"
        self.root.mkdir()
        self.sync_all()

    def where(self) -> dict[str, str]:
        return {"root": str(self.root), "shadow": str(self.shadow)}

    def sync_all(self) -> None:
        shutil.rmtree(self.shadow, ignore_errors=True)
        for sub in ("data", "dirs", "tmp"):
            (self.shadow / sub).mkdir(parents=True)
        self.worker.send(op="sync", **self.where())
        assert self.worker.answer() == {"ok": True}
        assert (self.shadow / "root").exists(), "the shim recorded nothing: is LD_PRELOAD honoured here?"

    def cut(self) -> tuple[int, int]:
        """Power off: rebuild the directory from what was synced. Returns what was lost: the live
        files that are gone or hold other bytes, and their live size."""
        rebuilt = self.root.with_name("rebuilt")

        def build(key: str, dest: Path) -> None:
            dest.mkdir()
            listing = self.shadow / "dirs" / key
            for line in listing.read_text().splitlines() if listing.exists() else []:
                kind, ident, name = line.split(" ", 2)
                if kind == "d":
                    build(ident, dest / name)
                elif kind == "f":
                    data = self.shadow / "data" / ident
                    (dest / name).write_bytes(data.read_bytes() if data.exists() else b"")

        build((self.shadow / "root").read_text(), rebuilt)
        files = lost = 0
        for folder, _, names in os.walk(self.root):
            for name in names:
                live = Path(folder, name)
                kept = rebuilt / live.relative_to(self.root)
                data = live.read_bytes()
                if not kept.is_file() or kept.read_bytes() != data:
                    files += 1
                    lost += len(data)
        shutil.rmtree(self.root)
        rebuilt.rename(self.root)
        return files, lost


def _lineage(store, head: str | None) -> set[str]:
    out = set()
    while head is not None:
        out.add(head)
        head = store.get_checkpoint(head).parent_id
    return out


def _check(url: str, acked: list[str]) -> int:
    """Every acknowledged commit is on the branch, the head loads without a fallback and the store
    verifies; returns the number of steps done."""
    with open_store(url) as s:
        head = s.get_ref("power", "main")
        if head is None:
            assert not acked, f"the task's ref is gone after the power cut, {len(acked)} commits were acknowledged"
            return 0
        loaded, fallback = load_head(s, "power")
        assert fallback is None, f"the head did not verify after the power cut:\n{fallback.describe()}"
        on_branch = _lineage(s, head)
        lost = [c for c in acked if c not in on_branch]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged commits lost at the power cut: {lost[:3]}"
        report = verify_store(s, ["power"])
        assert report.ok, report
        return len(loaded.state.done)


@pytest.mark.slow
@pytest.mark.parametrize("medium", ["sqlite", "file"])
def test_power_cut_keeps_every_acknowledged_commit(medium, worker, tmp_path):
    """Kill -9 at random moments with unsynced writes dropped (see the module docstring), then run
    to the end and cut the power once more: nothing acknowledged is lost, every load verifies."""
    disk = Disk(worker, tmp_path)
    url = f"sqlite://{disk.root / 's.db'}" if medium == "sqlite" else f"file://{disk.root / 'store'}"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    acked: list[str] = []
    dropped = []
    for n in range(CUTS + 1):
        events = tmp_path / f"events-{n}.jsonl"
        worker.send(op="run", url=url, events=str(events), steps=STEPS, **disk.where())
        pid = worker.answer()["pid"]
        if n < CUTS:
            want = rng.randint(1, 6)
            wait_for(lambda: sum(e["kind"] == "step_end" for e in read_events(events)) >= want
                     or any(e["kind"] == "end" for e in read_events(events)), timeout=120, what=f"{want} steps")
            time.sleep(rng.uniform(0, 0.03))  # in a step or inside its commit
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the run reached its end first (a loaded machine): its exit 0 is checked below
        code = worker.answer()["exit"]
        assert code in ((0, -signal.SIGKILL) if n < CUTS else (0,)), f"the run failed (exit {code})"
        acked += [e["checkpoint_id"] for e in read_events(events)
                  if e["kind"] in ("create", "step_end") and e.get("checkpoint_id")]
        dropped.append(disk.cut())
        done = _check(url, acked)
        disk.sync_all()
    assert done == STEPS + 1  # the plan and every step, after the last power cut too
    print(f"\n{medium}: {CUTS} kills + a final cut; {len(acked)} commits acknowledged, all kept; "
          f"(files, bytes) of unsynced writes dropped per cut: {dropped}")


def test_a_power_cut_drops_what_was_not_synced(worker, shim, tmp_path):
    """The harness itself: after the cut a file renamed into place without an fsync of its data
    comes back empty, one whose data and directory were synced is kept, and one whose directory
    was not synced after its rename is gone."""
    disk = Disk(worker, tmp_path)
    script = textwrap.dedent("""
        import os, sys
        root = sys.argv[1]
        def write(name, data, sync):
            fd = os.open(os.path.join(root, name + ".tmp"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, data)
            if sync:
                os.fsync(fd)
            os.close(fd)
            os.rename(os.path.join(root, name + ".tmp"), os.path.join(root, name))
        write("unsynced", b"lost", False)
        write("synced", b"kept", True)
        fd = os.open(root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        write("late", b"lost too", True)  # its data is synced, its name never is
    """)
    subprocess.run([sys.executable, "-c", script, str(disk.root)], check=True, timeout=60,
                   env={**env(), "LD_PRELOAD": str(shim), "PL_ROOT": str(disk.root), "PL_SHADOW": str(disk.shadow)})
    assert sorted(p.name for p in disk.root.iterdir()) == ["late", "synced", "unsynced"]
    assert disk.cut() == (2, len(b"lost") + len(b"lost too"))  # "unsynced" came back empty, "late" is gone
    assert {p.name: p.read_bytes() for p in disk.root.iterdir()} == {"synced": b"kept", "unsynced": b""}
