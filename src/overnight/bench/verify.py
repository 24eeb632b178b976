"""``overnight bench verify``: how long ``overnight verify --all`` takes on a large store.

Builds one task with ``checkpoints`` steps; each step writes a new artifact so the store holds
``mb`` MB of distinct artifact content (text-like bytes, so zstd has work to do), then runs the
full check -- every record, state, artifact blob and stored object -- and reports the time and
the throughput in MB/s of artifact content hashed. The baseline, measured in the same run, is
``hashlib.sha256`` over as many bytes held in memory (1 MB buffers): the floor of any check that
re-hashes content, with no read, decompression or parsing.
"""

from __future__ import annotations

import hashlib
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from overnight.bench.commit import message_text
from overnight.runtime.runner import Runner
from overnight.runtime.task import Task
from overnight.store.sqlite import SQLiteStore
from overnight.verify.fsck import verify_store


@dataclass
class VerifyBench:
    """Result of :func:`run_verify_bench`."""

    checkpoints: int
    artifact_mb: float
    store_mb: float
    build_s: float
    verify_s: float
    bytes_verified: int
    problems: int
    sha256_mbps: float

    @property
    def mbps(self) -> float:
        """Verification throughput: MB (1e6 bytes) of content hashed per second."""
        return self.bytes_verified / 1e6 / self.verify_s if self.verify_s else float("inf")

    def to_json(self) -> dict[str, float | int]:
        return {"checkpoints": self.checkpoints, "artifact_mb": round(self.artifact_mb, 3),
                "store_mb": round(self.store_mb, 3), "build_s": round(self.build_s, 3),
                "verify_s": round(self.verify_s, 3), "bytes_verified": self.bytes_verified,
                "mbps": round(self.mbps, 3), "sha256_mbps": round(self.sha256_mbps, 3),
                "vs_sha256": round(self.mbps / self.sha256_mbps, 5), "problems": self.problems}

    def markdown(self) -> str:
        mbps = self.mbps
        return "\n".join([
            f"verify --all on {self.checkpoints} checkpoints, {self.artifact_mb:.0f} MB of artifacts "
            f"({self.store_mb:.0f} MB stored after zstd)",
            "",
            "| phase | seconds | throughput |",
            "|---|---:|---:|",
            f"| build (run {self.checkpoints} steps) | {self.build_s:.1f} | "
            f"{self.artifact_mb / self.build_s:.0f} MB/s written |",
            f"| verify --all | {self.verify_s:.1f} | {mbps:.0f} MB/s hashed ({self.bytes_verified / 1e6:.0f} MB), "
            f"{mbps / self.sha256_mbps:.2f}x the floor |",
            f"| floor: sha256 in memory | {self.bytes_verified / 1e6 / self.sha256_mbps:.2f} | "
            f"{self.sha256_mbps:.0f} MB/s |",
            "",
            f"problems found: {self.problems}",
        ])


def run_verify_bench(checkpoints: int = 1000, mb: float = 100.0, directory: Path | None = None) -> VerifyBench:
    """Build the store and time the full verification; see the module docstring."""
    per_step = int(mb * 1e6 / checkpoints)
    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-verify-", dir=base) as tmp:
        path = Path(tmp) / "store.db"
        task = Task("bench-verify", goal="many checkpoints, many artifacts")

        @task.step
        def plan(ctx):
            for i in range(checkpoints - 1):
                ctx.add_step("write", i=i)

        @task.step(planned=False)
        def write(ctx, i):
            ctx.write_text(f"artifacts/{i:05d}.txt", message_text(random.Random(i), per_step))

        t0 = time.perf_counter()
        store = SQLiteStore(path)
        try:
            Runner(task, store, handle_signals=False).run()
            build_s = time.perf_counter() - t0
            store_mb = store.stored_bytes() / 1e6
            t1 = time.perf_counter()
            report = verify_store(store, all_objects=True)
            verify_s = time.perf_counter() - t1
        finally:
            store.close()
        return VerifyBench(checkpoints, per_step * (checkpoints - 1) / 1e6, store_mb, build_s, verify_s,
                           report.bytes_verified, len(report.problems), sha256_mbps(report.bytes_verified))


def sha256_mbps(nbytes: int) -> float:
    """``hashlib.sha256`` throughput (MB/s) over ``nbytes`` (at least 1 MB) hashed in 1 MB buffers."""
    buf = bytes(range(256)) * 4096
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(max(1, nbytes // len(buf))):
        h.update(buf)
    elapsed = time.perf_counter() - t0
    return max(1, nbytes // len(buf)) * len(buf) / 1e6 / elapsed
