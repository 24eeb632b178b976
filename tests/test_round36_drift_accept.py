"""Accepted drift stays accepted (round 36): ``--on-drift COMPONENT=accept`` makes what drifted the
baseline -- a later resume neither reports it again nor recomputes it, for every component (a
bumped step ``version=`` as for an environment variable) -- and the "accepted drift" list names
the drift that done steps were computed without, so it clears once those steps run again. An
aborted drift's hint names what fits the component that drifted.

Every session is a real ``python -m overnight`` process (:func:`_procs.cli`), the task file
edited between runs as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import _procs
from test_drift import make_wheel, pip_install

USER_TASK = '''
import overnight
task = overnight.Task("acc", goal="check that accepted drift stays accepted", expected_span="2d")
@task.step
def a(ctx): ctx.state["x"] = 1
@task.step
def b(ctx): ctx.state["x"] += 1
'''

WORLD_TASK = '''
import os, overnight
task = overnight.Task("world", goal="read the world", expected_span="2d", version=os.environ.get("EPOCH", "1"),
                      env=["ACC_SETTING"])

@task.step(version=os.environ.get("A_VERSION", "1"))
def a(ctx):
    ctx.state["a"] = 1

@task.step
def reads_env(ctx):
    return ctx.env("ACC_SETTING")

@task.step
def reads_file(ctx):
    return ctx.read_input_text("data.txt")

@task.step(packages=["tinydep"])
def uses_dep(ctx):
    import tinydep
    return tinydep.VALUE
'''


def cli(*args: str, cwd: Path, env: dict | None = None, check: int | None = 0) -> subprocess.CompletedProcess:
    proc = _procs.cli(*args, cwd=cwd, timeout=120, extra_env=env)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def ran(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [e["step"] for e in _procs.read_events(path) if e["kind"] == "step_start"]


def status(cwd: Path, task: str, env: dict | None = None) -> dict:
    return json.loads(cli("status", task, "--drift", "--json", cwd=cwd, env=env).stdout)


def bump(path: Path, step: str, version: int) -> None:
    """Give step function ``step`` of the user's task file ``version=`` (as the user's sed did)."""
    lines = path.read_text().splitlines()
    i = lines.index(f"def {step}(ctx): " + ("ctx.state[\"x\"] = 1" if step == "a" else "ctx.state[\"x\"] += 1"))
    lines[i - 1] = f"@task.step(version={version})"
    path.write_text("\n".join(lines) + "\n")


def test_an_accepted_step_version_is_the_baseline_and_the_label_clears_when_the_steps_run_again(tmp_path):
    (tmp_path / "t.py").write_text(USER_TASK)
    cli("run", "t.py", "-q", cwd=tmp_path)
    bump(tmp_path / "t.py", "a", 2)
    bump(tmp_path / "t.py", "b", 2)

    accept = cli("resume", "acc", "--on-drift", "code=accept", "--events", str(tmp_path / "e1.jsonl"), cwd=tmp_path)
    assert "accepted 2 drift(s)" in accept.stderr and ran(tmp_path / "e1.jsonl") == []

    # accepted: the new version is the baseline -- no drift, nothing would run
    st = status(tmp_path, "acc")
    assert st["drift"]["items"] == [] and st["will_run"] == [] and st["may_run"] == []
    # ...and the label says what it means: results computed before the accepted drift are kept
    assert [(a["key"], a["old"], a["new"], a["steps"]) for a in st["accepted_drift"]] == [
        ("step a version", "1", "2", ["a"]), ("step b version", "1", "2", ["b"])]
    human = cli("status", "acc", cwd=tmp_path).stdout
    assert "accepted drift code: step a version: 1 -> 2 (kept from before it: a)" in human

    # a plain resume neither reports it again nor recomputes
    again = cli("resume", "acc", "--events", str(tmp_path / "e2.jsonl"), cwd=tmp_path)
    assert "drift:" not in again.stderr and ran(tmp_path / "e2.jsonl") == []
    assert "0 run now" in again.stderr

    # a runs again (another bump, default recompute): its accepted drift is gone; b is replayed
    # (nothing it read changed), keeps its result from version 1 -- and its accepted label
    bump(tmp_path / "t.py", "a", 3)
    cli("resume", "acc", "--events", str(tmp_path / "e3.jsonl"), cwd=tmp_path)
    assert ran(tmp_path / "e3.jsonl") == ["a"]
    st = status(tmp_path, "acc")
    assert st["drift"]["items"] == []  # b's replay did not bring its old version back
    assert [(a["key"], a["steps"]) for a in st["accepted_drift"]] == [("step b version", ["b"])]

    # b runs again too: nothing computed without the accepted drift is left, the label is gone
    bump(tmp_path / "t.py", "b", 3)
    cli("resume", "acc", "--events", str(tmp_path / "e4.jsonl"), cwd=tmp_path)
    assert ran(tmp_path / "e4.jsonl") == ["b"]
    st = status(tmp_path, "acc")
    assert st["accepted_drift"] == [] and st["drift"]["items"] == []
    assert "accepted drift" not in cli("status", "acc", cwd=tmp_path).stdout


def site_path(site: Path) -> str:
    """``PYTHONPATH`` with ``site`` (a distribution's version installed there) in front."""
    return os.pathsep.join([str(site), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)])


def world(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "data.txt").write_text("hello")
    (tmp_path / "w.py").write_text(WORLD_TASK)
    for v in ("1.0", "2.0"):
        pip_install(make_wheel(tmp_path, v), tmp_path / f"site-{v}")
    base = {"ACC_SETTING": "a", "PYTHONPATH": site_path(tmp_path / "site-1.0")}
    cli("run", "w.py", "-q", cwd=tmp_path, env=base)
    return base


def test_every_component_accepted_is_not_reported_or_recomputed_again(tmp_path):
    """code (the task's version and a step's version), env, inputs, deps: each accepted once, then
    a plain resume in the same world runs nothing and reports nothing."""
    env = world(tmp_path)
    changes = [
        ("code", {"A_VERSION": "2"}, None, [("step a version", ["a"])]),
        ("env", {"ACC_SETTING": "b"}, None, [("ACC_SETTING", ["reads_env"])]),
        ("inputs", {}, "changed", [("data.txt", ["reads_file"])]),
        ("deps", {"PYTHONPATH": site_path(tmp_path / "site-2.0")}, None, [("tinydep", ["uses_dep"])]),
        ("code", {"EPOCH": "2"}, None, [("task version", ["a", "reads_env", "reads_file", "uses_dep"])]),
    ]
    accepted: list[tuple[str, list[str]]] = []
    for n, (component, change, data, expect) in enumerate(changes):
        env = {**env, **change}
        if data is not None:
            (tmp_path / "data.txt").write_text(data)
        [item] = status(tmp_path, "world", env)["drift"]["items"]
        assert item["component"] == component
        cli("resume", "world", "--on-drift", f"{component}=accept", "--events", str(tmp_path / f"a{n}.jsonl"),
            cwd=tmp_path, env=env)
        assert ran(tmp_path / f"a{n}.jsonl") == []
        st = status(tmp_path, "world", env)
        assert st["drift"]["items"] == [] and st["will_run"] == [], (component, st["drift"])
        accepted += expect
        assert [(Path(a["key"]).name, a["steps"]) for a in st["accepted_drift"]] == accepted  # a path: its name
        again = cli("resume", "world", "--events", str(tmp_path / f"r{n}.jsonl"), cwd=tmp_path, env=env)
        assert ran(tmp_path / f"r{n}.jsonl") == [] and "drift:" not in again.stderr, (component, again.stderr)


def test_an_accepted_read_survives_the_replay_of_its_step(tmp_path):
    """reads_env's env drift accepted; then a's version recomputes a, and reads_env (after it,
    reading nothing a wrote) is replayed from the checkpoint that first committed it: its recorded
    reads must stay the accepted ones, or the accepted drift comes back on the next resume."""
    env = {**world(tmp_path), "ACC_SETTING": "b"}
    cli("resume", "world", "--on-drift", "env=accept", cwd=tmp_path, env=env)
    env["A_VERSION"] = "2"
    cli("resume", "world", "--events", str(tmp_path / "e1.jsonl"), cwd=tmp_path, env=env)
    assert ran(tmp_path / "e1.jsonl") == ["a"]
    st = status(tmp_path, "world", env)
    assert st["drift"]["items"] == [], st["drift"]
    assert [(a["key"], a["steps"]) for a in st["accepted_drift"]] == [("ACC_SETTING", ["reads_env"])]
    again = cli("resume", "world", "--events", str(tmp_path / "e2.jsonl"), cwd=tmp_path, env=env)
    assert ran(tmp_path / "e2.jsonl") == [] and "drift:" not in again.stderr


def test_the_abort_hint_fits_the_component_that_drifted(tmp_path):
    (tmp_path / "t.py").write_text(USER_TASK)
    cli("run", "t.py", "-q", cwd=tmp_path)
    bump(tmp_path / "t.py", "a", 2)
    out = cli("resume", "acc", "--on-drift", "code=abort", cwd=tmp_path, check=5)
    hint = out.stderr[out.stderr.index("hint:"):]
    assert "env export" not in hint and "environment" not in hint
    assert "version= of step(s) a back" in hint
    assert "--on-drift code=recompute" in hint and "--on-drift code=accept" in hint

    env = world(tmp_path)
    out = cli("resume", "world", "--on-drift", "env=abort", cwd=tmp_path, env={**env, "ACC_SETTING": "b"}, check=5)
    hint = out.stderr[out.stderr.index("hint:"):]
    assert "overnight env export world" in hint and "--on-drift env=recompute" in hint

    (tmp_path / "data.txt").write_text("changed")
    out = cli("resume", "world", "--on-drift", "inputs=abort", cwd=tmp_path, env=env, check=5)
    hint = " ".join(out.stderr[out.stderr.index("hint:"):].split())
    assert "restore" in hint and "data.txt" in hint and "env export" not in hint
    assert "--on-drift inputs=recompute" in hint
