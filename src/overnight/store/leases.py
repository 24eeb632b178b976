"""Lease holders: who holds a task, and whether that holder is provably gone.

A lease expires after its TTL (default 30 s, renewed by a heartbeat every TTL/3). A holder on
*this* host whose process no longer exists -- checked by pid and the process start time from
``/proc/<pid>/stat``, so a recycled pid is not mistaken for the holder -- is gone at once: after
a ``kill -9`` the next run resumes immediately instead of waiting out the TTL. A holder on
another host -- or in another boot of this host, or another pid namespace (a container sharing
the host name) -- is only ever taken over after expiry.

The holder record is readable by everyone who can read the store (``TaskBusy`` messages show it):
it names the program and its arguments with URL passwords and secret-looking options masked.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass

DEFAULT_TTL_MS = 30_000

MAX_LEASE_AHEAD_MS = 3_600_000
"""A lease recorded as expiring more than this far in the future (1 h; overnight writes at most
10 min) was written by a wrong clock or by hand: it is treated as expired rather than blocking the
task for that long. Fencing tokens keep a holder that is in fact alive from committing over the
taker's work."""


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


def process_gone(host: str, pid: int, started_ms: int) -> bool:
    """True only when the process ``pid`` on ``host``, started at ``started_ms`` (ms since the
    epoch), provably no longer runs: ``host`` is this machine's name and, in its ``/proc``, that pid
    is not running, is a zombie, or started more than 2 s after ``started_ms`` (a recycled pid).
    Another host, this process, or no ``/proc``: False (the caller goes by heartbeat age). Used
    for ``overnight workers``, whose rows carry host, pid and start time but not the boot or pid
    namespace a lease holder records (:meth:`Holder.is_gone`)."""
    if host != socket.gethostname() or pid == os.getpid() or not os.path.isdir("/proc/self"):
        return False
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return True
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            boot_s = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        started_at_ms = (boot_s + int(stat[1]) / os.sysconf("SC_CLK_TCK")) * 1000
    except (OSError, ValueError, StopIteration):
        return False
    return started_at_ms > started_ms + 2000


def _boot_id() -> str | None:
    """This boot of this machine (Linux), so a pid from before a reboot is not looked up now."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    """Inode of this process's pid namespace (Linux): two containers can share a host name and pids."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@")
_SECRET_OPTION = re.compile(r"(?i)^--?[a-z0-9_-]*(key|token|secret|password|passwd)[a-z0-9_-]*$")


def redact_command(argv: list[str]) -> str:
    """The command line as a holder records it: program name, arguments; ``user:PASSWORD@`` in a
    URL becomes ``user:***@`` and the value of an option named like a key, token, secret or
    password becomes ``***``. At most 200 characters."""
    out: list[str] = []
    hide_next = False
    for i, arg in enumerate(argv):
        if i == 0:
            out.append(os.path.basename(arg))
            continue
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name, eq, value = arg.partition("=")
        if _SECRET_OPTION.match(name):
            if eq:
                out.append(f"{name}=***")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(_URL_PASSWORD.sub(r"\g<head>***@", arg))
    return " ".join(out)[:200]


@dataclass(frozen=True)
class Holder:
    """A process that holds (or wants) a lease."""

    id: str
    host: str
    pid: int
    started: str | None
    command: str
    boot: str | None = None
    pidns: str | None = None

    @classmethod
    def current(cls) -> "Holder":
        """This process, with a fresh holder id."""
        return cls(
            id=uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=_proc_start(os.getpid()),
            command=redact_command(sys.argv),
            boot=_boot_id(),
            pidns=_pid_namespace(),
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
        """True only when the holder is on this host, in this boot and pid namespace, and its
        process provably no longer runs.

        On Linux a pid whose start time differs from the recorded one is a recycled pid, and a
        zombie (killed, not yet reaped) counts as gone; elsewhere ``kill(pid, 0)`` decides.
        """
        if self.host != socket.gethostname() or self.pid == os.getpid():
            return False
        if self.boot != _boot_id() or self.pidns != _pid_namespace():
            return False  # another boot or container: its pids mean nothing here; wait for expiry
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


MAX_TOKEN = 2 ** 63 - 1
"""The largest fencing token SQLite's INTEGER and PostgreSQL's bigint hold."""


def next_token(task_id: str, branch: str, token: int) -> int:
    """The fencing token after ``token`` (every acquisition takes the next one).

    Raises:
        SchemaError: ``token`` is already :data:`MAX_TOKEN` (no process takes 2^63 leases: a store
            writer set it), naming the task and branch -- a fencing token must grow, so there is
            no lease to take.
    """
    if token >= MAX_TOKEN:
        from overnight.errors import SchemaError

        raise SchemaError(f"the lease of task {task_id!r} branch {branch!r} has fencing token {token}, the largest "
                          "a store holds: no next token (a store writer set it)", task_id=task_id,
                          hint="delete the lease row (leases table, this task and branch) once no run holds it; "
                               "its next acquisition starts the tokens again")
    return token + 1


def describe_holder(holder_json: str) -> str:
    holder = Holder.from_json(holder_json)
    return holder.describe() if holder else holder_json


def can_take_over(holder_json: str, expires_at_ms: int, now: int) -> bool:
    """May a new holder take a lease currently recorded as ``holder_json`` until ``expires_at_ms``?"""
    if expires_at_ms <= now or expires_at_ms - now > MAX_LEASE_AHEAD_MS:
        return True
    holder = Holder.from_json(holder_json)
    return holder is not None and holder.is_gone()


MAX_OUTCOME_CHARS = 500
"""An ended holder's outcome is kept to this many characters (the rest is the run's own output)."""


def released_holder(outcome: str | None) -> str:
    """The ``holder`` text of a released lease: ``{}``, or ``{"ended": OUTCOME}`` (at most
    :data:`MAX_OUTCOME_CHARS` characters, on one line) when its holder says why it ended
    (``failed: REASON``)."""
    if not outcome:
        return "{}"
    return json.dumps({"ended": " ".join(outcome.split())[:MAX_OUTCOME_CHARS]})


def ended(holder_json: str) -> str | None:
    """The outcome a released lease's last holder left (:func:`released_holder`), or None."""
    try:
        value = json.loads(holder_json)
    except (ValueError, TypeError):
        return None
    text = value.get("ended") if isinstance(value, dict) else None
    return text if isinstance(text, str) else None
