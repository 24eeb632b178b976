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


# -- a process killed inside a new task's first commit ------------------------------------------

# Runs the real CLI (``python -m overnight ARGS``) in this process, SIGKILLing it at a chosen
# instant of the first commit of task t5 (argv[1]) on an s3:// store:
#   task-created: right after the PutObject of the task record returned (the checkpoint record and
#                 the ref may not be written yet: the commit's records go up side by side);
#   ref-swap:     just before the ref's conditional PutObject onto a checkpoint (the commit point:
#                 every record of the commit written, the ref not moved).
S3_KILLER = r'''
import os, signal, sys, runpy

from overnight.store import s3

mode = sys.argv[1]
real_create, real_swap = s3.S3Container._create, s3.S3Container.swap


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def create(self, key, data):
    out = real_create(self, key, data)
    if mode == "task-created" and key == "tasks/t5/task":
        die()
    return out


def swap(self, key, data, expected):
    if mode == "ref-swap" and key == "tasks/t5/refs/main" and b'"checkpoint_id":"' in data:
        die()  # not the lease's fence raise (checkpoint_id null)
    return real_swap(self, key, data, expected)


s3.S3Container._create, s3.S3Container.swap = create, swap
sys.argv = ["overnight", *sys.argv[2:]]
runpy.run_module("overnight", run_name="__main__", alter_sys=True)
'''


@pytest.mark.slow  # real CLI processes against the S3 server
@pytest.mark.parametrize("when", ["task-created", "ref-swap"])
def test_a_run_killed_inside_its_first_s3_commit_is_started_by_the_next_run(s3_endpoint, tmp_path, when):
    """What ``file://`` does (``tests/test_file_store_faults.py``), on ``s3://``: the records a
    killed first commit left are no task; ``resume`` says to run it, the next ``run`` starts it."""
    import json
    import signal
    import subprocess
    import sys

    from _procs import THREE_STEPS, cli, env

    (tmp_path / "t5.py").write_text(THREE_STEPS)
    (tmp_path / "killer.py").write_text(S3_KILLER)
    url = _url(s3_endpoint)
    prefix = parse_url(url)["prefix"]
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    killed = subprocess.run([sys.executable, "killer.py", when, "run", "t5.py", "--store", url], cwd=tmp_path,
                            env=env(), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the kill landed where it was aimed: the task record is there, no ref names a checkpoint
    leftover = client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}tasks/t5/task")["Body"].read()
    ref = json.loads(client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}tasks/t5/refs/main")["Body"].read())
    assert ref["checkpoint_id"] is None and ref["fence"] >= 1

    def ok(proc, *codes):
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in codes, (proc.returncode, proc.stdout, proc.stderr)
        return proc

    resumed = ok(cli("resume", "t5", "--store", url, cwd=tmp_path), 2)
    assert "overnight run t5.py" in resumed.stderr and "no branch" not in resumed.stderr
    assert "t5" not in ok(cli("ls", "--store", url, cwd=tmp_path), 0).stdout
    run = ok(cli("run", "t5.py", "--store", url, cwd=tmp_path), 0)
    assert "created task t5" in run.stderr
    ok(cli("verify", "t5", "--store", url, cwd=tmp_path), 0)
    listed = ok(cli("ls", "--store", url, cwd=tmp_path), 0)
    assert "t5" in listed.stdout and "complete" in listed.stdout
    ok(cli("resume", "t5", "--store", url, cwd=tmp_path), 0)
    # the registration is the one of the run that committed, not the interrupted run's leftover
    assert client.get_object(Bucket=S3_BUCKET, Key=f"{prefix}tasks/t5/task")["Body"].read() != leftover


def test_the_records_of_an_interrupted_first_s3_commit_are_no_task_and_the_next_commit_replaces_them(s3_endpoint):
    """The state the kill leaves, written through the container as a first commit writes it: a
    lease's fence on the ref, the task and checkpoint records, no ref move."""
    from overnight.errors import TaskNotFound
    from overnight.store import layout

    store = S3Store(_url(s3_endpoint))
    lease = store.acquire_lease("t", "main", "h1", "{}", 60_000)
    old_task = TaskRow("t", "2026-11-30T00:00:00+00:00", "old goal", "old.py:task", b"{}")
    lost = _row("t", None, 0, "the interrupted run's")
    store._c.create_many({layout.task_key("t"): layout.encode_task(old_task),
                          layout.checkpoint_key(lost.checkpoint_id): layout.encode_checkpoint(lost, 0, [])})
    assert store.read_lease("t", "main").token == lease.token and store.get_ref("t", "main") is None
    with pytest.raises(TaskNotFound) as err:
        store.get_task("t")
    assert "overnight run old.py:task" in (err.value.hint or "")
    assert store.list_tasks() == [] and store.list_refs("t") == {} and store.list_checkpoints("t") == []

    new_task = TaskRow("t", "2026-11-30T00:00:05+00:00", "new goal", "new.py:task", b"{}")
    first = _row("t", None, 0)
    store.commit(Commit(first, None, [], [], lease, new_task))
    assert store.get_task("t") == new_task
    assert [t.task_id for t in store.list_tasks()] == ["t"]
    assert store.get_ref("t", "main") == first.checkpoint_id
    # a task whose every branch was deleted stays a task (its index remembers the old heads)
    store.set_ref("t", "main", None, first.checkpoint_id)
    assert store.get_task("t") == new_task and [t.task_id for t in store.list_tasks()] == ["t"]
    store.close()
