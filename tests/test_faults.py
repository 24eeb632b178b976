"""Randomized fault injection: every damaged head is detected, none is loaded, and resume falls
back to exactly the newest checkpoint that does not depend on the damage."""

from __future__ import annotations

import collections
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from _tasks import plan_task

import overnight
from overnight.errors import NoValidCheckpoint
from overnight.store.sqlite import SQLiteStore
from overnight.chain.read import load_head
from overnight.testing.faults import KINDS, NEEDS_KEY, Faults, Injected
from overnight.verify.fsck import verify_store

KEY = b"fault-test-key"
TRIALS_PER_KIND = 24  # x 9 kinds = 216 trials


def write(ctx, i):
    ctx.state["lines"].append(f"line {i} ✓ \u2028 {'é' * i}")
    log = ctx.read_text("log.md") if ctx.has_artifact("log.md") else ""
    rng = random.Random(i)
    # a growing artifact past the 16 KiB chunking threshold: chunk trees and shared chunks
    log += "".join(rng.choice("abcdefghij klmnop\n") for _ in range(4000))
    ctx.write_text("log.md", log)
    ctx.write_text(f"note-{i}.txt", f"note {i}")
    return {"i": i, "size": len(log)}


def build_task() -> overnight.Task:
    return plan_task("faulty", 8, write, step="write", goal="write a long log", data={"lines": []})


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "base.db"
    result = overnight.run(build_task(), f"sqlite://{path}", signing_key=KEY, handle_signals=False)
    assert result.status == "complete" and result.done == 9
    return path


@dataclass
class Outcome:
    """What one trial observed (nothing is asserted inside a trial: the caller counts)."""

    detected: bool = False  # verify reported the store damaged and the head invalid or missing
    not_loaded: bool = False  # the damaged head was never returned by a load
    fell_back_to_expected: bool = False  # load_head returned exactly the expected checkpoint
    completed: bool = False  # the task then finished from there, its head verifying with 9 steps
    detail: str = ""


Injector = Callable[[Path, random.Random], Injected]


def trial(base, tmp_path, kind: str, seed: int, inject: Injector | None = None) -> Outcome:
    """One injected fault (``inject``: instead of :class:`Faults`, e.g. a broken injector);
    returns what verify, load_head and a resume did with it."""
    path = tmp_path / f"{kind}-{seed}.db"
    shutil.copy(base, path)
    rng = random.Random(seed)
    # the original and its ditto copy both damaged: nothing to heal from (tests/test_ditto.py heals)
    inj = inject(path, rng) if inject is not None else Faults(path, rng, copies=True).inject(kind, "faulty")
    out = Outcome(detail=f"{kind} seed {seed}: {inj.detail}")
    with SQLiteStore(path) as store:
        report = verify_store(store, ["faulty"], key=KEY)
        out.detected = not report.ok and report.heads["faulty"]["main"] in ("invalid", "missing")
        try:
            loaded, fallback = load_head(store, "faulty", key=KEY)
        except NoValidCheckpoint:
            loaded, fallback = None, None
    if inj.expected is None:
        out.not_loaded = out.fell_back_to_expected = out.completed = loaded is None
        return out
    if loaded is None:
        return out
    out.not_loaded = loaded.id != inj.bad_head and fallback is not None
    out.fell_back_to_expected = loaded.id == inj.expected
    # and the task finishes from there, with intact artifacts
    result = overnight.run(build_task(), f"sqlite://{path}", signing_key=KEY, handle_signals=False)
    with SQLiteStore(path) as store:
        final, fallback = load_head(store, "faulty", key=KEY)
    out.completed = (result.status == "complete" and result.fallback is not None and fallback is None
                     and len(final.state.done) == 9)
    return out


FIELDS = ("detected", "not_loaded", "fell_back_to_expected", "completed")


def tally(outcomes: dict[str, list[Outcome]]) -> dict[str, collections.Counter]:
    """Per kind: trials, and how many trials showed each property of :data:`FIELDS`."""
    counts = {}
    for kind, outs in outcomes.items():
        c = collections.Counter(trials=len(outs))
        for o in outs:
            for f in FIELDS:
                c[f] += getattr(o, f)
        counts[kind] = c
    return counts


def check(outcomes: dict[str, list[Outcome]]) -> None:
    """Every trial showed every property of :data:`FIELDS`; raises AssertionError naming the
    first trials that did not."""
    failed = [f"{o.detail}: not {', not '.join(f for f in FIELDS if not getattr(o, f))}"
              for outs in outcomes.values() for o in outs if not all(getattr(o, f) for f in FIELDS)]
    assert not failed, f"{len(failed)} trial(s) failed:\n" + "\n".join(failed[:10])


@pytest.mark.slow
def test_every_fault_kind_is_detected_and_never_loaded(base_store, tmp_path):
    outcomes = {kind: [trial(base_store, tmp_path, kind, seed) for seed in range(TRIALS_PER_KIND)]
                for kind in KINDS}
    counts = tally(outcomes)
    total = sum(c["trials"] for c in counts.values())
    print(f"\nfault injection: {total} trials")
    for kind, c in counts.items():
        print(f"  {kind:18} trials {c['trials']:3}  detected {c['detected']:3}  never loaded {c['not_loaded']:3}  "
              f"fell back to expected {c['fell_back_to_expected']:3}  completed {c['completed']:3}")
    assert total >= 200 and set(counts) == set(KINDS)
    check(outcomes)
    assert all(c[f] == c["trials"] for c in counts.values() for f in FIELDS)


def test_the_fault_check_fails_on_a_fault_that_was_not_caught(base_store, tmp_path):
    """The check above can fail: a broken injector that claims to damage the head but changes
    nothing gives a trial whose damage goes undetected and whose "damaged" head loads -- and
    :func:`check` refuses it."""
    def broken(path: Path, rng: random.Random) -> Injected:
        with SQLiteStore(path) as store:
            head = store.get_ref("faulty", "main")
            parent = store.get_checkpoint(head).parent_id
        return Injected("nothing", head, parent, detail="claims damage, changes nothing")

    outcome = trial(base_store, tmp_path, "broken", 0, inject=broken)
    assert not outcome.detected and not outcome.not_loaded and not outcome.fell_back_to_expected
    with pytest.raises(AssertionError, match="broken seed 0: claims damage, changes nothing: not detected"):
        check({"broken": [outcome]})
    real = trial(base_store, tmp_path, KINDS[0], 0)
    check({KINDS[0]: [real]})  # a real fault passes the same check


@pytest.mark.parametrize("kind", sorted(NEEDS_KEY))
def test_consistent_forgery_needs_the_signing_key(base_store, tmp_path, kind):
    """Without a key, an internally consistent edit is indistinguishable from a real commit: that
    is what OVERNIGHT_SIGNING_KEY is for. With it, the same forgery is refused (tested above)."""
    path = tmp_path / "unsigned.db"
    shutil.copy(base_store, path)
    inj = Faults(path, random.Random(1)).inject(kind, "faulty")
    with SQLiteStore(path) as store:
        loaded, fallback = load_head(store, "faulty", key=None)
        assert loaded.id == inj.bad_head and fallback is None
        loaded, fallback = load_head(store, "faulty", key=KEY)
        assert loaded.id == inj.expected and fallback is not None


def test_damaging_a_ditto_copy_the_store_compressed(base_store, tmp_path):
    """The fault injector reads a ditto copy through its codec: a copy the store compressed (zstd,
    when that saves space) starts with zstd's magic, not ``ditto 1 ...`` (CI, round 37: the bit
    flip of such a copy raised UnicodeDecodeError in the injector, failing the fault run)."""
    import sqlite3

    import zstandard

    path = tmp_path / "s.db"
    shutil.copy(base_store, path)
    from overnight.chain.ditto import ditto_key

    db = sqlite3.connect(path, isolation_level=None)
    try:
        rows = {d: (bytes(data), size) for d, data, size in db.execute(
            "SELECT digest, data, size FROM objects WHERE kind != 'ditto' AND codec='none'")}
        original = next(d for d in rows if db.execute("SELECT 1 FROM objects WHERE digest=?",
                                                      (ditto_key(d),)).fetchone())
        key = ditto_key(original)
        (copy,) = db.execute("SELECT data FROM objects WHERE digest=?", (key,)).fetchone()
        copy = bytes(copy)
        db.execute("UPDATE objects SET data=?, codec='zstd', size=? WHERE digest=?",
                   (zstandard.ZstdCompressor().compress(copy), len(copy), key))
        Faults(path, random.Random(1), copies=True)._damage_copy(db, original, "bit_flip")
        (data, codec) = db.execute("SELECT data, codec FROM objects WHERE digest=?", (key,)).fetchone()
        assert codec == "none" and bytes(data).startswith(b"ditto 1 ") and bytes(data) != copy
    finally:
        db.close()
