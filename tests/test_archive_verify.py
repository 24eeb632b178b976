"""``overnight verify`` reports what is wrong with the archive catalog (spec: ``docs/FORMAT.md``,
"Tiered storage"), with a real hot store (SQLite) and a real cold store (a directory).

A catalog row whose manifest does not decode or check (damaged, forged, naming another archive id
or another task), whose pack is missing from its cold store, or whose cold store lost its copy of
the row, is a problem of check ``archive`` naming the task and the archive: ``verify --all``
always reports it, ``verify TASK`` when the archive is that task's; both exit 3.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from test_gc import make_task, run

from overnight import api
from overnight.codec import digest
from overnight.store import open_store
from overnight.store.compose.pack import manifest_of


def _archived(tmp_path, *tasks: str) -> tuple[str, str, dict[str, str]]:
    """A hot SQLite store with ``tasks`` run and archived (head kept) to a ``file://`` cold store:
    ``(hot url, cold url, task -> archive id)``."""
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    ids = {}
    with open_store(hot_url) as store:
        for task in tasks:
            run(store, make_task(task, n=4), max_steps=5)
            ids[task] = api.archive(task, cold=cold_url, keep_last=1, store=store, grace=0).archive_id
    return hot_url, cold_url, ids


def _verify(tmp_path, hot_url: str, *args: str) -> tuple[int, dict, str]:
    """``overnight verify ARGS --store HOT`` in a real process, with ``--json`` and without:
    ``(exit status, the JSON report, the plain output)``; both runs must exit alike."""
    env = {**os.environ, "COLUMNS": "250"}

    def cli(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "overnight", "verify", *args, "--store", hot_url, *extra],
                              check=False, capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=300)

    as_json, plain = cli("--json"), cli()
    assert as_json.returncode == plain.returncode, (as_json.stderr, plain.stderr)
    assert "Traceback" not in as_json.stderr + plain.stderr
    return plain.returncode, json.loads(as_json.stdout), plain.stdout + plain.stderr


def _archive_problems(report: dict) -> list[dict]:
    return [p for p in report["problems"] if p["check"] == "archive"]


def _hot_rows(tmp_path) -> list[tuple]:
    with sqlite3.connect(tmp_path / "hot.db") as db:
        return db.execute("SELECT task_id, archive_id, created_at, location, manifest FROM archives").fetchall()


def test_a_damaged_catalog_manifest_fails_verify_naming_the_archive(tmp_path):
    hot_url, _, ids = _archived(tmp_path, "g")
    with sqlite3.connect(tmp_path / "hot.db") as db:
        (frame,) = db.execute("SELECT manifest FROM archives WHERE archive_id=?", (ids["g"],)).fetchone()
        damaged = frame[:-8] + bytes(b ^ 0x5A for b in frame[-8:])
        assert db.execute("UPDATE archives SET manifest=? WHERE archive_id=?", (damaged, ids["g"])).rowcount == 1

    for args in (["--all"], ["g"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, (args, text)
        assert not report["ok"]
        (problem,) = _archive_problems(report)
        assert problem["task_id"] == "g" and ids["g"] in problem["detail"], problem
        assert ids["g"][7:19] in text and "archive" in text  # the plain table names it too


def test_a_catalog_row_naming_another_archive_id_fails_verify_of_its_task_only(tmp_path):
    """A row of task h whose archive id is not its manifest's (its manifest copied from h's real row):
    everything else verifies, so before this was reported verify said the store was fine."""
    hot_url, _, ids = _archived(tmp_path, "g", "h")
    assert _verify(tmp_path, hot_url, "--all")[0] == 0
    forged = digest.sha256(b"not this manifest")
    with sqlite3.connect(tmp_path / "hot.db") as db:
        (task, _, created, location, frame) = db.execute(
            "SELECT task_id, archive_id, created_at, location, manifest FROM archives WHERE archive_id=?",
            (ids["h"],)).fetchone()
        db.execute("INSERT INTO archives (task_id, archive_id, created_at, location, manifest) VALUES (?,?,?,?,?)",
                   (task, forged, created, location, frame))

    for args in (["--all"], ["h"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, (args, text)
        (problem,) = _archive_problems(report)
        assert problem["task_id"] == "h" and forged in problem["detail"], problem
        assert "does not match its id" in problem["detail"], problem
    # verify of another task does not report h's archive
    code, report, text = _verify(tmp_path, hot_url, "g")
    assert code == 0 and not report["problems"] and forged[7:19] not in text, text


def test_a_catalog_row_filed_under_another_task_fails_verify(tmp_path):
    """h's manifest, sound and hashing to its id, filed in the catalog under task g: verify of g
    names the archive and the task its manifest is of."""
    hot_url, _, ids = _archived(tmp_path, "g", "h")
    with sqlite3.connect(tmp_path / "hot.db") as db:
        (created, location, frame) = db.execute(
            "SELECT created_at, location, manifest FROM archives WHERE archive_id=?", (ids["h"],)).fetchone()
        db.execute("INSERT INTO archives (task_id, archive_id, created_at, location, manifest) VALUES (?,?,?,?,?)",
                   ("g", ids["h"], created, location, frame))

    for args in (["--all"], ["g"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, (args, text)
        problems = _archive_problems(report)
        assert [p["task_id"] for p in problems] == ["g"], problems
        assert ids["h"] in problems[0]["detail"] and "'h'" in problems[0]["detail"], problems
    code, report, _ = _verify(tmp_path, hot_url, "h")
    assert code == 0 and not report["problems"], report["problems"]


def test_a_missing_pack_or_cold_copy_of_the_row_is_an_archive_problem(tmp_path):
    hot_url, cold_url, ids = _archived(tmp_path, "g")
    cold = tmp_path / "cold"
    (row_file,) = [f for f in (cold / "archives").rglob("*") if f.is_file()]
    with open_store(cold_url) as store:
        pack = manifest_of(store.list_archives("g")[0]).pack["digest"]

    # the cold store's copy of the row is gone: a lost catalog could no longer be rebuilt from it
    saved = row_file.read_bytes()
    os.chmod(row_file, 0o644)
    row_file.unlink()
    for args in (["--all"], ["g"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, (args, text)
        (problem,) = _archive_problems(report)
        assert problem["task_id"] == "g" and ids["g"] in problem["detail"] and "cold" in problem["detail"], problem
    row_file.write_bytes(saved)
    assert _verify(tmp_path, hot_url, "--all")[0] == 0

    # the pack is gone from the cold store
    pack_file = cold / "objects" / pack[7:9] / pack[9:]
    os.chmod(pack_file, 0o644)
    pack_file.unlink()
    for args in (["--all"], ["g"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, (args, text)
        (problem,) = _archive_problems(report)
        assert ids["g"] in problem["detail"] and pack in problem["detail"] and "missing" in problem["detail"], problem


def test_an_undecodable_catalog_record_of_a_file_hot_store_is_reported_by_verify_all(tmp_path):
    """On a ``file://`` hot store, a catalog record whose header does not decode is left out of the
    listing (so reads cannot use it): ``verify --all`` names its key, which names the archive."""
    hot_url, cold_url = f"file://{tmp_path / 'hot'}", f"sqlite://{tmp_path / 'cold.db'}"
    with open_store(hot_url) as store:
        run(store, make_task("g", n=4), max_steps=5)
        archive_id = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0).archive_id
    (record,) = [f for f in (tmp_path / "hot" / "archives").rglob("*") if f.is_file()]
    header, _, frame = record.read_bytes().partition(b"\n")
    os.chmod(record, 0o644)
    record.write_bytes(header.replace(b'"created_at":', b'"created_at":7,"x":', 1) + b"\n" + frame)

    code, report, text = _verify(tmp_path, hot_url, "--all")
    assert code == 3, text
    found = [p for p in report["problems"] if p["check"] == "medium" and archive_id[7:] in p["detail"]]
    assert len(found) == 1 and "archive catalog row" in found[0]["detail"], report["problems"]


# -- a cold store that cannot be opened; cold-store passwords ---------------------------------------

SECRET = "TopSecretPW"


def _with_password(server: str) -> tuple[str, str]:
    """The test server's URL with a password in it (its own, or one a trusting server ignores):
    ``(url, password)``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(server)
    secret = parts.password or SECRET
    netloc = f"{parts.username or 'postgres'}:{secret}@{parts.hostname}:{parts.port or 5432}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), secret


def _archived_runs(tmp_path) -> tuple[str, dict[str, list[str]]]:
    """Tasks g (archived twice: two catalog rows at the same cold store) and h (never archived):
    ``(hot url, archive id -> the checkpoints it moved out of hot)``."""
    hot_url, cold_url = f"sqlite://{tmp_path / 'hot.db'}", f"file://{tmp_path / 'cold'}"
    runs = {}
    with open_store(hot_url) as store:
        run(store, make_task("g", n=3), max_steps=3)
        rep = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0)
        runs[rep.archive_id] = rep.archived
        run(store, make_task("g", n=6), max_steps=6)
        rep = api.archive("g", cold=cold_url, keep_last=1, store=store, grace=0)
        runs[rep.archive_id] = rep.archived
        run(store, make_task("h", n=4), max_steps=5)
    assert len(runs) == 2 and all(runs.values()), runs
    return hot_url, runs


def _relocate(tmp_path, location: str) -> None:
    with sqlite3.connect(tmp_path / "hot.db") as db:
        assert db.execute("UPDATE archives SET location=?", (location,)).rowcount == 2


@pytest.mark.parametrize("where", ["moved", "not a store", "not a database", "postgres role"])
def test_a_cold_store_that_cannot_be_opened_is_reported_and_every_other_task_verified(tmp_path, where, request):
    """The cold store of g's archives is gone (moved away), or the catalog names a folder or file
    that is no store, or a PostgreSQL role that does not exist: verify reports each archive once
    and each archived checkpoint once (check ``archive``), verifies h and g's hot checkpoints, exits
    3 -- before, it stopped with exit 2 at the first archived checkpoint and verified nothing else."""
    hot_url, runs = _archived_runs(tmp_path)
    location = f"file://{tmp_path / 'cold'}"
    if where == "moved":
        (tmp_path / "cold").rename(tmp_path / "cold-moved")
    elif where == "not a store":
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
        location = f"file://{tmp_path / 'etc'}"
    elif where == "not a database":
        (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
        location = f"sqlite://{tmp_path / 'passwd'}"
    else:
        url, secret = _with_password(request.getfixturevalue("postgres_url"))
        location = url.replace("://", "://overnight_no_such_role_", 1) + "?schema=overnight_t_none"
    if where != "moved":
        _relocate(tmp_path, location)
    archived = {cid: aid for aid, cids in runs.items() for cid in cids}

    for args in (["--all"], ["g"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, (args, text)
        problems = report["problems"]
        assert all(p["task_id"] == "g" and p["check"] == "archive" for p in problems), problems
        catalog = sorted(p["object"] for p in problems if p["checkpoint_id"] is None)
        assert catalog == sorted(runs), problems  # each archive once, as before
        per_checkpoint = [p for p in problems if p["checkpoint_id"] is not None]
        assert sorted(p["checkpoint_id"] for p in per_checkpoint) == sorted(archived), problems  # each once
        for p in per_checkpoint:
            assert p["object"] == archived[p["checkpoint_id"]] and p["checkpoint_id"][7:19] in p["detail"], p
            assert "cannot be opened" in p["detail"] and "cold store" in p["detail"], p
        assert report["checkpoints_invalid"] == len(archived)
        assert report["heads"]["g"] == {"main": "ok"}
        if args == ["--all"]:
            assert report["heads"]["h"] == {"main": "ok"}  # the other task was verified
            assert report["tasks"] == 2
        if where == "postgres role":
            assert secret not in text and secret not in json.dumps(report) and "***@" in text
    code, report, _ = _verify(tmp_path, hot_url, "h")
    assert code == 0 and not report["problems"]


def test_a_cold_store_that_cannot_be_opened_is_tried_a_bounded_number_of_times(tmp_path, monkeypatch):
    """However many archives and archived checkpoints name it, verify tries to open an unopenable
    cold store at most twice a run (the catalog check, then the checkpoints), not once a read."""
    from overnight.store.compose import tiered

    hot_url, runs = _archived_runs(tmp_path)
    (tmp_path / "cold").rename(tmp_path / "cold-moved")
    tries = []
    real = tiered.open_existing

    def counted(url):
        tries.append(url)
        return real(url)

    monkeypatch.setattr(tiered, "open_existing", counted)
    report = api.verify(store=hot_url)
    archived = sum(len(c) for c in runs.values())
    assert len([p for p in report.problems if p.checkpoint_id is not None]) == archived
    assert report.heads == {"g": {"main": "ok"}, "h": {"main": "ok"}}
    assert 1 <= len(tries) <= 2, tries
    tries.clear()
    report = api.verify("g", store=hot_url)
    assert len(report.problems) == archived + len(runs) and 1 <= len(tries) <= 2, tries


def _pg_cold(tmp_path, pg_schema) -> tuple[str, str, str, str]:
    """Tasks g and h in a hot SQLite store, and a PostgreSQL cold store URL with a password in it:
    ``(hot url, cold url, password, server url)``."""
    server, schema = pg_schema
    url, secret = _with_password(server)
    hot_url = f"sqlite://{tmp_path / 'hot.db'}"
    with open_store(hot_url) as store:
        for task in ("g", "h"):
            run(store, make_task(task, n=4), max_steps=5)
    return hot_url, f"{url}?schema={schema}", secret, server


def test_archive_never_prints_the_cold_store_password(tmp_path, pg_schema):
    """``archive`` to a PostgreSQL cold store whose URL has a password reports where it archived
    to (text and JSON) with the password masked (``user:***@``)."""
    hot_url, cold_url, secret, _ = _pg_cold(tmp_path, pg_schema)

    def cli(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "overnight", *args, "--store", hot_url], check=False,
                              capture_output=True, text=True, env={**os.environ, "COLUMNS": "250"}, cwd=tmp_path,
                              timeout=300)
        assert done.returncode == 0 and secret not in done.stdout + done.stderr, done
        return done

    text = cli("archive", "g", "--cold", cold_url, "--keep-last", "1", "--grace", "0").stderr
    assert "archived" in text and ":***@" in text, text
    shown = json.loads(cli("archive", "h", "--cold", cold_url, "--keep-last", "1", "--grace", "0", "--json").stdout)
    assert shown["cold"].startswith("postgresql://") and ":***@" in shown["cold"] and shown["archived"], shown
    assert _verify(tmp_path, hot_url, "--all")[0] == 0


def test_verify_of_a_lost_pack_never_prints_the_cold_store_password(tmp_path, pg_schema):
    """The packs are lost from a PostgreSQL cold store whose URL has a password: ``verify`` names
    the cold store with the password masked, in text and JSON."""
    hot_url, cold_url, secret, server = _pg_cold(tmp_path, pg_schema)
    for task in ("g", "h"):
        api.archive(task, cold=cold_url, keep_last=1, store=hot_url, grace=0)
    assert _verify(tmp_path, hot_url, "--all")[0] == 0

    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        assert conn.execute(f'DELETE FROM "{pg_schema[1]}".objects').rowcount >= 2
    for args in (["--all"], ["g"]):
        code, report, text = _verify(tmp_path, hot_url, *args)
        assert code == 3, text
        problems = [p for p in _archive_problems(report) if p["checkpoint_id"] is None]
        assert len(problems) == (2 if args == ["--all"] else 1), problems
        assert all("missing from the cold store" in p["detail"] for p in problems), problems
        assert secret not in text and secret not in json.dumps(report) and ":***@" in text, text
