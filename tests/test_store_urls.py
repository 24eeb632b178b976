"""``open_store(url)``: every scheme dispatches to its backend; malformed URLs are ConfigErrors."""

from __future__ import annotations

import pytest

from overnight.errors import ConfigError
from overnight.store import open_store
from overnight.store.file import FileStore
from overnight.store.sqlite import SQLiteStore


def test_local_schemes(tmp_path):
    for url, cls in ((f"sqlite://{tmp_path / 'a.db'}", SQLiteStore), (str(tmp_path / "b.sqlite"), SQLiteStore),
                     (f"file://{tmp_path / 'dir'}", FileStore), (f"FILE://{tmp_path / 'dir2'}", FileStore)):
        store = open_store(url)
        assert isinstance(store, cls)
        store.close()


@pytest.mark.parametrize("url", [
    "sqlite://", "file://", "file://dir?x=1", "ftp://host/x", "redis://localhost", "notes.txt", "",
    "postgresql://h/db?schema=bad-name", "s3://Bad_Bucket/x",
])
def test_malformed_urls_are_config_errors_with_a_hint(url):
    with pytest.raises(ConfigError) as err:
        open_store(url)
    assert err.value.hint


def test_server_schemes_dispatch(pg_schema, s3_endpoint):
    from overnight.store.postgres import PostgresStore
    from overnight.store.s3 import S3Store

    server, schema = pg_schema
    for url, cls in ((f"{server}?schema={schema}", PostgresStore),
                     (server.replace("postgresql://", "postgres://") + f"?schema={schema}", PostgresStore),
                     (f"s3://overnight-test/urls?endpoint_url={s3_endpoint}", S3Store)):
        store = open_store(url)
        assert isinstance(store, cls) and store.url == url
        store.close()


def test_messages_and_config_mask_a_password_in_a_store_url(monkeypatch, tmp_path):
    from overnight.config import load
    from overnight.store import location

    assert location("postgresql://app:s3cr3t@db.example:5432/ops?schema=x") == \
        "postgresql://app:***@db.example:5432/ops?schema=x"
    assert location("postgresql://app@db.example/ops") == "postgresql://app@db.example/ops"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OVERNIGHT_MEDIA_DATABASE", "postgresql://app:s3cr3t@db.example/ops")
    shown = {k: v for k, v, _ in load().shown()}
    assert shown["media.database"] == "postgresql://app:***@db.example/ops"
    assert "s3cr3t" not in repr(shown)
