"""Round 36, ditto loads: what ``verify`` counts as served by a ditto copy also loads.

A large artifact is a chunk tree: its ``tree`` object (protected: it has a ditto copy) names a
chunk index and the chunks. With the tree object missing (a lost row, a salvaged store), ``verify``
said its copy "verifies and serves reads" while every load -- ``status``, ``ls``, ``show``, ``cat``,
``resume`` -- checked that the artifact objects are present without looking at copies, fell back
and redid every step. Now a load reads a missing artifact object through its copy once the copy
reassembles to the artifact's digest (read-only commands write nothing; ``resume`` rewrites the
original), and a copy that does not verify is never used: the load falls back exactly as before.

Real ``python -m overnight`` processes on real SQLite (and ``file://``) stores; nothing mocked.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from _procs import cli

from overnight.chain.ditto import ditto_key, object_copy, parse
from overnight.codec import compress
from overnight.store.base import ObjectRecord

BIG = '''
import overnight, random
task = overnight.Task("big", goal="a task with one large artifact", expected_span="2d")
@task.step
def a(ctx):
    r = random.Random(1); ctx.write_text("big.txt", "".join(f"line {i} {r.random()}\\n" for i in range(5000)))
@task.step
def b(ctx): ctx.state["n"] = len(ctx.read_text("big.txt"))
'''

def _content() -> str:
    import random

    r = random.Random(1)
    return "".join(f"line {i} {r.random()}\n" for i in range(5000))


CONTENT = _content()
"""The bytes of ``big.txt`` (about 140 KB: a chunk tree)."""


def _run(project: Path, *args: str):
    r = cli(*args, cwd=project)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def _big(tmp_path: Path, store: str | None = None) -> tuple[Path, list[str]]:
    """A project with task ``big`` run to completion; returns it and the store arguments."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "big.py").write_text(BIG)
    args = ["--store", store] if store else []
    r = _run(project, "run", "big.py", "-q", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return project, args


def _db(project: Path) -> Path:
    return project / ".overnight" / "overnight.db"


def _trees(db: Path) -> list[str]:
    c = sqlite3.connect(db)
    try:
        return [r[0] for r in c.execute("SELECT digest FROM objects WHERE kind='tree'")]
    finally:
        c.close()


def _delete_trees(db: Path) -> list[str]:
    """Delete every ``tree`` object row (what the user did); returns their digests."""
    trees = _trees(db)
    assert trees, "the artifact is not a chunk tree"
    c = sqlite3.connect(db, isolation_level=None)
    try:
        c.execute("DELETE FROM objects WHERE kind='tree'")
    finally:
        c.close()
    return trees


def _served_everywhere(project: Path, args: list[str]) -> None:
    """Every reading command loads the head at 2/2 through the copy (and says so), none falls back."""
    status = _run(project, "status", "big", *args)
    assert status.returncode == 0, status.stdout + status.stderr
    out = status.stdout + status.stderr
    assert "fell back" not in out and "2/2 steps" in out and "complete" in out, out
    assert "healed object" in out, out  # the heal is said, not hidden
    cat = _run(project, "cat", "big", "big.txt", *args)
    assert cat.returncode == 0 and cat.stdout == CONTENT, cat.stderr
    assert "failed verification" not in cat.stderr, cat.stderr
    show = _run(project, "show", "big", *args)
    out = show.stdout + show.stderr
    assert show.returncode == 0, out
    assert "INVALID" not in out and "fell back" not in out and "status: complete, 2/2" in out, out
    assert "HEALED" in out, out
    ls = _run(project, "ls", *args)
    row = next(line for line in ls.stdout.splitlines() if line.startswith("big "))
    assert "complete" in row and "2/2" in row and "FELL BACK" not in row, ls.stdout


def test_a_missing_artifact_tree_its_copy_serves_loads_everywhere_and_resume_redoes_nothing(tmp_path: Path) -> None:
    project, args = _big(tmp_path)
    db = _db(project)
    trees = _delete_trees(db)

    v = _run(project, "verify", "big")
    assert v.returncode == 3 and "main ok" in v.stdout and "its ditto copy verifies and serves reads" in v.stdout, \
        v.stdout + v.stderr
    _served_everywhere(project, args)
    assert _trees(db) == []  # the reading commands wrote nothing back

    resume = _run(project, "resume", "big")
    out = resume.stdout + resume.stderr
    assert resume.returncode == 0, out
    assert "steps to redo" not in out and "fell back" not in out and "0 run now" in out, out
    assert sorted(_trees(db)) == sorted(trees)  # the resume (a writer) rewrote the original from its copy
    v = _run(project, "verify", "big")
    assert v.returncode == 0 and "main ok" in v.stdout, v.stdout + v.stderr


def test_a_copy_that_does_not_reassemble_is_never_loaded(tmp_path: Path) -> None:
    """The tree object missing and its copy damaged (its size off by one: it no longer reassembles
    to the artifact's digest): every load refuses the copy and falls back, as ``verify`` says."""
    project, args = _big(tmp_path)
    db = _db(project)
    (tree,) = _delete_trees(db)
    c = sqlite3.connect(db, isolation_level=None)
    try:
        kind, size, codec, data = c.execute("SELECT kind, size, codec, data FROM objects WHERE digest=?",
                                            (ditto_key(tree),)).fetchone()
        copy = parse(ObjectRecord(ditto_key(tree), kind, size, codec, bytes(data)))
        assert copy is not None and copy.kind == "tree"
        payload = compress.decompress(copy.codec, copy.data, copy.size)
        m = re.search(rb'"size":(\d+)', payload)
        assert m is not None, payload
        payload = payload[:m.start(1)] + str(int(m.group(1)) + 1).encode() + payload[m.end(1):]
        new_codec, stored = compress.compress(payload)
        forged = object_copy(ObjectRecord(tree, "tree", len(payload), new_codec, stored))  # well-formed, under its key
        assert forged.digest == ditto_key(tree)
        c.execute("UPDATE objects SET data=?, size=?, codec=? WHERE digest=?",
                  (forged.data, forged.size, forged.codec, forged.digest))
    finally:
        c.close()

    v = _run(project, "verify", "big")
    assert v.returncode == 3 and "main invalid" in v.stdout, v.stdout + v.stderr
    status = _run(project, "status", "big")
    out = status.stdout + status.stderr
    assert "fell back" in out and "0/2 steps" in out, out
    cat = _run(project, "cat", "big", "big.txt")
    assert cat.returncode != 0 and cat.stdout == "", cat.stdout[-300:]
    resume = _run(project, "resume", "big")
    out = resume.stdout + resume.stderr
    assert resume.returncode == 0 and "steps to redo: a, b" in out, out


def test_salvage_heads_agree_with_ls_when_a_copy_serves_an_artifact(tmp_path: Path) -> None:
    """``repair --salvage`` of a store that lost an artifact's tree row: its ``heads`` line and
    ``ls``/``status`` of the salvaged file agree (the head loads through the copy)."""
    project, _ = _big(tmp_path)
    db = _db(project)
    _delete_trees(db)
    out_db = tmp_path / "salvaged.db"
    salvage = _run(project, "repair", "--salvage", str(db), "--into", str(out_db))
    assert salvage.returncode in (0, 3), salvage.stdout + salvage.stderr
    assert "heads: big: main ok" in salvage.stdout, salvage.stdout
    args = ["--store", f"sqlite://{out_db}"]
    _served_everywhere(project, args)


def test_file_store_a_missing_artifact_tree_its_copy_serves_loads(tmp_path: Path) -> None:
    root = tmp_path / "fs"
    project, args = _big(tmp_path, f"file://{root}")
    objects = [p for p in (root / "objects").rglob("*") if p.is_file()]
    trees = [p for p in objects if b'"kind":"tree"' in p.read_bytes().split(b"\n", 1)[0]]  # header line, then data
    assert len(trees) == 1, [p.read_bytes()[:80] for p in objects[:5]]
    trees[0].unlink()

    # (a file:// store opens for writing even for reading commands: the first load rewrites the
    # original from its verified copy, as it rewrites any object it heals there)
    status = _run(project, "status", "big", *args)
    out = status.stdout + status.stderr
    assert status.returncode == 0 and "fell back" not in out and "complete, 2/2 steps" in out, out
    assert "healed object" in out, out
    cat = _run(project, "cat", "big", "big.txt", *args)
    assert cat.returncode == 0 and cat.stdout == CONTENT, cat.stderr
    resume = _run(project, "resume", "big", *args)
    out = resume.stdout + resume.stderr
    assert resume.returncode == 0 and "steps to redo" not in out and "0 run now" in out, out
    v = _run(project, "verify", "big", *args)
    assert v.returncode == 0 and "main ok" in v.stdout, v.stdout + v.stderr


def test_show_raw_reads_a_damaged_head_state_through_its_copy(tmp_path: Path) -> None:
    """``show --json --raw`` prints the head's state document read as its load read it: through
    the verified copy when the original is damaged (it printed no state at all)."""
    import json

    from overnight.chain.read import load_head
    from overnight.store import open_store

    project, _ = _big(tmp_path)
    db = _db(project)
    with open_store(f"sqlite://{db}") as s:
        d = load_head(s, "big")[0].record.state.digest
    c = sqlite3.connect(db, isolation_level=None)
    try:
        data, codec = c.execute("SELECT data, codec FROM objects WHERE digest=?", (d,)).fetchone()
        bad = bytes([data[0] ^ 0xFF]) + data[1:] if codec == "none" else data[:-4] + b"\0\0\0\0"
        c.execute("UPDATE objects SET data=? WHERE digest=?", (bad, d))
    finally:
        c.close()
    show = _run(project, "show", "big", "--json", "--raw")
    assert show.returncode == 0, show.stdout + show.stderr
    rep = json.loads(show.stdout)
    assert rep["status"] == "complete" and isinstance(rep["state"], dict), show.stdout[:2000]
    assert rep["state"]["task"]["id"] == "big"
    c = sqlite3.connect(db)
    try:
        assert bytes(c.execute("SELECT data FROM objects WHERE digest=?", (d,)).fetchone()[0]) == bad  # not written
    finally:
        c.close()
