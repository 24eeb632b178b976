"""The KPI report: Markdown tables with the claimed figure next to each measured one, the raw
trials as JSON, matplotlib plots, and ``report.md`` joining ``kpi.md`` with ``perf.md``.

Files written into the output directory by :func:`write_report`:

* ``kpi.md`` -- the tables of :func:`markdown` and honest notes;
* ``kpi.json`` -- :meth:`overnight.bench.kpi.KpiRun.to_json` (every trial, every session);
* ``kpi-continuation.png`` (continuation rate and wasted steps by configuration),
  ``kpi-latency.png`` (checkpoint overhead per step and resume latency by level, and overhead by
  medium), ``kpi-storage.png`` (stored bytes over steps);
* ``report.md`` -- ``kpi.md``, then ``perf.md`` when ``overnight bench perf`` wrote one there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from overnight.bench.kpi import CONFIGS, KpiRun

CLAIMED: dict[str, dict[str, str]] = {
    "naive": {"label": "single session (8k context, no persistence)", "continuation": "0 %",
              "wasted": "~4.3–4.5 per task", "failure": "context overflow 100 %", "latency": "—"},
    "session": {"label": "cross-session (snapshot + resume)", "continuation": "78–82 %", "wasted": "—",
                "failure": "snapshot distortion 18–22 %", "latency": "+3 s"},
    "durable": {"label": "cross-day (cold store + consistency check)", "continuation": "100 %",
                "wasted": "~0.1 per task", "failure": "drift 7–10 %", "latency": "+5 s"},
    "router": {"label": "hybrid router (by span)", "continuation": "58 % overall", "wasted": "—",
               "failure": "—", "latency": "16 s vs 45 s all-cross-day (−64 %)"},
}
"""The reference design's published figures (simulations with random numbers), per configuration."""

MEDIA_LABEL = {"local": "SQLite", "database": "Postgres", "critical-db": "Postgres + S3\n(db lost)",
               "critical-cloud": "Postgres + S3\n(S3 lost)"}

CLAIMED_MEDIA = {"local": "durability 60 %, 5 ms", "database": "durability 99 %, 80 ms",
                 "critical-db": "durability 99.9 %, 200 ms", "critical-cloud": "durability 99.9 %, 200 ms"}


def _p(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.0f} %"


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "—" if x is None else format(x, fmt)


def _failure(config: str, s: dict[str, Any]) -> str:
    parts = []
    if s["overflow"]:
        parts.append(f"context overflow {s['overflow']}/{s['tasks']} ({100 * s['overflow'] / s['tasks']:.0f} %: "
                     + ", ".join(f"{cls} {n}/{m}" for cls, (n, m) in sorted(s["overflow_by_class"].items())) + ")")
    if s["corrupt_injected"]:
        parts.append(f"corrupt state loaded {s['corrupt_loaded']}/{s['corrupt_injected']}")
    if s["drift_injected"]:
        parts.append(f"drift missed {s['drift_missed']}/{s['drift_injected']}")
    if not parts:
        parts.append("none")
    return "; ".join(parts)


def _latency(config: str, run: KpiRun) -> str:
    s = run.summary[config]
    if config == "naive":
        return "0 (nothing saved or loaded)"
    text = f"{_f(s['overhead_ms'])} ms/step; resume {_f(s['resume_ms'], '.0f')} ms"
    if config == "router" and "durable" in run.summary:
        ours, alld = s["cost_s"], run.summary["durable"]["cost_s"]
        if alld:
            text += f"; total {ours:.1f} s vs {alld:.1f} s all-durable ({100 * (ours - alld) / alld:+.0f} %)"
    return text


def markdown(run: KpiRun) -> str:
    """``kpi.md``: the headline table (claimed next to measured), faults and invariants, costs,
    medium loss, and the notes."""
    S = run.summary
    configs = [c for c in CONFIGS if c in S]
    lines = [
        f"## KPIs: {run.tasks} tasks × {len(configs)} configurations, seed {run.seed}",
        "",
        f"Measured by `overnight bench kpi --tasks {run.tasks} --seed {run.seed}` in {run.elapsed_s:.0f} s on "
        f"{run.machine.get('cpus')} CPUs (1-min load average at the end {run.machine.get('loadavg_1m')}). "
        "Claimed figures: the reference design's, from simulations with random numbers.",
        "",
        "| configuration | continuation (measured) | claimed | wasted steps / task, mean (max) | claimed | "
        "failure (measured) | claimed | extra latency (measured) | claimed |",
        "|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for c in configs:
        s, cl = S[c], CLAIMED[c]
        name = c if c != "router" else "router (" + ", ".join(f"{k} {v}" for k, v in sorted(s["levels"].items())) + ")"
        lines.append(
            f"| {name} | {_p(s['continuation'])} ({s['continued']}/{s['interruptions']}) | {cl['continuation']} | "
            f"{s['wasted_mean']:.2f} ({s['wasted_max']}) | {cl['wasted']} | {_failure(c, s)} | {cl['failure']} | "
            f"{_latency(c, run)} | {cl['latency']} |")
    lines += [
        "",
        "### Faults and invariants",
        "",
        "| configuration | completed | SIGKILLs | wasted / kill, mean (max) | committed steps lost | "
        "corruptions detected / injected | healed from ditto copies | corrupt states loaded | "
        "steps re-run after a corruption | drift detected / missed / false alarms (of relevant) | compactions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        s = S[c]
        lost = "— (nothing is saved)" if c == "naive" else str(s["committed_lost"])
        drift = ("— (no saved state to drift)" if c == "naive"
                 else f"{s['drift_detected']} / {s['drift_missed']} / {s['false_alarms']} (of {s['drift_injected']})")
        corr = "—" if c == "naive" else f"{s['corrupt_detected']} / {s['corrupt_injected']}"
        loaded = "—" if c == "naive" else str(s["corrupt_loaded"])
        healed = "—" if c == "naive" else str(s.get("corrupt_healed", 0))
        lines.append(
            f"| {c} | {s['completed']}/{s['tasks']} ({_p(s['completion'])}) | {s['kills']} | "
            f"{_f(s['wasted_per_kill_mean'], '.2f')} ({_f(s['wasted_per_kill_max'], 'd') if s['wasted_per_kill_max'] is not None else '—'}) | "
            f"{lost} | {corr} | {healed} | {loaded} | {'—' if c == 'naive' else s['corruption_waste']} | {drift} | "
            f"{s['compactions']} |")
    lines += [
        "",
        "### Cost",
        "",
        "| configuration | step time, mean ms | checkpoint overhead ms / step | % of step time | "
        "resume latency median (p95) ms | stored per task |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        s = S[c]
        stored = "—" if not s["stored_bytes"] else f"{s['stored_bytes'] / 1024:.0f} KB"
        lines.append(f"| {c} | {_f(s['step_ms'], '.2f')} | {_f(s['overhead_ms'], '.2f')} | {s['overhead_pct']:.0f} % | "
                     f"{_f(s['resume_ms'], '.0f')} ({_f(s['resume_p95_ms'], '.0f')}) | {stored} |")
    if run.media:
        lines += [
            "",
            "### Medium loss",
            "",
            "| medium | loss | tasks | lost (restarted from scratch) | continued | completed after | "
            "checkpoint overhead ms / step | claimed |",
            "|---|---|---:|---:|---:|---:|---:|---|",
        ]
        for m in run.media:
            if m.status != "measured":
                lines.append(f"| {m.media} | — | — | not measured: {m.detail} | — | — | — | {CLAIMED_MEDIA.get(m.case, '—')} |")
                continue
            oh = sum(m.overhead_ms) / len(m.overhead_ms) if m.overhead_ms else None
            lines.append(f"| {m.media} | {m.loss}{' (' + m.detail + ')' if m.detail else ''} | {m.tasks} | {m.lost} | "
                         f"{m.continued} | {m.completed} | {_f(oh, '.1f')} | {CLAIMED_MEDIA.get(m.case, '—')} |")
    lines += ["", "### Notes", "", *notes(run)]
    return "\n".join(lines) + "\n"


def notes(run: KpiRun) -> list[str]:
    """The honest notes under the tables: where a claimed figure is a property, not a measurement,
    or is not reproducible as stated."""
    S = run.summary
    out = [
        "- **0 % continuation without persistence is a property, not a measurement**: nothing is saved, so every "
        "interruption (a SIGKILL, or the end of a session or day) restarts from scratch. Its wasted steps depend on "
        "the fault rate and task length of this workload, not on anything the baseline does.",
        "- Continuation counts every interruption followed by another session (SIGKILLs and the planned ends of "
        "sessions and days) that resumed from a checkpoint rather than starting over.",
    ]
    restarts = {c: S[c]["no_valid_checkpoint"] for c in ("session", "durable", "router") if c in S}
    if any(restarts.values()):
        kinds = sorted({c["kind"] for t in run.trials for c in t.corruptions if c["expected"] is None})
        out.append(
            "- The interruptions not continued at `session`/`durable` (" + ", ".join(f"{c} {n}" for c, n in
                                                                             restarts.items()) + ") are resumes "
            f"after a corruption ({', '.join(kinds)}) of an object every checkpoint of the task shares (content "
            "addressing stores an unchanged object once -- a session's world fingerprint, a state chunk unchanged "
            "since the task began -- so one damaged copy invalidates the whole lineage): no checkpoint verified, "
            "and the task started over rather than load damaged state. The router's others are tasks it routed `ephemeral` (in-process only), killed.")
    if "naive" in S and S["naive"]["overflow"]:
        out.append(
            "- **Context overflow** (claimed 100 % for one 8k session) is measured per task class: the baseline "
            "sends its whole conversation every call, so it fails exactly on the tasks whose conversation outgrows "
            "8,000 tokens (about 15 sections; most long tasks here) and on none of the others; overnight compacts into a new session "
            "(see compactions) and finishes them.")
    if "session" in S:
        out.append(
            "- **Snapshot distortion** (claimed 18–22 % for snapshot + resume) is not reproducible with verified "
            f"checkpoints: {S['session']['corrupt_injected']} stored heads were damaged with the fault injector "
            "(every kind in turn, HMAC-signed checkpoints) and "
            f"{S['session']['corrupt_loaded']} were loaded; {S['session'].get('corrupt_healed', 0)} were healed from "
            "their verified ditto copies (the resume read the damaged record or object from its copy and continued "
            "from the head), every other resume fell back to the newest valid checkpoint. "
            "The cost of a corruption is re-running the steps after the fallback point (counted in wasted steps).")
    if "durable" in S:
        d = S["durable"]
        out.append(
            f"- **Drift** (claimed 7–10 % failure for cross-day) is a rate of the workload, not of the mechanism: here "
            f"{d['drift_injected']} relevant drifts were injected (a real edit of an input file a finished step read, "
            f"or of the environment variable it read) and {d['drift_detected']} detected, each recomputing only the "
            "steps that read it. The `session` level does not check the world, so it misses them by design.")
    out += [
        "- **Extra latency** (claimed +3 s / +5 s) is measured here in milliseconds: checkpoint overhead per step is "
        "the step's wall time minus its function's time (encode, content-address, commit with fsync); resume "
        "latency is from the worker's start to its first step (lease, load and verify the head, for `durable` "
        "also the consistency check). The percentage is of this workload's steps, which do a few ms of real CPU "
        "work (file read, term counts, the offline extractive model); a real model call takes 0.5–30 s, against "
        "which the same overhead is well under 1 %.",
        "- The router row's total compares checkpoint overhead plus resume latency summed over all tasks with "
        "the all-`durable` configuration on the same tasks and faults; short tasks routed `ephemeral` save that "
        "cost and lose their progress on a kill (their continuation is 0 by design).",
        "- The workload tasks declare their dependencies (`deps=[]`); with the default `deps=\"all\"` every session "
        "also reads the metadata of every installed distribution (about 0.5 s on this machine).",
        f"- The machine is shared (2 cores, other jobs running; load average {run.machine.get('loadavg_1m')} at the "
        "end): absolute times are noisy; the ratios within one run are the comparable figures.",
        "- Not measured here: branch and fork chains (the claimed breakpoint-chain 100 / 100 / 100 %; "
        "`tests/test_branches.py` covers them), dependency drift (a real pip install, covered by "
        "`tests/test_drift.py`), and durability as a probability (the medium-loss rows count tasks lost in one "
        "loss of each medium, not a rate over years).",
    ]
    return out


def plots(run: KpiRun, out: Path) -> list[Path]:
    """The three PNGs (see the module docstring); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = run.summary
    configs = [c for c in CONFIGS if c in S]
    paths = []

    def save(fig, name: str) -> Path:  # type: ignore[no-untyped-def]
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        return out / name

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(configs, [100 * (S[c]["continuation"] or 0) for c in configs], color="#4c72b0")
    a.set_ylabel("continuation rate (%)")
    a.set_ylim(0, 105)
    a.set_title("interrupted runs continued from a checkpoint")
    b.bar(configs, [S[c]["wasted_mean"] for c in configs], color="#dd8452",
          yerr=[[0] * len(configs), [S[c]["wasted_max"] - S[c]["wasted_mean"] for c in configs]], capsize=4)
    b.set_ylabel("wasted steps per task (mean, bar to max)")
    b.set_title("steps executed again for the same inputs")
    paths.append(save(fig, "kpi-continuation.png"))

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    lv = [c for c in configs if c != "naive"]
    x = range(len(lv))
    a.bar([i - 0.2 for i in x], [S[c]["overhead_ms"] for c in lv], width=0.4, label="checkpoint overhead / step")
    a.bar([i + 0.2 for i in x], [S[c]["resume_ms"] or 0 for c in lv], width=0.4, label="resume latency (median)")
    a.set_xticks(list(x), lv)
    a.set_ylabel("ms")
    a.set_title("latency overhead by level")
    a.legend()
    media = [m for m in run.media if m.status == "measured" and m.overhead_ms]
    b.bar([MEDIA_LABEL.get(m.case, m.case) for m in media], [sum(m.overhead_ms) / len(m.overhead_ms) for m in media],
          color="#55a868")
    b.set_ylabel("checkpoint overhead per step (ms)")
    b.set_title("by medium")
    paths.append(save(fig, "kpi-latency.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for c, color in (("session", "#4c72b0"), ("durable", "#c44e52")):
        pts: dict[int, list[int]] = {}
        for t in run.trials:
            if t.config != c:
                continue
            for s in t.sessions:
                for done, size in s.bytes:
                    pts.setdefault(done, []).append(size)
        if pts:
            xs = sorted(pts)
            ax.plot(xs, [sorted(pts[k])[len(pts[k]) // 2] / 1024 for k in xs], marker=".", color=color, label=c)
    ax.set_xlabel("steps done")
    ax.set_ylabel("stored bytes, median over tasks (KB)")
    ax.set_title("storage over steps (objects + records + model calls)")
    ax.legend()
    paths.append(save(fig, "kpi-storage.png"))
    return paths


def write_report(run: KpiRun, out: Path) -> str:
    """Write ``kpi.md``, ``kpi.json``, the PNGs and ``report.md`` into ``out``; returns ``kpi.md``'s text."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(run)
    names = [p.name for p in plots(run, out)]
    text += "\n" + "\n".join(f"![{n}]({n})" for n in names) + "\n"
    (out / "kpi.md").write_text(text)
    (out / "kpi.json").write_text(json.dumps(run.to_json(), indent=1, default=str))
    write_combined(out)
    return text


def write_combined(out: Path) -> Path:
    """``report.md``: ``kpi.md``, then ``perf.md`` when present (each as written by its command)."""
    parts = ["# overnight bench report", ""]
    for name in ("kpi.md", "perf.md"):
        p = out / name
        if p.exists():
            parts += [p.read_text().rstrip(), ""]
    path = out / "report.md"
    path.write_text("\n".join(parts))
    return path
