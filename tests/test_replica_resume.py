"""A replicated task whose primary medium lost its data resumes from the replica: it is not
started over as a new task (which would also fail at the replica's ref CAS)."""

from __future__ import annotations

import overnight
from overnight.store import open_store
from overnight.store.compose.replicated import ReplicatedStore


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


def test_lost_primary_gets_every_branch_back_a_fork_too(tmp_path):
    from overnight.chain.branches import fork
    from overnight.ops.repair import repair_task

    runs: list[str] = []
    (tmp_path / "primary").mkdir()
    result = overnight.run(_task(runs), _stores(tmp_path), max_steps=2, handle_signals=False)
    stores = _stores(tmp_path)
    rows = {r.step: r.checkpoint_id for r in stores.list_checkpoints("replicated")}
    fork(stores, "replicated", rows["one"], "exp")  # a branch that shares main's first checkpoints
    refs = stores.list_refs("replicated")
    assert set(refs) == {"main", "exp"} and refs["main"] == result.head
    stores.close()
    for p in (tmp_path / "primary").iterdir():  # the primary medium is lost
        p.unlink()
    stores = _stores(tmp_path)
    report = repair_task(stores.media, stores.names, "replicated", key=None)
    assert report.media[0].status == "repaired" and report.media[1].status == "ok", report
    assert stores.media[0].list_refs("replicated") == refs  # main did not move to the fork's history
    stores.close()
