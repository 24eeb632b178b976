"""Tiered storage: ``overnight archive`` / ``restore`` with a real hot and a real cold store
(SQLite + a directory, SQLite + S3 on a local server, a directory + SQLite).

Archived history must stay readable through every command (show, log, cat --at, verify), come
back when something builds on it (fork --at, rollback --to), never be needed by a resume, and be
verified like any other data when it is read.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import zstandard
from _procs import run_limited
from conftest import S3_BUCKET
from test_gc import big, make_task, run

from overnight import api
from overnight.codec import digest
from overnight.errors import ConfigError, IntegrityError, TaskBusy
from overnight.store import open_store
from overnight.store.leases import Holder
from overnight.store.compose.pack import manifest_of
from overnight.chain.read import load_head
from overnight.ops.gc import collect
from overnight.chain.integrity import load_checkpoint


def _file(request, tmp_path):
    return f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"


def _s3(request, tmp_path):
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"sqlite://{tmp_path / 'hot.db'}", f"s3://{S3_BUCKET}/cold-{uuid.uuid4().hex}?endpoint_url={endpoint}"


def _sqlite_cold(request, tmp_path):
    return f"file://{tmp_path / 'hot'}", f"sqlite://{tmp_path / 'cold.db'}"


PAIRS = {"sqlite+file": _file, "sqlite+s3": _s3, "file+sqlite": _sqlite_cold}


@pytest.fixture(params=sorted(PAIRS))
def pair(request, tmp_path):
    return request.param, *PAIRS[request.param](request, tmp_path)


def build(hot_url: str) -> dict:
    """main: plan + 7 notes; B forked at seq 3 with 3 notes of its own."""
    store = open_store(hot_url)
    task = make_task("g", n=10)
    run(store, task, max_steps=8)
    chain = sorted(store.list_checkpoints("g"), key=lambda r: r.seq)
    api.fork("g", chain[3].checkpoint_id, "B", store=store)
    run(store, task, "B", "B", max_steps=3)
    expected = {}
    for row in store.list_checkpoints("g"):
        loaded = load_checkpoint(store, row.checkpoint_id)
        expected[row.checkpoint_id] = {n: api.cat("g", n, at=row.checkpoint_id, store=store) for n in loaded.artifacts}
    store.close()
    return {"task": task, "expected": expected, "show": api.show("g", store=hot_url),
            "log": [e.row.checkpoint_id for e in api.log("g", store=hot_url)]}


def hot_ids(hot_url: str) -> set[str]:
    with open_store(hot_url) as s:
        return {r.checkpoint_id for r in s.list_checkpoints("g")}


def test_archive_keeps_everything_readable_and_restore_brings_it_back(pair, tmp_path):
    name, hot_url, cold_url = pair
    b = build(hot_url)
    everything = set(b["expected"])
    with open_store(hot_url) as s:
        objects_before = set(s.iter_object_digests())
        heads = s.list_refs("g")

    rep = api.archive("g", cold=cold_url, keep_last=2, store=hot_url, grace=0)
    assert rep.archive_id and rep.objects_packed > 0 and rep.objects_deleted > 0
    archived = set(rep.archived)
    # each branch keeps its head and the checkpoint before it; heads are never archived
    with open_store(hot_url) as s:
        for branch, head in heads.items():
            kept = [head, s.get_checkpoint(head).parent_id]
            assert not archived & set(kept)
        assert set(s.iter_object_digests()) < objects_before
        assert [a.archive_id for a in s.list_archives("g")] == [rep.archive_id]
    assert hot_ids(hot_url) == everything - archived and len(archived) >= 8
    with open_store(cold_url) as cold:
        (row,) = cold.list_archives("g")
        m = manifest_of(row)
        assert {c.checkpoint_id for c in m.checkpoints} == archived
        assert cold.missing_objects([m.pack["digest"]]) == set()

    # every command still sees the whole history, archived checkpoints marked
    show = api.show("g", store=hot_url)
    assert [c.checkpoint_id for c in show.chain] == [c.checkpoint_id for c in b["show"].chain]
    assert {c.checkpoint_id for c in show.chain if c.archived} == archived
    assert show.status == b["show"].status and show.done == b["show"].done
    assert [e.row.checkpoint_id for e in api.log("g", store=hot_url)] == b["log"]
    for cid, artifacts in b["expected"].items():
        for n, data in artifacts.items():
            assert api.cat("g", n, at=cid, store=hot_url) == data
    rep_v = api.verify("g", store=hot_url)
    assert rep_v.ok and rep_v.checkpoints == len(everything), rep_v.problems
    assert api.verify(store=hot_url, all_objects=True).ok
    old = next(c for c in sorted(archived) if "big-0.bin" in b["expected"][c])
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "overnight", "show", "g", "--store", hot_url], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0 and "archived" in out.stdout
    out = subprocess.run([sys.executable, "-m", "overnight", "cat", "g", "big-0.bin", "--at", old[7:19], "--store",
                          hot_url], capture_output=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout == b["expected"][old]["big-0.bin"]

    # resuming needs nothing from the cold store
    moved = tmp_path / "cold-away"
    if name == "sqlite+file":
        shutil.move(tmp_path / "cold", moved)
    for branch, label in (("main", "main"), ("B", "B")):
        assert run(open_store(hot_url), b["task"], branch, label).status == "complete"
    if name == "sqlite+file":
        with pytest.raises(ConfigError, match="does not exist"):  # archived data is in the cold store only
            api.cat("g", "big-0.bin", at=sorted(archived)[0], store=hot_url)
        assert not (tmp_path / "cold").exists()  # reading did not create an empty one
        shutil.move(moved, tmp_path / "cold")

    # building on an archived checkpoint brings it back first
    first_note = next(c for c in b["show"].chain if c.step == "note[i=0]").checkpoint_id
    assert first_note in archived
    api.fork("g", first_note, "C", store=hot_url)
    assert first_note in hot_ids(hot_url)
    assert run(open_store(hot_url), b["task"], "C", "C").status == "complete"
    api.rollback("g", next(c for c in b["show"].chain if c.step == "note[i=2]").checkpoint_id, store=hot_url)
    assert run(open_store(hot_url), b["task"], "main", "main").status == "complete"
    assert api.cat("g", "big-2.bin", store=hot_url) == big("main", 8)
    assert api.verify(store=hot_url, all_objects=True).ok

    # gc on the hot store keeps what the archive needs in hot; gc on the cold store keeps the pack
    assert collect(open_store(hot_url), apply=True, grace_s=0).checkpoints_deleted == 0
    with open_store(cold_url) as cold:
        assert collect(cold, apply=True, grace_s=0).objects_deleted == 0
    assert api.verify("g", store=hot_url).ok

    # restore: everything back in hot, the catalog empty, the cold store untouched
    res = api.restore("g", store=hot_url)
    assert res.archives == [rep.archive_id] and res.checkpoints == len(archived) - 2  # two came back already
    assert hot_ids(hot_url) >= everything
    with open_store(hot_url) as s:
        assert s.list_archives("g") == []
    with open_store(cold_url) as cold:
        assert len(cold.list_archives("g")) == 1
    if name == "sqlite+file":
        shutil.move(tmp_path / "cold", moved)
    for cid, artifacts in b["expected"].items():
        for n, data in artifacts.items():
            assert api.cat("g", n, at=cid, store=hot_url) == data
    assert api.verify(store=hot_url, all_objects=True).ok


def test_a_second_archive_packs_only_what_is_new(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    store = open_store(hot_url)
    task = make_task("g", n=12)
    run(store, task, max_steps=6)
    first = api.archive("g", cold=cold_url, keep_last=2, store=store, grace=0)
    run(store, task, max_steps=4)
    second = api.archive("g", cold=cold_url, keep_last=2, store=store, grace=0)
    assert first.archive_id != second.archive_id and set(first.archived).isdisjoint(second.archived)
    with open_store(cold_url) as cold:
        rows = {r.archive_id: manifest_of(r) for r in cold.list_archives("g")}
    assert rows[second.archive_id].previous == [first.archive_id]
    packed = {e.digest for m in rows.values() for e in m.objects}
    assert sum(len(m.objects) for m in rows.values()) == len(packed)  # no object packed twice
    assert api.verify("g", store=store).ok
    assert api.archive("g", cold=cold_url, keep_last=2, store=store).archived == []  # nothing left to move
    res = api.restore("g", store=store)
    assert len(res.archives) == 2 and api.verify(store=store, all_objects=True).ok
    store.close()


def test_the_pack_and_manifest_can_be_checked_by_hand(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    store = open_store(hot_url)
    run(store, make_task("g", n=6), max_steps=7)
    rep = api.archive("g", cold=cold_url, older_than="0s", store=store, grace=0)
    assert rep.kept == 1  # only the head stays
    with open_store(cold_url) as cold:
        (row,) = cold.list_archives("g")
        manifest = zstandard.ZstdDecompressor().decompress(row.manifest)
        assert digest.sha256(manifest) == row.archive_id == rep.archive_id
        m = manifest_of(row)
        pack = cold.get_objects([m.pack["digest"]])[m.pack["digest"]].data
    assert digest.sha256(pack) == m.pack["digest"] and len(pack) == m.pack["size"]
    # `zstd -d < pack`: every payload, in manifest order
    payloads = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(pack), read_across_frames=True).read()
    sizes = [e.size for e in m.objects]
    assert len(payloads) == sum(sizes)
    offset = 0
    for e in m.objects:
        payload = payloads[offset : offset + e.size]
        offset += e.size
        frame = zstandard.ZstdDecompressor().decompress(pack[e.offset : e.offset + e.length])
        assert frame == payload
        if e.kind == "blob":
            assert digest.sha256(payload) == e.digest
    assert {c.checkpoint_id for c in m.checkpoints} == set(rep.archived)
    assert all(digest.sha256(c.body) == c.checkpoint_id for c in m.checkpoints)
    store.close()


def test_a_damaged_pack_is_detected_and_never_loaded(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    store = open_store(hot_url)
    task = make_task("g", n=6)
    run(store, task, max_steps=7)
    rep = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0)
    with open_store(cold_url) as cold:
        pack_digest = manifest_of(cold.list_archives("g")[0]).pack["digest"]
    hexd = pack_digest[7:]
    path = tmp_path / "cold" / "objects" / hexd[:2] / hexd[2:]
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    check = api.verify("g", store=hot_url)
    assert not check.ok and any(pack_digest in p.detail for p in check.problems)
    with pytest.raises(IntegrityError):
        api.cat("g", "big-0.bin", at=rep.archived[-1], store=hot_url)
    head, fallback = load_head(store, "g", "main")
    assert fallback is None  # the head never needed the cold store
    with pytest.raises(IntegrityError):
        api.restore("g", store=hot_url)
    store.close()


def _claiming(n: int) -> bytes:
    """A small zstd frame whose header claims ``n`` content bytes (its 4-byte size field rewritten)."""
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * 100_000)
    fhd = frame[4]  # frame header descriptor: bits 7-6 size field width, bit 5 single segment, 1-0 dict id width
    assert fhd >> 6 == 2
    at = 5 + (0 if fhd & 0x20 else 1) + (0, 1, 2, 4)[fhd & 3]
    forged = frame[:at] + n.to_bytes(4, "little") + frame[at + 4:]
    assert zstandard.frame_content_size(forged) == n
    return forged


def _zeros(n: int, *, stated: bool) -> bytes:
    """``n`` zero bytes as one zstd frame (its size in the header or not), compressed a MiB at a time."""
    cctx = zstandard.ZstdCompressor(write_content_size=stated)
    cobj = cctx.compressobj(size=n if stated else -1)
    block = bytes(1 << 20)
    out = [cobj.compress(block) for _ in range(n >> 20)]
    return b"".join([*out, cobj.flush()])


@pytest.mark.slow  # real CLI processes, a 2 GiB bomb compressed
@pytest.mark.parametrize("bomb", ["claims-4GB", "expands-2GiB-stated", "expands-2GiB-unstated"])
def test_a_manifest_bomb_is_a_typed_error_within_bounded_memory(tmp_path, bomb):
    """A catalog row (hot) and archive row (cold) whose manifest frame claims, or expands to,
    gigabytes: reading it -- under a 1 GiB address-space limit -- is a DigestMismatch naming the
    archive, never a MemoryError or that much memory; ``show`` still lists the hot history and
    ``restore --cold`` fails typed, with no traceback."""
    import sqlite3

    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    with open_store(hot_url) as store:
        run(store, make_task("g", n=4), max_steps=5)
        archive_id = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0).archive_id
    frame = {"claims-4GB": lambda: _claiming(0xF000_0000),
             "expands-2GiB-stated": lambda: _zeros(2 << 30, stated=True),
             "expands-2GiB-unstated": lambda: _zeros(2 << 30, stated=False)}[bomb]()
    assert len(frame) < 1 << 20
    with sqlite3.connect(tmp_path / "hot.db") as db:
        assert db.execute("UPDATE archives SET manifest=?", (frame,)).rowcount == 1
    (row_file,) = [f for f in (tmp_path / "cold" / "archives").rglob("*") if f.is_file()]
    header = row_file.read_bytes().partition(b"\n")[0]
    os.chmod(row_file, 0o644)
    row_file.write_bytes(header + b"\n" + frame)

    def proc(argv):
        return run_limited(argv, cwd=tmp_path)

    script = ("import sys\nfrom overnight.store import open_store\nfrom overnight.store.compose.pack import manifest_of\n"
              "from overnight.errors import OvernightError\n"
              "for url in sys.argv[1:]:\n"
              "    with open_store(url) as s:\n"
              "        (row,) = s.list_archives('g')\n"
              "        try:\n"
              "            manifest_of(row)\n"
              "        except OvernightError as exc:\n"
              "            print(type(exc).__name__, exc.message)\n")
    read = proc(["-c", script, hot_url, cold_url])
    assert read.returncode == 0, read.stderr
    lines = read.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("DigestMismatch ") and archive_id in line for line in lines), lines
    assert all("manifest" in line for line in lines), lines
    show = proc(["-m", "overnight", "show", "g", "--store", hot_url])
    assert show.returncode == 0, show.stderr
    restore = proc(["-m", "overnight", "restore", "g", "--cold", cold_url, "--store", hot_url])
    assert restore.returncode == 3 and archive_id in restore.stderr, restore.stderr


def test_a_manifest_too_large_to_read_back_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from overnight.store.compose import pack

    hot_url, cold = f"sqlite://{tmp_path / 'hot.db'}", tmp_path / "cold"
    with open_store(hot_url) as store:
        run(store, make_task("g", n=4), max_steps=5)
        before = {r.checkpoint_id for r in store.list_checkpoints("g")}
    monkeypatch.setattr(pack, "MAX_MANIFEST_SIZE", 1000)
    with pytest.raises(ConfigError, match="more than the 1000 one archive run may write") as err:
        api.archive("g", cold=f"file://{cold}", keep_last=1, store=hot_url, grace=0)
    assert "--keep-last" in (err.value.hint or "")
    assert not cold.exists() and hot_ids(hot_url) == before


def test_a_pack_entry_whose_frame_claims_gigabytes_is_damage_not_an_allocation(tmp_path):
    """A codec-``none`` entry is decompressed within its size, as any object (MAX_SIZE): under a
    1 GiB address-space limit, a frame claiming 4 GB -- with the entry saying so too, or not --
    is a DigestMismatch naming the entry, not a MemoryError."""
    (tmp_path / "frame").write_bytes(_claiming(0xF000_0000))
    script = ("import sys\nfrom pathlib import Path\nfrom overnight.errors import DigestMismatch\n"
              "from overnight.store.compose.pack import PackEntry, read_entry\n"
              "frame = Path(sys.argv[1]).read_bytes()\n"
              "for size in (0xF0000000, 100000):\n"
              "    try:\n"
              "        read_entry(frame, PackEntry('sha256:' + '0' * 64, 'blob', size, 'none', 0, len(frame)))\n"
              "    except DigestMismatch as exc:\n"
              "        print('DigestMismatch', exc.message)\n")

    r = run_limited(["-c", script, str(tmp_path / "frame")], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("DigestMismatch pack entry sha256:000") for line in lines), lines


def test_restore_from_the_cold_store_after_losing_the_catalog(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    store = open_store(hot_url)
    run(store, make_task("g", n=6), max_steps=7)
    everything = {r.checkpoint_id for r in store.list_checkpoints("g")}
    rep = api.archive("g", cold=cold_url, keep_last=2, store=store, grace=0)
    store.delete_archive("g", rep.archive_id)  # the hot catalog is lost
    assert len(api.show("g", store=store).chain) == len(everything) - len(rep.archived)
    # the cold store moved too: packs are read from where --cold says
    shutil.move(tmp_path / "cold", tmp_path / "moved")
    res = api.restore("g", store=store, cold=f"file://{tmp_path / 'moved'}")
    assert res.archives == [rep.archive_id] and res.checkpoints == len(rep.archived)
    assert {r.checkpoint_id for r in store.list_checkpoints("g")} == everything
    assert api.verify(store=store, all_objects=True).ok
    store.close()


def test_archive_refuses_bad_policies_a_busy_task_and_its_own_store(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    store = open_store(hot_url)
    run(store, make_task("g", n=3), max_steps=4)
    for kw in ({}, {"keep_last": 2, "older_than": "1d"}, {"keep_last": 0}):
        with pytest.raises(ConfigError):
            api.archive("g", cold=cold_url, store=store, **kw)
    with pytest.raises(ConfigError, match="is the hot store"):
        api.archive("g", cold=hot_url, keep_last=1, store=store)
    other = Holder.current()
    store.acquire_lease("g", "main", "another-run", other.to_json(), 600_000)  # a live holder: this process
    with pytest.raises(TaskBusy):
        api.archive("g", cold=cold_url, keep_last=1, store=store)
    assert len(store.list_checkpoints("g")) == 5
    cli = subprocess.run([sys.executable, "-m", "overnight", "archive", "g", "--cold", cold_url, "--store", hot_url],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "exactly one of" in cli.stderr
    store.close()


def test_archive_and_restore_cli_json(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    with open_store(hot_url) as store:
        run(store, make_task("g", n=5), max_steps=6)
    env = {**os.environ, "COLUMNS": "200"}

    def cli(*args):
        p = subprocess.run([sys.executable, "-m", "overnight", *args, "--store", hot_url], capture_output=True,
                           text=True, env=env, timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return p

    rep = json.loads(cli("archive", "g", "--keep-last", "1", "--cold", cold_url, "--grace", "0", "--json").stdout)
    assert rep["archived"] and rep["cold"] == cold_url and rep["archive_id"].startswith("sha256:")
    assert "archived" in cli("show", "g").stdout
    cli("verify", "g")
    res = json.loads(cli("restore", "g", "--json").stdout)
    assert res["checkpoints"] == len(rep["archived"])
    assert "archived" not in cli("show", "g").stdout


def test_a_resume_that_falls_back_into_archived_history_brings_it_back(tmp_path):
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    store = open_store(hot_url)
    task = make_task("g", n=8)
    run(store, task, max_steps=6)
    rep = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0)
    head = store.get_ref("g", "main")
    parent = store.get_checkpoint(head).parent_id
    assert parent in rep.archived
    state = json.loads(store.get_checkpoint(head).body)["state"]["digest"]
    from overnight.chain.ditto import ditto_key
    assert store.delete_objects([state, ditto_key(state)]) > 0  # the head no longer verifies (nor heals)
    result = run(store, task)
    assert result.fallback is not None and result.fallback.used_id == parent
    assert result.status == "complete"
    assert {head, parent} <= {r.checkpoint_id for r in store.list_checkpoints("g")}
    shutil.move(tmp_path / "cold", tmp_path / "away")  # the new head loads from hot alone
    loaded, fallback = load_head(store, "g", "main")
    assert fallback is None and loaded.state.data["notes"][-1] == "main:7"
    assert api.cat("g", "big-1.bin", store=store) == big("main", 7)
    store.close()
