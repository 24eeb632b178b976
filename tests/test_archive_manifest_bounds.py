"""An archive manifest cannot make a reader take far more memory than a legitimate manifest of its
size: before it is parsed, its JSON containers, strings and separators are counted against its size
(``overnight.store.compose.pack.check_manifest_shape``); a forged one -- a few KB of zstd expanding
to tens of MiB of ``{},{},...`` -- is damage of that archive (``DigestMismatch``), not gigabytes of
Python objects; every manifest an archive run writes still reads, whatever its step names hold.
"""

from __future__ import annotations


import pytest
import zstandard
from _procs import run_limited
from _tasks import plan_task
from test_gc import make_task, run

from overnight import api
from overnight.codec import digest
from overnight.errors import ConfigError, DecodeError, DigestMismatch
from overnight.store import open_store
from overnight.store.base import ArchiveRow
from overnight.store.compose import pack
from overnight.store.compose.pack import manifest_of


def _exact_shape(data: bytes) -> dict[str, int]:
    """The counts ``pack._shape`` makes, one byte at a time (the reference)."""
    counts = {"containers": 0, "strings": 0, "separators": 0}
    inside = escaped = False
    for c in data.decode("ascii"):
        if inside:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                inside = False
        elif c == '"':
            inside = True
            counts["strings"] += 1
        elif c in "{[":
            counts["containers"] += 1
        elif c in ",:":
            counts["separators"] += 1
    return counts


SAMPLES = [
    b'{"a":[1,2,{"b":"c,d:{[e"}],"f":"\\"{,:[\\\\","g":"\\\\\\"x,y"}',
    b'["\\\\\\\\", ",", ":" , "{}[]" , {"k" : [ ] } , "tail \\" , still inside , "]',
    b'[{},{},[],[[]],"", "\\u0022,", 0,1.5,-2e3,true,false,null]',
    b'"unterminated, string: {[ \\" ,,,',
]


@pytest.mark.parametrize("piece", [1, 2, 3, 5, 7, 64, None])  # None: the default
def test_only_what_lies_outside_strings_is_counted_whatever_the_piece_size(monkeypatch, piece):
    if piece is not None:
        monkeypatch.setattr(pack, "_SHAPE_PIECE", piece)
    for sample in SAMPLES:
        assert pack._shape(sample) == _exact_shape(sample), sample


def _shapes() -> dict[str, bytes]:
    """Forged manifests: a JSON array of ``n`` bytes of one cheap value, each far below what a
    manifest entry takes; sized so the parse before the bound took more than 1 GiB."""
    return {"dicts": b"{},", "lists": b"[],", "strings": b'"ab",', "floats": b"1.5,"}


SIZES_MIB = {"dicts": 32, "lists": 32, "strings": 96, "floats": 128}


def _forged(shape: str) -> bytes:
    unit = _shapes()[shape]
    return b"[" + unit * ((SIZES_MIB[shape] << 20) // len(unit)) + unit[:-1] + b"]"


def test_a_forged_manifest_of_cheap_values_is_refused_before_it_is_parsed():
    for shape in _shapes():
        unit = _shapes()[shape]
        data = b"[" + unit * 100_000 + unit[:-1] + b"]"
        with pytest.raises(DecodeError, match=r"holds \d+ JSON (containers|strings|separators) in \d+ bytes"):
            pack.check_manifest_shape(data)
        with pytest.raises(DecodeError, match="holds"):
            pack.decode_manifest(data)
    with pytest.raises(DecodeError, match="not ASCII"):
        pack.check_manifest_shape('["\u00e9"]'.encode())
    # a row carrying one (its archive id is its hash: a forger writing the store can make that hold)
    data = b"[" + b"{}," * 100_000 + b"{}]"
    row = ArchiveRow(digest.sha256(data), "g", "2026-12-01T00:00:00.000000+00:00", "file:///x",
                     zstandard.ZstdCompressor().compress(data))
    with pytest.raises(DigestMismatch, match=f"archive {row.archive_id} of task 'g': its manifest holds") as err:
        manifest_of(row)
    assert err.value.object_digest == row.archive_id and "damaged or forged" in (err.value.hint or "")


@pytest.mark.slow  # real CLI processes under an address-space limit, up to 128 MiB of forged JSON checked each
@pytest.mark.parametrize("shape", sorted(SIZES_MIB))
def test_a_planted_manifest_is_damage_of_that_archive_within_bounded_memory(tmp_path, shape):
    """A forged archive row (hot catalog and cold store) whose manifest -- a few KB of zstd --
    expands to tens of MiB of ``{}``/``[]``/``"ab"``/``1.5``: under a 1 GiB address-space limit
    (the parse took 1.1-1.5 GB before), reading it is a DigestMismatch naming that archive;
    ``show`` and ``verify --all`` still see the task and its sound archive (``verify`` reports the
    forged row as a problem of check ``archive``, exit 3); ``restore --cold``
    fails typed, naming the forged archive, with no traceback."""
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    with open_store(hot_url) as store:
        run(store, make_task("g", n=4), max_steps=5)
        sound = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0)
    data = _forged(shape)
    row = ArchiveRow(digest.sha256(data), "g", "2026-12-01T00:00:00.000000+00:00", cold_url,
                     zstandard.ZstdCompressor(level=19, write_content_size=True).compress(data))
    del data
    assert len(row.manifest) < 64 * 1024
    for url in (hot_url, cold_url):
        with open_store(url) as s:
            s.put_archive(row)

    def proc(argv):
        return run_limited(argv, cwd=tmp_path)

    script = ("import sys\nfrom overnight.store import open_store\n"
              "from overnight.store.compose.pack import manifest_of\nfrom overnight.errors import OvernightError\n"
              "for url in sys.argv[1:]:\n"
              "    with open_store(url) as s:\n"
              "        for row in s.list_archives('g'):\n"
              "            try:\n"
              "                print('ok', row.archive_id, len(manifest_of(row).checkpoints))\n"
              "            except OvernightError as exc:\n"
              "                print(type(exc).__name__, exc.message)\n")
    read = proc(["-c", script, hot_url, cold_url])
    assert read.returncode == 0, read.stderr
    lines = sorted(read.stdout.splitlines())
    assert len(lines) == 4, lines
    damaged = [line for line in lines if line.startswith("DigestMismatch ")]
    assert len(damaged) == 2, lines
    assert all(f"archive {row.archive_id} of task 'g': its manifest holds" in line for line in damaged), lines
    assert [line for line in lines if line.startswith("ok ")] == [f"ok {sound.archive_id} {len(sound.archived)}"] * 2
    show = proc(["-m", "overnight", "show", "g", "--store", hot_url])
    assert show.returncode == 0 and "archived" in show.stdout, show.stderr
    # verify still checks the task through its sound archive, and reports the forged row (exit 3)
    check = proc(["-m", "overnight", "verify", "--all", "--store", hot_url])
    assert check.returncode == 3 and "g: main ok" in check.stdout, check.stdout + check.stderr
    assert "archive" in check.stdout and row.archive_id in check.stdout, check.stdout
    restore = proc(["-m", "overnight", "restore", "g", "--cold", cold_url, "--store", hot_url])
    assert restore.returncode == 3 and row.archive_id in restore.stderr, restore.stderr


def _dense(ctx, i):
    ctx.state["n"] = len(i)


def test_a_legitimate_archive_of_many_checkpoints_whose_step_names_are_dense_json_reads(tmp_path):
    """Steps named ``dense[i=[[], [], ..., '"\\\\', 7]]``: their names, in the manifest's journal
    and checkpoint rows, hold far more brackets and commas than the bound allows per byte -- but
    inside strings, which are not counted. 120 such checkpoints archive, list, verify and restore."""
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    values = [[[]] * 200 + [{}] * 50 + ['"\\', k] for k in range(120)]
    store = open_store(hot_url)
    run(store, plan_task("d", values, _dense, step="dense"), max_steps=len(values) + 1)
    before = {r.checkpoint_id for r in store.list_checkpoints("d")}
    rep = api.archive("d", cold=cold_url, keep_last=1, store=store, grace=0)
    assert len(rep.archived) == len(before) - 1 >= 120
    for url in (hot_url, cold_url):
        with open_store(url) as s:
            (row,) = s.list_archives("d")
            data = zstandard.ZstdDecompressor().decompress(row.manifest)
            raw = data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":")
            assert raw > len(data) // 8  # a count over the raw bytes would refuse it: counted are those outside strings
            assert {c.checkpoint_id for c in manifest_of(row).checkpoints} == set(rep.archived)
    show = api.show("d", store=hot_url)
    assert {c.checkpoint_id for c in show.chain if c.archived} == set(rep.archived)
    check = api.verify(store=hot_url, all_objects=True)
    assert check.ok and check.checkpoints == len(before), check.problems
    res = api.restore("d", store=hot_url)
    assert res.checkpoints == len(rep.archived)
    assert {r.checkpoint_id for r in store.list_checkpoints("d")} == before
    assert api.verify("d", store=hot_url).ok
    store.close()


def test_a_manifest_the_bound_would_refuse_is_never_written(tmp_path, monkeypatch):
    """The write side checks what the read side will: were the bound's figures ever wrong for a
    real manifest, archive refuses before anything is written or removed from hot, instead of
    leaving history no read accepts."""
    hot_url, cold = f"sqlite://{tmp_path / 'hot.db'}", tmp_path / "cold"
    with open_store(hot_url) as store:
        run(store, make_task("g", n=4), max_steps=5)
        before = {r.checkpoint_id for r in store.list_checkpoints("g")}
    monkeypatch.setattr(pack, "MANIFEST_BYTES_PER", {"containers": 64, "strings": 10, "separators": 10**6})
    monkeypatch.setattr(pack, "MANIFEST_SHAPE_SLACK", 0)
    with pytest.raises(ConfigError, match="JSON separators in .* no read would accept it, so nothing was archived"):
        api.archive("g", cold=f"file://{cold}", keep_last=1, store=hot_url, grace=0)
    assert not cold.exists()
    with open_store(hot_url) as store:
        assert {r.checkpoint_id for r in store.list_checkpoints("g")} == before
        assert store.list_archives("g") == []
