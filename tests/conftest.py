"""Servers the store tests run against: the local PostgreSQL, and an S3 server (moto) they start.

Nothing here is a mock of a database: PostgreSQL is the real server on 127.0.0.1:5432 (override
with ``OVERNIGHT_TEST_POSTGRES``), and S3 is moto's server mode, a real HTTP server on a free port
that boto3 talks to over the network. Both are started lazily, only by the tests that use them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

import pytest

# The router makes a span that crosses local midnight durable, so a test of a short task would
# depend on the hour it runs at (a 20-minute task started at 23:45 is durable). Tests -- and the
# processes they start, which inherit the environment -- run at local noon: a POSIX TZ whose offset
# puts the current UTC hour at 12. Tests of the midnight rule pass their own start time.
os.environ["TZ"] = f"NOON{time.gmtime().tm_hour - 12:+d}"
time.tzset()

POSTGRES_URL = os.environ.get("OVERNIGHT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _unavailable(what: str, why: str) -> None:
    """Skip on a developer machine without the service; fail in CI, where it must be there."""
    message = f"{what} is not available ({why})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test server's URL (no schema); skips (or fails in CI) when it is unreachable."""
    psycopg = pytest.importorskip("psycopg")
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        _unavailable(f"PostgreSQL at {POSTGRES_URL}", str(exc).strip())
    return POSTGRES_URL


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_schema(postgres_url):
    """A fresh schema name for one test, dropped afterwards: ``(server url, schema)``."""
    schema = f"overnight_t_{uuid.uuid4().hex[:12]}"
    yield postgres_url, schema
    drop_schema(postgres_url, schema)


@pytest.fixture(scope="session", autouse=True)
def _machine_state(tmp_path_factory):
    """Keep what overnight writes outside a store -- the high-water file of signed heads and the
    per-user environment key -- in the test session's own folder, for child processes too."""
    base = tmp_path_factory.mktemp("machine")
    saved = {k: os.environ.get(k) for k in ("OVERNIGHT_STATE_DIR", "OVERNIGHT_ENV_KEY_FILE")}
    os.environ["OVERNIGHT_STATE_DIR"] = str(base / "state")
    os.environ["OVERNIGHT_ENV_KEY_FILE"] = str(base / "env.key")
    yield base
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


S3_BUCKET = "overnight-test"


@pytest.fixture(scope="session")
def s3_env():
    """AWS credentials for the local server, in ``os.environ`` so child processes inherit them."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                            "AWS_SESSION_TOKEN")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    os.environ.pop("AWS_SESSION_TOKEN", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def s3_endpoint(s3_env) -> str:
    """moto's S3 server on a free 127.0.0.1 port for the session, with bucket ``overnight-test``.

    moto honours ``If-None-Match: *`` and ``If-Match`` on PutObject (and ``If-None-Match`` on
    CompleteMultipartUpload) -- checked by ``tests/test_store_s3.py`` -- so the store runs in its
    conditional-writes mode here.
    """
    pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=S3_BUCKET)
    yield endpoint
    server.stop()


def pytest_collection_modifyitems(config, items):
    """Deselect (not skip) the conformance tests that check what must survive the process or be
    shared between processes, for ``memory://``: the in-process ephemeral level by design."""
    from test_store_conformance import CROSS_PROCESS

    dropped = [i for i in items if getattr(i, "originalname", None) in CROSS_PROCESS and "[memory]" in i.name]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i not in dropped]


@pytest.fixture
def sqlite_url(tmp_path):
    """The queue tests' project (``tasks/chaos.py``, :func:`_fleet.project`) in ``tmp_path`` and a
    SQLite store there: its URL."""
    from _fleet import project

    project(tmp_path)
    return f"sqlite://{tmp_path / 'q.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def any_url(request, tmp_path):
    """As :func:`sqlite_url`, once per store kind: a SQLite file, then a fresh PostgreSQL schema
    (:func:`_fleet.store_url`; dropped afterwards)."""
    from _fleet import project, store_url

    project(tmp_path)
    return store_url(request, tmp_path)
