"""A replicated task whose primary medium lost its data resumes from the replica: it is not
started over as a new task (which would also fail at the replica's ref CAS)."""

from __future__ import annotations

import overnight
from overnight.store import open_store
from overnight.verify.replicas import ReplicatedStore


def _task(runs: list[str]) -> overnight.Task:
    task = overnight.Task("replicated", goal="three steps on two media")
    for name in ("one", "two", "three"):
        def step(ctx, _name=name):
            runs.append(_name)
            return _name
        task.step(step, name=name)
    return task


def _stores(tmp_path):
    return ReplicatedStore([open_store(f"sqlite://{tmp_path / 'primary' / 'store.db'}"),
                            open_store(f"file://{tmp_path / 'replica'}")], ["local", "cloud"])


def test_primary_lost_resume_continues_from_the_replica(tmp_path):
    runs: list[str] = []
    (tmp_path / "primary").mkdir()
    result = overnight.run(_task(runs), _stores(tmp_path), max_steps=2, handle_signals=False)
    assert result.status == "stopped" and runs == ["one", "two"]
    for p in (tmp_path / "primary").iterdir():  # the primary medium is lost
        p.unlink()
    result = overnight.run(_task(runs), _stores(tmp_path), handle_signals=False)
    assert result.status == "complete" and not result.created
    assert runs == ["one", "two", "three"]  # nothing committed ran again
    with open_store(f"sqlite://{tmp_path / 'primary' / 'store.db'}") as primary:
        assert primary.get_ref("replicated", "main") == result.head  # repaired, and advanced
