"""Lease holders: who holds a task, and whether that holder is provably gone.

A lease expires after its TTL (default 30 s, renewed by a heartbeat every TTL/3). A holder on
*this* host whose process no longer exists -- checked by pid and the process start time from
``/proc/<pid>/stat``, so a recycled pid is not mistaken for the holder -- is gone at once: after
a ``kill -9`` the next run resumes immediately instead of waiting out the TTL. A holder on
another host is only ever taken over after expiry.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass

DEFAULT_TTL_MS = 30_000


def now_ms() -> int:
    """Unix time in milliseconds."""
    return int(time.time() * 1000)


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, starttime)`` of a live pid from ``/proc/<pid>/stat``, or None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # fields after the parenthesised command name: 3 (state) ... 22 (starttime)
    rest = stat.rsplit(")", 1)[-1].split()
    return (rest[0], rest[19]) if len(rest) > 19 else None


def _proc_start(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


@dataclass(frozen=True)
class Holder:
    """A process that holds (or wants) a lease."""

    id: str
    host: str
    pid: int
    started: str | None
    command: str

    @classmethod
    def current(cls) -> "Holder":
        """This process, with a fresh holder id."""
        return cls(
            id=uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=_proc_start(os.getpid()),
            command=" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200],
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Holder | None":
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):
            return None

    def describe(self) -> str:
        """``pid 1234 on host-a (overnight run demo.py)``."""
        return f"pid {self.pid} on {self.host} ({self.command})"

    def is_gone(self) -> bool:
        """True only when the holder is on this host and its process provably no longer runs.

        On Linux a pid whose start time differs from the recorded one is a recycled pid, and a
        zombie (killed, not yet reaped) counts as gone; elsewhere ``kill(pid, 0)`` decides.
        """
        if self.host != socket.gethostname() or self.pid == os.getpid():
            return False
        if os.path.isdir("/proc/self"):
            stat = _proc_stat(self.pid)
            if stat is None or stat[0] in ("Z", "X"):
                return True
            return self.started is not None and stat[1] != self.started
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def describe_holder(holder_json: str) -> str:
    holder = Holder.from_json(holder_json)
    return holder.describe() if holder else holder_json


def can_take_over(holder_json: str, expires_at_ms: int, now: int) -> bool:
    """May a new holder take a lease currently recorded as ``holder_json`` until ``expires_at_ms``?"""
    if expires_at_ms <= now:
        return True
    holder = Holder.from_json(holder_json)
    return holder is not None and holder.is_gone()
