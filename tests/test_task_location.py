"""Where a task lives (:mod:`overnight.store.task_location`), and ``resume`` / ``show`` verifying the head once."""

from __future__ import annotations

import pytest

import overnight
from overnight import api
from overnight.chain import integrity
from overnight.errors import TaskNotFound
from overnight.store import task_location as media

JOB = (
    "import overnight\n"
    "task = overnight.Task('job', goal='g')\n"
    "@task.step\n"
    "def a(ctx): return 1\n"
    "@task.step\n"
    "def b(ctx): return 2\n"
    "@task.step\n"
    "def c(ctx): return 3\n"
)


@pytest.fixture
def stopped_job(tmp_path, monkeypatch):
    """A task stopped after one of its three steps, its code in the project folder (cwd)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    url = f"sqlite://{tmp_path / 's.db'}"
    result = overnight.run(api.load_task("job.py"), url, max_steps=1)
    assert result.status == "stopped"
    return url


def _head_loads(monkeypatch, url: str) -> list[str]:
    """Record every full load of the task's current head checkpoint (the verification of it)."""
    from overnight.store import open_store

    with open_store(url) as s:
        head = s.get_ref("job", "main")
    seen: list[str] = []
    real = integrity.load_checkpoint

    def counting(store, checkpoint_id, *args, **kwargs):
        if checkpoint_id == head:
            seen.append(checkpoint_id)
        return real(store, checkpoint_id, *args, **kwargs)

    for module in ("overnight.chain.integrity", "overnight.chain.read", "overnight.api"):
        mod = __import__(module, fromlist=["load_checkpoint"])
        if hasattr(mod, "load_checkpoint"):
            monkeypatch.setattr(mod, "load_checkpoint", counting)
    return seen


def test_resume_verifies_the_head_once(stopped_job, monkeypatch):
    seen = _head_loads(monkeypatch, stopped_job)
    result = api.resume("job", store=stopped_job)
    assert result.status == "complete"
    assert len(seen) == 1, f"the head was loaded {len(seen)} times"


def test_resume_loads_again_when_the_ref_moved_after_the_first_load(stopped_job, monkeypatch):
    """The head loaded before the lease is used only if the branch still names it: a commit in
    between (here: one more step run by another session) is not lost."""
    from overnight.runtime import runner as runner_mod

    real_init = runner_mod.Runner.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if kwargs.get("head") is not None:  # another session commits after resume loaded the head
            overnight.run(api.load_task("job.py"), stopped_job, max_steps=1)

    monkeypatch.setattr(runner_mod.Runner, "__init__", init)
    result = api.resume("job", store=stopped_job)
    assert result.status == "complete"
    shown = api.show("job", store=stopped_job)
    assert shown.done == 3
    # a, b (the other session), c: nothing ran twice
    assert [e.step for e in shown.chain if e.event == "step"] == ["a", "b", "c"]


def test_show_verifies_the_head_once(stopped_job, monkeypatch):
    seen = _head_loads(monkeypatch, stopped_job)
    report = api.show("job", store=stopped_job)
    assert report.done == 1 and report.total == 3
    assert len(seen) == 1, f"the head was loaded {len(seen)} times"


def test_locate_finds_a_task_where_it_lives_and_says_none_for_an_unknown_one(stopped_job, monkeypatch):
    from overnight.config import load

    monkeypatch.setenv("OVERNIGHT_STORE", stopped_job)
    cfg = load()
    found = media.locate("job", cfg)
    assert found is not None
    store, route = found
    try:
        assert store.url == stopped_job and route is not None and route.urls == [stopped_job]
    finally:
        store.close()
    assert media.locate("no-such-task", cfg) is None


def test_opened_by_url_reads_through_and_refuses_a_missing_store(stopped_job, tmp_path):
    with media.opened(stopped_job) as s:
        assert s.get_task("job").task_id == "job"
    with pytest.raises(Exception) as exc:
        with media.opened(f"sqlite://{tmp_path / 'nothing.db'}"):
            pass
    assert "no store at" in str(exc.value)
    assert not (tmp_path / "nothing.db").exists()


def test_open_routed_gives_one_store_per_route_shape(tmp_path):
    one = media.Route(level="durable", media=["local"], urls=[f"sqlite://{tmp_path / 'a.db'}"], reasons=[],
                      completeness=1.0, crosses_night=False)
    two = media.Route(level="durable", media=["local", "database"],
                      urls=[f"sqlite://{tmp_path / 'a.db'}", f"sqlite://{tmp_path / 'b.db'}"], reasons=[],
                      completeness=1.0, crosses_night=False)
    eph = media.Route(level="ephemeral", media=[], urls=[], reasons=[], completeness=1.0, crosses_night=False)
    with media.open_routed(one, "t") as s:
        assert s.url.startswith("sqlite://")
    with media.open_routed(two, "t") as s:
        assert isinstance(s, media.ReplicatedStore) and s.names == ["local", "database"]
    s = media.open_routed(eph, "t")
    assert "ephemeral-t" in s.url
    s.close()
    with pytest.raises(TaskNotFound):
        with media.opened(f"sqlite://{tmp_path / 'a.db'}") as s:
            s.get_task("nope")
