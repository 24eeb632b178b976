"""The queue's tables carry a schema version (``queue_meta``), so a later format can be told apart.

Each test uses a real store (a SQLite file, a fresh PostgreSQL schema) and the real CLI or queue API:
a new queue records version 1; queue tables made before the version was recorded are version 1 and
a writer records it; tables of a newer overnight are refused with a typed error naming the store
and both versions, and nothing is written to them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from _fleet import cli, project, queue_rows, start_worker, stop, store_url, wait_until
from overnight.errors import StoreCorrupt, StoreVersionError
from overnight.store.queue_sql import QUEUE_SCHEMA_VERSION, SqlQueue


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: Any, tmp_path: Path) -> str:
    return store_url(request, tmp_path)


def _sql(url: str, sql: str, fetch: bool = False) -> list[tuple]:
    """Run ``sql`` as another client would (``{s}.``: the schema prefix)."""
    if url.startswith("sqlite://"):
        with sqlite3.connect(url[len("sqlite://"):]) as db:
            return db.execute(sql.replace("{s}.", "")).fetchall()
    import psycopg

    from overnight.store.postgres import parse_url

    conninfo, schema, _ = parse_url(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(sql.replace("{s}.", f'"{schema}".'))
        return cur.fetchall() if fetch else []


def _queue(url: str) -> tuple[Any, Any]:
    from overnight.store import open_store
    from overnight.store.queue_open import queue_for

    SqlQueue._ready.clear()  # as a new process: the version is checked again
    store = open_store(url)
    try:
        return store, queue_for(store)
    except BaseException:
        store.close()
        raise


def _submit(url: str, task_id: str) -> None:
    from overnight.store.queue import QueuedTask

    store, queue = _queue(url)
    try:
        queue.submit(QueuedTask(task_id=task_id, entry="tasks/chaos.py:task", params={}))
    finally:
        store.close()


def _version(url: str) -> list[tuple]:
    return _sql(url, "SELECT value FROM {s}.queue_meta WHERE key='schema_version'", fetch=True)


def test_a_new_queue_records_its_version(url: str) -> None:
    _submit(url, "a")
    assert _version(url) == [(str(QUEUE_SCHEMA_VERSION),)]


def test_tables_from_before_the_version_are_version_1_and_a_writer_records_it(url: str) -> None:
    _submit(url, "a")
    _sql(url, "DROP TABLE {s}.queue_meta")  # as a queue made before the version was recorded
    _submit(url, "b")
    assert _version(url) == [("1",)]
    store, queue = _queue(url)
    try:
        assert {t.task_id for t in queue.list()} == {"a", "b"}
    finally:
        store.close()


def test_queue_tables_of_a_newer_overnight_are_refused(url: str, tmp_path: Path) -> None:
    _submit(url, "a")
    _sql(url, "UPDATE {s}.queue_meta SET value='2' WHERE key='schema_version'")
    with pytest.raises(StoreVersionError) as err:
        _submit(url, "b")
    assert "schema version 2" in err.value.message and f"knows up to {QUEUE_SCHEMA_VERSION}" in err.value.message
    assert "upgrade overnight" in (err.value.hint or "")
    assert _sql(url, "SELECT task_id FROM {s}.queue", fetch=True) == [("a",)]  # nothing written
    project(tmp_path)
    for args in (["submit", "tasks/chaos.py", "--id", "c"], ["worker", "--max-tasks", "1", "--idle-exit", "1"], ["status", "a"], ["ls"]):
        proc = cli(tmp_path, *args, "--store", url)
        assert proc.returncode != 0, (args, proc.stdout, proc.stderr)
        assert "schema version 2" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert _sql(url, "SELECT task_id FROM {s}.queue", fetch=True) == [("a",)]


def test_a_version_edited_into_garbage_is_named(url: str) -> None:
    _submit(url, "a")
    _sql(url, "UPDATE {s}.queue_meta SET value='two' WHERE key='schema_version'")
    with pytest.raises(StoreCorrupt, match="'two'.*queue_meta"):
        _submit(url, "b")


def test_a_running_worker_stops_claiming_once_the_tables_are_a_newer_version(url: str, tmp_path: Path) -> None:
    project(tmp_path)
    early = cli(tmp_path, "submit", "tasks/chaos.py", "--id", "early", "--store", url)
    # "late" becomes claimable only long after the bump below (+4 s raced a slow machine, where
    # "early" took longer than that and the worker claimed "late" before the bump); a worker that
    # ignored the bump would idle out (exit 0) at 30 s, before it could claim it
    late = cli(tmp_path, "submit", "tasks/chaos.py", "--id", "late", "--not-before", "+90s", "--store", url)
    assert early.returncode == 0 and late.returncode == 0, early.stderr + late.stderr
    worker = start_worker(tmp_path, url, "--idle-exit", "30")
    try:
        wait_until(lambda: queue_rows(url)["early"].status == "complete", 60, "the first task to complete")
        _sql(url, "UPDATE {s}.queue_meta SET value='2' WHERE key='schema_version'")
        assert worker.wait(timeout=60) != 0
    finally:
        stop(worker)
    log = (tmp_path / "w.err").read_text()
    assert "schema version 2" in log, log[-2000:]
    assert _sql(url, "SELECT status FROM {s}.queue WHERE task_id='late'", fetch=True) == [("queued",)]


def test_duplicate_version_rows_are_refused(url: str) -> None:
    _submit(url, "a")
    _sql(url, "DROP TABLE {s}.queue_meta")
    _sql(url, "CREATE TABLE {s}.queue_meta (key text, value text)")  # no unique key: a hand-made table
    _sql(url, "INSERT INTO {s}.queue_meta VALUES ('schema_version', '1'), ('schema_version', '2')")
    with pytest.raises(StoreCorrupt, match="2 schema versions"):
        _submit(url, "b")


def test_a_version_of_thousands_of_digits_is_named_not_a_crash(url: str) -> None:
    _submit(url, "a")
    _sql(url, "UPDATE {s}.queue_meta SET value='" + "9" * 5000 + "' WHERE key='schema_version'")
    with pytest.raises(StoreCorrupt):
        _submit(url, "b")
