"""Replicas of a critical task: the hot copy is lost or damaged between sessions, the next resume
continues from a replica, and ``overnight repair`` makes the hot copy whole again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

import overnight
from conftest import drop_schema
from overnight.store import open_store
from overnight.testing.faults import Faults
from overnight.verify.fsck import verify_store

STEPS = 6


def critical_task() -> overnight.Task:
    t = overnight.Task("ledger", goal="reconcile the ledger over three nights", expected_span="3d",
                       criticality="critical", done_when="every month reconciled")
    for i in range(STEPS):
        def month(ctx, i=i):
            ctx.write_text(f"month-{i}.txt", f"month {i} reconciled: {'ü€' * 200 * (i + 1)}")
            ctx.state[f"m{i}"] = i * i
            return i
        t.step(month, name=f"month-{i}")
    return t


@pytest.fixture
def media(tmp_path, monkeypatch, pg_schema, s3_endpoint):
    """A project whose critical tasks go to local SQLite (hot) + PostgreSQL + S3."""
    server, schema = pg_schema
    urls = {
        "local": f"sqlite://{tmp_path / 'hot' / 'overnight.db'}",
        "database": f"{server}?schema={schema}",
        "cloud": f"s3://overnight-test/replicas-{uuid.uuid4().hex[:8]}?endpoint_url={s3_endpoint}",
    }
    (tmp_path / "overnight.toml").write_text(
        f'[store]\nurl = "{urls["local"]}"\n'
        f'[media]\ndatabase = "{urls["database"]}"\ncloud = "{urls["cloud"]}"\n'
        '[criticality]\ncritical = ["local", "database", "cloud"]\n')
    monkeypatch.chdir(tmp_path)
    for var in ("OVERNIGHT_STORE", "OVERNIGHT_MEDIA_LOCAL", "OVERNIGHT_MEDIA_DATABASE", "OVERNIGHT_MEDIA_CLOUD",
                "OVERNIGHT_CONFIG", "OVERNIGHT_SIGNING_KEY"):
        monkeypatch.delenv(var, raising=False)
    return urls


def first_session(urls) -> str:
    """Run half the task; every medium then holds the same head."""
    r = overnight.run(critical_task(), handle_signals=False, max_steps=STEPS // 2)
    assert r.status == "stopped" and r.level == "durable"
    heads = {name: _head(url) for name, url in urls.items()}
    assert len(set(heads.values())) == 1, heads
    return heads["local"]


def _head(url: str) -> str | None:
    with open_store(url) as s:
        return s.get_ref("ledger", "main")


def finish_and_check(urls) -> overnight.RunResult:
    r = overnight.run(critical_task(), handle_signals=False)
    assert r.status == "complete"
    assert r.steps_run == STEPS - STEPS // 2, "resume must redo nothing that was committed"
    heads = {name: _head(url) for name, url in urls.items()}
    assert len(set(heads.values())) == 1 and None not in heads.values(), heads
    for url in urls.values():  # every medium holds the whole, verifiable history again
        with open_store(url) as s:
            report = verify_store(s, ["ledger"])
            assert report.ok, (url, report.problems)
    return r


def repair_cli(tmp_path) -> dict:
    out = subprocess.run([sys.executable, "-m", "overnight", "repair", "ledger", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert out.returncode == 0, out.stdout + out.stderr
    (report,) = json.loads(out.stdout)
    return {m["name"]: m for m in report["media"]}


def test_hot_copy_deleted_resume_from_replica_then_repair(media, tmp_path):
    first_session(media)
    db = tmp_path / "hot" / "overnight.db"
    for p in db.parent.iterdir():  # the machine's disk is gone: database, WAL, everything
        p.unlink()
    db.parent.rmdir()
    repaired = repair_cli(tmp_path)
    assert repaired["local"]["status"] == "repaired" and repaired["local"]["checkpoints_copied"] >= STEPS // 2
    assert repaired["database"]["status"] == repaired["cloud"]["status"] == "ok"
    assert _head(media["local"]) == _head(media["cloud"])
    finish_and_check(media)


def test_hot_copy_deleted_resume_heals_it_without_repair(media, tmp_path):
    first_session(media)
    (tmp_path / "hot" / "overnight.db").unlink()
    finish_and_check(media)


@pytest.mark.parametrize("kind", ["bit_flip", "removed_blob", "truncation"])
def test_hot_copy_corrupted_resume_from_replica_then_repair(media, tmp_path, kind):
    head = first_session(media)
    # copies too: the hot copy cannot heal itself (tests/test_ditto.py), so the replica must
    injected = Faults(tmp_path / "hot" / "overnight.db", copies=True).inject(kind, "ledger")
    assert injected.kind == kind
    with open_store(media["local"]) as s:
        assert not verify_store(s, ["ledger"]).ok, "the injected damage must be visible on the hot copy"
    repaired = repair_cli(tmp_path)
    assert repaired["local"]["status"] == "repaired", repaired
    assert _head(media["local"]) == head == _head(media["database"])
    with open_store(media["local"]) as s:
        assert verify_store(s, ["ledger"]).ok
    r = finish_and_check(media)
    assert r.fallback is None or not r.fallback.skipped, "a healthy replica leaves nothing to fall back from"


def test_replica_corrupted_is_repaired_from_hot_copy(media, tmp_path):
    first_session(media)
    import psycopg

    server, schema = media["database"].split("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:  # a replica loses an artifact (a botched restore, say)
        from overnight.chain.ditto import ditto_key

        (big,) = conn.execute(f'SELECT digest FROM "{schema}".objects WHERE kind <> %s ORDER BY size DESC LIMIT 1',
                              ("ditto",)).fetchone()
        # and its ditto copy, if it has one: the replica cannot heal itself, the hot copy must
        conn.execute(f'DELETE FROM "{schema}".objects WHERE digest = ANY(%s)', ([big, ditto_key(big)],))
    repaired = repair_cli(tmp_path)
    assert repaired["database"]["status"] == "repaired" and repaired["database"]["objects_copied"] >= 1
    assert repaired["local"]["status"] == "ok"
    finish_and_check(media)


@pytest.mark.slow
def test_two_media_lost_the_third_carries_the_task(media, tmp_path):
    first_session(media)
    (tmp_path / "hot" / "overnight.db").unlink()
    server, schema = media["database"].split("?schema=")
    drop_schema(server, schema)
    # the cloud copy alone still carries the task
    repaired = repair_cli(tmp_path)
    assert repaired["cloud"]["status"] == "ok"
    assert {repaired["local"]["status"], repaired["database"]["status"]} == {"repaired"}
    finish_and_check(media)


@pytest.mark.slow
def test_cli_finds_a_task_on_the_configured_media_without_store(media, tmp_path):
    first_session(media)
    (tmp_path / "hot" / "overnight.db").unlink()  # only the database and cloud copies are left

    def cli(*args):
        out = subprocess.run([sys.executable, "-m", "overnight", *args], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env=os.environ.copy())
        assert out.returncode == 0, (args, out.stderr)
        return out.stdout

    (listed,) = json.loads(cli("ls", "--json"))
    assert listed["task_id"] == "ledger" and listed["done"] == STEPS // 2
    assert listed["store"] == media["database"]  # listed from the medium that still holds it
    assert json.loads(cli("show", "ledger", "--json"))["task_id"] == "ledger"
    assert json.loads(cli("verify", "ledger", "--json"))["ok"] is True
    assert cli("cat", "ledger", "month-0.txt").startswith("month 0 reconciled")


def test_every_object_of_the_hot_copy_damaged_is_rewritten_from_a_replica(media, tmp_path):
    """Objects every checkpoint shares (the world fingerprint, unchanged state pages) damaged too:
    nothing on the hot copy verifies, and repair still heals it object by object."""
    import sqlite3

    head = first_session(media)
    with sqlite3.connect(tmp_path / "hot" / "overnight.db") as conn:
        conn.execute("UPDATE objects SET data = substr(data, 1, length(data) - 1) WHERE length(data) > 1")
    with open_store(media["local"]) as s:
        assert not verify_store(s, ["ledger"]).ok
    repaired = repair_cli(tmp_path)
    assert repaired["local"]["status"] == "repaired" and repaired["local"]["objects_copied"] > 3
    assert _head(media["local"]) == head
    finish_and_check(media)


# --- two media (local + database), driven through the CLI as a user would ------------------------

LEDGER = r'''
import os, overnight
task = overnight.Task("ledger", goal="reconcile the ledger", expected_span="3d", criticality="critical",
                      done_when="all months")
for i in range(6):
    def month(ctx, i=i):
        ctx.write_text(f"month-{i}.txt", f"month {i} " * 50)
        ctx.state[f"m{i}"] = i
        with open("runs.log", "a") as log:  # which steps actually ran, across processes
            log.write(f"month-{i}\n")
        if os.environ.get("DROP_REPLICA_AT") == str(i):  # the replica disappears while the run goes on
            import psycopg
            server, schema = os.environ["DROP_REPLICA"].split("?schema=")
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    task.step(month, name=f"month-{i}")
'''


@pytest.fixture
def two_media(tmp_path, monkeypatch, pg_schema):
    """A project whose critical tasks go to local SQLite (primary) + PostgreSQL; ``ledger.py``."""
    server, schema = pg_schema
    urls = {"local": f"sqlite://{tmp_path / '.overnight' / 'overnight.db'}", "database": f"{server}?schema={schema}"}
    (tmp_path / "overnight.toml").write_text(
        f'[store]\nurl = "{urls["local"]}"\n[media]\ndatabase = "{urls["database"]}"\n'
        '[criticality]\ncritical = ["local", "database"]\n')
    (tmp_path / "ledger.py").write_text(LEDGER)
    monkeypatch.chdir(tmp_path)
    for var in ("OVERNIGHT_STORE", "OVERNIGHT_MEDIA_LOCAL", "OVERNIGHT_MEDIA_DATABASE", "OVERNIGHT_MEDIA_CLOUD",
                "OVERNIGHT_CONFIG", "OVERNIGHT_SIGNING_KEY", "DROP_REPLICA_AT"):
        monkeypatch.delenv(var, raising=False)
    return urls


def overnight_cli(cwd, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """``overnight ARGS`` in a real process, in the project directory."""
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def _steps_on(url: str, branch: str = "main") -> list[str]:
    """Step names of the first-parent lineage of ``branch`` on one medium, oldest first."""
    from overnight.chain.reachability import first_parent_chain

    with open_store(url) as s:
        rows = {r.checkpoint_id: r for r in s.list_checkpoints("ledger")}
        head = s.get_ref("ledger", branch)
    return [r.step for r in reversed(first_parent_chain(rows, head)) if r.step]


def test_replica_lost_mid_run_stops_with_a_typed_error_and_resume_heals_it(two_media, tmp_path):
    out = overnight_cli(tmp_path, "run", "ledger.py", "--quiet",
                        env={"DROP_REPLICA_AT": "2", "DROP_REPLICA": two_media["database"]})
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr and "replica database could not take the" in out.stderr, out.stderr
    assert "overnight repair" in out.stderr
    # the primary kept the commit the replica could not take; nothing is lost
    assert _steps_on(two_media["local"]) == ["month-0", "month-1", "month-2"]
    out = overnight_cli(tmp_path, "resume", "ledger", "--quiet")  # the replica is reachable again (empty)
    assert out.returncode == 0, out.stderr
    assert _steps_on(two_media["local"]) == _steps_on(two_media["database"]) == [f"month-{i}" for i in range(6)]


def _runs(tmp_path) -> list[str]:
    log = tmp_path / "runs.log"
    return log.read_text().split() if log.exists() else []


def _repair_json(tmp_path, expect_rc: int = 0, which: str = "ledger") -> tuple[dict, dict]:
    out = overnight_cli(tmp_path, "repair", which, "--json")
    assert out.returncode == expect_rc, (out.returncode, out.stdout, out.stderr)
    (report,) = json.loads(out.stdout)
    return report, {m["name"]: m for m in report["media"]}


MONTHS = [f"month-{i}" for i in range(6)]


def test_damaged_head_falls_back_on_its_medium_instead_of_rolling_back_to_a_lagging_replica(two_media, tmp_path):
    import sqlite3

    assert overnight_cli(tmp_path, "run", "ledger.py", "--max-steps", "2", "--quiet").returncode == 75
    # the replica was "down" for two steps: only the local medium has month-2 and month-3
    out = overnight_cli(tmp_path, "resume", "ledger", "--store", two_media["local"], "--max-steps", "2", "--quiet")
    assert out.returncode == 75, out.stderr
    db = sqlite3.connect(tmp_path / ".overnight" / "overnight.db")  # bit rot in local's head record
    (body,) = db.execute("SELECT body FROM checkpoints WHERE step='month-3'").fetchone()
    body = bytearray(body)
    body[len(body) // 2] ^= 4
    db.execute("UPDATE checkpoints SET body=? WHERE step='month-3'", (bytes(body),))
    from overnight.codec.digest import sha256
    from overnight.chain.ditto import ditto_key  # and its ditto copy: the medium cannot heal itself
    (cid,) = db.execute("SELECT checkpoint_id FROM checkpoints WHERE step='month-3'").fetchone()
    db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(cid),))
    assert sha256(bytes(body)) != cid
    db.commit()
    db.close()
    report, media = _repair_json(tmp_path)
    # the newest checkpoint that verifies anywhere is local's month-2, not the replica's month-1
    assert report["sources"] == {"main": "local"}
    assert media["local"]["heads"] == {"main": "invalid"} and media["local"]["status"] == "repaired"
    assert media["database"]["heads"] == {"main": "behind"} and media["database"]["status"] == "repaired"
    assert [s["step"] for s in report["skipped"]["main"]] == ["month-3"]
    assert _steps_on(two_media["local"]) == _steps_on(two_media["database"]) == MONTHS[:3]
    assert overnight_cli(tmp_path, "resume", "ledger", "--quiet").returncode == 0
    assert _runs(tmp_path) == MONTHS[:4] + MONTHS[3:], "only the step that verifies nowhere runs again"
    assert _steps_on(two_media["local"]) == _steps_on(two_media["database"]) == MONTHS


@pytest.mark.slow
def test_diverged_media_keep_the_losing_head_on_a_branch(two_media, tmp_path):
    assert overnight_cli(tmp_path, "run", "ledger.py", "--max-steps", "2", "--quiet").returncode == 75
    # split brain: each medium resumed alone (two machines, each seeing one medium)
    for url, steps in ((two_media["local"], "2"), (two_media["database"], "3")):
        out = overnight_cli(tmp_path, "resume", "ledger", "--store", url, "--max-steps", steps, "--quiet")
        assert out.returncode == 75, out.stderr
    local_head, db_head = _head(two_media["local"]), _head(two_media["database"])
    report, media = _repair_json(tmp_path, expect_rc=4)
    assert report["sources"]["main"] == "database"  # the newer head wins main ...
    assert media["local"]["status"] == "diverged" and media["local"]["heads"]["main"] == "diverged"
    assert media["local"]["kept"] == {"main@local": local_head}  # ... and local's work is kept, not dropped
    assert "main@local" in media["local"]["detail"] and "overnight merge" in media["local"]["detail"]
    for url in two_media.values():  # both media hold both heads
        with open_store(url) as s:
            assert s.list_refs("ledger") == {"main": db_head, "main@local": local_head}
    out = overnight_cli(tmp_path, "gc", "--apply", "--store", two_media["local"], "--grace", "0s", "--quiet")
    assert out.returncode == 0, out.stderr
    assert _steps_on(two_media["local"], "main@local") == MONTHS[:4]  # gc kept the diverged work
    assert overnight_cli(tmp_path, "repair", "ledger").returncode == 0  # nothing diverges any more
    out = overnight_cli(tmp_path, "merge", "ledger", "--from", "main@local")
    assert out.returncode == 0, out.stderr
    assert _head(two_media["local"]) == _head(two_media["database"]) != db_head


def test_truncated_local_store_is_set_aside_and_rebuilt_from_the_replica(two_media, tmp_path):
    assert overnight_cli(tmp_path, "run", "ledger.py", "--max-steps", "3", "--quiet").returncode == 75
    path = tmp_path / ".overnight" / "overnight.db"
    half = path.stat().st_size // 2
    os.truncate(path, half)
    report, media = _repair_json(tmp_path, which="--all")  # the tasks are listed from the replica
    assert media["local"]["status"] == "damaged" and media["local"]["checkpoints_copied"] >= 3, media
    (aside,) = path.parent.glob("overnight.db.damaged-*")
    assert aside.stat().st_size == half and str(aside) in media["local"]["detail"]  # moved, never deleted
    assert media["database"]["status"] == "ok"
    assert _steps_on(two_media["local"]) == MONTHS[:3]
    # the same damage found by resume: set aside, rebuilt, and the run goes on
    os.truncate(path, path.stat().st_size // 2)
    out = overnight_cli(tmp_path, "resume", "ledger", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "damaged" in out.stderr and "moved aside to" in out.stderr
    assert len(list(path.parent.glob("overnight.db.damaged-*"))) == 2
    assert _runs(tmp_path) == MONTHS, "nothing committed ran again"
    assert _steps_on(two_media["local"]) == _steps_on(two_media["database"]) == MONTHS
