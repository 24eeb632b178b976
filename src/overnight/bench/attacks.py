"""The attack table: every attack on the trust boundary, N times on every store, counted.

    .venv/bin/python scripts/attack_table.py [--trials N] [--stores sqlite,file,postgres,s3] [--json]
    (the same: python -m overnight.bench.attacks ...)

An attacker with write access to the store (the ``Store`` API: a shared PostgreSQL schema, an S3
bucket, a copied SQLite file) but without the signing key, against a victim task of four steps.
Each trial is fresh (own store, own machine-state folder). Outcomes:

* **refused** -- the attack failed as it must: the command raised the typed error (or, for a
  forgery, resumed from the newest genuine checkpoint), and nothing of the attacker's ran;
* **loaded** -- the attack worked: attacker code ran (its canary file appeared), a rolled-back
  or forged state was loaded, a guessed secret matched, a stored tag called something.

The victim's commands run in this process through ``overnight.api`` (the CLI is a thin shell over
it; ``tests/test_attacks.py`` runs the same attacks through real CLI processes). PostgreSQL:
``$OVERNIGHT_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``), a schema per
trial, dropped after; S3: a moto server this script starts on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import overnight
from overnight import api
from overnight.bench.kpi import _start_s3
from overnight.codec import decode
from overnight.errors import CodeLocationRefused, DecodeError, NoValidCheckpoint, OvernightError, RollbackDetected
from overnight.store import open_store
from overnight.chain.read import load_head
from overnight.testing.faults import forge_record

KEY = "victim-signing-key"
POSTGRES = os.environ.get("OVERNIGHT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

JOB = '''\
import os
import overnight
task = overnight.Task("job", goal="four counted steps", deps=[])
def _count(name):
    with open(os.environ["RUNS_FILE"], "a") as f:
        f.write(name + "\\n")
@task.step
def a(ctx):
    _count("a")
@task.step
def b(ctx):
    _count("b")
@task.step
def c(ctx):
    _count("c")
@task.step
def d(ctx):
    _count("d")
'''

EVIL = '''\
import os, pathlib
if os.environ.get("CANARY"):
    pathlib.Path(os.environ["CANARY"]).write_text("attacker code ran")
import overnight
task = overnight.Task("{task_id}", goal="g", deps=[])
@task.step
def a(ctx):
    return 1
'''


SECRET_JOB = '''\
import overnight
task = overnight.Task("secretive", goal="reads a secret", deps=[])
@task.step(env=["API_TOKEN"])
def a(ctx):
    return len(ctx.env("API_TOKEN") or "")
'''


class Trial:
    """One fresh world: a project folder (the cwd), a store, a machine-state folder, env vars."""

    def __init__(self, kind: str, s3: str | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="overnight-attack-"))
        self.project = self.dir / "project"
        self.project.mkdir()
        (self.project / "job.py").write_text(JOB)
        self.schema = None
        if kind == "sqlite":
            self.url = f"sqlite://{self.dir / 'store.db'}"
        elif kind == "file":
            self.url = f"file://{self.dir / 'store'}"
        elif kind == "postgres":
            self.schema = f"overnight_attack_{uuid.uuid4().hex[:12]}"
            self.url = f"{POSTGRES}?schema={self.schema}"
        else:
            self.url = f"s3://overnight-kpi/attack-{uuid.uuid4().hex}?endpoint_url={s3}"
        self.saved = {k: os.environ.get(k) for k in ("OVERNIGHT_STATE_DIR", "OVERNIGHT_ENV_KEY_FILE", "RUNS_FILE",
                                                     "CANARY", "OVERNIGHT_SIGNING_KEY")}
        os.environ.update(OVERNIGHT_STATE_DIR=str(self.dir / "state"), OVERNIGHT_ENV_KEY_FILE=str(self.dir / "env.key"),
                          RUNS_FILE=str(self.dir / "runs.txt"), CANARY=str(self.dir / "CANARY"))
        os.environ.pop("OVERNIGHT_SIGNING_KEY", None)
        self.cwd = os.getcwd()
        os.chdir(self.project)

    def key(self, on: bool) -> None:
        if on:
            os.environ["OVERNIGHT_SIGNING_KEY"] = KEY
        else:
            os.environ.pop("OVERNIGHT_SIGNING_KEY", None)

    def runs(self) -> list[str]:
        f = self.dir / "runs.txt"
        return f.read_text().split() if f.exists() else []

    def canary(self) -> bool:
        return (self.dir / "CANARY").exists()

    def close(self) -> None:
        os.chdir(self.cwd)
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.schema:
            import psycopg

            with psycopg.connect(POSTGRES, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        shutil.rmtree(self.dir, ignore_errors=True)


def _victim(t: Trial, signed: bool) -> list[str]:
    """Run the victim task to completion; its checkpoint ids, oldest first."""
    t.key(signed)
    api.run("job.py", store=t.url)
    with open_store(t.url) as s:
        rows = {r.checkpoint_id: r for r in s.list_checkpoints("job")}
        chain, cid = [], s.get_ref("job", "main")
    while cid is not None:
        chain.append(cid)
        cid = rows[cid].parent_id
    return chain[::-1]


def _plant(t: Trial, task_id: str, entry: str) -> None:
    saved = os.environ.pop("OVERNIGHT_SIGNING_KEY", None)
    task = overnight.Task(task_id, goal="g", entry=entry, deps=[])

    @task.step
    def a(ctx):
        return 1

    overnight.run(task, t.url, max_steps=1)
    if saved:
        os.environ["OVERNIGHT_SIGNING_KEY"] = saved


def code_location(command: str, signed: bool) -> Callable[[Trial], bool]:
    def attack(t: Trial) -> bool:
        (t.dir / "evil.py").write_text(EVIL.format(task_id="job"))
        _plant(t, "job", f"{t.dir / 'evil.py'}:task")
        t.key(signed)
        try:
            if command == "resume":
                api.resume("job", store=t.url)
            else:
                api.status("job", store=t.url, drift=True)
        except (CodeLocationRefused, NoValidCheckpoint):
            pass
        return t.canary()
    return attack


def ref_back(signed: bool, delete_newer: bool) -> Callable[[Trial], bool]:
    def attack(t: Trial) -> bool:
        chain = _victim(t, signed)
        with open_store(t.url) as s:
            s.set_ref("job", "main", chain[1], chain[-1])
            if delete_newer:
                s.delete_checkpoints(chain[2:], orphans=True)
        before = len(t.runs())
        try:
            api.resume("job", store=t.url)
        except RollbackDetected:
            return False
        return len(t.runs()) > before  # steps after the old checkpoint ran again
    return attack


def forged(where: str, sig: str) -> Callable[[Trial], bool]:
    def attack(t: Trial) -> bool:
        chain = _victim(t, True)
        with open_store(t.url) as s:
            rows = {c: s.get_checkpoint(c) for c in chain}
            signature = {"missing": None, "wrong": "hmac-sha256:" + "0" * 64, "old": rows[chain[1]].signature}[sig]
            if where == "head":
                ids = [forge_record(s, rows[chain[-1]], parent=chain[0], seq=1, signature=signature)]
            elif where == "mid-chain":
                f1 = forge_record(s, rows[chain[2]], parent=chain[0], seq=1, signature=signature)
                ids = [f1, forge_record(s, rows[chain[3]], parent=f1, seq=2, signature=signature)]
            else:
                ids = [forge_record(s, rows[chain[1]], parent=None, seq=0, signature=signature)]
            s.set_ref("job", "main", ids[-1], chain[-1])
            try:
                loaded, _ = load_head(s, "job", "main", key=KEY.encode())
            except NoValidCheckpoint:
                return True  # the real head verifies: refusing everything is wrong too
        return loaded.id != chain[-1]
    return attack


DICTIONARY = ["password", "123456", "letmein", "hunter2", "secret", "qwerty", "admin", "changeme", "dragon", "monkey"]


def env_guess(t: Trial) -> bool:
    (t.project / "secretive.py").write_text(SECRET_JOB)
    os.environ["API_TOKEN"] = "hunter2"
    try:
        api.run("secretive.py", store=t.url)
    finally:
        os.environ.pop("API_TOKEN")
    with open_store(t.url) as s:
        state = load_head(s, "secretive", "main")[0].state_tree
    salt = bytes.fromhex(state["task"]["spec"]["salt"])
    recorded = state["done"][0]["reads"]["env"]["API_TOKEN"]
    os.environ["OVERNIGHT_ENV_KEY_FILE"] = str(t.dir / "attacker.key")  # the attacker's machine: not the user's key
    from overnight.verify.fingerprint import keyed_like

    tries = [keyed_like(recorded, salt, "API_TOKEN", w) for w in DICTIONARY]
    tries += ["hmac-sha256:" + hmac.new(salt, b"API_TOKEN\0" + w.encode(), hashlib.sha256).hexdigest() for w in DICTIONARY]
    return recorded in tries


SENTINEL = Path(tempfile.gettempdir()) / f"overnight-attack-sentinel-{os.getpid()}"


def sentinel_fn(*args: Any, **kwargs: Any) -> int:
    SENTINEL.write_text("called")
    return 0


class Sentinel:
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        SENTINEL.write_text("instantiated")
        return super().__new__(cls)


class SentinelTuple(tuple):
    _fields = ("x",)

    def __new__(cls, *args: Any) -> Any:
        SENTINEL.write_text("instantiated")
        return super().__new__(cls, args)


def codec_tag(tag: str) -> Callable[[Trial], bool]:
    me = __name__
    targets = [f"{me}:sentinel_fn", "subprocess:Popen", f"{me}:Sentinel", f"{me}:SentinelTuple"]
    build = {
        "enum": lambda ref: {"$t": "enum", "cls": ref, "v": 1},
        "model": lambda ref: {"$t": "model", "cls": ref, "fields": [["args", ["true"]]]},
        "dataclass": lambda ref: {"$t": "dataclass", "cls": ref, "fields": [["args", ["true"]]]},
        "namedtuple": lambda ref: {"$t": "namedtuple", "cls": ref, "items": [["true"]]},
        "defaultdict": lambda ref: {"$t": "defaultdict", "factory": f"type:{ref}", "items": []},
    }[tag]

    def attack(t: Trial) -> bool:
        import subprocess  # noqa: F401 (imported, as in any real program: the tag can find it)

        worked = False
        for ref in targets:
            SENTINEL.unlink(missing_ok=True)
            try:
                value = decode(json.dumps({"x": build(ref)}).encode())
                value["x"]["missing"]
                worked = True
            except (DecodeError, KeyError, TypeError):
                pass
            worked = worked or SENTINEL.exists()
        SENTINEL.unlink(missing_ok=True)
        return worked
    return attack


ATTACKS: list[tuple[str, Callable[[Trial], bool], bool]] = [
    # (name, attack -> True when it worked, depends on the store)
    ("code location outside the project: resume", code_location("resume", False), True),
    ("code location outside the project: status --drift", code_location("status", False), True),
    ("code location, signed task: resume", code_location("resume", True), True),
    ("ref moved back, no key", ref_back(False, False), True),
    ("ref moved back, signed", ref_back(True, False), True),
    ("ref moved back + newer records deleted, signed", ref_back(True, True), True),
    *[(f"forged {w}, {s} HMAC", forged(w, s), True) for w in ("head", "mid-chain", "root")
      for s in ("missing", "wrong", "old")],
    ("declared env value: dictionary guess", env_guess, True),
    *[(f"codec tag {tag}: function, Popen, unrelated class, tuple subclass", codec_tag(tag), False)
      for tag in ("defaultdict", "enum", "model", "dataclass", "namedtuple")],
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3, help="trials per attack and store (default 3)")
    ap.add_argument("--stores", default="sqlite,file,postgres,s3")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a Markdown table")
    args = ap.parse_args(argv)
    stores = [x for x in args.stores.split(",") if x]
    server, endpoint = None, None
    if "s3" in stores:
        started = _start_s3()
        if isinstance(started, str):
            raise SystemExit(started)
        server, endpoint = started
    rows = []
    t0 = time.perf_counter()
    try:
        for name, attack, per_store in ATTACKS:
            for kind in (stores if per_store else ["-"]):
                counts = collections.Counter()
                for _ in range(args.trials):
                    trial = Trial(kind if kind != "-" else "sqlite", endpoint)
                    try:
                        worked = attack(trial)
                        counts["loaded" if worked else "refused"] += 1
                    except OvernightError as exc:  # anything else typed: refused, but say so
                        counts["refused"] += 1
                        counts["other errors"] += 1
                        print(f"  {name} on {kind}: {type(exc).__name__}: {exc.message}", file=sys.stderr)
                    finally:
                        trial.close()
                rows.append({"attack": name, "store": kind, "trials": args.trials, "refused": counts["refused"],
                             "loaded": counts["loaded"]})
                print(f"  {name} [{kind}]: {counts['refused']}/{args.trials} refused", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| attack | store | trials | refused | loaded |\n|---|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['attack']} | {r['store']} | {r['trials']} | {r['refused']} | {r['loaded']} |")
        total = sum(r["trials"] for r in rows)
        print(f"\n{total} trials, {sum(r['refused'] for r in rows)} refused, {sum(r['loaded'] for r in rows)} loaded, "
              f"{time.perf_counter() - t0:.0f} s")
    return 0 if all(r["loaded"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
