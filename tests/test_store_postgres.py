"""PostgreSQL backend specifics: versioned migrations, upgrades, NUL-safe columns, URLs, errors.

Against the real server (``conftest.postgres_url``), each test in its own schema, dropped after.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

psycopg = pytest.importorskip("psycopg")

from overnight.errors import ConfigError, StoreBusy, StoreVersionError  # noqa: E402
from overnight.store import open_store  # noqa: E402
from overnight.store.postgres import PostgresStore, parse_url  # noqa: E402
from overnight.store.postgres_schema import MIGRATIONS, Migration, check_migrations, migrate  # noqa: E402


def _ledger(server: str, schema: str) -> list[tuple[int, str]]:
    with psycopg.connect(server) as conn:
        return conn.execute(f'SELECT version, description FROM "{schema}".overnight_schema ORDER BY version').fetchall()


def test_a_new_schema_is_migrated_once_and_reopening_is_a_no_op(pg_schema):
    server, schema = pg_schema
    PostgresStore(f"{server}?schema={schema}").close()
    assert _ledger(server, schema) == [(m.version, m.description) for m in MIGRATIONS]
    PostgresStore(f"{server}?schema={schema}").close()
    assert len(_ledger(server, schema)) == len(MIGRATIONS)


def test_processes_opening_a_new_schema_at_once_all_succeed(pg_schema):
    """The advisory lock serializes them: one migrates, the others find nothing to do."""
    server, schema = pg_schema
    code = "import sys; from overnight.store import open_store; open_store(sys.argv[1]).close(); print('ok')"
    procs = [subprocess.Popen([sys.executable, "-c", code, f"{server}?schema={schema}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert len(_ledger(server, schema)) == len(MIGRATIONS)


def test_threads_opening_a_new_schema_at_once_all_succeed(pg_schema):
    server, schema = pg_schema
    errors = []

    def open_close():
        try:
            PostgresStore(f"{server}?schema={schema}").close()
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_close) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(_ledger(server, schema)) == len(MIGRATIONS)


def test_a_schema_from_a_newer_overnight_is_refused(pg_schema):
    server, schema = pg_schema
    PostgresStore(f"{server}?schema={schema}").close()
    with psycopg.connect(server) as conn:
        conn.execute(f"INSERT INTO \"{schema}\".overnight_schema (version, description) VALUES (99, 'future')")
    with pytest.raises(StoreVersionError, match="schema version 99") as err:
        open_store(f"{server}?schema={schema}")
    assert "upgrade overnight" in str(err.value)


def test_an_upgrade_applies_only_the_new_migrations(pg_schema):
    server, schema = pg_schema
    store = PostgresStore(f"{server}?schema={schema}")
    store.put_objects([])
    store.close()
    later = MIGRATIONS + (Migration(len(MIGRATIONS) + 1, "a test column", (
        "ALTER TABLE {s}.tasks ADD COLUMN note text",)),)
    upgraded = PostgresStore(f"{server}?schema={schema}", _migrations=later)
    upgraded.close()
    assert [v for v, _ in _ledger(server, schema)] == [m.version for m in later]
    with psycopg.connect(server) as conn:
        cols = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                           "WHERE table_schema=%s AND table_name='tasks'", (schema,))}
    assert "note" in cols
    # the older code now refuses the upgraded store instead of misreading it
    with pytest.raises(StoreVersionError):
        PostgresStore(f"{server}?schema={schema}")


def test_a_failing_migration_leaves_the_store_at_its_previous_version(pg_schema):
    server, schema = pg_schema
    PostgresStore(f"{server}?schema={schema}").close()
    broken = MIGRATIONS + (Migration(len(MIGRATIONS) + 1, "half of it works", (
        "ALTER TABLE {s}.tasks ADD COLUMN half text",
        "ALTER TABLE {s}.no_such_table ADD COLUMN x text",
    )),)
    with psycopg.connect(server, autocommit=True) as conn, pytest.raises(psycopg.errors.UndefinedTable):
        migrate(conn, schema, where="test", migrations=broken)
    assert len(_ledger(server, schema)) == len(MIGRATIONS)
    with psycopg.connect(server) as conn:
        cols = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                           "WHERE table_schema=%s AND table_name='tasks'", (schema,))}
    assert "half" not in cols  # DDL rolled back with the rest


def test_the_migration_list_is_checked():
    assert check_migrations(MIGRATIONS) == len(MIGRATIONS)
    with pytest.raises(ValueError, match="CONCURRENTLY"):
        check_migrations(MIGRATIONS + (Migration(len(MIGRATIONS) + 1, "x", (
            "CREATE INDEX CONCURRENTLY i ON {s}.tasks (goal)",)),))
    with pytest.raises(ValueError, match="versions must be"):
        check_migrations(MIGRATIONS + (Migration(len(MIGRATIONS) + 5, "gap", ()),))


def test_caller_strings_are_bytea_not_text(pg_schema):
    """PostgreSQL text cannot hold U+0000: every column a caller's string lands in is bytea."""
    server, schema = pg_schema
    PostgresStore(f"{server}?schema={schema}").close()
    with psycopg.connect(server) as conn:
        types = dict(((t, c), d) for t, c, d in conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema=%s",
            (schema,)))
    caller = [("tasks", "task_id"), ("tasks", "goal"), ("tasks", "entry"), ("tasks", "created_at"),
              ("checkpoints", "task_id"), ("checkpoints", "branch"), ("checkpoints", "session"),
              ("checkpoints", "event"), ("checkpoints", "step"), ("checkpoints", "created_at"),
              ("refs", "task_id"), ("refs", "branch"), ("journal", "step_name"), ("journal", "session"),
              ("journal", "started_at"), ("leases", "holder"), ("leases", "holder_id"), ("leases", "branch"),
              ("objects", "data"), ("checkpoints", "body"), ("archives", "task_id"), ("archives", "created_at"),
              ("archives", "location"), ("archives", "manifest")]
    assert {c: types[c] for c in caller} == {c: "bytea" for c in caller}


def test_a_non_digest_id_with_nul_is_a_typed_error_not_a_driver_error(pg_schema):
    from overnight.errors import CheckpointNotFound, SchemaError
    from overnight.store.base import CheckpointRow, Commit

    server, schema = pg_schema
    with PostgresStore(f"{server}?schema={schema}") as store:
        with pytest.raises(CheckpointNotFound):
            store.get_checkpoint("sha256:\x00")
        assert store.missing_objects(["x\x00"]) == {"x\x00"}
        assert store.get_objects(["x\x00"]) == {}
        with pytest.raises(SchemaError):
            store.commit(Commit(CheckpointRow("bad\x00id", "t", None, "main", 0, "", "", "", None, b"", None, 0), None))


def test_a_row_lock_held_past_the_timeout_is_store_busy(pg_schema):
    server, schema = pg_schema
    with PostgresStore(f"{server}?schema={schema}&busy_timeout_ms=200") as store:
        store.acquire_lease("t", "main", "me", "{}", 60_000)
        with psycopg.connect(server) as other:
            other.execute(f'SELECT * FROM "{schema}".leases FOR UPDATE')  # held until this block ends
            with pytest.raises(StoreBusy, match="stayed locked"):
                store.acquire_lease("t", "main", "you", "{}", 60_000)


def test_urls():
    assert parse_url("postgresql://u@h:5433/db?schema=s1&sslmode=disable") == (
        "postgresql://u@h:5433/db?sslmode=disable", "s1", {})
    assert parse_url("postgres://h/db")[1] == "overnight"
    assert parse_url("postgresql://h/db?pool_max=3&busy_timeout_ms=50")[2] == {"pool_max": 3, "busy_timeout_ms": 50}
    for bad in ("postgresql://h/db?schema=a-b", "postgresql://h/db?schema=1x", "postgresql://h/db?schema=" + "x" * 64,
                "postgresql://h:notaport/db", "postgresql://h/db?pool_max=0", "postgresql://"):
        with pytest.raises(ConfigError):
            open_store(bad)


def test_an_unreachable_server_is_store_unavailable():
    from conftest import free_port

    from overnight.errors import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="cannot connect") as err:
        PostgresStore(f"postgresql://postgres@127.0.0.1:{free_port()}/test", connect_timeout_s=2)
    assert err.value.hint


def test_a_schema_1_store_is_upgraded_and_its_objects_dated(pg_schema):
    from overnight.codec import digest
    from overnight.store.base import ArchiveRow

    server, schema = pg_schema
    PostgresStore(f"{server}?schema={schema}", _migrations=MIGRATIONS[:1]).close()
    data = b"written by schema 1"
    with psycopg.connect(server) as conn:
        conn.execute(f'INSERT INTO "{schema}".objects VALUES (%s, %s, %s, %s, %s)',
                     (digest.sha256(data), "blob", len(data), "none", data))
    with PostgresStore(f"{server}?schema={schema}") as store:
        assert [v for v, _ in _ledger(server, schema)] == [m.version for m in MIGRATIONS]
        (stat,) = list(store.iter_object_stats())
        assert stat.digest == digest.sha256(data) and 0 <= stat.age_ms < 60_000
        store.put_archive(ArchiveRow("sha256:" + "1" * 64, "t", "2026", "file:///c", b"m"))
        assert len(store.list_archives()) == 1


def test_reading_commands_never_create_a_schema(pg_schema):
    import subprocess
    import sys

    import psycopg

    server, schema = pg_schema
    url = f"{server}?schema={schema}"
    for args in (["ls"], ["verify", "--all"], ["gc"]):
        out = subprocess.run([sys.executable, "-m", "overnight", *args, "--store", url], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "no store at" in out.stderr, out.stderr
    with psycopg.connect(server) as conn:
        assert conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                            (schema,)).fetchone() is None



# --- the one-statement commit (schema 4) ----------------------------------------------------------


def test_a_commit_on_connections_cut_by_the_server_runs_again_on_a_live_one(pg_schema):
    """pg_terminate_backend (or a server restart) between two commits: pooled connections are not
    checked per checkout, so the next read, commit or transaction meets a dead one -- it runs
    again, once, on a live connection, and the chain is as if nothing happened."""
    from test_store_conformance import _obj, _row, _task

    from overnight.store.base import Commit

    server, schema = pg_schema
    with PostgresStore(f"{server}?schema={schema}") as store:
        r0 = _row("t", None, 0)
        store.commit(Commit(r0, None, [_obj(b"zero")], [], None, _task("t")))

        def cut() -> None:
            with store._pool.connection() as a, store._pool.connection() as b:
                pids = [a.info.backend_pid, b.info.backend_pid]
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,))

        cut()
        r1 = _row("t", store.get_ref("t", "main"), 1)  # a read on a dead connection
        cut()
        store.commit(Commit(r1, r0.checkpoint_id, [_obj(b"one")]))
        cut()
        r2 = _row("t", r1.checkpoint_id, 2)
        store.put_checkpoints([r2])  # a transaction: its BEGIN meets the dead connection
        cut()
        store.set_ref("t", "main", r2.checkpoint_id, r1.checkpoint_id)
        assert store.get_ref("t", "main") == r2.checkpoint_id
        assert [c.seq for c in store.list_checkpoints("t")] == [0, 1, 2]


def test_a_commit_whose_answer_was_lost_is_sent_again_and_committed_once(pg_schema):
    """The connection dies after the server committed but before the answer arrived: the commit
    runs again, finds the head already at its checkpoint, and succeeds without writing anything
    twice. The same commit sent afresh (not a retry) is a stale head, as before."""
    from test_store_conformance import _obj, _row, _task

    from overnight.errors import StaleHead
    from overnight.store.base import Commit

    server, schema = pg_schema
    with PostgresStore(f"{server}?schema={schema}") as store:
        r0 = _row("t", None, 0)
        store.commit(Commit(r0, None, [_obj(b"zero")], [], None, _task("t")))
        real, sent = store._call, []

        def answer_lost(fn):
            def commit_then_die(conn, retry):
                sent.append(retry)
                result = fn(conn, retry)
                if not retry:  # the server committed; its answer dies with the connection
                    conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
                return result
            return real(commit_then_die)

        r1 = _row("t", r0.checkpoint_id, 1)
        one = _obj(b"one")
        store._call = answer_lost
        try:
            added = store.commit(Commit(r1, r0.checkpoint_id, [one]))
        finally:
            store._call = real
        assert sent == [False, True]
        assert added == len(r1.body) + len(one.data) == store.get_checkpoint(r1.checkpoint_id).stored_bytes
        assert store.get_ref("t", "main") == r1.checkpoint_id
        assert [c.seq for c in store.list_checkpoints("t")] == [0, 1]
        with pytest.raises(StaleHead):
            store.commit(Commit(r1, r0.checkpoint_id, [one]))


def test_a_commit_rewrites_a_damaged_stored_object_and_keeps_an_intact_one(pg_schema):
    """A stored object with other bytes under the digest a commit carries: replaced if it is
    damaged (does not hash to its digest), kept if it is intact (another encoding: the first
    write wins); only the rewritten bytes count as added."""
    from test_store_conformance import _obj, _row, _task

    from overnight.codec import compress
    from overnight.store.base import Commit, ObjectRecord

    server, schema = pg_schema
    with PostgresStore(f"{server}?schema={schema}") as store:
        good = _obj(b"payload " * 8)
        damaged = ObjectRecord(good.digest, "blob", good.size, "none", b"garbage " * 8)
        plain = _obj(b"compressible " * 200)
        codec, data = compress.compress(plain.data)
        assert codec != "none"
        zipped = ObjectRecord(plain.digest, "blob", plain.size, codec, data)
        store.put_objects([damaged, zipped])
        r0 = _row("t", None, 0)
        added = store.commit(Commit(r0, None, [good, plain], [], None, _task("t")))
        got = store.get_objects([good.digest, plain.digest])
        assert got[good.digest].data == good.data  # healed
        assert (got[plain.digest].codec, got[plain.digest].data) == (codec, data)  # kept
        assert added == len(r0.body) + len(good.data)
