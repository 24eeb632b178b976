"""S3 backend: ``s3://BUCKET/PREFIX`` on AWS S3 or any S3-compatible server (boto3).

Options (URL query): ``endpoint_url=http://127.0.0.1:9000`` (else ``$OVERNIGHT_S3_ENDPOINT_URL``,
else AWS), ``region=NAME`` (else ``$AWS_REGION`` / ``$AWS_DEFAULT_REGION``, else ``us-east-1``),
``conditional_writes=auto|require|off`` (default ``auto``). Credentials come from the usual AWS
sources (environment, profile, instance role). The bucket must exist.

The layout is :mod:`overnight.store.layout` (one S3 object per record, under ``PREFIX/``); the
algorithm is :class:`~overnight.store.keyed.KeyedStore`. This module supplies its two write
primitives:

* **write once** (objects, checkpoints, task records, index entries): ``PutObject`` with
  ``If-None-Match: *``; a 412 means the key exists (the first bytes win). Objects larger than
  8 MiB go up as a multipart upload of 8 MiB parts whose ``CompleteMultipartUpload`` carries the
  same condition.
* **compare-and-swap** (refs, leases): ``PutObject`` with ``If-Match: <ETag read>`` (or
  ``If-None-Match: *`` for a new key); a 412 (or 409, a concurrent conditional write) means another
  writer got there first.
* **refresh** (a commit meets an object that exists): ``CopyObject`` of the key onto itself with
  ``MetadataDirective: REPLACE``, which gives it a new ``LastModified`` (the object's stored time);
* **delete with a minimum age**: ``HeadObject`` (``LastModified`` against the response's ``Date``,
  both the server's clock), then ``DeleteObject``. S3 cannot make these one step; the gap is one
  round trip, and a commit that refreshed the object inside it finds it gone when it checks again
  after its ref swap and writes it back (:mod:`overnight.store.keyed`).

**Guarantees, by server.** When the store opens, it probes the server once per endpoint and bucket
(a throw-away key under ``PREFIX/.overnight-probe/``): a second ``PutObject`` with ``If-None-Match: *``
must be refused, and one with a wrong ``If-Match`` too. A server that refuses both, as AWS S3 has
since 2024 (and moto, MinIO, Cloudflare R2), gives the full ``Store`` contract: refs and leases move
by atomic compare-and-swap, so two processes -- on any machines -- never both advance a branch from
the same head, and a process that lost its lease cannot commit (fencing).

A server that ignores or rejects the headers (many older S3 clones silently ignore them) runs in
*fallback* mode, with a warning (``conditional_writes=require`` refuses to open instead):

* objects and records are still written once: ``HeadObject``, then ``PutObject`` only if absent
  (two writers racing on one new digest both write it -- the same bytes, content-addressed);
* ref and lease updates are compare-then-write, serialized **within one process** by a lock per
  key, so the threads of one process never fork a branch;
* **across processes there is no compare-and-swap**: two processes that commit to one branch at the
  same instant may both succeed, and the later write wins the ref (the other checkpoint stays
  stored and verifiable, off the branch); two processes may both take an expired lease. Use such a
  server with one writer process per task at a time, or use ``postgresql://`` as the coordinator.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qsl, urlsplit

import boto3
import botocore.config
import botocore.exceptions

from overnight.store.base import MinAge, age_limit
from overnight.errors import ConfigError
from overnight.store.refusal import unreachable
from overnight.store import layout
from overnight.store.keyed import KeyedStore

MULTIPART_THRESHOLD = 8 * 1024 * 1024  # objects larger than this go up in parts
PART_SIZE = 8 * 1024 * 1024
_MODES = ("auto", "require", "off")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_CONFLICT = (409, 412)
_CONFIG_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                 "InvalidBucketName", "AllAccessDisabled", "PermanentRedirect", "AuthorizationHeaderMalformed"}

_session: Any = None
_session_lock = threading.Lock()
# (endpoint, bucket) -> (supported, reason): the probe runs once per process
_probed: dict[tuple[str | None, str], tuple[bool, str]] = {}
_probed_lock = threading.Lock()
# fallback mode: one lock per (endpoint, bucket, key), shared by every store of this process
_key_locks: dict[tuple[str | None, str, str], threading.Lock] = {}
_key_locks_guard = threading.Lock()


def _status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _server_now(response: dict[str, Any]) -> datetime:
    """The server's clock from a response's ``Date`` header (the local clock if it has none)."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        try:
            return parsedate_to_datetime(date)
        except (TypeError, ValueError):
            pass
    return datetime.now(timezone.utc)


def _age_ms(now: datetime, last_modified: datetime) -> int:
    """Milliseconds from ``last_modified`` to ``now``, never negative. Both have 1 s resolution, so
    one second is taken off: an age is never overstated."""
    return max(0, int((now - last_modified).total_seconds() * 1000) - 1000)


def parse_url(url: str) -> dict[str, Any]:
    """``{bucket, prefix, endpoint_url, region, mode}`` from ``s3://BUCKET/PREFIX?...``; raises ConfigError."""
    parts = urlsplit(url)
    usage = "use s3://BUCKET[/PREFIX][?endpoint_url=URL&region=NAME&conditional_writes=auto|require|off]"
    bucket = parts.netloc
    if parts.scheme != "s3" or not _BUCKET.match(bucket or "") or ".." in bucket:
        raise ConfigError(f"malformed S3 store URL {url!r}: bucket {bucket!r} is not a valid bucket name", hint=usage)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = set(query) - {"endpoint_url", "region", "conditional_writes"}
    if unknown:
        raise ConfigError(f"S3 store URL {url!r} has unknown option(s) {sorted(unknown)}", hint=usage)
    mode = query.get("conditional_writes", "auto")
    if mode not in _MODES:
        raise ConfigError(f"S3 store URL {url!r}: conditional_writes must be one of {', '.join(_MODES)}", hint=usage)
    endpoint = query.get("endpoint_url") or os.environ.get("OVERNIGHT_S3_ENDPOINT_URL") or None
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise ConfigError(f"S3 endpoint {endpoint!r} must be an http:// or https:// URL", hint=usage)
    prefix = parts.path.strip("/")
    if "//" in prefix:
        raise ConfigError(f"S3 store URL {url!r}: the prefix has an empty path segment", hint=usage)
    region = query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return {"bucket": bucket, "prefix": prefix + "/" if prefix else "", "endpoint_url": endpoint,
            "region": region, "mode": mode}


def probe_conditional_writes(client: Any, bucket: str, prefix: str) -> tuple[bool, str]:
    """Does the server honour ``If-None-Match: *`` and ``If-Match`` on PutObject? ``(yes, why)``.

    Writes, overwrites and deletes one throw-away key under ``PREFIX/.overnight-probe/``.
    """
    key = f"{prefix}.overnight-probe/{uuid.uuid4().hex}"
    client.put_object(Bucket=bucket, Key=key, Body=b"probe")
    try:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"probe-2", IfNoneMatch="*")
            return False, "the server accepted If-None-Match: * on an existing key (it ignores the header)"
        except botocore.exceptions.ClientError as exc:
            if _status(exc) not in _CONFLICT:
                return False, f"the server refused If-None-Match: * ({_code(exc) or _status(exc)})"
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"probe-3", IfMatch='"' + "0" * 32 + '"')
            return False, "the server accepted a wrong If-Match ETag (it ignores the header)"
        except botocore.exceptions.ClientError as exc:
            if _status(exc) not in _CONFLICT:
                return False, f"the server refused If-Match ({_code(exc) or _status(exc)})"
        return True, "PutObject honours If-None-Match and If-Match"
    finally:
        client.delete_object(Bucket=bucket, Key=key)


class S3Container:
    """A bucket prefix as a :class:`~overnight.store.keyed.Container` (see the module docstring).

    Args:
        client: a boto3 S3 client.
        bucket, prefix: where the store lives (``prefix`` is empty or ends with ``/``).
        conditional: use conditional writes (True) or the fallback (False).
        endpoint: the endpoint URL, to share fallback locks between stores on one server.
    """

    def __init__(self, client: Any, bucket: str, prefix: str, *, conditional: bool, endpoint: str | None) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.conditional = conditional
        self.endpoint = endpoint
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="overnight-s3")

    def _call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """Call the client, turning configuration problems into :class:`ConfigError`."""
        try:
            return fn(Bucket=self.bucket, **kwargs)
        except botocore.exceptions.ClientError as exc:
            code, status, op = _code(exc), _status(exc), getattr(exc, "operation_name", "?")
            if code in _CONFIG_CODES:
                raise ConfigError(f"S3 bucket {self.bucket!r}: {code}: {exc.response['Error'].get('Message', '')}",
                                  hint="check the bucket name, that it exists, and the AWS credentials") from exc
            if status >= 500:
                raise unreachable(f"s3://{self.bucket}/{self.prefix}", f"the S3 endpoint answered {status} to {op}",
                                  hint="the server failed or is overloaded; run the command again once it "
                                  "answers") from exc
            if (not code or code.isdigit()) and status not in (409, 412) and op not in ("GetObject", "HeadObject"):
                # no S3 error document: whatever answered is not an S3 server (or not this bucket's)
                raise ConfigError(f"S3 bucket {self.bucket!r}: the endpoint answered {status} to {op} without an "
                                  f"S3 error (is {self.endpoint or 'the default endpoint'} an S3 server?)",
                                  hint="check endpoint_url / OVERNIGHT_S3_ENDPOINT_URL and the bucket name") from exc
            raise
        except botocore.exceptions.NoCredentialsError as exc:
            raise ConfigError("no AWS credentials found for the S3 store",
                              hint="set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or AWS_PROFILE") from exc
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectionClosedError) as exc:
            raise unreachable(f"s3://{self.bucket}/{self.prefix}", f"cannot reach the S3 endpoint: {exc}",
                              hint="check endpoint_url / OVERNIGHT_S3_ENDPOINT_URL and that the server runs; "
                              "run the command again once it answers") from exc

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _lock(self, key: str) -> threading.Lock:
        with _key_locks_guard:
            return _key_locks.setdefault((self.endpoint, self.bucket, self._key(key)), threading.Lock())

    # -- reads ------------------------------------------------------------------------------

    def read(self, key: str) -> tuple[bytes, str] | None:
        """``(data, ETag)``, None when the key does not exist. An object larger than
        :data:`~overnight.store.layout.MAX_KEY_BYTES` (the response's ``ContentLength``, checked
        before the body is read) was never written by this store: it reads as
        :data:`~overnight.store.layout.DAMAGED`, as the same plant does on ``file://``, and its body
        is never downloaded (no allocation of a planted size)."""
        try:
            r = self._call(self.client.get_object, Key=self._key(key))
        except botocore.exceptions.ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        with r["Body"] as body:
            if int(r.get("ContentLength") or 0) > layout.MAX_KEY_BYTES:
                return layout.DAMAGED, r["ETag"]
            data = body.read(layout.MAX_KEY_BYTES + 1)  # a server that sends more than it announced
            return (layout.DAMAGED if len(data) > layout.MAX_KEY_BYTES else data), r["ETag"]

    def _map(self, fn: Callable[[str], Any], keys: list[str]) -> list[Any]:
        return list(self._pool.map(fn, keys)) if len(keys) > 1 else [fn(k) for k in keys]

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(dict.fromkeys(keys))
        return {k: got[0] for k, got in zip(keys, self._map(self.read, keys)) if got is not None}

    def _etag(self, key: str) -> str | None:
        try:
            return self._call(self.client.head_object, Key=self._key(key))["ETag"]
        except botocore.exceptions.ClientError as exc:
            if _status(exc) == 404:
                return None
            raise

    def exists_many(self, keys: Iterable[str]) -> set[str]:
        keys = list(dict.fromkeys(keys))
        return {k for k, etag in zip(keys, self._map(self._etag, keys)) if etag is not None}

    def _pages(self, **kwargs: Any) -> Iterator[dict]:
        """``list_objects_v2`` pages, with the errors of :meth:`_call` typed the same way."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kwargs)
        it = iter(pages)
        while True:
            try:
                page = self._call(lambda Bucket: next(it))
            except StopIteration:
                return
            yield page

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix + "/" if prefix else "")
        names = []
        for page in self._pages(Prefix=full, Delimiter="/"):
            names.extend(p["Prefix"][len(full):].rstrip("/") for p in page.get("CommonPrefixes", []))
            names.extend(o["Key"][len(full):] for o in page.get("Contents", []))
        return sorted(n for n in names if n)

    def occupied(self, prefix: str) -> bool:
        """Does the folder ``prefix`` hold any key? One ``ListObjectsV2`` of at most one key."""
        page = self._call(self.client.list_objects_v2, Prefix=self._key(prefix + "/" if prefix else ""), MaxKeys=1)
        return bool(page.get("Contents"))

    def size(self) -> int:
        total = 0
        for page in self._pages(Prefix=self.prefix):
            total += sum(o["Size"] for o in page.get("Contents", []))
        return total

    def stats(self, prefix: str) -> Iterator[tuple[str, int, int]]:
        full = self._key(prefix + "/" if prefix else "")
        for page in self._pages(Prefix=full):
            now = _server_now(page)
            for o in page.get("Contents", []):
                yield o["Key"][len(self.prefix):], int(o["Size"]), _age_ms(now, o["LastModified"])

    def _refresh(self, key: str) -> bool:
        try:
            self._call(self.client.copy_object, Key=self._key(key), CopySource={"Bucket": self.bucket,
                       "Key": self._key(key)}, MetadataDirective="REPLACE", Metadata={"refreshed": "1"})
            return True
        except botocore.exceptions.ClientError as exc:
            if _status(exc) == 404:
                return False
            raise

    def refresh(self, keys: Iterable[str]) -> set[str]:
        keys = list(dict.fromkeys(keys))
        return {k for k, ok in zip(keys, self._map(self._refresh, keys)) if not ok}

    def _delete_one(self, key: str, min_age_ms: MinAge | None) -> int | None:
        try:
            head = self._call(self.client.head_object, Key=self._key(key))
        except botocore.exceptions.ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        if min_age_ms is not None and _age_ms(_server_now(head), head["LastModified"]) < age_limit(min_age_ms):
            return None
        self._call(self.client.delete_object, Key=self._key(key))
        return int(head["ContentLength"])

    def delete(self, keys: Iterable[str], *, min_age_ms: MinAge | None = None) -> dict[str, int]:
        keys = list(dict.fromkeys(keys))
        sizes = self._map(lambda k: self._delete_one(k, min_age_ms), keys)
        return {k: n for k, n in zip(keys, sizes) if n is not None}

    # -- writes -----------------------------------------------------------------------------

    def _put(self, key: str, data: bytes, **condition: str) -> str | None:
        """PutObject (multipart above the threshold); None when the condition failed."""
        if len(data) > MULTIPART_THRESHOLD:
            return self._put_multipart(key, data, **condition)
        for attempt in range(20):
            try:
                return self._call(self.client.put_object, Key=self._key(key), Body=data, **condition)["ETag"]
            except botocore.exceptions.ClientError as exc:
                if _status(exc) == 409 and "IfNoneMatch" in condition and attempt < 19:
                    time.sleep(0.005 * (attempt + 1))  # another conditional write in flight: see who wins
                    continue
                if _status(exc) in _CONFLICT or (_status(exc) == 404 and "IfMatch" in condition):
                    return None
                raise
        return None  # pragma: no cover

    def _put_multipart(self, key: str, data: bytes, **condition: str) -> str | None:
        full = self._key(key)
        upload = self._call(self.client.create_multipart_upload, Key=full)["UploadId"]
        try:
            parts = []
            for number, offset in enumerate(range(0, len(data), PART_SIZE), start=1):
                r = self._call(self.client.upload_part, Key=full, UploadId=upload, PartNumber=number,
                               Body=data[offset : offset + PART_SIZE])
                parts.append({"ETag": r["ETag"], "PartNumber": number})
            r = self._call(self.client.complete_multipart_upload, Key=full, UploadId=upload,
                           MultipartUpload={"Parts": parts}, **condition)
            return r["ETag"]
        except botocore.exceptions.ClientError as exc:
            self._abort(full, upload)
            if _status(exc) in _CONFLICT:
                return None
            raise
        except BaseException:
            self._abort(full, upload)
            raise

    def _abort(self, full: str, upload: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload)
        except botocore.exceptions.BotoCoreError:
            pass
        except botocore.exceptions.ClientError:
            pass

    def _create(self, key: str, data: bytes) -> bool:
        if self.conditional:
            return self._put(key, data, IfNoneMatch="*") is not None
        if self._etag(key) is not None:
            return False
        self._put(key, data)
        return True

    def create_many(self, items: dict[str, bytes]) -> set[str]:
        keys = list(items)
        done = self._map(lambda k: self._create(k, items[k]), keys)
        return {k for k, created in zip(keys, done) if created}

    def swap(self, key: str, data: bytes, expected: str | None) -> str | None:
        if self.conditional:
            return self._put(key, data, **({"IfMatch": expected} if expected is not None else {"IfNoneMatch": "*"}))
        with self._lock(key):  # fallback: atomic within this process only (see the module docstring)
            if self._etag(key) != expected:
                return None
            return self._put(key, data)

    def publish(self, items: dict[str, bytes], key: str, data: bytes, expected: str | None,
                then: dict[str, bytes] | None = None) -> tuple[set[str], str | None]:
        created = self.create_many(items)  # each PutObject is durable when it returns
        version = self.swap(key, data, expected)
        if version is not None and then:
            self.create_many(then)
        return created, version

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class S3Store(KeyedStore):
    """:class:`~overnight.store.base.Store` under an S3 bucket prefix (see the module docstring).

    Args:
        url: ``s3://BUCKET[/PREFIX][?endpoint_url=URL&region=NAME&conditional_writes=auto|require|off]``.

    Attributes:
        conditional_writes: True when refs and leases move by atomic compare-and-swap on the
            server; False in fallback mode (single writer process per task; see the module docstring).
        conditional_writes_reason: what the probe found (or ``"conditional_writes=off"``).

    Raises:
        ConfigError: malformed URL, missing bucket, bad credentials, a prefix holding something
            else, or ``conditional_writes=require`` on a server without them.
        StoreUnavailable: the endpoint cannot be reached (refused, timed out); also from any later
            call when it goes away.
        StoreVersionError: the store was written by a newer overnight.
    """

    def __init__(self, url: str) -> None:
        opts = parse_url(url)
        self.bucket, self.prefix, self.endpoint_url = opts["bucket"], opts["prefix"], opts["endpoint_url"]
        config = botocore.config.Config(
            max_pool_connections=32,
            retries={"mode": "standard", "max_attempts": 5},
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        with _session_lock:  # one session per process: its service model loads once (boto3 sessions
            global _session  # are not thread-safe, the clients they make are)
            if _session is None:
                _session = boto3.session.Session()
            client = _session.client("s3", endpoint_url=self.endpoint_url, region_name=opts["region"], config=config)
        container = S3Container(client, self.bucket, self.prefix, conditional=False, endpoint=self.endpoint_url)
        try:
            if opts["mode"] == "off":
                self.conditional_writes, self.conditional_writes_reason = False, "conditional_writes=off"
            else:
                self.conditional_writes, self.conditional_writes_reason = self._probe(container)
                if not self.conditional_writes:
                    message = (f"S3 server for {url!r} does not support conditional writes "
                               f"({self.conditional_writes_reason})")
                    if opts["mode"] == "require":
                        raise ConfigError(message, hint="use a server with If-None-Match/If-Match on PutObject, "
                                                        "or conditional_writes=auto to accept the fallback")
                    warnings.warn(message + ": refs and leases are compare-and-swap only within one process; "
                                  "run one writer process per task", RuntimeWarning, stacklevel=3)
            container.conditional = self.conditional_writes
            super().__init__(container, url)
        except BaseException:
            container.close()
            raise

    def _probe(self, container: S3Container) -> tuple[bool, str]:
        key = (self.endpoint_url, self.bucket)
        with _probed_lock:
            if key not in _probed:
                _probed[key] = container._call(lambda Bucket: probe_conditional_writes(container.client, Bucket,
                                                                                       self.prefix))
            return _probed[key]
