"""Benchmarks' peak-memory figures are the measured process's own, not its parent's."""

import os
import subprocess
import sys

from overnight.bench import memory
from overnight.bench.resume_process import _timed


def test_a_child_reports_its_own_peak_not_the_size_of_the_process_that_started_it(tmp_path):
    ballast = bytearray(200 * 1024 * 1024)  # this process: > 200 MB resident
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    code = "from overnight.bench.memory import report; report()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    _, _, peak_mb = _timed([sys.executable, "-c", code], tmp_path, env)
    assert 5 < peak_mb < 100  # the child's own peak: an interpreter and one small module

    # what the kernel's rusage says for the same child: the parent's size leaks in (why memory exists)
    proc = subprocess.Popen([sys.executable, "-c", "pass"], env=env)
    _, _, usage = os.wait4(proc.pid, 0)
    assert usage.ru_maxrss / 1024 > 200
    del ballast


def test_parse_reads_the_reported_line_among_other_output():
    assert memory.parse(f"hello\n{memory.MARK} 20480\nbye\n") == 20.0
    assert memory.parse("no report here\n") is None
    assert memory.peak_rss_kb() > 1000
