"""``overnight bench kpi --tasks 10``: the invariants a user relies on, measured with real faults.

One run of the command (a real CLI process; its workers are forked and SIGKILLed, stored heads are
damaged with the fault injector, inputs and the environment are edited between days, the local
store directory is deleted) and checks, from the raw trials it writes to ``kpi.json``:

* no corrupted state is ever loaded, and every damaged head is detected;
* no committed step is lost to a SIGKILL;
* at ``session`` and ``durable`` a SIGKILL wastes at most the one step in flight;
* every drift injected into a finished step's inputs is detected at ``durable`` (no false alarm);
* every task completes at ``session`` and ``durable``; the baseline never continues;
* the report files are written, ``report.md`` includes ``perf.md`` when one is there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import env


@pytest.fixture(scope="module")
def kpi(tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("kpi")
    (out / "perf.md").write_text("## perf\n\nwritten by bench perf\n")
    proc = subprocess.run([sys.executable, "-m", "overnight", "bench", "kpi", "--tasks", "10", "--seed", "7",
                           "--out", str(out), "--postgres", ""], env=env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "kpi.json").read_text()), proc.stdout


@pytest.mark.slow
def test_the_schedule_injects_every_kind_of_fault(kpi):
    _, data, _ = kpi
    s = data["summary"]
    for config in ("session", "durable"):
        assert s[config]["kills"] > 0 and s[config]["corrupt_injected"] > 0, config
    assert s["durable"]["drift_injected"] > 0
    assert s["naive"]["overflow"] + s["session"]["compactions"] > 0  # the context window fills up


def test_no_corrupted_state_is_loaded_and_every_damage_is_detected(kpi):
    _, data, _ = kpi
    corruptions = [c for t in data["trials"] for c in t["corruptions"] if c["detected"] is not None]
    assert corruptions
    assert not [c for c in corruptions if c["loaded_bad"]]
    assert all(c["detected"] for c in corruptions)
    # a fallback lands exactly on the newest checkpoint the damage left intact; a damage healed from
    # its ditto copy continues from the head itself. Known gap: a swap of a lineage object with any
    # other stored object (ditto copies included) sometimes lands elsewhere than the injector's
    # estimate (~1 run in 4); it is still detected and never loaded, as asserted above.
    assert all(c["fell_back_to"] == c["expected"] for c in corruptions
               if c["expected"] is not None and not c.get("healed") and c["kind"] != "swapped_blob")
    assert all(c["fell_back_to"] == c["bad_head"] for c in corruptions if c.get("healed"))


def test_no_committed_step_is_lost_and_a_kill_wastes_at_most_the_step_in_flight(kpi):
    _, data, _ = kpi
    for t in data["trials"]:
        if t["config"] not in ("session", "durable"):
            continue
        assert t["committed_lost"] == 0, t["task_id"]
        killed = [s for s in t["sessions"] if s["status"] == "killed"]
        assert all(s["caused_waste"] <= 1 for s in killed), (t["config"], t["task_id"], t["sessions"])
        assert t["status"] == "complete", (t["config"], t["task_id"], t["status"])
        assert all(s["resumed"] for s in t["sessions"] if s["cause"] == "kill")


def test_every_injected_drift_is_detected_at_durable(kpi):
    _, data, _ = kpi
    drifts = [d for t in data["trials"] if t["level"] == "durable" for d in t["drifts"] if d["relevant"]]
    assert drifts and all(d["detected"] for d in drifts), drifts
    assert all(t["false_alarms"] == 0 for t in data["trials"])
    # the session level does not look at the world: it misses them (the reason durable exists)
    session = [d for t in data["trials"] if t["config"] == "session" for d in t["drifts"] if d["relevant"]]
    assert session and not any(d["detected"] for d in session)


def test_the_baseline_never_continues_and_wastes_more(kpi):
    _, data, _ = kpi
    s = data["summary"]
    assert s["naive"]["continued"] == 0 and s["naive"]["interruptions"] > 0
    assert s["naive"]["wasted_mean"] > s["durable"]["wasted_mean"]
    local = next(m for m in data["media"] if m["case"] == "local")
    assert local["lost"] == local["tasks"] > 0  # the local directory deleted: every task starts over


def test_report_files_and_the_printed_table(kpi):
    out, data, stdout = kpi
    for name in ("kpi.md", "kpi.json", "kpi-continuation.png", "kpi-latency.png", "kpi-storage.png", "report.md"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "kpi-continuation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kpi_md = (out / "kpi.md").read_text()
    assert "| session |" in stdout and "78–82 %" in stdout  # claimed next to measured
    report = (out / "report.md").read_text()
    assert kpi_md.strip() in report and "written by bench perf" in report
    assert not any(p.name.startswith("kpi-work") for p in out.iterdir())  # scratch removed
