"""Resume follows the user (issue 19): a plan that changes, a model that changes, output
conventions, short tasks, the user's own folders, readable output -- each through the real CLI,
as a user would drive it, editing the task file between runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import _procs
import pytest


def cli(*args: str, cwd: Path, env: dict | None = None, check: int | None = 0,
        timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m overnight ARGS`` (:func:`_procs.cli`), asserting its exit code unless ``check`` is None."""
    proc = _procs.cli(*args, cwd=cwd, timeout=timeout, extra_env=env)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def events(path: Path, kind: str) -> list[str]:
    return [e["step"] for e in _procs.read_events(path) if e["kind"] == kind]


PLAN_V1 = '''
import overnight
task = overnight.Task("planned", goal="a plan that changes", deps=[])

@task.step
def a(ctx):
    ctx.state.setdefault("order", []).append("a")

@task.step
def b(ctx):
    ctx.state["order"].append("b")
{middle}
@task.step
def c(ctx):
    ctx.state["order"].append("c")
    return {c_body}
{tail}'''
X_STEP = '''
@task.step
def x(ctx):
    ctx.state["order"].append("x")
    return "made by x"
'''
Y_STEP = '''
@task.step
def y(ctx):
    ctx.state["order"].append("y")
'''


def test_a_planned_step_inserted_in_the_code_runs_in_its_place(tmp_path):
    task = tmp_path / "plan.py"
    task.write_text(PLAN_V1.format(middle="", c_body="None", tail=Y_STEP))
    cli("run", "plan.py", "--max-steps", "2", "-q", cwd=tmp_path, check=75)  # a and b ran
    # the user inserts x between b and c (c now needs it) and deletes y
    task.write_text(PLAN_V1.format(middle=X_STEP, c_body='ctx.outputs["x"]', tail=""))

    status = json.loads(cli("status", "planned", "--drift", "--json", cwd=tmp_path).stdout)
    assert status["plan_change"] == "+ x before c; - y"
    assert status["will_run"] == ["x", "c"]
    human = cli("status", "planned", "--drift", cwd=tmp_path).stdout
    assert "plan changed: + x before c; - y" in human and "resume runs 2 step(s): x, c" in human

    ev = tmp_path / "events.jsonl"
    run = cli("resume", "planned", "--events", str(ev), cwd=tmp_path)
    assert "plan changed: + x before c; - y" in run.stderr
    assert events(ev, "step_start") == status["will_run"]  # the prediction is what ran
    from overnight.store import open_store
    from overnight.chain.read import load_head

    with open_store(f"sqlite://{tmp_path}/.overnight/overnight.db") as s:
        head, _ = load_head(s, "planned", "main", key=None)
        assert head.state.data["order"] == ["a", "b", "x", "c"]
        assert [d.output for d in head.state.done if d.name == "c"] == ["made by x"]


MODEL_TASK = '''
import overnight
task = overnight.Task("modelled", goal="a task that calls a model", deps=[])

@task.step
def ask(ctx):
    return ctx.model.complete([{"role": "user", "content": "Say hello."}], max_tokens=16).text

@task.step
def other(ctx):
    return "no model here"
'''
NOWHERE = ["--base-url", "http://127.0.0.1:9/v1"]  # nothing listens: a call there fails at once


def drift_items(proc: subprocess.CompletedProcess) -> list[dict]:
    return json.loads(proc.stdout)["drift"]["items"]


@pytest.mark.slow
def test_a_switched_model_is_drift_accepted_by_default_and_recompute_calls_the_new_one(tmp_path):
    (tmp_path / "m.py").write_text(MODEL_TASK)
    cli("run", "m.py", "-q", cwd=tmp_path)  # extractive (the default)
    assert [i for i in drift_items(cli("status", "modelled", "--drift", "--json", cwd=tmp_path))
            if i["component"] == "model"] == []

    switched = cli("status", "modelled", "--drift", "--json", "--model", "openai:tiny", *NOWHERE, cwd=tmp_path)
    [item] = [i for i in drift_items(switched) if i["component"] == "model"]
    assert item["old"] == "extractive (tokenizer o200k_base)" and item["steps"] == ["ask"] and not item["warning"]
    assert item["new"].startswith("openai:tiny (name tiny, base URL http://127.0.0.1:9/v1")
    assert "model: accept" in json.loads(switched.stdout)["drift_plan"]

    run = cli("resume", "modelled", "--model", "openai:tiny", *NOWHERE, cwd=tmp_path)  # default policy: accept
    assert "drift:" in run.stderr and "model: model: extractive" in run.stderr and "accepted 1 drift" in run.stderr
    again = cli("status", "modelled", "--drift", "--json", "--model", "openai:tiny", *NOWHERE, cwd=tmp_path)
    assert [i for i in drift_items(again) if i["component"] == "model"] == []  # accepted: not reported again

    # recompute: the step that called the model runs again, and calls the new model -- the response
    # recorded from the earlier one is not replayed (nothing listens there, so the call fails)
    ev = tmp_path / "ev.jsonl"
    failed = cli("resume", "modelled", "--model", "openai:other", *NOWHERE, "--on-drift", "model=recompute",
                 "--events", str(ev), cwd=tmp_path, check=1)
    assert events(ev, "step_start") == ["ask"]
    assert "cannot connect to http://127.0.0.1:9/v1" in failed.stderr


def test_a_checkpoint_without_the_model_component_is_not_recorded_not_drift(tmp_path):
    """World format 1 (before `model` was recorded) loads, and compares as `not recorded`: a
    warning, never drift -- even under --on-drift all=abort."""
    from overnight.store import open_store
    from overnight.chain.write import ChainWriter
    from overnight.chain.read import load_head
    from overnight.chain.integrity import encode_state
    from overnight.chain.records import event

    (tmp_path / "m.py").write_text(MODEL_TASK)
    cli("run", "m.py", "-q", cwd=tmp_path)
    with open_store(f"sqlite://{tmp_path}/.overnight/overnight.db") as s:
        head, _ = load_head(s, "modelled", "main", key=None)
        assert head.world["format"] == 2 and head.world["model"]["spec"] == "extractive"
        old = {k: v for k, v in head.world.items() if k != "model"} | {"format": 1}
        state = head.state_tree
        state = {**state, "done": [{**d, "reads": {k: v for k, v in d["reads"].items() if k != "model"}}
                                   for d in state["done"]]}
        chain = ChainWriter(s, "modelled", "main", key=None, session_id="old", session_n=head.record.session.n)
        chain.start_from(head, None)
        writer = chain.blob_writer()
        raw = encode_state(old)
        chain.commit(state, event("drift", detail="as an older overnight wrote it"), writer=writer,
                     fingerprint={"world": {"digest": writer.put(raw), "size": len(raw)}, "exports": {}, "accepted": []})
    rep = json.loads(cli("status", "modelled", "--drift", "--json", cwd=tmp_path).stdout)
    [item] = [i for i in rep["drift"]["items"] if i["component"] == "model"]
    assert item["old"] == "not recorded" and item["warning"] and rep["drift"]["drifted"] is False
    cli("resume", "modelled", "-q", "--on-drift", "all=abort", cwd=tmp_path)  # exit 0: nothing to abort for


def test_demo_report_lists_every_name_pydoc_lists_with_working_anchors_and_code_spans(tmp_path):
    """The main job's report against pydoc, module by module: every public name pydoc lists
    (classes, their methods and attributes -- inherited ones included, EmailMessage's from
    MIMEPart and Message --, functions, data; a package's submodules) appears in that module's
    section; the contents link to the anchors GitHub gives the headings; stdlib-style `quote'
    docstrings stay text, not broken code spans."""
    import html
    import importlib
    import inspect
    import pydoc
    import re

    from markdown_it import MarkdownIt

    out = cli("demo", "-q", cwd=tmp_path).stdout  # -q: only the result, the report's path
    assert out.strip().startswith(f"report: {tmp_path / 'report.md'}")
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    sections = {m.group(1): part for part in re.split(r"(?m)^(?=## `)", report)
                if (m := re.match(r"## `([\w.]+)`", part))}
    assert len(sections) == 25
    missing = []
    for name, text in sections.items():
        mod = importlib.import_module(name)
        public = getattr(mod, "__all__", None)
        for key, value in inspect.getmembers(mod):
            if key.startswith("_") or not pydoc.visiblename(key, public, mod) or inspect.ismodule(value):
                continue
            if (inspect.isclass(value) or inspect.isroutine(value)) and public is None \
                    and inspect.getmodule(value) is not mod:
                continue  # pydoc lists a class or function under the module that defines it
            names = [key] + ([a for a in dir(value) if not a.startswith("_")] if inspect.isclass(value) else [])
            missing += [f"{name}.{key}:{n}" for n in names if not re.search(rf"\b{re.escape(n)}\b", text)]
        if hasattr(mod, "__path__"):  # a package: its submodules, as pydoc's PACKAGE CONTENTS
            missing += [f"{name}: {sub}" for sub in ("email.mime.text",) if name == "email.mime" and sub not in text]
    assert missing == []
    block = sections["email.message"].split("### class `EmailMessage(MIMEPart)`", 1)[1].split("\n### ", 1)[0]
    assert "Inherited from `email.message.MIMEPart`" in block and "`walk`" in block and "get_body(" in block

    assert "- [`email.message`](#emailmessage)" in report  # GitHub drops the dots: ## `email.message`
    assert "- [`email.mime.text`](#emailmimetext)" in report
    rendered = html.unescape(MarkdownIt().render(report))
    assert "the `mapping' interface" in rendered  # a stdlib `quote' is text, and so is what follows it
    spans = re.findall(r"(?<!<pre>)<code>(.*?)</code>", rendered, re.S)  # inline code, not code blocks
    assert spans and all("\n" not in c for c in spans)  # no code span runs on across lines


@pytest.mark.slow
def test_results_on_stdout_progress_on_stderr_and_help_that_says_what_happens(tmp_path):
    run = cli("demo", "--package", "json", "-q", cwd=tmp_path)
    assert run.stdout == f"report: {tmp_path / 'report.md'} ({run.stdout.split('(', 1)[1]}"  # the result only
    assert run.stdout.count("\n") == 1 and run.stderr == ""  # -q: nothing but the result
    loud = cli("demo", "--package", "json", cwd=tmp_path)
    assert loud.stdout.startswith("report: ") and "store:" in loud.stderr and "store:" not in loud.stdout
    missing = cli("resume", "nosuch", cwd=tmp_path, check=2)
    assert missing.stderr.startswith("error: no task 'nosuch'") and missing.stdout == ""  # no blank line first
    assert cli("run", "nothere.py", cwd=tmp_path, check=2).stderr.startswith("error: task file nothere.py")

    assert cli("resume", "--help", cwd=tmp_path).stdout.startswith("Usage: python -m overnight resume [OPTIONS] TASK_ID\n")
    assert "overnight cat [OPTIONS] TASK_ID ARTIFACT" in cli("cat", "--help", cwd=tmp_path).stdout
    for command in ("verify", "gc", "rm"):
        text = " ".join(cli(command, "--help", cwd=tmp_path).stdout.split())
        assert "-q, --quiet No progress bar (results, errors and warnings still print)." in text
        assert "resume command" not in text
    run_help = " ".join(cli("run", "--help", cwd=tmp_path).stdout.split())
    assert "unless it is ephemeral" in run_help and "the exit is 1" in run_help
    status_help = " ".join(cli("status", "--help", cwd=tmp_path).stdout.split())
    assert "for this run" not in status_help and "Predict with these drift policies" in status_help


SMALL = '''
import os, overnight
task = overnight.Task("small", goal="readable output", deps=[], env=["MY_VAR"], expected_span=os.environ.get("SPAN"))

@task.step
def start(ctx):
    ctx.add_step("use", fn="a step argument named fn")

@task.step(planned=False)
def use(ctx, fn):
    ctx.state["v"] = ("x", int(os.environ.get("V", "0")))
    if os.environ.get("BAD_TEXT"):
        ctx.write_text("n.txt", 42)
    return fn
'''


def test_readable_output(tmp_path):
    (tmp_path / "small.py").write_text(SMALL)
    cli("run", "small.py", "--max-steps", "1", "-q", cwd=tmp_path, check=75)
    cli("fork", "small", "--at", "main", "--branch", "b", cwd=tmp_path)
    done = cli("resume", "small", "-q", cwd=tmp_path, env={"V": "1"})  # add_step(..., fn=...) is a step argument
    assert done.returncode == 0
    cli("resume", "small", "--branch", "b", "-q", cwd=tmp_path, env={"V": "2"})
    conflict = cli("merge", "small", "--from", "b", cwd=tmp_path, check=4)
    assert "data 'v': ours ('x', 1) / theirs ('x', 2)" in conflict.stderr  # Python reprs, not {"$t": ...}

    show = cli("show", "small", cwd=tmp_path, env={"COLUMNS": "80"}).stdout
    assert max(len(line) for line in show.splitlines()) <= 80, show
    ids = [line.split()[2] for line in show.splitlines() if line.strip()[:1].isdigit()]
    assert ids and all(len(i) == 8 for i in ids)  # short ids

    typo = cli("show", "smal", cwd=tmp_path, check=2)
    assert "did you mean small?" in typo.stderr

    pins = cli("env", "export", "small", cwd=tmp_path).stdout
    assert not any(line.startswith(("overnight==", "pip==", "setuptools==")) for line in pins.splitlines())

    # a drift no step read (the declared MY_VAR) is reported once, not on every later run
    first = cli("resume", "small", cwd=tmp_path, env={"MY_VAR": "changed"})
    assert "drift:" in first.stderr and "MY_VAR" in first.stderr
    again = cli("resume", "small", cwd=tmp_path, env={"MY_VAR": "changed"})
    assert "drift:" not in again.stderr

    (tmp_path / "small.py").write_text(SMALL.replace('"small"', '"small2"'))
    bad = cli("run", "small.py", "-q", cwd=tmp_path, env={"BAD_TEXT": "1"}, check=1)
    assert "write_text('n.txt') takes str, got int (42)" in bad.stderr


def test_deps_drift_row_puts_old_and_new_in_their_columns():
    from overnight.verify.drift import detect

    world = {"code": {"task": "1", "steps": {}}, "env": {"python": "3", "implementation": "C", "platform": "p",
                                                          "vars": {}}, "inputs": {}, "model": None}
    old = {**world, "deps": {"packages": {"alpha": "1.0", "beta": "2.0"}, "locks": {}}}
    new = {**world, "deps": {"packages": {"alpha": "1.1", "beta": "2.0"}, "locks": {}}}
    rep = detect(checkpoint_id=None, recorded=old, now=new, done=[], step_versions={}, exports={}, salt=b"",
                 sources={})
    [item] = rep.items
    assert (item.component, item.old, item.new) == ("deps", "alpha 1.0", "alpha 1.1")
    grown = {**world, "deps": {"packages": {"alpha": "1.1", "gamma": "3.0", "delta": "4.0", "epsilon": "5.0"},
                               "locks": {}}}  # beta removed, three added
    [item] = detect(checkpoint_id=None, recorded=old, now=grown, done=[], step_versions={}, exports={}, salt=b"",
                    sources={}).items
    assert "(3 added, 1 removed, 1 changed)" in item.key, item.key
    assert item.old.startswith("alpha 1.0, beta 2.0, delta not installed") and item.old.endswith("and 2 more")
    assert item.new.startswith("alpha 1.1, beta not installed, delta 4.0"), item.new


EPHEMERAL = '''
import overnight
task = overnight.Task("quick", goal="a short task", expected_span="20m", deps=[])

@task.step
def one(ctx):
    return 1

@task.step
def boom(ctx):
    raise RuntimeError("no luck")
'''


def test_ephemeral_warns_once_through_the_api_and_no_hint_offers_a_resume(tmp_path):
    (tmp_path / "quick.py").write_text(EPHEMERAL)
    script = ("import overnight, importlib.util\n"
              "spec = importlib.util.spec_from_file_location('quick', 'quick.py'); m = importlib.util.module_from_spec(spec)\n"
              "spec.loader.exec_module(m)\n"
              "del m.task.steps['boom']\n"
              "for _ in range(2):\n"
              "    print(overnight.run(m.task).level)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ephemeral", "ephemeral"]
    assert proc.stderr.count("task quick is ephemeral") == 1  # logged once per process, on overnight.runner
    failed = cli("run", "quick.py", cwd=tmp_path, check=1)
    assert "level ephemeral" in failed.stderr and "no luck" in failed.stderr
    assert "overnight resume" not in failed.stderr and "resume (" not in failed.stderr


def test_the_users_own_folders_give_typed_errors_never_a_traceback(tmp_path):
    ro = Path("/sys")  # read-only even for root (permission bits are not)
    in_ro = cli("demo", "--package", "json", cwd=ro, check=2)
    assert in_ro.stderr.startswith("error: cannot create or open the store at /sys/.overnight")
    (tmp_path / "afile").write_text("")
    under_file = cli("demo", "--package", "json", "--store", "sqlite://afile/x.db", cwd=tmp_path, check=2)
    assert f"{tmp_path / 'afile'} is a file, not a folder" in under_file.stderr
    under_ro = cli("demo", "--package", "json", "--store", "sqlite:///sys/nope/x.db", cwd=tmp_path, check=2)
    assert "cannot create or open the store at /sys/nope" in under_ro.stderr
    out_ro = cli("demo", "--package", "json", "--out", "/sys/report.md", cwd=tmp_path, check=2)
    assert "task 'api-report-json' is complete (7 step(s) committed)" in out_ro.stderr
    assert "overnight cat api-report-json report.md -o FILE" in out_ro.stderr
    for proc in (in_ro, under_file, under_ro, out_ro):
        assert "Traceback" not in proc.stderr
    cli("cat", "api-report-json", "report.md", "-o", "r.md", cwd=tmp_path)  # nothing was lost
    assert (tmp_path / "r.md").read_text().startswith("# API reference: `json`")


@pytest.mark.llm
@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib.util").util.find_spec("llama_cpp") is None,
                    reason="llama_cpp is not installed: run `bash scripts/ensure-llama-wheel.sh` (or pip install "
                    "'overnight[llm]') to run the real-model tests")
def test_local_model_sections_say_each_paragraph_once_and_keep_the_signatures(tmp_path):
    """SmolLM2-135M through the real CLI on a small package (`html`: 3 modules): its overview is
    sampled with a repeat penalty, stopped at a repeated line and capped per section; no paragraph
    of a section repeats, and every signature the extractive writer lists is still there."""
    import re

    cli("demo", "--model", "local", "--package", "html", "--section-tokens", "160", "-q", cwd=tmp_path, timeout=900)
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    sections = [s for s in re.split(r"(?m)^(?=## `html)", report) if s.startswith("## `html")]
    assert len(sections) == 3
    for section in sections:
        assert "*Overview by local:*" in section
        prose = section.split("*Overview by local:*", 1)[1].split("\n*", 1)[0]  # up to "*N classes, ..."
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", prose) if p.strip()]
        sentences = [x for p in paragraphs for x in re.split(r"(?<=[.!?]) ", p)]
        assert paragraphs and len(paragraphs) == len(set(paragraphs)), section
        assert len(sentences) == len(set(sentences)), section
    assert "#### `escape(s, quote=True)`" in report and "#### `HTMLParser.feed(self, data)`" in report


def test_a_small_models_repeats_are_cut_and_said_once():
    """What stops a looping small model, without the model: a reply is cut at its first line that
    repeats an earlier one (the local model's stop), and the demo keeps each sentence once."""
    from overnight.demo.api_report import unique_prose
    from overnight.models.local import _first_repeat

    loop = ["The `json.dumps` function is available in all Python versions."] * 19
    assert _first_repeat(["JSON encoder and decoder.", *loop]) == 2
    assert _first_repeat(["- a b c", "* A  B c"]) == 1 and _first_repeat(["ok", "ok"]) is None  # short: kept
    assert unique_prose("It encodes. It decodes. It encodes.\n\nIt decodes.\n\nIt is fast.") == \
        "It encodes. It decodes.\n\nIt is fast."


MAIN_TASK = '''
import enum
import sys

import overnight


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


task = overnight.Task("colours", goal="one task whichever way the file is started", deps=[])


@task.step
def pick(ctx):
    return Color.RED


@task.step
def paint(ctx):
    return [ctx.outputs["pick"].value, Color.BLUE]


@task.step
def frame(ctx):
    return [c.value if isinstance(c, Color) else c for c in ctx.outputs["paint"]]


if __name__ == "__main__":
    overnight.run(task, max_steps=int(sys.argv[1]) if len(sys.argv) > 1 else None)
'''


def test_python_file_and_overnight_run_file_are_the_same_task(tmp_path):
    """Issue 19 item 2: a task started by ``python FILE.py`` records ``FILE.py:task`` and its
    classes under the file's module name (``paint:Color``, never ``__main__:Color``), so ``overnight
    resume ID`` continues it -- and ``python FILE.py`` continues one ``overnight run FILE.py`` began."""
    from overnight import api
    from overnight.store import open_store
    from overnight.chain.read import load_head

    (tmp_path / "paint.py").write_text(MAIN_TASK)
    started = subprocess.run([sys.executable, "paint.py", "1"], cwd=tmp_path, env=_procs.env(), capture_output=True,
                             text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    url = f"sqlite://{tmp_path}/.overnight/overnight.db"
    assert api.show("colours", store=url).entry == "paint.py:task"
    cli("resume", "colours", "--max-steps", "1", cwd=tmp_path, check=75)  # loads Color from paint.py
    again = subprocess.run([sys.executable, "paint.py"], cwd=tmp_path, env=_procs.env(), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    with open_store(url) as s:
        head, _ = load_head(s, "colours", "main", key=None)
    assert [d.name for d in head.state.done] == ["pick", "paint", "frame"]
    assert [d.output for d in head.state.done if d.name == "frame"] == [["red", "blue"]]


def test_a_full_store_during_a_model_call_is_the_typed_error_only(tmp_path):
    """The store fills up while a step's model call is being journaled: the run ends with
    StoreFull itself (the step is not retried or wrapped, no traceback of the step), nothing
    committed is lost."""
    import overnight
    from overnight.errors import StoreFull
    from overnight.store.sqlite import SQLiteStore

    task = overnight.Task("full-call", goal="a model call on a full disk", deps=[])
    held: dict = {}

    @task.step
    def first(ctx):
        return "kept"

    @task.step(retries=2)
    def ask(ctx):
        db = held["store"]._db
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own SQLITE_FULL, as on a full disk
        return ctx.model.complete([{"role": "user", "content": "Write at length."}], max_tokens=64).text

    class Verbose:
        """A model whose reply (24 KB) needs new pages in the call journal."""

        name = "verbose"

        def complete(self, messages, *, max_tokens=512, temperature=0.0):
            import os

            from overnight.models.base import Completion

            return Completion(os.urandom(12_000).hex(), 5, 64, "verbose", 1.0, "stop")

    with SQLiteStore(tmp_path / "s.db") as store:
        held["store"] = store
        overnight.run(task, store, max_steps=1)
        with pytest.raises(StoreFull) as err:
            overnight.run(task, store, model=Verbose())
        assert err.value.__cause__ is None and err.value.__suppress_context__
        assert err.value.task_id == "full-call" and "rolled back" in err.value.message
        from overnight.chain.read import load_head

        head, fallback = load_head(store, "full-call", "main", key=None)
        assert fallback is None and [d.name for d in head.state.done] == ["first"]
