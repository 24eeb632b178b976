"""Cross-day resume: every real drift is detected and only what read it is recomputed.

Changes are real: a distribution installed at another version by pip into a directory on
``sys.path``, an environment variable set differently in a new process, a file edited, a
directory entry added, a step's version bumped. Each session runs in its own process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from overnight.store import open_store
from overnight.chain.read import load_head

TASK = '''
import os, overnight
task = overnight.Task("drifty", goal="read the world", version=os.environ.get("EPOCH", "1"),
                      env=["MY_SETTING", "MY_SECRET"], on_drift=dict(x.split("=") for x in
                      os.environ.get("POLICY", "").split(",") if x))

@task.step
def settings(ctx):
    return {{"setting": ctx.env("MY_SETTING"), "secret_len": len(ctx.env("MY_SECRET") or "")}}

@task.step(packages=["tinydep"])
def uses_dep(ctx):
    import tinydep
    return tinydep.VALUE

@task.step
def reads_file(ctx):
    return ctx.read_input_text({data!r}).upper()

@task.step
def lists_dir(ctx):
    ctx.track_listing({folder!r})
    return sorted(os.listdir({folder!r}))

@task.step(version=os.environ.get("STEP_VERSION", "1"))
def versioned(ctx):
    ctx.env("DRIFTY_MODE")  # read by this step only (not declared on the task)
    return "v" + os.environ.get("STEP_VERSION", "1")

@task.step
def summary(ctx):
    return [ctx.outputs["settings"]["setting"], ctx.outputs["reads_file"]]
'''


def make_wheel(tmp: Path, version: str) -> Path:
    """A real wheel of a tiny distribution ``tinydep`` at ``version``."""
    files = {
        "tinydep/__init__.py": f"VALUE = {version!r}\n".encode(),
        f"tinydep-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tinydep\nVersion: {version}\n".encode(),
        f"tinydep-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"tinydep-{version}.dist-info/RECORD,,\n"
    path = tmp / f"tinydep-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"tinydep-{version}.dist-info/RECORD", record)
    return path


def pip_install(wheel: Path, target: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)


@pytest.fixture
def world(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("hello")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    (tmp_path / "drifty.py").write_text(TASK.format(data=str(data), folder=str(folder)))
    for v in ("1.0", "2.0"):
        pip_install(make_wheel(tmp_path, v), tmp_path / f"site-{v}")
    return tmp_path


def run(world: Path, *args: str, dep: str = "1.0", check: int | None = 0, **env: str) -> subprocess.CompletedProcess:
    base = {"MY_SETTING": "a", "MY_SECRET": "s3cr3t-value-0xDEADBEEF", "COLUMNS": "200"}
    full_env = {**os.environ, **base, **env, "PYTHONPATH": str(world / f"site-{dep}")}
    proc = subprocess.run([sys.executable, "-m", "overnight", *args, "--store", f"sqlite://{world / 's.db'}"],
                          cwd=world, capture_output=True, text=True, env=full_env, timeout=120)
    if check is not None:
        assert proc.returncode == check, proc.stderr
    return proc


def executed(world: Path, events: str) -> list[str]:
    path = world / events
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if json.loads(line)["kind"] == "step_start"]


def drift_items(world: Path, **env: str) -> list[dict]:
    out = run(world, "status", "drifty", "--drift", "--json", **env).stdout
    return json.loads(out)["drift"]["items"]


def first_run(world: Path) -> None:
    run(world, "run", "drifty.py", "-q", "--events", "ev0.jsonl")
    assert executed(world, "ev0.jsonl") == ["settings", "uses_dep", "reads_file", "lists_dir", "versioned", "summary"]


def test_no_change_means_no_drift_100_resumes(world, tmp_path):
    """100 resumes with nothing changed: 0 drift reported, nothing recomputed."""
    first_run(world)
    env = {"MY_SETTING": "a", "MY_SECRET": "s3cr3t-value-0xDEADBEEF", "PYTHONPATH": str(world / "site-1.0")}
    code = f"""
import os, sys, json
sys.path.insert(0, {str(world / 'site-1.0')!r}); sys.path.insert(0, {str(world)!r})
os.chdir({str(world)!r})
from overnight import api
reports = [api.status("drifty", store={f"sqlite://{world / 's.db'}"!r}, drift=True) for _ in range(100)]
print(json.dumps([len(r.drift.items) for r in reports]))
"""
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout)
    assert len(counts) == 100 and sum(counts) == 0
    run(world, "resume", "drifty", "-q", "--events", "ev1.jsonl")
    assert executed(world, "ev1.jsonl") == []


def test_deps_drift_real_distribution_version(world):
    first_run(world)
    items = drift_items(world, dep="2.0")
    assert {"component": "deps", "key": "tinydep", "old": "1.0", "new": "2.0", "steps": ["uses_dep"],
            "warning": False} in items
    run(world, "resume", "drifty", "-q", "--events", "ev1.jsonl", dep="2.0")
    assert executed(world, "ev1.jsonl") == ["uses_dep"]
    with open_store(f"sqlite://{world / 's.db'}") as s:
        loaded, _ = load_head(s, "drifty")
    assert [d.output for d in loaded.state.done if d.name == "uses_dep"] == ["2.0"]


def test_env_drift_recompute_accept_abort(world):
    first_run(world)
    items = drift_items(world, MY_SETTING="b")
    assert [(i["component"], i["key"], i["steps"]) for i in items] == [("env", "MY_SETTING", ["settings"])]
    assert items[0]["old"].startswith("env-hmac:") and items[0]["new"].startswith("env-hmac:")  # keyed, never the value
    # abort: distinct exit code, nothing written
    out = run(world, "resume", "drifty", "-q", "--on-drift", "env=abort", check=5, MY_SETTING="b")
    assert "MY_SETTING" in out.stderr and "abort" in out.stderr
    # accept: nothing recomputed; the drift is recorded on every later checkpoint
    run(world, "resume", "drifty", "-q", "--on-drift", "env=accept", "--events", "ev1.jsonl", MY_SETTING="b")
    assert executed(world, "ev1.jsonl") == []
    status = json.loads(run(world, "status", "drifty", "--json", MY_SETTING="b").stdout)
    assert [a["key"] for a in status["accepted_drift"]] == ["MY_SETTING"]
    assert drift_items(world, MY_SETTING="b") == []  # accepted: not reported again
    # recompute (the default): the step that read it, and the step that read its output
    run(world, "resume", "drifty", "-q", "--events", "ev2.jsonl", MY_SETTING="c")
    assert executed(world, "ev2.jsonl") == ["settings", "summary"]


def test_file_edit_and_directory_entry_added(world):
    first_run(world)
    (world / "data.txt").write_text("changed")
    (world / "folder" / "b.txt").write_text("b")
    items = {(i["component"], i["key"]): i["steps"] for i in drift_items(world)}
    # paths inside the project (the current directory here) are named relative to it
    assert items == {("inputs", "data.txt"): ["reads_file"], ("inputs", "listing of folder"): ["lists_dir"]}
    run(world, "resume", "drifty", "-q", "--events", "ev1.jsonl")
    assert executed(world, "ev1.jsonl") == ["reads_file", "lists_dir", "summary"]
    with open_store(f"sqlite://{world / 's.db'}") as s:
        loaded, _ = load_head(s, "drifty")
    outputs = {d.name: d.output for d in loaded.state.done}
    assert outputs["reads_file"] == "CHANGED" and outputs["lists_dir"] == ["a.txt", "b.txt"]
    # editing a listed file's *content* is not a listing change
    (world / "folder" / "a.txt").write_text("A!")
    assert drift_items(world) == []


def test_step_version_bump_recomputes_and_source_edit_only_warns(world):
    first_run(world)
    items = drift_items(world, STEP_VERSION="2")
    assert [(i["component"], i["key"], i["steps"]) for i in items] == [("code", "step versioned version", ["versioned"])]
    run(world, "resume", "drifty", "-q", "--events", "ev1.jsonl", STEP_VERSION="2")
    assert executed(world, "ev1.jsonl") == ["versioned"]
    # a cosmetic edit of a step's source with the same version: a warning, nothing recomputed
    src = (world / "drifty.py").read_text().replace("return tinydep.VALUE", "return tinydep.VALUE  # tidy")
    (world / "drifty.py").write_text(src)
    items = drift_items(world, STEP_VERSION="2")
    assert len(items) == 1 and items[0]["warning"] and items[0]["key"].startswith("step uses_dep source")
    run(world, "resume", "drifty", "-q", "--events", "ev2.jsonl", STEP_VERSION="2")
    assert executed(world, "ev2.jsonl") == []
    # the task's code epoch recomputes everything
    run(world, "resume", "drifty", "-q", "--events", "ev3.jsonl", STEP_VERSION="2", EPOCH="2")
    assert len(executed(world, "ev3.jsonl")) == 6


def test_rollback_to_the_newest_checkpoint_matching_the_world(world):
    first_run(world)
    url = f"sqlite://{world / 's.db'}"
    with open_store(url) as s:
        made_in_a = s.get_ref("drifty", "main")
    # a later session in another environment accepts the drift: its checkpoints record MY_SETTING=b
    run(world, "resume", "drifty", "-q", "--on-drift", "env=accept", MY_SETTING="b")
    with open_store(url) as s:
        made_in_b = s.get_ref("drifty", "main")
    assert made_in_b != made_in_a
    # back in the first environment, rollback resumes from the newest checkpoint made there
    run(world, "resume", "drifty", "-q", "--on-drift", "env=rollback", "--events", "ev2.jsonl", MY_SETTING="a")
    with open_store(url) as s:
        head, _ = load_head(s, "drifty")
    assert head.record.event.kind == "rollback" and head.record.event.ref == made_in_a
    assert head.record.parent_id == made_in_b  # the newer checkpoints stay in the history
    assert executed(world, "ev2.jsonl") == []
    assert drift_items(world, MY_SETTING="a") == []
    # and when nothing matches, rollback refuses (exit 5) rather than guess
    out = run(world, "resume", "drifty", "-q", "--on-drift", "env=rollback", check=5, MY_SETTING="zzz")
    assert "no earlier checkpoint matches" in out.stderr


def test_no_secret_value_anywhere_in_the_store(world):
    secret = "s3cr3t-value-0xDEADBEEF"
    first_run(world)
    run(world, "resume", "drifty", "-q", MY_SECRET=secret + "-rotated")  # the digest changes; never the value
    raw = b"".join(p.read_bytes() for p in world.glob("s.db*"))
    for needle in (secret, secret + "-rotated"):
        for form in (needle.encode(), needle.encode("utf-16-le"), base64.b64encode(needle.encode())):
            assert form not in raw
    # ... and the declared name is there, so the drift report can say which variable changed
    assert b"MY_SECRET" in raw


def test_env_export_writes_pins_and_names_not_values(world):
    first_run(world)
    text = run(world, "env", "export", "drifty").stdout
    assert "tinydep==1.0" in text and f"python {sysconfig.get_python_version()}" in text
    assert "MY_SETTING" in text and "MY_SECRET" in text and "s3cr3t" not in text
    assert "# environment variables its steps read (values not recorded): DRIFTY_MODE" in text
    assert any(line.startswith("pydantic==") for line in text.splitlines())


def test_on_drift_option_is_validated(world):
    first_run(world)
    out = run(world, "resume", "drifty", "--on-drift", "deps=maybe", check=2)
    assert "unknown drift policy 'maybe'" in out.stderr


def test_demo_recomputes_only_changed_modules(tmp_path):
    """The main job on a copy of a real package: edit one module, resume -- only its section and
    the assembly run again; the rest come from the checkpoints."""
    src = Path(sysconfig.get_paths()["stdlib"]) / "email"
    pkg = tmp_path / "mailpkg"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "overnight", "demo", "-p", "mailpkg", "-q", "--store", f"sqlite://{tmp_path / 's.db'}",
           "--out", str(tmp_path / "report.md")]
    subprocess.run([*cmd, "--events", "ev0.jsonl"], cwd=tmp_path, env=env, check=True, capture_output=True)
    first = executed(tmp_path, "ev0.jsonl")
    before = (tmp_path / "report.md").read_text()
    text = (pkg / "charset.py").read_text()
    assert "Add character set properties to the global registry." in text
    (pkg / "charset.py").write_text(text.replace("Add character set properties to the global registry.",
                                                 "Add character set properties (edited after the first run)."))
    proc = subprocess.run([*cmd, "--events", "ev1.jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    again = executed(tmp_path, "ev1.jsonl")
    assert again == ["section:mailpkg.charset", "assemble"]
    after = (tmp_path / "report.md").read_text()
    assert "edited after the first run" in after and "edited after the first run" not in before
    assert after.replace("(edited after the first run)", "to the global registry") == before
    print(f"\ndemo drift: first run {len(first)} steps; after editing one module: {len(again)} recomputed, "
          f"{len(first) - len(again)} reused")


FLOW = '''
import overnight
task = overnight.Task("flow", goal="count the words of a file", data={{"words": [], "count": 0}})

@task.step
def load(ctx):
    ctx.state["words"] = ctx.read_input_text({path!r}).split()
    return {{"n": len(ctx.state["words"])}}

@task.step
def expand(ctx):
    for w in ctx.state["words"]:
        ctx.add_step("per_word", w=w)

@task.step(planned=False)
def per_word(ctx, w):
    ctx.state["count"] += 1
    return len(w)

@task.step
def report(ctx):
    return {{"words": len(ctx.state["words"]), "count": ctx.state["count"], "n": ctx.outputs["load"]["n"]}}
'''


def test_drift_follows_data_passed_through_ctx_state(tmp_path):
    """A step that reads a ctx.state key written by a recomputed step runs again when the value it
    reads changed (and only then): here a new word in the input adds its per_word step, and the
    report is consistent."""
    data = tmp_path / "input.txt"
    data.write_text("alpha beta gamma")
    (tmp_path / "flow.py").write_text(FLOW.format(path=str(data)))
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "overnight", "run", "flow.py", "-q", "--store", f"sqlite://{tmp_path / 's.db'}"]
    subprocess.run([*cmd, "--events", "ev0.jsonl"], cwd=tmp_path, env=env, check=True, capture_output=True)
    data.write_text("alpha beta gamma delta")
    proc = subprocess.run([*cmd, "--events", "ev1.jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert executed(tmp_path, "ev1.jsonl") == ["load", "expand", "per_word[w='delta']", "report"]
    with open_store(f"sqlite://{tmp_path / 's.db'}") as s:
        loaded, _ = load_head(s, "flow")
    out = {d.name: d.output for d in loaded.state.done}
    assert out["report"] == {"words": 4, "count": 4, "n": 4}
    # same content again (a touch, no change): nothing runs
    data.write_text("alpha beta gamma delta")
    subprocess.run([*cmd, "--events", "ev2.jsonl"], cwd=tmp_path, env=env, check=True, capture_output=True)
    assert executed(tmp_path, "ev2.jsonl") == []


ACCUMULATE = '''
import overnight
from pathlib import Path
folder = Path({folder!r})
task = overnight.Task("accum", goal="sum the numbers in five files", data={{"total": 0, "seen": []}})

@task.step
def plan(ctx):
    for i in range(5):
        ctx.add_step("add", i=i)

@task.step(planned=False)
def add(ctx, i):
    x = int(ctx.read_input_text(folder / f"{{i}}.txt"))
    ctx.state["total"] += x          # accumulates: a recompute must not count anything twice
    ctx.state["seen"].append(i)
    return x

@task.step
def report(ctx):
    return {{"total": ctx.state["total"], "seen": ctx.state["seen"]}}
'''


def test_recompute_never_applies_a_state_update_twice(tmp_path):
    folder = tmp_path / "numbers"
    folder.mkdir()
    for i in range(5):
        (folder / f"{i}.txt").write_text(str(10 * (i + 1)))
    (tmp_path / "accum.py").write_text(ACCUMULATE.format(folder=str(folder)))
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "overnight", "run", "accum.py", "-q", "--store", f"sqlite://{tmp_path / 's.db'}"]
    subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    (folder / "1.txt").write_text("25")  # 20 -> 25
    proc = subprocess.run([*cmd, "--events", "ev1.jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # the edited step, the steps after it that read what it changed (the running total), the report;
    # add[i=0] before it is untouched
    assert executed(tmp_path, "ev1.jsonl") == ["add[i=1]", "add[i=2]", "add[i=3]", "add[i=4]", "report"]
    with open_store(f"sqlite://{tmp_path / 's.db'}") as s:
        loaded, _ = load_head(s, "accum")
    out = {d.name: d.output for d in loaded.state.done}
    assert out["report"] == {"total": 10 + 25 + 30 + 40 + 50, "seen": [0, 1, 2, 3, 4]}
    assert loaded.state.recompute is None


def test_demo_replans_when_a_module_is_added_or_removed(tmp_path):
    """The package gains a module, then loses one: the planning step runs again and re-plans --
    the new module's section is written before the assembly, the removed one's leaves the plan."""
    pkg = tmp_path / "tinypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A tiny package."""\n')
    (pkg / "a.py").write_text('"""Module a."""\n\ndef fa(x: int) -> int:\n    """Double x."""\n    return 2 * x\n')
    (pkg / "b.py").write_text('"""Module b."""\n\ndef fb(y: str) -> str:\n    """Echo y."""\n    return y\n')
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "overnight", "demo", "-p", "tinypkg", "-q", "--store", f"sqlite://{tmp_path / 's.db'}",
           "--out", str(tmp_path / "report.md")]

    def demo():
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return (tmp_path / "report.md").read_text()

    assert "## `tinypkg.b`" in demo()
    (pkg / "c.py").write_text('"""Module c."""\n\ndef fc() -> None:\n    """Nothing."""\n')
    report = demo()
    assert "## `tinypkg.c`" in report and "`fc() -> None`" in report
    (pkg / "b.py").unlink()
    report = demo()
    assert "## `tinypkg.b`" not in report and "## `tinypkg.a`" in report and "## `tinypkg.c`" in report
