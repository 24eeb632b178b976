"""The router: level and media from span, nights and criticality, at every threshold edge."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta

import pytest

import overnight
from overnight.config import load
from overnight.errors import SpecError
from overnight.runtime.router import crosses_night, route


def task(span, **kw) -> overnight.Task:
    kw.setdefault("criticality", "normal")
    kw.setdefault("done_when", "a report exists")
    t = overnight.Task("routed", goal="write the weekly report", expected_span=span, **kw)

    @t.step
    def only(ctx):
        return 1

    return t


def at(hh: int, mm: int = 0) -> datetime:
    return datetime(2026, 11, 30, hh, mm).astimezone()


@pytest.mark.parametrize("span, start, level", [
    (timedelta(hours=1, minutes=59), at(9), "ephemeral"),
    (timedelta(hours=2), at(9), "session"),
    (timedelta(hours=24), at(0), "session"),          # ends exactly at the next midnight: no night inside
    (timedelta(hours=24, minutes=1), at(0), "durable"),
    (timedelta(hours=3), at(22), "durable"),          # crosses midnight in 3 h
    (timedelta(hours=1), at(23, 30), "durable"),      # even a short task, if it crosses a night
    (timedelta(hours=1), at(22, 59), "ephemeral"),    # ends 23:59: same day
    (timedelta(days=3), at(9), "durable"),
])
def test_level_by_span_and_night(span, start, level):
    decision = route(task(span), load(), now=start)
    assert decision.level == level, decision.reasons
    assert decision.crosses_night == crosses_night(start, span.total_seconds())


def test_missing_span_is_refused_listing_what_is_missing():
    t = overnight.Task("nospan", goal="x")
    with pytest.raises(SpecError) as err:
        route(t, load(), now=at(9))
    assert "expected_span" in err.value.missing and "no expected span" in str(err.value)


@pytest.mark.parametrize("score, ok", [(0.29, False), (0.3, True)])
def test_completeness_threshold(score, ok):
    t = task("3h", completeness=score)
    if ok:
        assert route(t, load(), now=at(9)).completeness == 0.3
    else:
        with pytest.raises(SpecError) as err:
            route(t, load(), now=at(9))
        assert "29%" in str(err.value) and "30%" in str(err.value)


def test_computed_completeness_lists_missing_items():
    t = overnight.Task("thin", goal="do", expected_span="3h")  # no plan, criticality, world, done_when
    with pytest.raises(SpecError) as err:
        route(t, load(), now=at(9))
    assert set(err.value.missing) >= {"goal", "plan", "criticality", "world", "done_when"}


def test_criticality_picks_media_and_falls_back_when_unconfigured(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for var in ("OVERNIGHT_MEDIA_DATABASE", "OVERNIGHT_MEDIA_CLOUD", "OVERNIGHT_STORE"):
        monkeypatch.delenv(var, raising=False)
    assert route(task("3h"), load(), now=at(9)).media == ["local"]
    d = route(task("3h", criticality="important"), load(), now=at(9))
    assert d.media == ["local"] and any("not configured" in r for r in d.reasons)
    monkeypatch.setenv("OVERNIGHT_MEDIA_DATABASE", "postgresql://127.0.0.1:5432/test")
    monkeypatch.setenv("OVERNIGHT_MEDIA_CLOUD", "s3://bucket/x")
    d = route(task("3h", criticality="critical"), load(), now=at(9))
    assert d.media == ["database", "cloud"] and d.urls == ["postgresql://127.0.0.1:5432/test", "s3://bucket/x"]
    # an important/critical task is never ephemeral
    assert route(task("1h", criticality="important"), load(), now=at(9)).level == "session"


def test_thresholds_come_from_overnight_toml(tmp_path, monkeypatch):
    (tmp_path / "overnight.toml").write_text('[router]\nsession_hours = 1\ndurable_hours = 4\n')
    monkeypatch.chdir(tmp_path)
    assert route(task("90m"), load(), now=at(9)).level == "session"
    assert route(task("5h"), load(), now=at(9)).level == "durable"


def test_task_overrides_are_recorded():
    d = route(task("1h", level="durable", media=["local"]), load(), now=at(9))
    assert d.level == "durable" and d.overridden and any("overridden" in r for r in d.reasons)


def test_route_command_prints_decision_without_running(tmp_path):
    (tmp_path / "t.py").write_text(
        "import overnight\n"
        "task = overnight.Task('r', goal='write the weekly report', expected_span='3h', criticality='normal',"
        " done_when='sent')\n"
        "@task.step\n"
        "def s(ctx): raise SystemExit('must not run')\n")
    out = subprocess.run([sys.executable, "-m", "overnight", "route", "t.py", "--at", "2026-11-30T22:00"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "level: durable" in out.stdout and "crosses local midnight" in out.stdout
    assert not (tmp_path / ".overnight").exists()  # nothing was created


def test_ephemeral_level_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OVERNIGHT_STORE", raising=False)
    t = task("10m")
    result = overnight.run(t, handle_signals=False)
    assert result.status == "complete" and result.level == "ephemeral"
    assert not (tmp_path / ".overnight").exists()


def test_stopped_ephemeral_task_is_not_called_resumable(tmp_path):
    (tmp_path / "quick.py").write_text(
        "import overnight\n"
        "task = overnight.Task('quick', goal='count three short things', expected_span='30m', level='ephemeral', criticality='normal',"
        " done_when='counted')\n"
        "for i in range(3):\n"
        "    task.step(lambda ctx, i=i: i, name=f's{i}')\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OVERNIGHT_")}
    out = subprocess.run([sys.executable, "-m", "overnight", "run", "quick.py", "--max-steps", "1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1, out.stderr
    assert "NOT resumable" in out.stderr and "resume with" not in out.stderr


def test_relative_store_paths_in_overnight_toml_are_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "overnight.toml").write_text('[store]\nurl = "sqlite://.overnight/overnight.db"\n'
                                             '[media]\ncloud = "file://cold"\ndatabase = "postgresql://h/db"\n')
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "sub" / "deeper")
    for var in ("OVERNIGHT_STORE", "OVERNIGHT_MEDIA_CLOUD", "OVERNIGHT_MEDIA_DATABASE", "OVERNIGHT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    cfg = load()
    assert cfg.get("store.url") == f"sqlite://{(tmp_path / '.overnight' / 'overnight.db').as_posix()}"
    assert cfg.medium("cloud") == f"file://{(tmp_path / 'cold').as_posix()}"
    assert cfg.medium("database") == "postgresql://h/db"
