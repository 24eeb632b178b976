"""Input files follow the project (round 36): a path a step reads inside the project is recorded
relative to the project root, so a copied project checks its own copy's inputs and a moved one
finds them where they are now; one outside the project stays absolute. A store written before this
(absolute paths inside the project, no ``project`` in the spec) keeps working after a move: its
paths are mapped from the recorded (or inferred) root to the current one. Resume and ``status
--drift`` say once that the project moved. Stored data never makes overnight read outside the
project: a stored relative path with ``..`` is refused, never read.

Every session is a real ``python -m overnight`` process (:func:`_procs.cli`) run in the project
folder, as a user runs it; the folder is copied or moved with :mod:`shutil` between runs.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import _procs
from overnight.verify.input_paths import REFUSED, ProjectPaths, infer_root, safe_relative

TASK = '''
import overnight
task = overnight.Task("cp", goal="read project input files", expected_span="2d")

@task.step
def a(ctx):
    ctx.state["n"] = len(ctx.read_input_text("data/input.txt"))

@task.step(inputs=["data/declared.txt"])
def declared(ctx):
    ctx.state["d"] = 1

@task.step
def tracked(ctx):
    ctx.track_input("data/tracked.txt")
    ctx.track_listing("data/folder")

@task.step
def b(ctx):
    ctx.state["n"] += 1
'''


def cli(*args: str, cwd: Path, check: int | None = 0) -> subprocess.CompletedProcess:
    proc = _procs.cli(*args, cwd=cwd, timeout=120)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def make_project(folder: Path, task: str = TASK) -> Path:
    (folder / "data" / "folder").mkdir(parents=True)
    (folder / "data" / "input.txt").write_text("hello\n")
    (folder / "data" / "declared.txt").write_text("declared\n")
    (folder / "data" / "tracked.txt").write_text("tracked\n")
    (folder / "data" / "folder" / "one.txt").write_text("1")
    (folder / "t.py").write_text(task)
    return folder


def drift(cwd: Path, task_id: str = "cp") -> dict:
    return json.loads(cli("status", task_id, "--drift", "--json", cwd=cwd).stdout)


def drift_keys(report: dict) -> dict[str, list[str]]:
    return {i["key"]: i["steps"] for i in report["drift"]["items"] if not i["warning"]}


def test_a_copied_project_checks_its_own_inputs(tmp_path):
    a = make_project(tmp_path / "a")
    cli("run", "t.py", "-q", cwd=a)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "data" / "input.txt").write_text("CHANGED in the copy\n")
    report = drift(b)
    assert drift_keys(report) == {"data/input.txt": ["a"]}, report
    assert report["drift_words"] == [f"project moved: recorded at {a}, now {b}"]
    r = cli("resume", "cp", cwd=b)
    assert f"project moved: recorded at {a}, now {b}" in r.stderr, r.stderr
    assert "run now" in r.stdout + r.stderr and "missing" not in r.stdout + r.stderr
    # a ran again in the copy (b after it: it read a's state); the original is no business of the copy's
    (a / "data" / "input.txt").write_text("x\n")
    report = drift(b)
    assert report["drift"]["items"] == [] and report["drift_words"] == [], report  # said once
    r = cli("resume", "cp", cwd=b)
    assert "project moved" not in r.stderr and "0 run now" in r.stdout + r.stderr, r.stderr
    # and the original still checks its own: its edited input is drift there
    assert drift_keys(drift(a)) == {"data/input.txt": ["a"]}


def test_a_moved_project_finds_its_inputs_where_they_are(tmp_path):
    old = make_project(tmp_path / "old")
    cli("run", "t.py", "-q", cwd=old)
    new = tmp_path / "new"
    old.rename(new)
    report = drift(new)
    assert report["drift"]["items"] == [], report  # nothing "missing": every input is right there
    assert report["drift_words"] == [f"project moved: recorded at {old}, now {new}"]
    (new / "data" / "declared.txt").write_text("edited after the move\n")
    (new / "data" / "folder" / "two.txt").write_text("2")
    assert drift_keys(drift(new)) == {"data/declared.txt": ["declared"], "listing of data/folder": ["tracked"]}
    r = cli("resume", "cp", cwd=new)
    out = r.stdout + r.stderr
    assert "missing" not in out and "2 run now" in out, out  # declared and tracked, not a nor b


def test_inputs_outside_the_project_stay_absolute(tmp_path):
    outside = tmp_path / "shared.txt"
    outside.write_text("shared\n")
    task = TASK.replace('ctx.read_input_text("data/input.txt")',
                        f'ctx.read_input_text("data/input.txt") + ctx.read_input_text({str(outside)!r})')
    a = make_project(tmp_path / "a", task)
    cli("run", "t.py", "-q", cwd=a)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    outside.write_text("shared, edited\n")
    assert drift_keys(drift(b)) == {str(outside): ["a"]}


FORGED = '''
import overnight
from overnight.codec.digest import sha256
task = overnight.Task("forged", goal="record a path that leaves the project", expected_span="2d")

@task.step
def a(ctx):
    # what a store edited by someone else could hold: a relative path climbing out of the project
    with open("../outside.txt", "rb") as fh:
        ctx.reads["inputs"]["../outside.txt"] = sha256(fh.read())
'''


def test_a_stored_relative_path_never_leaves_the_project(tmp_path):
    (tmp_path / "outside.txt").write_text("not the project's\n")
    project = tmp_path / "p"
    project.mkdir()
    (project / "t.py").write_text(FORGED)
    cli("run", "t.py", "-q", cwd=project)
    items = drift(project, "forged")["drift"]["items"]
    # the file did not change: had it been read, there would be no drift; it is refused instead
    assert [(i["key"], i["new"]) for i in items] == [("../outside.txt", REFUSED)], items


OLD_COMMIT = "a2b2424"
"""A commit from before input paths were recorded relative to the project (round 36)."""


def _old_overnight(dest: Path) -> Path | None:
    """``src`` of overnight at :data:`OLD_COMMIT`, extracted with git, or None without git or it."""
    repo = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(repo), "archive", OLD_COMMIT, "src/overnight"],
                             capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        tar.extractall(dest)
    return dest / "src"


@pytest.mark.slow  # extracts and runs an older overnight
@pytest.mark.parametrize("how", ["move", "copy"])
def test_a_store_written_with_absolute_paths_keeps_working(tmp_path, how):
    """The store of an older overnight (absolute paths inside the project, no ``project`` in the
    spec): after a move its inputs are found under the new root, after a copy the copy's are read."""
    old_src = _old_overnight(tmp_path / "old-overnight")
    if old_src is None:
        pytest.skip(f"no git history with {OLD_COMMIT} to run the older overnight from")
    a = make_project(tmp_path / "a")
    old = _procs.cli("run", "t.py", "-q", cwd=a, timeout=120, extra_env={"PYTHONPATH": str(old_src)})
    assert old.returncode == 0, old.stderr
    from overnight.store import open_store
    from overnight.chain.read import load_head

    with open_store(f"sqlite://{a / '.overnight' / 'overnight.db'}") as s:
        loaded, _ = load_head(s, "cp", "main")
        assert "project" not in loaded.doc.task.spec  # what the older overnight wrote
        done = loaded.state_tree["done"]
        assert str(a / "data" / "input.txt") in done[0]["reads"]["inputs"]
    b = tmp_path / "b"
    if how == "move":
        a.rename(b)
    else:
        shutil.copytree(a, b)
    report = drift(b)
    assert report["drift"]["items"] == [], report
    assert report["drift_words"] == [f"project moved: recorded at {a}, now {b}"]
    (b / "data" / "tracked.txt").write_text("edited in the new place\n")
    if how == "copy":
        (a / "data" / "input.txt").write_text("the original, edited\n")  # not the copy's input
    assert drift_keys(drift(b)) == {"data/tracked.txt": ["tracked"]}
    r = cli("resume", "cp", cwd=b)
    assert "missing" not in r.stdout + r.stderr and "1 run now" in r.stdout + r.stderr, r.stdout + r.stderr
    assert drift(b)["drift"]["items"] == []  # the old entries still map after the spec records b


# -- the path rules, without processes ------------------------------------------------------------


def test_paths_are_recorded_relative_inside_the_project_only(tmp_path):
    paths = ProjectPaths(str(tmp_path / "p"))
    assert paths.key(tmp_path / "p" / "data" / "x.txt") == "data/x.txt"
    assert paths.key(tmp_path / "elsewhere.txt") == str(tmp_path / "elsewhere.txt")
    assert paths.key(tmp_path / "p2" / "x.txt") == str(tmp_path / "p2" / "x.txt")  # a prefix is not a parent
    assert paths.resolve("data/x.txt") == str(tmp_path / "p" / "data" / "x.txt")
    for bad in ("../x", "data/../../x", "a/..", "\0x"):
        assert safe_relative(bad) is None and paths.resolve(bad) is None, bad
    moved = ProjectPaths(str(tmp_path / "new"), (str(tmp_path / "old"),))
    assert moved.resolve(str(tmp_path / "old" / "d" / "x")) == str(tmp_path / "new" / "d" / "x")
    assert moved.resolve(str(tmp_path / "older" / "x")) == str(tmp_path / "older" / "x")


def test_an_old_root_is_inferred_only_for_a_moved_or_copied_project(tmp_path):
    root = tmp_path / "now"
    (root / "data").mkdir(parents=True)
    (root / "data" / "in.txt").write_text("x")
    (root / "t.py").write_text("")
    gone = str(tmp_path / "gone" / "data" / "in.txt")  # the folder it was in no longer exists: moved
    assert infer_root([gone], str(root), "t.py") == str(tmp_path / "gone")
    # a folder that still exists and holds no copy of the task's code: a real outside input, kept
    (tmp_path / "srv" / "data").mkdir(parents=True)
    (tmp_path / "srv" / "data" / "in.txt").write_text("x")
    assert infer_root([str(tmp_path / "srv" / "data" / "in.txt")], str(root), "t.py") is None
    (tmp_path / "srv" / "t.py").write_text("")  # ... unless it is a copy of the project
    assert infer_root([str(tmp_path / "srv" / "data" / "in.txt")], str(root), "t.py") == str(tmp_path / "srv")
    assert infer_root([str(root / "data" / "in.txt"), "data/in.txt"], str(root), "t.py") is None
