"""Handed cases (``/work/shared/cases/README.md``) that concern the codec and the SQLite store.

Each test is named after its case id. Runs and resumes happen in *separate processes* (small
scripts written to ``tmp_path``): a value that only survives because it is still in memory, or a
class that is only found because the test process imported it, would otherwise pass unnoticed.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import overnight
from overnight import api
from overnight.codec import from_tree, to_tree
from overnight.errors import FormatTooNew, UnknownTypeError
from overnight.store import open_store
from overnight.store.base import CheckpointRow, Commit
from overnight.store.blobs import BlobWriter
from overnight.chain.read import load_head
from overnight.chain.write import utc_now
from overnight.chain.integrity import encode_record, encode_state, load_checkpoint
from overnight.chain.records import FORMAT_VERSION

# --- helpers -----------------------------------------------------------------------------------

RUN_SCRIPT = """
import json, sys
import overnight
from overnight.api import load_task

task = load_task(sys.argv[1])
max_steps = int(sys.argv[3]) if len(sys.argv) > 3 else None
r = overnight.run(task, sys.argv[2], max_steps=max_steps)
print(json.dumps({"status": r.status, "session": r.session, "steps_run": r.steps_run,
                  "created": r.created, "fallback": r.fallback is not None}))
"""

RESUME_SCRIPT = """
import json, sys
from overnight import api

r = api.resume(sys.argv[1], store=sys.argv[2])
print(json.dumps({"status": r.status, "session": r.session, "steps_run": r.steps_run,
                  "created": r.created, "fallback": r.fallback is not None}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OVERNIGHT_SIGNING_KEY", None)
    env.pop("OVERNIGHT_STORE", None)
    env["PYTHONIOENCODING"] = "ascii:backslashreplace"
    return env


def run_py(tmp_path: Path, code: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` as a script in a fresh interpreter (cwd ``tmp_path``)."""
    n = len(list(tmp_path.glob("_script_*.py")))
    script = tmp_path / f"_script_{n}.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(), timeout=120)
    if ok:
        assert proc.returncode == 0, f"script failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def last_json(proc: subprocess.CompletedProcess) -> Any:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_run(tmp_path: Path, task_file: Path, url: str, max_steps: int | None = None) -> dict:
    args = [str(task_file), url] + ([str(max_steps)] if max_steps is not None else [])
    return last_json(run_py(tmp_path, RUN_SCRIPT, *args))


def resume(tmp_path: Path, task_id: str, url: str) -> dict:
    return last_json(run_py(tmp_path, RESUME_SCRIPT, task_id, url))


def write_module(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def head(url: str, task_id: str):
    store = open_store(url)
    try:
        loaded, fallback = load_head(store, task_id)
    finally:
        store.close()
    assert fallback is None, fallback.describe()
    return loaded


def outputs_tree(loaded) -> dict[str, Any]:
    return {d["name"]: d["output"] for d in loaded.state_tree["done"]}


@pytest.fixture(autouse=True)
def _no_signing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OVERNIGHT_SIGNING_KEY", raising=False)


# --- H01: NUL inside strings ---------------------------------------------------------------------

H01_TASK = r'''
import overnight

TEXT = "before\u0000after"
task = overnight.Task("h01", goal="H01: NUL in state, outputs and artifacts", expected_span="1h")


@task.step
def produce(ctx):
    ctx.state["text"] = TEXT
    ctx.state["nested"] = {TEXT: [TEXT, (TEXT,)]}
    ctx.write_text("notes.txt", TEXT)
    ctx.write_artifact("raw.bin", TEXT.encode("utf-8") + b"\x00tail")
    return {"out": TEXT}


@task.step
def consume(ctx):
    # runs in a new process: it sees only what came back from the store
    return {
        "state": ctx.state["text"],
        "nested": ctx.state["nested"],
        "output": ctx.outputs["produce"],
        "artifact": ctx.read_text("notes.txt"),
        "raw": ctx.read_artifact("raw.bin"),
        "session": ctx.session,
    }
'''


def test_H01_nul_roundtrips_through_run_and_resume_in_new_process(tmp_path: Path) -> None:
    text = "before\x00after"
    url = f"sqlite://{tmp_path / 'store.db'}"
    task_file = write_module(tmp_path, "h01_task", H01_TASK)

    r1 = first_run(tmp_path, task_file, url, max_steps=1)
    assert r1["status"] == "stopped" and r1["created"]
    r2 = resume(tmp_path, "h01", url)
    assert r2 == {"status": "complete", "session": 2, "steps_run": 1, "created": False, "fallback": False}

    loaded = head(url, "h01")
    data = from_tree(loaded.state_tree["data"], "state.data")
    assert data["text"] == text and len(data["text"]) == len(text)
    assert data["nested"] == {text: [text, (text,)]}
    assert type(data["nested"][text][1]) is tuple

    outs = {k: from_tree(v) for k, v in outputs_tree(loaded).items()}
    assert outs["produce"] == {"out": text}
    seen = outs["consume"]  # what the resumed process read back
    assert seen == {
        "state": text,
        "nested": {text: [text, (text,)]},
        "output": {"out": text},
        "artifact": text,
        "raw": text.encode() + b"\x00tail",
        "session": 2,
    }
    assert api.cat("h01", "notes.txt", store=url) == text.encode("utf-8")
    assert api.cat("h01", "raw.bin", store=url) == b"before\x00after\x00tail"


# --- H02: lone surrogates, U+2028/U+2029 ---------------------------------------------------------

H02_TASK = r'''
import overnight

LONE = "\ud800"
LOW = "\udfff lone low"
SEPS = "a\u2028b\u2029c"
NAME_LONE = "report-\ud800.md"
NAME_SEPS = "notes\u2028\u2029.txt"
task = overnight.Task("h02", goal="H02: lone surrogates and line separators", expected_span="1h")


@task.step
def produce(ctx):
    ctx.state["lone"] = LONE
    ctx.state["low"] = LOW
    ctx.state["seps"] = SEPS
    ctx.state[LONE] = SEPS  # as a key too
    ctx.write_text(NAME_LONE, LONE + SEPS)
    ctx.write_text(NAME_SEPS, LOW)
    return [LONE, SEPS, {LOW: LONE}]


@task.step
def consume(ctx):
    return {
        "state": [ctx.state["lone"], ctx.state["low"], ctx.state["seps"], ctx.state[LONE]],
        "output": ctx.outputs["produce"],
        "names": ctx.artifact_names(),
        "a1": ctx.read_text(NAME_LONE),
        "a2": ctx.read_text(NAME_SEPS),
    }
'''


def test_H02_lone_surrogate_and_line_separators_roundtrip(tmp_path: Path) -> None:
    lone, low, seps = "\ud800", "\udfff lone low", "a\u2028b\u2029c"
    name_lone, name_seps = "report-\ud800.md", "notes\u2028\u2029.txt"
    url = f"sqlite://{tmp_path / 'store.db'}"
    task_file = write_module(tmp_path, "h02_task", H02_TASK)

    # the plain JSON string path, never a tagged (weaker, different) encoding
    for s in (lone, low, seps, name_lone, name_seps):
        assert to_tree(s) == s and type(to_tree(s)) is str
    assert to_tree({lone: seps}) == {lone: seps}

    first_run(tmp_path, task_file, url, max_steps=1)
    r2 = resume(tmp_path, "h02", url)
    assert r2["status"] == "complete" and not r2["fallback"]

    loaded = head(url, "h02")
    tree = loaded.state_tree
    # stored as plain JSON strings in the state document too
    assert tree["data"]["lone"] == lone and tree["data"]["seps"] == seps and tree["data"][lone] == seps
    assert set(tree["artifacts"]) == {name_lone, name_seps}

    data = from_tree(tree["data"], "state.data")
    assert [data["lone"], data["low"], data["seps"], data[lone]] == [lone, low, seps, seps]
    outs = {k: from_tree(v) for k, v in outputs_tree(loaded).items()}
    assert outs["produce"] == [lone, seps, {low: lone}]
    assert outs["consume"] == {
        "state": [lone, low, seps, seps],
        "output": [lone, seps, {low: lone}],
        "names": sorted([name_lone, name_seps]),
        "a1": lone + seps,
        "a2": low,
    }
    assert api.cat("h02", name_lone, store=url) == (lone + seps).encode("utf-8", "surrogatepass")
    assert api.cat("h02", name_seps, store=url) == low.encode("utf-8", "surrogatepass")


# --- H03: collections types ---------------------------------------------------------------------

H03_TASK = r'''
import collections
import overnight

task = overnight.Task("h03", goal="H03: collections types in user state", expected_span="1h")


@task.step
def produce(ctx):
    ctx.state["dd"] = collections.defaultdict(list, {"a": [1]})
    ctx.state["counter"] = collections.Counter("abca")
    ctx.state["dq"] = collections.deque([1, 2], maxlen=3)
    ctx.state["od"] = collections.OrderedDict([("z", 1), ("a", 2)])
    return collections.deque([collections.Counter("xx")], maxlen=5)


def describe(state):
    dd, c, dq, od = state["dd"], state["counter"], state["dq"], state["od"]
    return {
        "dd": [type(dd).__name__, getattr(dd.default_factory, "__name__", None), dict(dd)],
        "counter": [type(c).__name__, dict(c)],
        "dq": [type(dq).__name__, dq.maxlen, list(dq)],
        "od": [type(od).__name__, list(od.items())],
    }


@task.step
def consume(ctx):
    before = describe(ctx.state)
    # use them as the types they are: these only work if the parameters came back
    ctx.state["dd"]["b"].append(2)
    ctx.state["dq"].extend([3, 4])
    ctx.state["counter"].update("a")
    ctx.state["od"].move_to_end("z")
    return {"before": before, "output": [type(ctx.outputs["produce"]).__name__, ctx.outputs["produce"].maxlen]}
'''


def test_H03_collections_types_come_back_with_their_parameters(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}"
    task_file = write_module(tmp_path, "h03_task", H03_TASK)
    first_run(tmp_path, task_file, url, max_steps=1)
    r2 = resume(tmp_path, "h03", url)
    assert r2["status"] == "complete" and r2["session"] == 2

    loaded = head(url, "h03")
    outs = {k: from_tree(v) for k, v in outputs_tree(loaded).items()}
    # what the resumed process found before touching anything
    assert outs["consume"]["before"] == {
        "dd": ["defaultdict", "list", {"a": [1]}],
        "counter": ["Counter", {"a": 2, "b": 1, "c": 1}],
        "dq": ["deque", 3, [1, 2]],
        "od": ["OrderedDict", [("z", 1), ("a", 2)]],
    }
    assert outs["consume"]["output"] == ["deque", 5]
    assert type(outs["produce"]) is collections.deque and outs["produce"].maxlen == 5
    assert type(outs["produce"][0]) is collections.Counter

    # and what it committed, loaded again here
    data = from_tree(loaded.state_tree["data"], "state.data")
    dd, c, dq, od = data["dd"], data["counter"], data["dq"], data["od"]
    assert type(dd) is collections.defaultdict and dd.default_factory is list
    assert dict(dd) == {"a": [1], "b": [2]}
    assert type(c) is collections.Counter and c == collections.Counter({"a": 3, "b": 1, "c": 1})
    assert type(dq) is collections.deque and dq.maxlen == 3 and list(dq) == [2, 3, 4]
    assert type(od) is collections.OrderedDict and list(od.items()) == [("a", 2), ("z", 1)]


# --- H04: pydantic model with a nested Enum -----------------------------------------------------

H04_MODELS = r'''
import enum
import pydantic


class Report(pydantic.BaseModel):
    class Status(enum.Enum):
        DRAFT = "draft"
        FINAL = "final"

    title: str
    status: Status
'''

H04_TASK = r'''
import overnight
from h04_models import Report

task = overnight.Task("h04", goal="H04: pydantic model with a nested Enum", expected_span="1h")


@task.step
def draft(ctx):
    ctx.state["report"] = Report(title="night\u0000shift", status=Report.Status.DRAFT)
    ctx.state["status"] = Report.Status.DRAFT
    return Report.Status.FINAL


@task.step
def finish(ctx):
    report, out = ctx.state["report"], ctx.outputs["draft"]
    checks = {
        "report_is_model": type(report) is Report,
        "title": report.title,
        "status_member": report.status is Report.Status.DRAFT,
        "bare_member": ctx.state["status"] is Report.Status.DRAFT,
        "output_member": out is Report.Status.FINAL,
    }
    ctx.state["report"] = report.model_copy(update={"status": out})
    return checks
'''

# the same task, but its code does not import the module that defines Report
H04_TASK_NO_MODELS = r'''
import overnight

task = overnight.Task("h04", goal="H04: pydantic model with a nested Enum", expected_span="1h")


@task.step
def draft(ctx):
    raise AssertionError("draft is already done and must not run again")


@task.step
def finish(ctx):
    return repr(ctx.state.get("report"))
'''

H04_DECODE_WITHOUT_MODELS = r'''
import json, sys
from overnight.codec import from_tree
from overnight.errors import UnknownTypeError
from overnight.store import open_store
from overnight.chain.read import load_head

store = open_store(sys.argv[1])
loaded, _ = load_head(store, "h04")
outputs = {d["name"]: d["output"] for d in loaded.state_tree["done"]}
results = {}
for label, tree in [("report", loaded.state_tree["data"]["report"]),
                    ("status", loaded.state_tree["data"]["status"]),
                    ("output", outputs["draft"])]:
    try:
        value = from_tree(tree, "state.data." + label)
        results[label] = {"loaded": repr(value)}
    except UnknownTypeError as exc:
        results[label] = {"error": "UnknownTypeError", "type_name": exc.type_name, "message": str(exc)}
    except Exception as exc:
        results[label] = {"error": type(exc).__name__, "message": str(exc)}
results["imported"] = "h04_models" in sys.modules
print(json.dumps(results))
'''


def test_H04_nested_enum_in_pydantic_model_resumes_or_fails_loudly(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}"
    write_module(tmp_path, "h04_models", H04_MODELS)
    task_file = write_module(tmp_path, "h04_task", H04_TASK)
    no_models_dir = tmp_path / "elsewhere"
    no_models_dir.mkdir()
    no_models_file = write_module(no_models_dir, "h04_task_plain", H04_TASK_NO_MODELS)

    r1 = first_run(tmp_path, task_file, url, max_steps=1)
    assert r1["status"] == "stopped"
    head_before = head(url, "h04").id

    # 1) a process where the class cannot be found: the load fails loudly, naming the type (the
    # task code lives in another file there, so that run says the code moved)
    moved = RUN_SCRIPT.replace("max_steps=max_steps)", "max_steps=max_steps, code_moved=True)")
    assert moved != RUN_SCRIPT
    proc = run_py(no_models_dir, moved, str(no_models_file), url, ok=False)
    assert proc.returncode != 0
    assert "UnknownTypeError" in proc.stderr
    assert "h04_models:Report" in proc.stderr
    assert head(url, "h04").id == head_before  # nothing was committed, the draft was not redone

    res = last_json(run_py(no_models_dir, H04_DECODE_WITHOUT_MODELS, url))
    assert res["imported"] is False
    assert res["report"]["error"] == "UnknownTypeError"
    assert res["report"]["type_name"] == "h04_models:Report"
    for label in ("status", "output"):
        assert res[label]["error"] == "UnknownTypeError", res[label]
        assert res[label]["type_name"] == "h04_models:Report.Status"
        assert "h04_models:Report.Status" in res[label]["message"]

    # same check in this (pytest) process, which never imported the model module
    assert "h04_models" not in sys.modules
    with pytest.raises(UnknownTypeError) as info:
        from_tree(head(url, "h04").state_tree["data"], "state.data")
    assert "h04_models:Report" in str(info.value)

    # 2) a new process whose task code imports the model: the enum members come back
    r2 = resume(tmp_path, "h04", url)
    assert r2["status"] == "complete" and r2["session"] >= 2 and not r2["fallback"]
    loaded = head(url, "h04")
    finish_tree = outputs_tree(loaded)["finish"]
    assert from_tree(finish_tree) == {
        "report_is_model": True,
        "title": "night\x00shift",
        "status_member": True,
        "bare_member": True,
        "output_member": True,
    }
    # the committed model carries the member taken from the previous step's output
    res = last_json(run_py(no_models_dir, H04_DECODE_WITHOUT_MODELS, url))
    assert res["report"]["type_name"] == "h04_models:Report"
    check_loaded = run_py(tmp_path, r'''
        import json, sys
        sys.path.insert(0, sys.argv[2])
        import h04_models
        from overnight.codec import from_tree
        from overnight.store import open_store
        from overnight.chain.read import load_head
        loaded, _ = load_head(open_store(sys.argv[1]), "h04")
        data = from_tree(loaded.state_tree["data"], "state.data")
        r = data["report"]
        print(json.dumps([type(r) is h04_models.Report, r.status is h04_models.Report.Status.FINAL,
                          data["status"] is h04_models.Report.Status.DRAFT]))
    ''', url, str(tmp_path))
    assert last_json(check_loaded) == [True, True, True]


# --- H10: newer format ---------------------------------------------------------------------------


def _make_task(task_id: str) -> overnight.Task:
    task = overnight.Task(task_id, goal="H10: newer format", expected_span="1h")

    @task.step
    def one(ctx):
        ctx.state["n"] = 1
        return 1

    @task.step
    def two(ctx):
        ctx.state["n"] = 2
        return 2

    return task


def _append_raw(url: str, task_id: str, *, record_format: int = FORMAT_VERSION, state_format: int | None = None) -> tuple[str, str]:
    """Append a checkpoint built by hand (valid digest) on top of the head. Returns (old head, new id)."""
    store = open_store(url)
    try:
        loaded, _ = load_head(store, task_id)
        parent = loaded.id
        record = json.loads(loaded.row.body)
        writer = BlobWriter(store)
        if state_format is not None:
            state = dict(loaded.state_tree, format=state_format)
            state_bytes = encode_state(state)
            record["state"] = {"digest": writer.put(state_bytes), "size": len(state_bytes)}
        # everything else (event, session, fingerprint, ...) is copied from the head as this version writes it
        record.update(format=record_format, parent_id=parent, seq=loaded.record.seq + 1, created_at=utc_now())
        body = encode_record(record)
        cid = overnight.codec.sha256(body)
        row = CheckpointRow(checkpoint_id=cid, task_id=task_id, parent_id=parent, branch="main",
                            seq=record["seq"], created_at=record["created_at"], session=record["session"]["id"],
                            event=loaded.row.event, step=loaded.row.step, body=body, signature=None, stored_bytes=0)
        store.commit(Commit(row, parent, list(writer.objects.values())))
        assert store.get_ref(task_id, "main") == cid
        return parent, cid
    finally:
        store.close()


NEWER = FORMAT_VERSION + 1
"""A record format from the future."""


@pytest.mark.parametrize("where", ["record", "state"])
def test_H10_newer_format_checkpoint_is_refused_on_load(tmp_path: Path, where: str) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}"
    overnight.run(_make_task("h10"), url, max_steps=1, handle_signals=False)
    kw = {"record_format": NEWER} if where == "record" else {"state_format": NEWER}
    _, new_id = _append_raw(url, "h10", **kw)

    store = open_store(url)
    try:
        with pytest.raises(FormatTooNew) as info:
            load_checkpoint(store, new_id)
    finally:
        store.close()
    assert f"newer overnight (format {NEWER})" in str(info.value)
    assert info.value.checkpoint_id == new_id


@pytest.mark.parametrize("where", ["record", "state"])
def test_H10_resume_refuses_a_head_written_by_a_newer_format(tmp_path: Path, where: str) -> None:
    """Resuming must stop with FormatTooNew -- not fall back past the newer head and overwrite it."""
    url = f"sqlite://{tmp_path / 'store.db'}"
    task = _make_task("h10")
    overnight.run(task, url, max_steps=1, handle_signals=False)
    kw = {"record_format": NEWER} if where == "record" else {"state_format": NEWER}
    _, new_id = _append_raw(url, "h10", **kw)

    with pytest.raises(FormatTooNew) as info:
        overnight.run(task, url, handle_signals=False)
    assert f"newer overnight (format {NEWER})" in str(info.value)

    store = open_store(url)
    try:
        assert store.get_ref("h10", "main") == new_id  # the newer head was neither misread nor replaced
        with pytest.raises(FormatTooNew):
            load_head(store, "h10")
    finally:
        store.close()
