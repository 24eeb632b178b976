"""The trust boundary, attacked: someone who can write the store (a shared PostgreSQL schema, an
S3 bucket, a copied SQLite file) but is not the user.

Each attack runs on every store it applies to (SQLite, file, PostgreSQL, S3) with real processes
for the commands under test (``python -m overnight ...``); the attacker uses the ``Store`` API,
which is exactly the write access the threat model grants. Nothing is mocked.

- code named by the store never runs (a canary file the attacker's module writes must not appear):
  ``resume``, ``status --drift``, ``run``; a file outside the project and a module outside it;
- a branch ref moved back is refused (``RollbackDetected``, exit 3) -- with a signing key also
  after the newer records were deleted (the high-water mark) -- and reported by ``status``,
  ``ls`` and ``verify`` without one; ``--allow-rollback`` and ``overnight rollback`` accept it;
- forged records with a missing, wrong or replayed ("old") HMAC, at the head, mid-chain and as a
  root, contribute nothing: the fallback lands on the newest checkpoint that verifies;
- a declared environment value cannot be guessed back from the store with a dictionary;
- codec tags naming a function, a module-level callable or an unrelated class fail the load
  and call nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

import overnight
from conftest import S3_BUCKET
from overnight.codec import decode
from overnight.errors import DecodeError, NoValidCheckpoint
from overnight.store import open_store
from overnight.chain.read import load_head
from overnight.bench.attacks import EVIL, JOB, SECRET_JOB
from overnight.testing.faults import forge_record

KEY = "victim-signing-key"
STORES = ["sqlite", "file", "postgres", "s3"]


@pytest.fixture(params=STORES)
def store_url(request, tmp_path):
    """A fresh, empty store of each backend (PostgreSQL: own schema, dropped after; S3: own prefix)."""
    kind = request.param
    if kind == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}"
    if kind == "file":
        return f"file://{tmp_path / 'store'}"
    if kind == "postgres":
        server, schema = request.getfixturevalue("pg_schema")
        return f"{server}?schema={schema}"
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{S3_BUCKET}/attack-{uuid.uuid4().hex}?endpoint_url={endpoint}"


def cli(*args: str, cwd: Path, key: str | None = None, check: int | None = 0, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    e.update(COLUMNS="250", PYTHONUNBUFFERED="1", **env)
    if key is not None:
        e["OVERNIGHT_SIGNING_KEY"] = key
    r = subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, env=e, capture_output=True, text=True,
                       timeout=120)
    if check is not None:
        assert r.returncode == check, f"overnight {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture
def project(tmp_path):
    """The victim's project folder (the cwd of every victim command) with ``job.py``."""
    p = tmp_path / "project"
    p.mkdir()
    (p / "job.py").write_text(JOB)
    return p


def runs(project: Path) -> list[str]:
    f = project / "runs.txt"
    return f.read_text().split() if f.exists() else []


# --- code comes from the project, never from the store ---------------------------------------------


def _plant(url: str, task_id: str, entry: str, tmp_path: Path) -> None:
    """The attacker, in their own process, creates ``task_id`` in the shared store with its code
    location set to ``entry`` (Task(entry=...) is recorded in the row and the spec as is)."""
    script = (
        "import sys, overnight\n"
        "t = overnight.Task(sys.argv[1], goal='g', entry=sys.argv[2], deps=[])\n"
        "@t.step\ndef a(ctx):\n    return 1\n"
        "@t.step\ndef b(ctx):\n    return 2\n"
        "overnight.run(t, sys.argv[3], max_steps=1)\n")
    r = subprocess.run([sys.executable, "-c", script, task_id, entry, url], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={k: v for k, v in os.environ.items() if k != "OVERNIGHT_SIGNING_KEY"})
    assert r.returncode == 0, r.stderr


@pytest.mark.slow  # real CLI processes, several per store
@pytest.mark.parametrize("signed", [False, True], ids=["nokey", "key"])
def test_code_location_from_the_store_never_runs(store_url, project, tmp_path, signed):
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    (attacker / "evil.py").write_text(EVIL.format(task_id="job"))
    canary = tmp_path / "CANARY"
    _plant(store_url, "job", f"{attacker / 'evil.py'}:task", tmp_path)
    _plant(store_url, "zen", "this:task", tmp_path)  # a module outside the project (stdlib `this` prints on import)
    key = KEY if signed else None
    env = {"CANARY": str(canary), "RUNS_FILE": str(project / "runs.txt")}
    for args in (["resume", "job"], ["status", "job", "--drift"], ["resume", "zen"], ["status", "zen", "--drift"]):
        r = cli(*args, "--store", store_url, cwd=project, key=key, check=3, **env)
        assert not canary.exists(), f"{args}: the attacker's module ran"
        assert "Beautiful is better than ugly" not in r.stdout + r.stderr, f"{args}: module `this` was imported"
        if signed:  # unsigned records: nothing verifies, so no location is even read
            assert "NoValidCheckpoint" in r.stderr or "passes verification" in r.stderr, r.stderr
        else:
            assert "outside the project" in r.stderr and "--file" in r.stderr, r.stderr
    # `overnight run job.py` (the victim's own code, same task id) refuses instead of importing the store's
    r = cli("run", "job.py", "--store", store_url, cwd=project, key=key, check=None, **env)
    assert r.returncode in (2, 3) and not canary.exists(), r.stderr
    # naming the code on the command line is the way to run it anyway (here: the victim's own file)
    if not signed:
        cli("resume", "job", "--store", store_url, "--file", "job.py", cwd=project, check=None, **env)
        assert not canary.exists()


def test_a_moved_project_resumes_from_its_relative_location(tmp_path):
    """Locations inside the project are recorded relative to it, so a moved project still resumes."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "overnight.toml").write_text('[store]\nurl = "sqlite://.overnight/overnight.db"\n')
    (old / "tasks").mkdir()
    (old / "tasks" / "job.py").write_text(JOB)
    env = {"RUNS_FILE": str(tmp_path / "runs.txt")}
    cli("run", "tasks/job.py", "--max-steps", "1", cwd=old, check=75, **env)
    with open_store(f"sqlite://{old / '.overnight' / 'overnight.db'}") as s:
        assert s.get_task("job").entry == "tasks/job.py:task"
    new = tmp_path / "new"
    old.rename(new)
    cli("resume", "job", cwd=new / "tasks", check=0, **env)  # from a subfolder: the root is overnight.toml's
    assert (tmp_path / "runs.txt").read_text().split() == ["a", "b", "c", "d"]


# --- no silent rollback ------------------------------------------------------------------------------


def _chain(url: str) -> list[str]:
    """Checkpoint ids of task ``job``'s main branch, oldest first."""
    with open_store(url) as s:
        rows = {r.checkpoint_id: r for r in s.list_checkpoints("job")}
        out, cid = [], s.get_ref("job", "main")
    while cid is not None:
        out.append(cid)
        cid = rows[cid].parent_id
    return out[::-1]


def _move_ref(url: str, to: str, *, delete_newer: bool = False) -> None:
    with open_store(url) as s:
        head = s.get_ref("job", "main")
        s.set_ref("job", "main", to, head)
        if delete_newer:
            newer = [r.checkpoint_id for r in s.list_checkpoints("job") if r.seq > s.get_checkpoint(to).seq]
            s.delete_checkpoints(newer, orphans=True)


@pytest.mark.slow  # real CLI processes, several per store
@pytest.mark.parametrize("signed", [False, True], ids=["nokey", "key"])
def test_ref_moved_back_is_refused_and_reported(store_url, project, signed):
    key = KEY if signed else None
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", store_url, cwd=project, key=key, **env)
    chain = _chain(store_url)  # init, a, b, c, d
    assert runs(project) == ["a", "b", "c", "d"] and len(chain) == 5
    _move_ref(store_url, chain[1])  # back to "a done": b, c and d would run again
    r = cli("resume", "job", "--store", store_url, cwd=project, key=key, check=3, **env)
    assert "rollback detected" in r.stderr and chain[1][7:19] in r.stderr and chain[-1][7:19] in r.stderr, r.stderr
    assert runs(project) == ["a", "b", "c", "d"]  # nothing ran again
    status = cli("status", "job", "--store", store_url, cwd=project, key=key, **env)
    assert "rolled back" in status.stdout and "rollback detected" in status.stdout, status.stdout
    listed = json.loads(cli("ls", "--json", "--store", store_url, cwd=project, key=key, **env).stdout)
    assert [t["status"] for t in listed if t["task_id"] == "job"] == ["rolled back"]
    v = cli("verify", "job", "--store", store_url, cwd=project, key=key, check=3, **env)
    assert "rollback" in v.stdout + v.stderr
    # deliberate: --allow-rollback continues from there (b and c run again) and records it
    cli("resume", "job", "--store", store_url, "--allow-rollback", cwd=project, key=key, **env)
    assert runs(project) == ["a", "b", "c", "d", "b", "c", "d"]
    cli("resume", "job", "--store", store_url, cwd=project, key=key, **env)  # accepted once, then normal
    cli("verify", "job", "--store", store_url, cwd=project, key=key, **env)
    assert runs(project) == ["a", "b", "c", "d", "b", "c", "d"]


@pytest.mark.slow  # real CLI processes, several per store
def test_signed_ref_moved_back_with_newer_records_deleted_is_caught_by_the_high_water_mark(store_url, project):
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", store_url, cwd=project, key=KEY, **env)
    chain = _chain(store_url)
    _move_ref(store_url, chain[1], delete_newer=True)  # the store alone no longer shows anything newer
    r = cli("resume", "job", "--store", store_url, cwd=project, key=KEY, check=3, **env)
    assert "high-water" in r.stderr and chain[-1][7:19] in r.stderr, r.stderr
    assert runs(project) == ["a", "b", "c", "d"]
    # another machine (its own, empty high-water file) cannot know: that is the documented limit
    other = cli("resume", "job", "--store", store_url, cwd=project, key=KEY, check=0,
                OVERNIGHT_STATE_DIR=str(project / "other-machine"), **env)
    assert other.returncode == 0 and runs(project) == ["a", "b", "c", "d", "b", "c", "d"]


@pytest.mark.slow  # real CLI processes, several per store
def test_deliberate_rollback_command_is_not_a_detected_rollback(store_url, project):
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", store_url, cwd=project, key=KEY, **env)
    chain = _chain(store_url)
    cli("rollback", "job", "--to", chain[1][7:19], "--store", store_url, cwd=project, key=KEY, **env)
    cli("resume", "job", "--store", store_url, cwd=project, key=KEY, **env)
    assert runs(project) == ["a", "b", "c", "d", "b", "c", "d"]
    cli("verify", "job", "--store", store_url, cwd=project, key=KEY, **env)


# --- fallback follows only what verified ---------------------------------------------------------------


def _victim(url: str, monkeypatch, calls: list[str]) -> overnight.Task:
    monkeypatch.setenv("OVERNIGHT_SIGNING_KEY", KEY)
    t = overnight.Task("job", goal="four steps", deps=[])
    for name in ("a", "b", "c", "d"):
        def fn(ctx, _n=name):
            calls.append(_n)
            return _n
        fn.__name__ = fn.__qualname__ = name
        t.step(fn)
    return t


def _forge(s, like, *, parent, seq, signature):
    return forge_record(s, like, parent=parent, seq=seq, signature=signature)


HMACS = {"missing": lambda real: None, "wrong": lambda real: "hmac-sha256:" + "0" * 64, "old": lambda real: real}


@pytest.mark.parametrize("hmac_kind", sorted(HMACS))
@pytest.mark.parametrize("where", ["head", "mid-chain", "root"])
def test_forged_records_contribute_nothing_to_the_fallback(store_url, monkeypatch, hmac_kind, where):
    calls: list[str] = []
    overnight.run(_victim(store_url, monkeypatch, calls), store_url)
    with open_store(store_url) as s:
        real = _chain(store_url)  # init, a, b, c, d
        rows = {c: s.get_checkpoint(c) for c in real}
        sig = HMACS[hmac_kind](rows[real[1]].signature)  # "old": a genuine signature, of another record
        if where == "head":  # names the init checkpoint as parent: following it would redo a..d
            forged = [_forge(s, rows[real[-1]], parent=real[0], seq=1, signature=sig)]
        elif where == "mid-chain":
            f1 = _forge(s, rows[real[2]], parent=real[0], seq=1, signature=sig)
            forged = [f1, _forge(s, rows[real[3]], parent=f1, seq=2, signature=sig)]
        else:
            forged = [_forge(s, rows[real[1]], parent=None, seq=0, signature=sig)]
        s.set_ref("job", "main", forged[-1], real[-1])
        loaded, fallback = load_head(s, "job", "main", key=KEY.encode())
        assert loaded.id == real[-1]  # the newest checkpoint that verifies
        assert fallback is not None and set(forged) <= {k.checkpoint_id for k in fallback.skipped}
        assert all(k.error == "SignatureError" for k in fallback.skipped)
    calls.clear()
    result = overnight.run(_victim(store_url, monkeypatch, calls), store_url)
    assert result.status == "complete" and calls == []  # nothing re-run
    # the forger's choice is never where it lands, even when every real record is gone
    with open_store(store_url) as s:
        s.set_ref("job", "main", forged[-1], s.get_ref("job", "main"))
        s.delete_checkpoints([r.checkpoint_id for r in s.list_checkpoints("job") if r.checkpoint_id not in forged],
                             orphans=True)
        with pytest.raises(NoValidCheckpoint):
            load_head(s, "job", "main", key=KEY.encode())


# --- secrets stay secret ---------------------------------------------------------------------------------

DICTIONARY = ["password", "123456", "letmein", "hunter2", "secret", "qwerty", "admin", "changeme"]


def test_declared_env_value_cannot_be_guessed_from_the_store(tmp_path):
    from overnight.verify import fingerprint

    project = tmp_path / "p"
    project.mkdir()
    (project / "secretive.py").write_text(SECRET_JOB)
    keyfile = tmp_path / "user" / "env.key"
    cli("run", "secretive.py", cwd=project, API_TOKEN="hunter2", OVERNIGHT_ENV_KEY_FILE=str(keyfile))
    assert keyfile.stat().st_mode & 0o777 == 0o600
    with open_store(f"sqlite://{project / '.overnight' / 'overnight.db'}") as s:
        loaded, _ = load_head(s, "secretive", "main")
        state = loaded.state_tree
    salt = bytes.fromhex(state["task"]["spec"]["salt"])
    recorded = state["done"][0]["reads"]["env"]["API_TOKEN"]
    assert recorded.startswith("env-hmac:") and "hunter2" not in json.dumps(state)
    # the attacker has the store (salt included) and a dictionary: the old scheme would match
    import hashlib
    import hmac

    legacy = {w: "hmac-sha256:" + hmac.new(salt, b"API_TOKEN\0" + w.encode(), hashlib.sha256).hexdigest()
              for w in DICTIONARY}
    assert recorded not in legacy.values()
    # ... and so does a guess of the key: the digest names a key id, not the key
    assert [w for w in DICTIONARY if fingerprint.keyed_like(recorded, salt, "API_TOKEN", w) == recorded] == []
    # the user's machine (its key file) does confirm it: the digest is of the value, keyed
    os.environ["OVERNIGHT_ENV_KEY_FILE"], saved = str(keyfile), os.environ["OVERNIGHT_ENV_KEY_FILE"]
    try:
        assert fingerprint.keyed_like(recorded, salt, "API_TOKEN", "hunter2") == recorded
        assert fingerprint.keyed_like(recorded, salt, "API_TOKEN", "hunter3") != recorded
    finally:
        os.environ["OVERNIGHT_ENV_KEY_FILE"] = saved
    # a machine without the key reports "cannot compare", never a false "changed"
    r = cli("status", "secretive", "--drift", cwd=project, API_TOKEN="hunter2",
            OVERNIGHT_ENV_KEY_FILE=str(tmp_path / "other" / "env.key"))
    assert "cannot compare" in r.stdout, r.stdout
    same = cli("status", "secretive", "--drift", cwd=project, API_TOKEN="hunter2", OVERNIGHT_ENV_KEY_FILE=str(keyfile))
    assert "no drift" in same.stdout, same.stdout


# --- codec tags that name a class --------------------------------------------------------------------------

SENTINEL = Path(tempfile.gettempdir()) / f"overnight-sentinel-{os.getpid()}"


def sentinel_fn(*args, **kwargs):  # a function a tag may name
    SENTINEL.write_text("called")
    return 0


class Sentinel:  # an unrelated class a tag may name
    def __init__(self, *args, **kwargs):
        SENTINEL.write_text("instantiated")

    def __new__(cls, *args, **kwargs):
        SENTINEL.write_text("instantiated")
        return super().__new__(cls)


class SentinelTuple(tuple):  # a tuple subclass that is not a namedtuple
    _fields = ("x",)

    def __new__(cls, *args):
        SENTINEL.write_text("instantiated")
        return super().__new__(cls, args)


TARGETS = [f"{__name__}:sentinel_fn", "subprocess:Popen", f"{__name__}:Sentinel", f"{__name__}:SentinelTuple"]
TAGS = {
    "enum": lambda ref: {"$t": "enum", "cls": ref, "v": 1},
    "model": lambda ref: {"$t": "model", "cls": ref, "fields": [["args", ["touch", str(SENTINEL)]]]},
    "dataclass": lambda ref: {"$t": "dataclass", "cls": ref, "fields": [["args", ["touch", str(SENTINEL)]]]},
    "namedtuple": lambda ref: {"$t": "namedtuple", "cls": ref, "items": [["touch", str(SENTINEL)]]},
    "defaultdict": lambda ref: {"$t": "defaultdict", "factory": f"type:{ref}", "items": []},
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("tag", sorted(TAGS))
def test_class_naming_tags_call_nothing_but_their_kind(tag, target):
    SENTINEL.unlink(missing_ok=True)
    data = json.dumps({"x": TAGS[tag](target)}).encode()
    with pytest.raises(DecodeError) as info:
        out = decode(data)
        out["x"]["missing key"]  # a defaultdict calls its factory here
    assert target in str(info.value) and "x" in str(info.value)
    assert not SENTINEL.exists()


def test_registered_defaultdict_factory_still_loads():
    import collections

    @overnight.register_type
    class Bucket(list):
        pass

    data = overnight.codec.encode({"x": collections.defaultdict(Bucket, {"a": 1})})
    back = decode(data)
    assert type(back["x"]["new"]) is Bucket
    with pytest.raises(overnight.errors.EncodeError):
        overnight.codec.encode({"x": collections.defaultdict(Sentinel)})  # not registered: refused on save


# --- a run committing beside a check holding no lease is not a rollback ---------------------------


def test_a_run_committing_while_verify_checks_is_not_reported_as_a_rollback(tmp_path):
    """``verify`` (and ``ls``, ``status``) read the branch ref, then look for newer records of the
    branch; a run that commits in between made its new record look like evidence that the ref had
    been moved back ("rolled back", exit 3, on a healthy running task). The ref is read again before
    a rollback is reported: moved on, it is not one; still there, it is."""
    from overnight.chain.rollback import find_rollback
    from overnight.store.sqlite import SQLiteStore
    from overnight.verify.fsck import verify_store

    from _tasks import plan_task

    path = tmp_path / "s.db"
    url = f"sqlite://{path}"
    task = plan_task("busy", 10, lambda ctx, i: i)
    overnight.run(task, url, max_steps=3, handle_signals=False)

    def one_more_step() -> None:
        overnight.run(task, url, max_steps=1, handle_signals=False)

    class CommitsDuringCheck(SQLiteStore):
        """A run commits one more step the first time a check asks for newer records."""

        pending: list = [one_more_step]

        def checkpoints_after(self, *args, **kwargs):
            while self.pending:
                self.pending.pop()()
            return super().checkpoints_after(*args, **kwargs)

    with CommitsDuringCheck(str(path)) as s:
        report = verify_store(s, ["busy"])
    assert report.ok and report.heads["busy"] == {"main": "ok"}, report.problems
    with SQLiteStore(str(path)) as s:
        loaded, _ = load_head(s, "busy")
        one_more_step()
        assert find_rollback(s, loaded, key=None) is not None  # the newer record alone looks like one
        assert find_rollback(s, loaded, key=None, named=loaded.id) is None  # the ref moved on
        s.set_ref("busy", "main", loaded.id, s.get_ref("busy", "main"))  # moved back, and it stays
        again, _ = load_head(s, "busy")
        assert find_rollback(s, again, key=None, named=again.id) is not None
        assert not verify_store(s, ["busy"]).ok


@pytest.mark.slow  # real CLI processes, several per store
@pytest.mark.parametrize("signed", [False, True], ids=["nokey", "key"])
def test_ref_moved_onto_another_branchs_older_record_is_a_rollback(store_url, project, signed):
    """A fork's record is a genuine (signed) record, but of another branch: ``main`` moved onto
    the fork made at "a done" would run b, c and d again. The chain check of the fork's branch
    cannot see it; the store's newer records of ``main`` itself do."""
    key = KEY if signed else None
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", store_url, cwd=project, key=key, **env)
    chain = _chain(store_url)  # init, a, b, c, d
    cli("fork", "job", "--at", chain[1][7:19], "--branch", "old", "--store", store_url, cwd=project, key=key, **env)
    with open_store(store_url) as s:
        fork_head = s.get_ref("job", "old")
    _move_ref(store_url, fork_head)
    r = cli("resume", "job", "--store", store_url, cwd=project, key=key, check=3, **env)
    assert "rollback detected" in r.stderr and "another branch" in r.stderr, r.stderr
    assert runs(project) == ["a", "b", "c", "d"]  # nothing ran again
    assert "rolled back" in cli("status", "job", "--store", store_url, cwd=project, key=key, **env).stdout
    cli("verify", "job", "--store", store_url, cwd=project, key=key, check=3, **env)
    cli("resume", "job", "--store", store_url, "--branch", "old", cwd=project, key=key, **env)  # the fork itself: fine


@pytest.mark.slow  # real CLI processes
def test_ref_moved_onto_another_tasks_record_is_never_loaded_as_this_task(tmp_path, project):
    """``job``'s ref moved onto the head of task ``other``: no view shows the other task's state as
    ``job``'s, and a resume falls back to ``job``'s own newest checkpoint instead of running
    ``job``'s steps on the other task's state."""
    url = f"sqlite://{tmp_path / 'store.db'}"
    env = {"RUNS_FILE": str(project / "runs.txt")}
    (project / "other.py").write_text(JOB.replace('"job"', '"other"'))
    cli("run", "job.py", "--store", url, "--max-steps", "2", cwd=project, check=75, **env)
    cli("run", "other.py", "--store", url, cwd=project, **env)
    with open_store(url) as s:
        own, theirs = s.get_ref("job", "main"), s.get_ref("other", "main")
        s.set_ref("job", "main", theirs, own)
    status = cli("status", "job", "--store", url, cwd=project, **env)
    assert f"fell back from {theirs[7:19]} to {own[7:19]}" in status.stdout, status.stdout
    shown = json.loads(cli("show", "job", "--store", url, "--json", cwd=project, **env).stdout)
    assert shown["done"] == 2 and shown["fell_back"].startswith(f"fell back from {theirs[7:19]}")
    before = runs(project)
    cli("resume", "job", "--store", url, cwd=project, **env)
    assert runs(project)[len(before):] == ["c", "d"]  # job's own remaining steps, from job's own head


@pytest.mark.slow  # real CLI processes
@pytest.mark.parametrize("form", ["module", "path"])
def test_a_module_of_a_virtualenv_inside_the_project_is_not_the_projects_code(tmp_path, project, form):
    """The README's own setup puts ``.venv`` in the project: a store naming one of its installed
    modules (e.g. a package's ``__main__``, which runs a CLI when imported) is refused like code
    outside the project -- by module name and by path alike."""
    site = project / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "evilpkg").mkdir(parents=True)
    (project / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    canary = tmp_path / "CANARY"
    (site / "evilpkg" / "__init__.py").write_text("")
    (site / "evilpkg" / "__main__.py").write_text(EVIL.format(task_id="job"))
    url = f"sqlite://{tmp_path / 'store.db'}"
    entry = "evilpkg.__main__:task" if form == "module" else f"{site / 'evilpkg' / '__main__.py'}:task"
    _plant(url, "job", entry, tmp_path)
    env = {"CANARY": str(canary), "PYTHONPATH": str(site)}
    for args in (["resume", "job"], ["status", "job", "--drift"]):
        r = cli(*args, "--store", url, cwd=project, check=3, **env)
        assert not canary.exists(), f"{args}: the installed module ran"
        assert "installed packages" in r.stderr and "--file" in r.stderr, r.stderr


@pytest.mark.slow  # real CLI processes, several per store
def test_signed_ref_moved_onto_a_fork_with_main_s_newer_records_deleted_is_caught_by_the_high_water_mark(
        store_url, project):
    """As above, and the newer records of ``main`` deleted too: the store shows nothing newer,
    but this machine saw ``main`` further on (its high-water mark of the ref's own branch)."""
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", store_url, cwd=project, key=KEY, **env)
    chain = _chain(store_url)
    cli("fork", "job", "--at", chain[1][7:19], "--branch", "old", "--store", store_url, cwd=project, key=KEY, **env)
    with open_store(store_url) as s:
        fork_head = s.get_ref("job", "old")
        s.set_ref("job", "main", fork_head, chain[-1])
        s.delete_checkpoints(chain[2:], orphans=True)
    r = cli("resume", "job", "--store", store_url, cwd=project, key=KEY, check=3, **env)
    assert "rollback detected" in r.stderr and "high-water" in r.stderr, r.stderr
    assert runs(project) == ["a", "b", "c", "d"]
