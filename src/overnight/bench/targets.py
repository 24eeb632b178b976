"""Issue 14's cost targets, each judged from one ``overnight bench perf`` run.

:func:`judge` turns the benchmarks of one :class:`~overnight.bench.perf.PerfReport` into one
:class:`Target` row per measured figure: the figure, the target it is held to, and whether it is
met. The targets and their sizes come from issue 14 ("Cost proportional to what changed"); a run at
other sizes (``--quick``) is judged against the same limits and says the size it measured at, so a
quick run's verdict is a hint, not the issue's figure.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """One judged figure.

    Attributes:
        number: the issue's target number (1-7).
        what: what is measured, with the size it was measured at.
        figure: the measured value, formatted with its unit (bytes, ms, MB/s, x for ratios).
        limit: the target, formatted the same way (``<= 1,200 B``).
        met: whether the figure meets the target.
        value, limit_value: the same two as numbers (bytes, ms, MB, MB/s or a ratio).
        at_most: the target is an upper bound (else a lower one).
    """

    number: int
    what: str
    figure: str
    limit: str
    met: bool
    value: float
    limit_value: float
    at_most: bool


def _ratio(x: float) -> str:
    return f"{x:.2f}x"


def judge(report: Any) -> list[Target]:
    """The targets measured in ``report`` (a :class:`~overnight.bench.perf.PerfReport`, which
    imports this module), in the issue's order; a benchmark the report lacks (left out, or not
    served: PostgreSQL) adds no row."""
    out: list[Target] = []

    def add(n: int, what: str, value: float, limit: float, fmt: Any, *, at_most: bool = True) -> None:
        sign = "<=" if at_most else ">="
        met = value <= limit if at_most else value >= limit
        out.append(Target(n, what, fmt(value), f"{sign} {fmt(limit)}", met, round(value, 4), limit, at_most))

    def bytes_(x: float) -> str:
        return f"{x:,.0f} B"

    def ms(x: float) -> str:
        return f"{x:,.1f} ms"

    def mb(x: float) -> str:
        return f"{x:,.0f} MB"

    if report.step_bytes is not None:
        sb = report.step_bytes
        trivial, large = sb.series[0], sb.series[-1]
        add(1, f"bytes per checkpoint, a step setting one small field ({sb.steps:,} steps, SQLite)",
            trivial.per_step, 1200, bytes_)
        add(1, f"a {sb.large_kb:.0f} KB value that never changes, bytes per step more", large.per_step - trivial.per_step,
            100, bytes_)
    if report.storage is not None:
        st = report.storage
        add(1, f"`bench storage` ({st.steps:,} steps): SqliteSaver bytes / overnight SQLite bytes",
            st.ratio(st.series[0]), 100, _ratio, at_most=False)
    if report.langgraph is not None:
        lg = report.langgraph
        o, t = lg.ours, lg.theirs
        med = statistics.median
        add(2, f"LangGraph ({lg.turns:,} turns): put median / SqliteSaver.put", med(o.turn_ms) / med(t.turn_ms), 0.5,
            _ratio)
        add(2, "LangGraph: get_tuple (verified) median / SqliteSaver.get_tuple", med(o.get_ms) / med(t.get_ms), 2.0,
            _ratio)
        add(2, "LangGraph: the whole invoke loop / with SqliteSaver", sum(o.invoke_ms) / sum(t.invoke_ms), 1.0, _ratio)
        add(2, "LangGraph: SqliteSaver bytes / overnight bytes", t.stored_bytes / o.stored_bytes, 100, _ratio,
            at_most=False)
    if report.session is not None:
        se = report.session
        for op, mine in se.ms["OvernightSession"].items():
            add(3, f"Agents SDK session ({se.turns:,} turns): {op} median / SQLiteSession",
                mine / se.ms["SQLiteSession"][op], 1.5, _ratio)
    process = report.resume_process
    if process is not None:
        first, last = process.lengths[0], process.lengths[-1]
        for probe, label in (("load + verify head", "load + verify head, done pages read as used (lazy)"),
                             ("load + what a resume checks", "load + verify head, with what a resume checks before "
                              "its first step (every done page hashed; parsed unless checked on this machine)")):
            at_last = process.median(probe, last)
            add(4, f"{label}, at {last:,} checkpoints (SQLite)", at_last, 5.0, ms)
            add(4, f"{label}: {last:,} checkpoints / {first:,}", at_last / process.median(probe, first), 2.0, _ratio)
        add(4, f"`overnight resume` to its first step at {last:,} checkpoints, CPU over a bare import",
            process.over_import(last, cpu=True), 150.0, ms)
    v = report.verify
    add(5, f"`verify --all`, MB/s of content ({v.checkpoints:,} checkpoints, {v.first.artifact_mb:.0f} MB)", v.mbps,
        150.0, lambda x: f"{x:,.0f} MB/s", at_most=False)
    add(5, "`verify --all`: peak RSS on the largest store / the smallest", v.rss_growth(), 1.2, _ratio)
    commits = {s.name: s.median for s in report.commit.series}
    if "overnight file" in commits and "overnight sqlite" in commits:
        add(6, f"`file://` commit median / SQLite store's ({report.commit.n} commits)",
            commits["overnight file"] / commits["overnight sqlite"], 3.0, _ratio)
    if process is not None:
        last = process.lengths[-1]
        add(7, f"peak RSS of `overnight resume` at {last:,} checkpoints", process.peak_rss("resume to first step", last),
            150.0, mb)
    if report.storage is not None:
        add(7, f"peak RSS of `bench storage` ({report.storage.steps:,} steps)", report.storage.peak_rss_mb, 300.0, mb)
    return out


INTRO = ("Issue 14, \"Cost proportional to what changed\": 1 bytes per checkpoint, 2 the LangGraph "
         "checkpointer against `SqliteSaver`, 3 the Agents SDK session against `SQLiteSession`, 4 resume in "
         "constant time, 5 `verify --all` at disk speed, 6 `file://` commits, 7 memory. Each figure is from "
         "this run, against a baseline measured in it; docs/perf.md says where the time and bytes go.")
"""What the targets table is, in one paragraph (above it in ``perf.md``)."""


def markdown(targets: list[Target]) -> str:
    """The targets as a Markdown table: target number, what, figure, limit, met."""
    lines = ["| # | measured | figure | target | met |", "|---:|---|---:|---:|:---:|"]
    lines += [f"| {t.number} | {t.what} | {t.figure} | {t.limit} | {'yes' if t.met else '**no**'} |" for t in targets]
    met = sum(t.met for t in targets)
    lines += ["", f"{met} of {len(targets)} figures meet their target."]
    return "\n".join(lines)


def to_json(targets: list[Target]) -> list[dict[str, Any]]:
    """The targets as JSON-ready dicts (the fields of :class:`Target`)."""
    return [asdict(t) for t in targets]
