"""``overnight bench fleet`` runs end to end on a small workload and reports what it promises:
every task complete, claim latencies, a takeover after SIGKILL bounded by the lease, and CPU per
step commit of overnight next to DBOS's on the same server."""

from __future__ import annotations

import json

import pytest

from _procs import CLI, env

pytestmark = pytest.mark.slow


def test_bench_fleet_small_run_reports_every_figure(tmp_path, postgres_url):
    import subprocess

    res = subprocess.run([*CLI, "bench", "fleet", "--workers", "2", "--tasks", "4", "--steps", "3", "--no-sqlite",
                          "--no-dbos", "--cpu-steps", "0", "--postgres", postgres_url, "--out", str(tmp_path),
                          "--json"], env=env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (r,) = json.loads(res.stdout)["results"]
    assert (r["system"], r["store"], r["tasks"], r["steps"]) == ("overnight", "postgresql", 4, 3)
    assert r["step_commits_per_s"] > 0 and r["claim_p50_ms"] is not None
    assert 0 < r["takeover_s"] <= 60  # bounded by the 3 s lease, plus start-up on a loaded machine
    assert (tmp_path / "fleet.md").exists() and (tmp_path / "fleet.png").exists()


def test_cpu_per_step_measures_overnight_and_dbos(postgres_url):
    pytest.importorskip("dbos")
    from overnight.bench.fleet import cpu_markdown, cpu_per_step

    rows = cpu_per_step(postgres_url, steps=20, dbos=True)
    assert [r["system"] for r in rows] == ["overnight", "dbos"]
    assert rows[0]["steps"] == 21 and rows[1]["steps"] == 20  # overnight's plan step commits too
    for r in rows:
        assert r["client_ms_per_step"] > 0 and r["postgres_ms_per_step"] >= 0
        assert r["cpu_ms_per_step"] == pytest.approx(r["client_ms_per_step"] + r["postgres_ms_per_step"], abs=0.02)
    assert "| dbos | 20 |" in cpu_markdown(rows) and "1.00x" in cpu_markdown(rows)
