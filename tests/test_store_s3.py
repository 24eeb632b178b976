"""S3 backend specifics: the conditional-write probe, the fallback, multipart uploads, URLs, errors.

Two real HTTP servers: moto's (``conftest.s3_endpoint``), which honours ``If-None-Match`` and
``If-Match`` on PutObject, and the same moto application behind a WSGI layer that drops those
headers -- what an S3 clone without conditional writes does, silently.
"""

from __future__ import annotations

import threading
import uuid
import warnings

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

from conftest import S3_BUCKET, free_port  # noqa: E402
from overnight.codec import digest  # noqa: E402
from overnight.errors import ConfigError, StaleHead, TaskBusy  # noqa: E402
from overnight.store import open_store  # noqa: E402
from overnight.store.base import CheckpointRow, Commit, ObjectRecord, TaskRow  # noqa: E402
from overnight.store.s3 import MULTIPART_THRESHOLD, S3Store, parse_url  # noqa: E402

LEGACY_BUCKET = "overnight-legacy"


class _IgnoreConditions:
    """WSGI middleware: the server never sees If-Match / If-None-Match (like an older S3 clone)."""

    def __init__(self, app) -> None:
        self.app = app

    def __call__(self, environ, start_response):
        environ.pop("HTTP_IF_MATCH", None)
        environ.pop("HTTP_IF_NONE_MATCH", None)
        return self.app(environ, start_response)


@pytest.fixture(scope="module")
def legacy_endpoint(s3_env):
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", free_port(), _IgnoreConditions(DomainDispatcherApplication(create_backend_app)),
                         threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=LEGACY_BUCKET)
    yield endpoint
    server.shutdown()
    thread.join()


def _url(endpoint: str, bucket: str = S3_BUCKET, **opts: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"endpoint_url": endpoint, **opts}.items())
    return f"s3://{bucket}/t-{uuid.uuid4().hex}?{query}"


def _row(task_id, parent, seq, extra=""):
    body = f'{{"seq":{seq},"x":"{extra}"}}'.encode()
    return CheckpointRow(digest.sha256(body), task_id, parent, "main", seq, "2026-11-30T00:00:00+00:00", "s", "step",
                         None, body, None, 0)


def _task(task_id):
    return TaskRow(task_id, "2026-11-30T00:00:00+00:00", "goal", None, b"{}")


def test_moto_honours_conditional_writes_so_the_store_uses_them(s3_endpoint):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        store = S3Store(_url(s3_endpoint, conditional_writes="require"))
    assert store.conditional_writes is True
    assert "honours" in store.conditional_writes_reason
    store.close()


def test_a_server_that_ignores_the_headers_is_detected(legacy_endpoint):
    with pytest.warns(RuntimeWarning, match="does not support conditional writes"):
        store = S3Store(_url(legacy_endpoint, LEGACY_BUCKET))
    assert store.conditional_writes is False
    assert "ignores the header" in store.conditional_writes_reason
    store.close()
    with pytest.raises(ConfigError, match="does not support conditional writes"):
        S3Store(_url(legacy_endpoint, LEGACY_BUCKET, conditional_writes="require"))


def test_the_fallback_still_writes_once_and_never_forks_within_a_process(legacy_endpoint):
    with pytest.warns(RuntimeWarning):
        store = S3Store(_url(legacy_endpoint, LEGACY_BUCKET))
    d = digest.sha256(b"first")
    store.put_objects([ObjectRecord(d, "blob", 5, "none", b"first")])
    store.put_objects([ObjectRecord(d, "blob", 5, "none", b"other")])
    assert store.get_objects([d])[d].data == b"first"
    r0 = _row("t", None, 0)
    store.commit(Commit(r0, None, [], [], None, _task("t")))
    wins, losses = [], []

    def attempt(i):
        try:
            store.commit(Commit(_row("t", r0.checkpoint_id, 1, str(i)), r0.checkpoint_id))
            wins.append(i)
        except StaleHead:
            losses.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert len(store.list_checkpoints("t")) == 2
    lease = store.acquire_lease("t", "main", "me", "{}", 60_000)
    with pytest.raises(TaskBusy):
        store.acquire_lease("t", "main", "you", "{}", 60_000)
    store.release_lease(lease)
    store.close()


@pytest.mark.parametrize("server", ["conditional", "fallback"])
def test_large_objects_go_up_in_parts_and_are_written_once(server, request):
    endpoint = request.getfixturevalue("s3_endpoint" if server == "conditional" else "legacy_endpoint")
    bucket = S3_BUCKET if server == "conditional" else LEGACY_BUCKET
    store = S3Store(_url(endpoint, bucket, conditional_writes="auto" if server == "conditional" else "off"))
    big = b"\x01" * (MULTIPART_THRESHOLD + 1024)
    d = digest.sha256(big)
    store.put_objects([ObjectRecord(d, "blob", len(big), "none", big)])
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    head = client.head_object(Bucket=bucket, Key=f"{store.prefix}objects/{d[7:9]}/{d[9:]}")
    assert head["ETag"].strip('"').endswith("-2")  # a two-part multipart upload
    store.put_objects([ObjectRecord(d, "blob", len(big), "none", b"\x02" * len(big))])
    assert store.get_objects([d])[d].data == big  # first bytes win
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix=store.prefix).get("Uploads")
    store.close()


def test_prefixes_are_separate_stores_and_foreign_prefixes_are_refused(s3_endpoint):
    a, b = S3Store(_url(s3_endpoint)), S3Store(_url(s3_endpoint))
    a.commit(Commit(_row("t", None, 0), None, [], [], None, _task("t")))
    assert [t.task_id for t in a.list_tasks()] == ["t"] and b.list_tasks() == []
    a.close()
    b.close()
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    foreign = f"f-{uuid.uuid4().hex}"
    client.put_object(Bucket=S3_BUCKET, Key=f"{foreign}/backup.tar", Body=b"x")
    with pytest.raises(ConfigError, match="not an overnight store"):
        open_store(f"s3://{S3_BUCKET}/{foreign}?endpoint_url={s3_endpoint}")


def test_endpoint_from_the_environment(s3_endpoint, monkeypatch):
    monkeypatch.setenv("OVERNIGHT_S3_ENDPOINT_URL", s3_endpoint)
    store = open_store(f"s3://{S3_BUCKET}/t-{uuid.uuid4().hex}")
    assert store.endpoint_url == s3_endpoint
    store.close()


def test_a_missing_bucket_is_a_config_error(s3_endpoint):
    with pytest.raises(ConfigError, match="NoSuchBucket") as err:
        open_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p?endpoint_url={s3_endpoint}")
    assert err.value.hint


def test_an_unreachable_endpoint_is_store_unavailable(s3_env):
    from overnight.errors import StoreUnavailable

    with pytest.raises(StoreUnavailable, match="cannot reach"):
        open_store(f"s3://{S3_BUCKET}/p?endpoint_url=http://127.0.0.1:{free_port()}")


def test_urls():
    assert parse_url("s3://bkt/a/b/?region=eu-west-1") == {
        "bucket": "bkt", "prefix": "a/b/", "endpoint_url": None, "region": "eu-west-1", "mode": "auto"}
    assert parse_url("s3://bkt")["prefix"] == ""
    for bad in ("s3://", "s3://B/x", "s3://a/x", "s3://bkt/x?colour=red", "s3://bkt/x?conditional_writes=maybe",
                "s3://bkt/x?endpoint_url=127.0.0.1:9000", "s3://bkt/a//b"):
        with pytest.raises(ConfigError):
            open_store(bad)
