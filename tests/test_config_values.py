"""Configuration values are checked when read: a value out of its range or a store URL with an
unknown scheme is refused (exit 2), naming the key, the value and the file or variable it came from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from overnight.config import load
from overnight.errors import ConfigError


@pytest.mark.parametrize("text, key, why", [
    ("[router]\nsession_hours = -3\n", "router.session_hours = -3.0", "greater than 0"),
    ("[router]\nsession_hours = 30\n", "router.session_hours = 30.0", "(24) must not be below router.session_hours (30)"),
    ("[router]\nmin_completeness = 1.5\n", "router.min_completeness = 1.5", "less than or equal to 1"),
    ("[lease]\nttl_ms = 5\n", "lease.ttl_ms = 5", "greater than or equal to 1000"),
    ("[lease]\nttl_ms = 2.5\n", "lease.ttl_ms = 2.5", "integer"),
    ('[store]\nurl = "sqlit://x.db"\n', "store.url = 'sqlit://x.db'", "scheme 'sqlit'"),
    ('[media]\ndatabase = "postgresql://"\n', "media.database", "names no path, host or bucket"),
    ('[criticality]\ncritical = []\n', "criticality.critical", "at least 1"),
    ('[criticality]\nnormal = ["tape"]\n', "criticality.normal", "unknown media ['tape']"),
])
def test_a_bad_value_is_refused_naming_key_value_and_file(tmp_path, monkeypatch, text, key, why):
    monkeypatch.delenv("OVERNIGHT_STORE", raising=False)
    monkeypatch.delenv("OVERNIGHT_CONFIG", raising=False)
    (tmp_path / "overnight.toml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load(tmp_path)
    assert key in err.value.message and why in err.value.message
    assert str(tmp_path / "overnight.toml") in err.value.message and err.value.hint


def test_an_environment_value_names_its_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("OVERNIGHT_CONFIG", raising=False)
    monkeypatch.setenv("OVERNIGHT_STORE", "ftp://host/x")
    with pytest.raises(ConfigError, match=r"\$OVERNIGHT_STORE: store.url = 'ftp://host/x'"):
        load(tmp_path)


def test_good_values_load_and_the_cli_refuses_bad_ones_with_exit_2(tmp_path, monkeypatch):
    monkeypatch.delenv("OVERNIGHT_STORE", raising=False)
    monkeypatch.delenv("OVERNIGHT_CONFIG", raising=False)
    (tmp_path / "overnight.toml").write_text('[router]\nsession_hours = 1\ndurable_hours = 4\n'
                                             '[lease]\nttl_ms = 60000\n[store]\nurl = "x.db"\n')
    cfg = load(tmp_path)
    assert cfg.get("router.session_hours") == 1.0 and cfg.get("lease.ttl_ms") == 60000
    (tmp_path / "overnight.toml").write_text("[router]\nsession_hours = -3\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OVERNIGHT_STORE", "OVERNIGHT_CONFIG")}
    done = subprocess.run([sys.executable, "-m", "overnight", "config"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "router.session_hours = -3.0" in done.stderr and "Traceback" not in done.stderr


def test_store_urls_in_messages_hide_a_password_in_the_userinfo_or_a_parameter():
    from overnight.config import mask_password

    assert mask_password("postgresql://u:hunter2@db/x?schema=s") == "postgresql://u:***@db/x?schema=s"
    assert mask_password("postgresql://db/x?schema=s&password=hunter2&sslmode=require") == \
        "postgresql://db/x?schema=s&password=***&sslmode=require"
    assert mask_password("postgresql://db/x?PASSWORD=hunter2") == "postgresql://db/x?PASSWORD=***"
