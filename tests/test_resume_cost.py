"""What a resume pays for before its first step: the distribution fingerprint is cached on disk
(re-read only when ``sys.path`` or a ``*.dist-info`` changes), and the tokenizer's vocabulary is
loaded only when a model is called."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from overnight.verify import dists
from overnight.verify.fingerprint import _scan_installed, installed


def _dist(site: Path, name: str, version: str) -> Path:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A fresh state folder and an empty in-process memo (what a new process starts with)."""
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(dists, "_memo", {})
    return tmp_path / "state"


def test_fingerprint_is_read_once_then_from_the_cache_file(state, monkeypatch):
    before = dists.scans
    first = installed()
    assert dists.scans == before + 1 and first == _scan_installed()
    doc = json.loads((state / dists.CACHE_FILE).read_text())
    assert doc["packages"] == first and doc["key"] == dists.path_key()
    monkeypatch.setattr(dists, "_memo", {})  # a new process: only the file remains
    assert installed() == first and dists.scans == before + 1


def test_a_new_dist_info_on_sys_path_is_read(state, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    assert "tinydep-cache" not in installed()
    before = dists.scans
    _dist(site, "tinydep_cache", "1.0")
    monkeypatch.setattr(dists, "_memo", {})
    assert installed()["tinydep-cache"] == "1.0" and dists.scans == before + 1
    assert installed()["tinydep-cache"] == "1.0" and dists.scans == before + 1  # and kept


def test_a_changed_dist_info_mtime_is_read_again(state, tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = _dist(site, "tinydep_cache", "1.0")
    monkeypatch.syspath_prepend(str(site))
    assert installed()["tinydep-cache"] == "1.0"
    # the same name, rewritten in place (a reinstall that kept the folder): its mtime moves
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinydep_cache\nVersion: 1.0.post1\n")
    st = info.stat()
    os.utime(info, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    before = dists.scans
    monkeypatch.setattr(dists, "_memo", {})
    assert installed()["tinydep-cache"] == "1.0.post1" and dists.scans == before + 1


def test_a_sys_path_order_change_is_read_again(state, tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    _dist(a, "tinydep_cache", "1.0")
    _dist(b, "tinydep_cache", "2.0")
    monkeypatch.syspath_prepend(str(b))
    monkeypatch.syspath_prepend(str(a))
    assert installed()["tinydep-cache"] == "1.0"  # the first on sys.path wins
    monkeypatch.setattr(sys, "path", [str(b), str(a), *[p for p in sys.path if p not in (str(a), str(b))]])
    assert installed()["tinydep-cache"] == "2.0"


def test_a_damaged_or_foreign_cache_file_is_ignored(state, monkeypatch):
    truth = installed()
    path = state / dists.CACHE_FILE
    for bad in ("{not json", json.dumps({"format": 1, "key": dists.path_key(), "packages": ["x"]}),
                json.dumps({"format": 1, "key": "0" * 64, "packages": {"forged": "9"}})):
        path.write_text(bad)
        monkeypatch.setattr(dists, "_memo", {})
        before = dists.scans
        assert installed() == truth and dists.scans == before + 1


# --- the tokenizer loads only when a model is used --------------------------------------------

TASK = '''
import overnight

task = overnight.Task("lazy-tok", goal="steps without a model, then one with", level="durable")

@task.step
def a(ctx):
    ctx.state["n"] = 1

@task.step
def b(ctx):
    ctx.state["n"] = 2

@task.step
def c(ctx):
    return ctx.model.complete([{"role": "user", "content": "say something short"}]).text
'''

PROBE = '''
import json, sys
from overnight import tokens, tokens_lazy
from overnight.api import resume
r = resume("lazy-tok", store=sys.argv[1], max_steps=int(sys.argv[2]))
print(json.dumps({"status": r.status, "tiktoken": "tiktoken" in sys.modules,
                  "encoders": tokens._load_encoder.cache_info().currsize, "lazy_loads": tokens_lazy.loads}))
'''


def _probe(tmp_path: Path, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), str(tmp_path)])}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE), f"sqlite://{tmp_path / 's.db'}", str(steps)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_resume_of_a_model_free_step_never_loads_the_vocabulary(tmp_path):
    (tmp_path / "lazytok.py").write_text(TASK)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    made = subprocess.run([sys.executable, "-m", "overnight", "run", "lazytok.py", "--store", f"sqlite://{tmp_path / 's.db'}",
                           "--max-steps", "1", "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 75, made.stderr  # stopped after step a
    got = _probe(tmp_path, 1)  # resume; runs step b, which calls no model
    assert got == {"status": "stopped", "tiktoken": False, "encoders": 0, "lazy_loads": 0}
    got = _probe(tmp_path, 1)  # resume; runs step c, which calls the model: now the vocabulary loads
    assert got["status"] == "complete" and got["encoders"] == 1 and got["lazy_loads"] >= 1  # one vocabulary, shared


CLI_PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write("\\nMODULES " + json.dumps(
    {"typer": "typer" in sys.modules, "app": "overnight.cli.app" in sys.modules}) + "\\n"))
sys.argv = ["overnight", *sys.argv[1:]]
from overnight.cli import main
main()
"""


def _cli(tmp_path: Path, *args: str) -> tuple[int, str, dict]:
    """``(exit code, stderr, {"typer", "app": imported?})`` of ``overnight ARGS`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    env.pop("OVERNIGHT_STORE", None)
    proc = subprocess.run([sys.executable, "-c", CLI_PROBE, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    text, _, tail = proc.stderr.rpartition("MODULES ")
    return proc.returncode, text.strip(), json.loads(tail)


def test_resume_runs_without_the_cli_framework_and_says_the_same(tmp_path):
    """``overnight resume TASK_ID`` with the options a resume usually has runs without importing
    typer or the command modules (a third of its start-up), with the typer command's messages and
    exit codes; any other form -- another option, --help, a bad value -- goes through typer."""
    (tmp_path / "lazytok.py").write_text(TASK)
    url = f"sqlite://{tmp_path / 's.db'}"
    assert _cli(tmp_path, "run", "lazytok.py", "--store", url, "--max-steps", "1", "-q")[0] == 75
    code, err, mods = _cli(tmp_path, "resume", "lazy-tok", "--store", url, "--max-steps", "1", "--quiet")
    assert (code, mods) == (75, {"typer": False, "app": False})
    assert err == f"resume with: overnight resume lazy-tok --store {url}"
    code, err, mods = _cli(tmp_path, "resume", "nope", "-s", url)
    assert code == 2 and err.startswith("error: no task 'nope'") and not mods["typer"]
    code, err, mods = _cli(tmp_path, "resume", "lazy-tok", "--store", url, "--max-steps", "0")
    assert code == 2 and "--max-steps" in err and mods["typer"]  # typer says what is wrong
    code, err, mods = _cli(tmp_path, "resume", "lazy-tok", "--store", url, "--events", str(tmp_path / "e.jsonl"),
                           "--max-steps", "1", "-q")
    assert (code, mods["typer"]) == (0, True) and (tmp_path / "e.jsonl").read_text().count("\n") >= 3  # c ran: complete


# --- overnight bench resume ---------------------------------------------------------------------


@pytest.mark.slow
def test_bench_resume_cli_times_the_process_at_each_length_and_writes_its_files(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "COLUMNS": "200"}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "overnight", "bench", "resume", "--chain", "3,4", "--reps", "1",
                           "--out", str(out), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [(b["length"], b["checkpoints"]) for b in data["by_length"]] == [(3, 3), (4, 4)]
    for b in data["by_length"]:  # a resume does more than importing overnight, and stops before committing
        assert b["resume to first step"]["median_ms"] > b["bare import"]["median_ms"] > 0
    assert {p.name for p in out.iterdir()} == {"resume_process.md", "resume_process.json", "resume_process.png"}
    bad = subprocess.run([sys.executable, "-m", "overnight", "bench", "resume", "--chain", "5,2"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "ascending" in bad.stderr


# --- what a resume imports before its first step --------------------------------------------------

DEFERRED = ("overnight.verify.fsck", "overnight.verify.content_proc", "overnight.ops.archive", "overnight.ops.gc",
            "overnight.ops.repair", "overnight.store.memory",
            "tomllib", "concurrent.futures", "pickle")
"""Modules ``overnight resume`` of a one-medium task does not need before its first step, imported
only by the commands (or the rare paths: a fallback into archived history, a replicated task,
an ``overnight.toml``) that use them (``overnight bench resume``)."""

SEEN = '''
import json, os, sys
import overnight

task = overnight.Task("imports", goal="say what was imported before a step ran", level="durable")

@task.step
def a(ctx):
    ctx.state["n"] = 1

@task.step
def b(ctx):
    with open(os.environ["SEEN_FILE"], "w") as f:
        json.dump(sorted(sys.modules), f)
'''


def test_resume_to_its_first_step_leaves_the_other_commands_modules_unimported(tmp_path):
    (tmp_path / "seen.py").write_text(SEEN)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "SEEN_FILE": str(tmp_path / "seen.json")}
    env.pop("OVERNIGHT_STORE", None)
    env.pop("OVERNIGHT_CONFIG", None)
    url = f"sqlite://{tmp_path / 's.db'}"
    made = subprocess.run([sys.executable, "-m", "overnight", "run", "seen.py", "--store", url, "--max-steps", "1", "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 75, made.stderr
    resumed = subprocess.run([sys.executable, "-m", "overnight", "resume", "imports", "--store", url, "-q"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    seen = set(json.loads((tmp_path / "seen.json").read_text()))
    assert "overnight.runtime.runner" in seen and "overnight.api" in seen  # the resume path, not something else
    assert sorted(seen.intersection(DEFERRED)) == []
