"""``overnight bench agents-session``: OvernightSession against the SDK's own SQLiteSession.

Both sessions get the same conversation -- ``turns`` turns of two messages (a user message and an
assistant reply of about ``message_bytes`` bytes of prose each), one ``add_items`` per turn, as
the Agents SDK ``Runner`` writes them -- in SQLite files on the same disk, in the same run, taking
turns operation by operation (so a change in the machine's load hits both alike). Then each reads
the whole history (``get_items()``) and the last 20 items (``get_items(20)``), and pops 20 items.
Reported per operation: the median latency in milliseconds, wall and CPU time of the process; and
the bytes each file holds at the end. ``SQLiteSession`` (the SDK's default, one JSON row per item,
no history, no verification) is the baseline of every ratio.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.bench.commit import message_text
from overnight.errors import ConfigError

POPS = 20


@dataclass
class SessionBench:
    """Result of :func:`run_session_bench`: ``ms[system][operation]`` median milliseconds (wall),
    ``cpu_ms[system][operation]`` median CPU milliseconds of the process (every thread) over the
    operation, ``stored_bytes[system]`` bytes on disk after the run."""

    turns: int
    message_bytes: int
    ms: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)

    def markdown(self) -> str:
        base, ours = "SQLiteSession", "OvernightSession"
        rows = [f"{self.turns} turns x 2 messages of ~{self.message_bytes} B; median ms per operation "
                "(ratio: OvernightSession / SQLiteSession, same run); CPU: median CPU ms of the process "
                "(steadier than wall time on a loaded machine)", "",
                f"| operation | {ours} | {base} | ratio | CPU {ours} | CPU {base} | CPU ratio |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for op in self.ms[base]:
            a, b = self.ms[ours][op], self.ms[base][op]
            ca, cb = self.cpu_ms[ours][op], self.cpu_ms[base][op]
            rows.append(f"| {op} | {a:.2f} | {b:.2f} | {a / b:.1f}x | {ca:.2f} | {cb:.2f} | {ca / max(cb, 1e-3):.1f}x |")
        a, b = self.stored_bytes[ours], self.stored_bytes[base]
        rows.append(f"| bytes on disk at the end | {a:,} | {b:,} | {a / b:.1f}x | | | |")
        return "\n".join(rows)

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON-ready data: ``ms`` and ``cpu_ms`` (``{session: {operation: median}}``),
        ``stored_bytes``, and each operation's ratio (OvernightSession / SQLiteSession, wall)."""
        return {"turns": self.turns, "message_bytes": self.message_bytes, "ms": self.ms, "cpu_ms": self.cpu_ms,
                "stored_bytes": self.stored_bytes,
                "ratio": {op: round(ms / self.ms["SQLiteSession"][op], 4) for op, ms in self.ms["OvernightSession"].items()}}


async def _measure(sessions: dict[str, Any], turns: list[list[dict[str, str]]]) -> tuple[dict, dict]:
    """Median wall and CPU ms per operation of each session, two ``{name: {operation: ms}}``. The
    sessions take turns operation by operation (the first one first on even rounds, last on odd
    ones), so a change in the machine's load hits both alike."""
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for name in sessions}

    async def each(round_: int, label: str, op: Any) -> list[Any]:
        names = list(sessions) if round_ % 2 == 0 else list(sessions)[::-1]
        out = []
        for name in names:
            t0, c0 = time.perf_counter(), time.process_time()
            out.append(await op(sessions[name]))
            samples[name].setdefault(label, []).append((time.perf_counter() - t0, time.process_time() - c0))
        return out

    for i, batch in enumerate(turns):
        await each(i, "add_items (one turn)", lambda s, b=batch: s.add_items(b))
    for label, limit in (("get_items() (all)", None), ("get_items(20)", 20)):
        for i in range(5):
            for items in await each(i, label, lambda s, n=limit: s.get_items(n)):
                assert len(items) == (limit or 2 * len(turns))
    for i in range(POPS):
        await each(i, "pop_item", lambda s: s.pop_item())
    return tuple({name: {op: statistics.median(v[k] for v in vs) * 1000 for op, vs in ops.items()}  # type: ignore[return-value]
                  for name, ops in samples.items()} for k in (0, 1))


def _disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def run_session_bench(turns: int = 200, message_bytes: int = 400, directory: Path | None = None) -> SessionBench:
    """Run both sessions on the same conversation; see the module docstring.

    Args:
        turns: conversation turns (two items each).
        message_bytes: size of each message's text (bytes).
        directory: where the SQLite files go (default: a temporary directory under the cwd).

    Raises:
        ConfigError: ``turns`` < 10 (the bench pops 20 items and reads the last 20).
    """
    if turns < POPS // 2:
        raise ConfigError(f"bench agents-session needs at least {POPS // 2} turns ({POPS} items to pop), got {turns}")
    from agents import SQLiteSession

    from overnight.adapters.openai_agents import OvernightSession

    rng = random.Random(7)
    convo = [[{"role": "user", "content": message_text(rng, message_bytes)},
              {"role": "assistant", "content": message_text(rng, message_bytes)}] for _ in range(turns)]
    result = SessionBench(turns, message_bytes)
    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-agents-", dir=base) as tmp:
        dirs = {name: Path(tmp) / name for name in ("OvernightSession", "SQLiteSession")}
        for where in dirs.values():
            where.mkdir()
        sessions = {"OvernightSession": OvernightSession("bench", store=f"sqlite://{dirs['OvernightSession'] / 'store.db'}",
                                                         signing_key=b""),
                    "SQLiteSession": SQLiteSession("bench", str(dirs["SQLiteSession"] / "session.db"))}
        result.ms, result.cpu_ms = asyncio.run(_measure(sessions, convo))
        for name, session in sessions.items():
            session.close()
            result.stored_bytes[name] = _disk_bytes(dirs[name])
    return result
