"""``overnight bench agents-session``: OvernightSession against the SDK's own SQLiteSession.

Both sessions get the same conversation -- ``turns`` turns of two messages (a user message and an
assistant reply of about ``message_bytes`` bytes of prose each), one ``add_items`` per turn, as
the Agents SDK ``Runner`` writes them -- in SQLite files on the same disk, in the same run. Then
each reads the whole history (``get_items()``) and the last 20 items (``get_items(20)``), and
pops 20 items. Reported per operation: the median latency in milliseconds; and the bytes each
file holds at the end. ``SQLiteSession`` (the SDK's default, one JSON row per item, no history,
no verification) is the baseline of every ratio.
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

POPS = 20


@dataclass
class SessionBench:
    """Result of :func:`run_session_bench`: ``ms[system][operation]`` median milliseconds,
    ``stored_bytes[system]`` bytes on disk after the run."""

    turns: int
    message_bytes: int
    ms: dict[str, dict[str, float]] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)

    def markdown(self) -> str:
        base, ours = "SQLiteSession", "OvernightSession"
        rows = [f"{self.turns} turns x 2 messages of ~{self.message_bytes} B; median ms per operation "
                "(ratio: OvernightSession / SQLiteSession, same run)", "",
                f"| operation | {ours} | {base} | ratio |", "|---|---:|---:|---:|"]
        for op in self.ms[base]:
            a, b = self.ms[ours][op], self.ms[base][op]
            rows.append(f"| {op} | {a:.2f} | {b:.2f} | {a / b:.1f}x |")
        a, b = self.stored_bytes[ours], self.stored_bytes[base]
        rows.append(f"| bytes on disk at the end | {a:,} | {b:,} | {a / b:.1f}x |")
        return "\n".join(rows)


async def _measure(session: Any, turns: list[list[dict[str, str]]]) -> dict[str, float]:
    adds: list[float] = []
    for batch in turns:
        t0 = time.perf_counter()
        await session.add_items(batch)
        adds.append(time.perf_counter() - t0)
    out = {"add_items (one turn)": statistics.median(adds)}
    for label, limit in (("get_items() (all)", None), ("get_items(20)", 20)):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            items = await session.get_items(limit)
            times.append(time.perf_counter() - t0)
        assert len(items) == (limit or 2 * len(turns))
        out[label] = statistics.median(times)
    pops = []
    for _ in range(POPS):
        t0 = time.perf_counter()
        await session.pop_item()
        pops.append(time.perf_counter() - t0)
    out["pop_item"] = statistics.median(pops)
    return {k: v * 1000 for k, v in out.items()}


def _disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def run_session_bench(turns: int = 200, message_bytes: int = 400, directory: Path | None = None) -> SessionBench:
    """Run both sessions on the same conversation; see the module docstring.

    Args:
        turns: conversation turns (two items each).
        message_bytes: size of each message's text (bytes).
        directory: where the SQLite files go (default: a temporary directory under the cwd).
    """
    from agents import SQLiteSession

    from overnight.adapters.openai_agents import OvernightSession

    rng = random.Random(7)
    convo = [[{"role": "user", "content": message_text(rng, message_bytes)},
              {"role": "assistant", "content": message_text(rng, message_bytes)}] for _ in range(turns)]
    result = SessionBench(turns, message_bytes)
    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-agents-", dir=base) as tmp:
        for name in ("OvernightSession", "SQLiteSession"):
            where = Path(tmp) / name
            where.mkdir()
            if name == "SQLiteSession":
                session: Any = SQLiteSession("bench", str(where / "session.db"))
            else:
                session = OvernightSession("bench", store=f"sqlite://{where / 'store.db'}", signing_key=b"")
            result.ms[name] = asyncio.run(_measure(session, convo))
            session.close()
            result.stored_bytes[name] = _disk_bytes(where)
    return result
