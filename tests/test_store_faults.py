"""When the disk or the server says no: typed errors (exit 6), nothing committed lost, reading
commands still working on a read-only store, half-migrated PostgreSQL schemas named as such.

Real media only: a small tmpfs mounted for the test (full, then remounted read-only), the local
PostgreSQL server (a half-migrated schema built for real, a closed port), real CLI processes.
The tmpfs tests need root (``mount``); where mounting is impossible they skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _tasks import plan_task

from overnight.errors import StoreReadOnly, StoreSchemaMismatch, StoreUnavailable
from overnight.store import open_store
from overnight.store.postgres_schema import MIGRATIONS
from overnight.store.sqlite import SQLiteStore

EXIT_STORE = 6

TASK = '''
import os, overnight
task = overnight.Task("fill", goal="write big artifacts", expected_span="3h", level="session")

@task.step
def plan(ctx):
    for i in range(int(os.environ.get("CHUNKS", "12"))):
        ctx.add_step("chunk", i=i)

@task.step(planned=False)
def chunk(ctx, i):
    ctx.write_artifact(f"blob-{i}.bin", os.urandom(300_000))   # incompressible: 300 KB stored per step
    ctx.write_text("last.txt", f"chunk {i}")
'''


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    return subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**e, "COLUMNS": "200", **(env or {})}, timeout=120)


def _mount(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): {done.stderr.strip()}")


def _remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


@pytest.fixture
def tmpfs(tmp_path):
    """A 2 MB tmpfs at ``tmp_path/mnt``, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the disk-full and read-only tests run where it can")
    mnt = tmp_path / "mnt"
    _mount(mnt, "2m")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _url(medium: str, mnt: Path) -> str:
    return f"file://{mnt}/store" if medium == "file" else f"sqlite://{mnt}/overnight.db"


def _done(url: str) -> int:
    out = cli("show", "fill", "--store", url, "--json", cwd=Path("/"))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["done"]


@pytest.mark.slow
@pytest.mark.parametrize("medium", ["file", "sqlite"])
def test_disk_full_is_store_full_and_nothing_committed_is_lost(tmpfs, tmp_path, medium):
    (tmp_path / "task.py").write_text(TASK)
    url = _url(medium, tmpfs)
    full = cli("run", "task.py", "--store", url, "-q", cwd=tmp_path)
    assert full.returncode == EXIT_STORE, full.stderr
    assert "Traceback" not in full.stderr
    assert "error:" in full.stderr and ("no space left" in full.stderr or "disk is full" in full.stderr)
    assert str(tmpfs) in full.stderr and "hint: free space" in full.stderr
    committed = _done(url)  # a reading command on the full disk still works
    assert 1 <= committed < 13
    _remount(tmpfs, "size=32m")
    resumed = cli("resume", "fill", "--store", url, "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert _done(url) == 13
    verify = cli("verify", "fill", "--store", url, cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.slow
@pytest.mark.parametrize("medium", ["file", "sqlite"])
def test_a_read_only_store_can_be_read_but_not_written(tmpfs, tmp_path, medium):
    (tmp_path / "task.py").write_text(TASK)
    url = _url(medium, tmpfs)
    env = {"CHUNKS": "2"}
    assert cli("run", "task.py", "--store", url, "-q", "--max-steps", "2", cwd=tmp_path, env=env).returncode == 75
    _remount(tmpfs, "ro")
    reading = [["ls"], ["show", "fill", "--json"], ["verify", "fill"]]
    if medium == "sqlite":  # the file store writes nothing to read; SQLite must open read-only for these
        reading += [["show", "fill"], ["log", "fill"], ["status", "fill"], ["cat", "fill", "last.txt"]]
    for args in reading:
        done = cli(*args, "--store", url, cwd=tmp_path, env=env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    assert cli("cat", "fill", "last.txt", "--store", url, cwd=tmp_path).stdout == "chunk 0"
    before = sorted(os.listdir(tmpfs))
    for args in (["resume", "fill", "-q"], ["fork", "fill", "--at", "main", "--branch", "b2"]):
        refused = cli(*args, "--store", url, cwd=tmp_path, env=env)
        assert refused.returncode == EXIT_STORE, (args, refused.stderr)
        assert "read-only" in refused.stderr and str(tmpfs) in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert sorted(os.listdir(tmpfs)) == before
    with pytest.raises(StoreReadOnly, match="read-only"):
        s = open_store(url)
        try:
            s.set_ref("fill", "x", s.get_ref("fill", "main"), None)
        finally:
            s.close()


def test_a_read_only_sqlite_file_opens_read_only_and_refuses_writes(tmp_path):
    path = tmp_path / "s.db"
    SQLiteStore(path).close()
    ro = SQLiteStore(path, read_only=True)
    try:
        assert ro.list_tasks() == []
        with pytest.raises(StoreReadOnly, match=str(path)):
            ro.set_ref("t", "main", "sha256:" + "0" * 64, None)
    finally:
        ro.close()
    with pytest.raises(StoreUnavailable, match="does not exist"):
        SQLiteStore(tmp_path / "missing.db", read_only=True)


def test_permission_denied_is_typed_for_another_user(tmp_path):
    """As an unprivileged user (root bypasses permissions), a store owned by someone else."""
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root")
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    (tmp_path / "task.py").write_text(TASK)
    url = f"file://{tmp_path}/store"
    assert cli("run", "task.py", "--store", url, "-q", "--max-steps", "1", cwd=tmp_path,
               env={"CHUNKS": "2"}).returncode == 75
    os.chmod(tmp_path, 0o755)
    for folder, dirs, files in os.walk(tmp_path):
        os.chmod(folder, 0o755)
        for f in files:
            os.chmod(os.path.join(folder, f), 0o644)
    e = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_SIGNING_KEY")}
    e.update(HOME=str(tmp_path), CHUNKS="2")
    parents = [p for p in tmp_path.parents if str(p) != "/"]
    modes = {p: p.stat().st_mode for p in parents}
    try:
        for p in parents:
            os.chmod(p, modes[p] | 0o005)
        done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                               "overnight", "resume", "fill", "--store", url, "-q"], cwd=tmp_path, capture_output=True,
                              text=True, env=e, timeout=120)
    finally:
        for p in parents:
            os.chmod(p, modes[p])
    assert done.returncode == EXIT_STORE, done.stderr
    assert "permission denied" in done.stderr and "Traceback" not in done.stderr


# --- PostgreSQL ---------------------------------------------------------------------------------


def test_postgres_unreachable_is_store_unavailable_exit_6(tmp_path):
    from conftest import free_port

    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test?schema=x"
    with pytest.raises(StoreUnavailable, match="unreachable") as err:
        open_store(url)
    assert err.value.location and "127.0.0.1" in err.value.location and err.value.hint
    done = cli("ls", "--store", url, cwd=tmp_path)
    assert done.returncode == EXIT_STORE, done.stderr
    assert "unreachable" in done.stderr and "Traceback" not in done.stderr


def _psql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def test_a_half_migrated_postgres_schema_is_named_not_a_raw_sql_error(pg_schema):
    pytest.importorskip("psycopg")
    server, schema = pg_schema
    url = f"{server}?schema={schema}"
    open_store(url).close()
    # back to version 3 (what the rest of this test half-migrates): migration 4 undone
    _psql(server, f'DROP FUNCTION "{schema}".commit_checkpoint')
    _psql(server, f'DELETE FROM "{schema}".overnight_schema WHERE version = 4')
    # the version row of migration 3 lost, its column and table still there: half-migrated
    _psql(server, f'DELETE FROM "{schema}".overnight_schema WHERE version = 3')
    with pytest.raises(StoreSchemaMismatch) as err:
        open_store(url)
    assert "records version 2" in err.value.message and "objects.stored_at_ms" in err.value.message
    assert "already exists" not in str(err.value)
    assert err.value.unexpected == ["objects.stored_at_ms", "archives", "checkpoints_parent"]
    assert "INSERT INTO" in err.value.hint  # complete: record it
    # the hint works
    _psql(server, f"INSERT INTO \"{schema}\".overnight_schema (version, description) VALUES (3, 'by hand')")
    open_store(url).close()
    # one of two objects of migration 3 missing from a schema that says 3
    _psql(server, f'DROP TABLE "{schema}".archives')
    with pytest.raises(StoreSchemaMismatch, match=r"lacks archives \(version 3\)") as err:
        open_store(url)
    assert err.value.missing == ["archives"]
    # and a version 2 schema with half of migration 3: the hint says drop what it half-created
    _psql(server, f'DROP FUNCTION "{schema}".commit_checkpoint')
    _psql(server, f'DELETE FROM "{schema}".overnight_schema WHERE version >= 3')
    with pytest.raises(StoreSchemaMismatch, match="applied in part") as err:
        open_store(url)
    _psql(server, f'ALTER TABLE "{schema}".objects DROP COLUMN stored_at_ms')
    _psql(server, f'DROP INDEX "{schema}".checkpoints_parent')
    s = open_store(url)  # migration 3 runs again, whole (and 4)
    s.close()


def test_postgres_migrations_are_idempotent_and_serialized(pg_schema):
    """Eight processes open one new schema at once: one migrates, the others find it done."""
    server, schema = pg_schema
    url = f"{server}?schema={schema}"
    code = ("import sys; from overnight.store import open_store; s = open_store(sys.argv[1]); "
            "s.close(); print('ok')")
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    import psycopg

    with psycopg.connect(server) as conn:
        versions = [r[0] for r in conn.execute(f'SELECT version FROM "{schema}".overnight_schema ORDER BY 1')]
    assert versions == [m.version for m in MIGRATIONS]


# --- leases --------------------------------------------------------------------------------------


def test_a_failing_lease_release_does_not_hide_the_error_that_ended_the_run(tmp_path):
    """The store's disk goes read-only while a step fails: the user sees the step's failure (exit
    1), with the failed release reported beside it, not a release error instead of it."""
    import overnight
    from overnight.errors import StepFailed
    from overnight.store.base import Lease

    class ReleaseRefused(SQLiteStore):  # the medium refuses exactly the release
        def release_lease(self, lease: Lease, outcome: str | None = None) -> None:
            raise StoreReadOnly(f"store {self.path} is read-only", location=str(self.path))

    task = overnight.Task(f"t-{uuid.uuid4().hex[:6]}", goal="fail", expected_span="3h", level="session")

    @task.step
    def boom(ctx):
        raise RuntimeError("the step's own failure")

    store = ReleaseRefused(tmp_path / "s.db")
    with pytest.raises(StepFailed, match="the step's own failure|boom") as err:
        overnight.run(task, store)
    notes = "\n".join(getattr(err.value, "__notes__", []))
    assert "releasing the lease" in notes and "read-only" in notes
    store.close()

    ok = overnight.Task(f"t-{uuid.uuid4().hex[:6]}", goal="ok", expected_span="3h", level="session")

    @ok.step
    def fine(ctx):
        ctx.state["x"] = 1

    store = ReleaseRefused(tmp_path / "s2.db")
    with pytest.warns(RuntimeWarning, match="releasing the lease"):
        assert overnight.run(ok, store).status == "complete"
    store.close()


# --- salvage of a damaged SQLite file -----------------------------------------------------------


def _part(ctx, i):
    import hashlib

    data = hashlib.sha256(str(i).encode()).digest() * 100  # 3.2 KB, the same in every run
    ctx.write_artifact(f"part-{i}.bin", data + os.urandom(1024))
    ctx.state["parts"] = ctx.state["parts"] + [i]


def _no_parts(ctx):
    ctx.state["parts"] = []


def _salvage_task(task_id: str):
    return plan_task(task_id, 30, _part, step="part", setup=_no_parts,
                     goal="many small steps", expected_span="3h", level="session")


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped"])
def test_salvage_recovers_what_verifies_and_the_task_completes_from_it(tmp_path, damage):
    import overnight

    db = tmp_path / "s.db"
    overnight.run(_salvage_task("salv"), f"sqlite://{db}")
    with SQLiteStore(db) as store:
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    size = db.stat().st_size
    if damage == "truncated":
        with open(db, "r+b") as f:
            f.truncate(size * 6 // 10 // 4096 * 4096)
    else:
        import random

        rnd = random.Random(7)
        with open(db, "r+b") as f:
            for p in rnd.sample(range(pages // 3, pages), 6):  # six pages in the later half
                f.seek(4096 * (p - 1) + rnd.randrange(100, 4000))
                f.write(os.urandom(16))
    # the damaged file is refused with a hint that works
    broken = cli("verify", "--all", "--store", f"sqlite://{db}", cwd=tmp_path)
    assert broken.returncode == 3, broken.stderr
    out = tmp_path / "out.db"
    done = cli("repair", "--salvage", str(db), "--into", str(out), "--json", cwd=tmp_path)
    assert done.returncode in (0, 3), done.stderr
    assert "Traceback" not in done.stderr
    rep = json.loads(done.stdout)
    assert rep["rows"]["checkpoints"] > 0 and rep["rows"]["objects"] > 0
    assert out.is_file() and db.stat().st_size <= size  # the damaged file was not written
    # what was salvaged resumes: from the newest checkpoint that verifies, never from damaged data
    result = overnight.run(_salvage_task("salv"), f"sqlite://{out}")
    assert result.status == "complete" and result.done == 31
    with SQLiteStore(out, read_only=True) as s:
        from overnight.chain.read import load_head

        loaded, _ = load_head(s, "salv", "main")
        assert set(loaded.artifacts) == {f"part-{i}.bin" for i in range(30)}


# --- servers that go away while a store is open --------------------------------------------------


class _Proxy:
    """A TCP forwarder 127.0.0.1:port -> target, closed with every connection it carries: the
    network between the store and its server going away, for real."""

    def __init__(self, target: tuple[str, int]) -> None:
        import socket
        import threading

        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        import socket

        self.closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # stops listening (close alone leaves a blocked accept listening)
        except OSError:
            pass
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass


def test_postgres_going_away_mid_use_is_store_unavailable(pg_schema):
    pytest.importorskip("psycopg")
    server, schema = pg_schema
    open_store(f"{server}?schema={schema}").close()  # migrated directly
    proxy = _Proxy(("127.0.0.1", 5432))
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/test?schema={schema}&busy_timeout_ms=3000"
    s = open_store(url)
    try:
        assert s.list_tasks() == []
        proxy.close()
        with pytest.raises(StoreUnavailable, match="unreachable") as err:
            s.list_tasks()
        assert "pg_isready" in err.value.hint or "stopped answering" in err.value.hint
    finally:
        s.close()


def test_s3_going_away_mid_use_is_store_unavailable(s3_env):
    pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    import boto3
    from conftest import free_port

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="gone")
    s = open_store(f"s3://gone/p?endpoint_url={endpoint}")
    try:
        assert s.list_tasks() == []
        server.stop()
        with pytest.raises(StoreUnavailable, match="cannot reach"):
            s.list_tasks()
    finally:
        s.close()


def test_a_file_store_whose_folder_vanished_is_store_unavailable(tmp_path):
    import shutil

    from overnight.store.base import ObjectRecord

    s = open_store(f"file://{tmp_path}/store")
    try:
        shutil.rmtree(tmp_path / "store")  # unmounted, or deleted by hand, while the store is open
        with pytest.raises(StoreUnavailable, match="missing") as err:
            s.put_objects([ObjectRecord("sha256:" + "ab" * 32, "blob", 1, "raw", b"x")])
        assert err.value.location == f"{tmp_path}/store" and "mount or restore" in err.value.hint
    finally:
        s.close()


@pytest.mark.parametrize("status, error, exit_code", [(404, "ConfigError", 2), (503, "StoreUnavailable", EXIT_STORE)])
@pytest.mark.slow
def test_an_endpoint_that_is_not_s3_is_a_typed_error_not_a_traceback(tmp_path, status, error, exit_code):
    """A web server that is not S3 (a 404 or 503 page without an S3 error document) at
    ``endpoint_url``: a clear ConfigError (exit 2) or StoreUnavailable (exit 6), never botocore's
    ClientError traceback."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NotS3(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html>not here</html>")

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NotS3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"s3://bucket/p?endpoint_url=http://127.0.0.1:{server.server_address[1]}"
        done = cli("ls", "--store", url, cwd=tmp_path, env={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                                                            "AWS_MAX_ATTEMPTS": "1"})
    finally:
        server.shutdown()
    assert done.returncode == exit_code, done.stderr
    assert "Traceback" not in done.stderr and "ClientError" not in done.stderr
    assert "S3" in done.stderr or "s3://" in done.stderr


def test_a_postgres_database_that_does_not_exist_is_a_config_error_not_an_unreachable_server(pg_schema):
    """The server answered and refused the database name: the hint says to create it or fix the
    URL, not to check that the server runs (a new user was sent to `pg_isready`)."""
    from overnight.errors import ConfigError

    server, _ = pg_schema
    base = server.rsplit("/", 1)[0]
    with pytest.raises(ConfigError, match="nosuchdb_overnight") as err:
        open_store(f"{base}/nosuchdb_overnight?schema=x")
    assert "createdb" in err.value.hint and "pg_isready" not in err.value.hint
