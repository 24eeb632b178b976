"""Peak resident memory of the calling process, measured so a parent's size does not leak in.

``getrusage(RUSAGE_SELF).ru_maxrss`` (and ``wait4``'s for a child) is not the process's own peak on
Linux: ``execve`` carries the high-water mark of the address space it replaces into the new
program's, so a child started by a 300 MB benchmark process reports >= 300 MB however little it
used (``fork``/``vfork`` + ``exec``, measured: a child whose own peak was 9 MB reported 311 MB).
The kernel's ``VmHWM`` in ``/proc/self/status`` is the peak of the current address space alone.
"""

from __future__ import annotations

import os
import resource
import sys

MARK = "overnight-bench-peak-rss-kb"
"""The line prefix :func:`report` writes and :func:`parse` reads."""


def peak_rss_kb() -> int:
    """Peak resident memory of this process since its program started, in KiB: ``VmHWM`` on Linux,
    else ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def report(fd: int = 1) -> None:
    """Write ``MARK <KiB>`` as one line to file descriptor ``fd`` (unbuffered: safe before ``os._exit``)."""
    os.write(fd, f"{MARK} {peak_rss_kb()}\n".encode("ascii"))


def parse(output: str) -> float | None:
    """The peak (MB) a child wrote with :func:`report` in ``output``; None when it wrote none."""
    for line in output.splitlines():
        if line.startswith(MARK + " "):
            return int(line.split()[1]) / 1024
    return None
