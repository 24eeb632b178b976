"""Lease holders: when a holder is provably gone, and what a holder record reveals."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from overnight.store.leases import Holder, can_take_over, now_ms, redact_command


def _dead_holder() -> Holder:
    """A holder record of a process of this host that really ran and exited."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "from overnight.store.leases import Holder; print(Holder.current().to_json())"],
                            stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    holder = Holder.from_json(out.strip())
    assert holder is not None
    return holder


def test_a_dead_holder_on_this_host_is_taken_over_at_once_but_not_from_another_boot_or_container():
    dead = _dead_holder()
    far_future = now_ms() + 600_000
    assert dead.is_gone() and can_take_over(dead.to_json(), far_future, now_ms())
    for other in (dataclasses.replace(dead, boot="another-boot"), dataclasses.replace(dead, pidns="4026531999"),
                  dataclasses.replace(dead, host="another-host")):
        # its pid means nothing here: only expiry frees the lease
        assert not other.is_gone()
        assert not can_take_over(other.to_json(), far_future, now_ms())
        assert can_take_over(other.to_json(), now_ms() - 1, now_ms())


def test_a_live_holder_is_never_gone():
    me = Holder.current()
    other_live = dataclasses.replace(me, id="x", pid=1 if me.pid != 1 else 2)  # pid 1 runs as long as the machine
    assert not me.is_gone()
    started_now = Holder.from_json(other_live.to_json())
    assert started_now is not None and not dataclasses.replace(started_now, started=None).is_gone()


def test_holder_records_mask_passwords_and_secret_options():
    line = redact_command(["/usr/local/bin/overnight", "run", "job.py", "--store",
                           "postgresql://bob:s3cr3t@db:5432/test", "--api-key", "sk-live-123", "--token=abc",
                           "s3://bucket/p?endpoint_url=http://minio:minio123@127.0.0.1:9000", "--goal", "keep me"])
    for secret in ("s3cr3t", "sk-live-123", "abc", "minio123"):
        assert secret not in line
    assert line.startswith("overnight run job.py --store postgresql://bob:***@db:5432/test --api-key *** --token=***")
    assert "--goal keep me" in line


def test_a_lease_expiring_absurdly_far_ahead_does_not_block_the_task():
    """A wrong clock or a hand edit must not hold a task for days; fencing keeps the old holder
    (if alive) from committing after the takeover."""
    from overnight.store.leases import MAX_LEASE_AHEAD_MS

    live = Holder.current()
    other_host = dataclasses.replace(live, host="another-host")
    assert not can_take_over(other_host.to_json(), now_ms() + 60_000, now_ms())
    assert can_take_over(other_host.to_json(), now_ms() + MAX_LEASE_AHEAD_MS + 60_000, now_ms())
