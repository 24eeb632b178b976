"""Randomized fault injection: every damaged head is detected, none is loaded, and resume falls
back to exactly the newest checkpoint that does not depend on the damage."""

from __future__ import annotations

import collections
import random
import shutil

import pytest

import overnight
from overnight.errors import NoValidCheckpoint
from overnight.store.sqlite import SQLiteStore
from overnight.chain.read import load_head
from overnight.testing.faults import KINDS, NEEDS_KEY, Faults
from overnight.verify.fsck import verify_store

KEY = b"fault-test-key"
TRIALS_PER_KIND = 24  # x 9 kinds = 216 trials


def build_task() -> overnight.Task:
    task = overnight.Task("faulty", goal="write a long log", data={"lines": []})

    @task.step
    def plan(ctx):
        for i in range(8):
            ctx.add_step("write", i=i)

    @task.step(planned=False)
    def write(ctx, i):
        ctx.state["lines"].append(f"line {i} ✓ \u2028 {'é' * i}")
        log = ctx.read_text("log.md") if ctx.has_artifact("log.md") else ""
        rng = random.Random(i)
        # a growing artifact past the 16 KiB chunking threshold: chunk trees and shared chunks
        log += "".join(rng.choice("abcdefghij klmnop\n") for _ in range(4000))
        ctx.write_text("log.md", log)
        ctx.write_text(f"note-{i}.txt", f"note {i}")
        return {"i": i, "size": len(log)}

    return task


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "base.db"
    result = overnight.run(build_task(), f"sqlite://{path}", signing_key=KEY, handle_signals=False)
    assert result.status == "complete" and result.done == 9
    return path


def trial(base, tmp_path, kind: str, seed: int) -> tuple[bool, bool]:
    """One injected fault; returns (detected_by_verify, fell_back_to_expected)."""
    path = tmp_path / f"{kind}-{seed}.db"
    shutil.copy(base, path)
    inj = Faults(path, random.Random(seed)).inject(kind, "faulty")
    with SQLiteStore(path) as store:
        report = verify_store(store, ["faulty"], key=KEY)
        assert not report.ok, f"{kind}: {inj.detail} went undetected by verify"
        assert report.heads["faulty"]["main"] in ("invalid", "missing")
        if inj.expected is None:
            with pytest.raises(NoValidCheckpoint):
                load_head(store, "faulty", key=KEY)
            return True, True
        loaded, fallback = load_head(store, "faulty", key=KEY)
        assert fallback is not None, f"{kind}: {inj.detail}: damaged head loaded silently"
        assert loaded.id != inj.bad_head
        assert loaded.id == inj.expected, f"{kind}: {inj.detail}: fell back to {loaded.id}, expected {inj.expected}"
    # and the task finishes from there, with intact artifacts
    result = overnight.run(build_task(), f"sqlite://{path}", signing_key=KEY, handle_signals=False)
    assert result.status == "complete" and result.fallback is not None
    with SQLiteStore(path) as store:
        loaded, fallback = load_head(store, "faulty", key=KEY)
        assert fallback is None and len(loaded.state.done) == 9
    return True, True


def test_every_fault_kind_is_detected_and_never_loaded(base_store, tmp_path):
    counts: dict[str, collections.Counter] = {k: collections.Counter() for k in KINDS}
    for kind in KINDS:
        for seed in range(TRIALS_PER_KIND):
            detected, fell_back = trial(base_store, tmp_path, kind, seed)
            counts[kind]["trials"] += 1
            counts[kind]["detected"] += detected
            counts[kind]["fallback_to_expected"] += fell_back
    total = sum(c["trials"] for c in counts.values())
    print(f"\nfault injection: {total} trials")
    for kind, c in counts.items():
        print(f"  {kind:18} trials {c['trials']:3}  detected {c['detected']:3}  silently loaded 0  "
              f"fell back to expected {c['fallback_to_expected']:3}")
    assert total >= 200
    assert all(c["detected"] == c["trials"] == c["fallback_to_expected"] for c in counts.values())


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
