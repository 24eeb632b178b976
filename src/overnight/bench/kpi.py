# Over 600 lines: one benchmark (a leaf: nothing in the library imports it); workload and report are in kpi_workload.py and kpi_report.py.
"""``overnight bench kpi``: the reference KPIs measured with real faults, per configuration.

A seeded workload (:func:`make_workload`) of long tasks (:mod:`overnight.bench.kpi_workload`)
runs through each configuration -- ``naive`` (no persistence), ``session``, ``durable`` and the
``router`` (:func:`overnight.runtime.router.route` picks each task's level) -- under the same
fault schedule. Every session is a worker process forked from this one; the faults are real:

* **SIGKILL** of the worker at the start of a chosen step execution plus a random delay (so it
  lands in the step, in its checkpoint commit, or just after);
* **context-budget exhaustion**: each section adds ~500 tokens to an 8,000-token window (the
  naive agent overflows; overnight compacts into a new session);
* **stored-record corruption** of the head between sessions, by
  :class:`overnight.testing.faults.Faults` (every kind in turn; checkpoints are HMAC-signed);
* **drift between days**: a real edit of an input file a done step read, or of the environment
  variable the ``setup`` step read;
* **medium loss** (:func:`run_media`): the local store directory deleted, the Postgres schema
  dropped, the S3 server (moto) stopped.

Each :class:`Trial` (one task, one configuration) records its sessions and what they saw;
:func:`summarize` turns trials into the per-configuration measures of :mod:`overnight.bench.kpi_report`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from statistics import fmean, median
from typing import Any, Callable

from overnight.bench.commit import percentile
from overnight.bench.kpi_workload import FORMAT_ENV, Kill, TaskSpec, build_task, chunk_text, run_session, \
    write_inputs
from overnight.testing.faults import KINDS, Faults

CONFIGS = ("naive", "session", "durable", "router")
"""Configurations every task runs through, in table order."""

MAX_SESSIONS = 40
"""A trial gives up after this many sessions (a task that cannot finish)."""


# -- workload -------------------------------------------------------------------------------------

def make_workload(n: int, seed: int) -> list[TaskSpec]:
    """``n`` tasks with mixed spans and their fault schedule, from ``seed``.

    Classes (share): ``short`` (1 h, 4-7 chunks, one session; 30 %), ``medium`` (4-12 h the same
    day, 8-13 chunks, two sessions; 30 %), ``overnight`` (8-10 h from 18-22 h, 10-15 chunks, two
    days; 20 %), ``long`` (30-60 h, 17-24 chunks, two or three days; 20 %). A section adds ~520 tokens
    of context, so a long task's sections do not fit in one 8,000-token window. Each step execution
    draws a SIGKILL with probability 0.08; each boundary between days draws drift (input edit or
    env change) with probability 0.8, and each other boundary between sessions a corruption of
    the stored head with probability 0.6 (kinds in turn; one fault per boundary, so each is
    attributable).
    """
    rng = random.Random(seed)
    specs = []
    kinds = list(KINDS)
    corruptions = 0
    for t in range(n):
        r = rng.random()
        if r < 0.3:
            cls, span, start, chunks, parts = "short", 1.0, rng.randint(9, 14), rng.randint(4, 7), 1
        elif r < 0.6:
            cls, span, start, chunks, parts = "medium", float(rng.randint(4, 12)), rng.randint(7, 10), rng.randint(8, 13), 2
        elif r < 0.8:
            cls, span, start, chunks, parts = "overnight", float(rng.randint(8, 10)), rng.randint(18, 22), rng.randint(10, 15), 2
        else:
            cls, span, start, chunks, parts = "long", float(rng.randint(30, 60)), rng.randint(8, 17), rng.randint(17, 24), rng.choice((2, 3))
        plan = chunks + 2
        cuts = sorted(rng.sample(range(2, plan - 1), parts - 1)) if parts > 1 else []
        days = [b - a for a, b in zip([0, *cuts], [*cuts, plan])]
        executions = int(plan * 1.6)
        kills = [Kill(e, round(rng.uniform(0, 45), 2)) for e in range(1, executions) if rng.random() < 0.08]
        crosses_night = cls in ("overnight", "long")
        drift: list[tuple[str, int] | None] = []
        corrupt: list[str | None] = []
        for b in range(parts - 1):
            done = sum(days[:b + 1])
            if crosses_night and rng.random() < 0.8:
                drift.append(("env", 0) if rng.random() < 0.3 else ("input", rng.randrange(0, max(1, done - 1))))
            else:
                drift.append(None)
            if drift[-1] is None and rng.random() < 0.6:  # one fault per boundary: each is attributable
                corrupt.append(kinds[corruptions % len(kinds)])
                corruptions += 1
            else:
                corrupt.append(None)
        specs.append(TaskSpec(id=f"kpi-{t:03d}-{cls}", span_h=span, start_hour=start, n_chunks=chunks, days=days,
                              kills=kills, drift=drift, corrupt=corrupt, seed=seed * 1000 + t))
    return specs


def routed_level(spec: TaskSpec) -> str:
    """The level :func:`overnight.runtime.router.route` picks for ``spec`` (started at its hour)."""
    from overnight.config import load
    from overnight.runtime.router import route

    task = build_task(spec, Path("."), Path("."), None)
    now = datetime(2026, 3, 2, spec.start_hour, 0).astimezone()
    return route(task, load(), now=now).level


# -- one trial ------------------------------------------------------------------------------------

@dataclass
class Session:
    """One worker process of a trial: why it started, what it loaded, what it ran, how it ended.

    ``wasted``: executions in this session of a step already executed with the same inputs;
    ``caused_waste``: such re-executions (in any later session) whose previous execution was in
    this session -- the waste caused by the interruption that ended it (the step in flight at a
    SIGKILL; with no persistence, everything it ran) -- unless a damaged store was resumed or
    started over in between: those re-executions are this session's ``corruption_waste``.
    """

    cause: str  # start / kill / day / restart
    status: str = "killed"
    resumed: bool = False
    loaded: str | None = None
    last_checkpoint: str | None = None
    done_at_start: int = 0
    committed_seen: int = 0
    after_corruption: bool = False
    executions: int = 0
    wasted: int = 0
    caused_waste: int = 0
    corruption_waste: int = 0
    ready_ms: float | None = None
    overhead_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    bytes: list[tuple[int, int]] = field(default_factory=list)
    drift: list[dict[str, Any]] = field(default_factory=list)
    compactions: int = 0
    healed: int = 0
    """Objects and records its resume read from their ditto copies."""
    error: str | None = None


@dataclass
class Trial:
    """One task through one configuration; every raw figure the summary is built from.

    ``committed_lost``: steps lost to SIGKILLs -- counted when the checkpoint a resume loaded does
    not descend from the last one the killed worker reported committed. ``corruptions`` and
    ``drifts``: each injected fault and whether (and how) the next resume caught it.
    """

    config: str
    task_id: str
    span_h: float
    level: str
    plan_steps: int
    status: str = "incomplete"
    sessions: list[Session] = field(default_factory=list)
    kills: int = 0
    committed_lost: int = 0
    corruptions: list[dict[str, Any]] = field(default_factory=list)
    drifts: list[dict[str, Any]] = field(default_factory=list)
    false_alarms: int = 0
    stored_bytes: int | None = None
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _read_events(path: Path, start: int) -> tuple[list[dict[str, Any]], int]:
    if not path.exists():
        return [], start
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].split(b"\n"):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out, start + end


def _exec_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class _TrialRun:
    """Runs the sessions of one trial and injects its faults."""

    def __init__(self, config: str, level: str, spec: TaskSpec, root: Path, store: dict[str, Any] | None) -> None:
        self.config, self.level, self.spec = config, level, spec
        self.dir = root / config / spec.id
        shutil.rmtree(self.dir, ignore_errors=True)
        self.inputs = self.dir / "inputs"
        write_inputs(spec, self.inputs)
        self.exec_log = self.dir / "exec.log"
        self.events = self.dir / "events.jsonl"
        self.store = store
        self.trial = Trial(config, spec.id, spec.span_h, level, spec.plan_steps)
        self.kills = sorted(spec.kills, key=lambda k: k.step)
        self.executions = 0
        self.last_run: dict[str, int] = {}  # execution-log line -> index of the session that last ran it

    def _worker(self, max_steps: int | None) -> multiprocessing.Process:
        ctx = multiprocessing.get_context("fork")
        cfg = "naive" if self.config == "naive" else self.level
        proc = ctx.Process(target=run_session, args=(cfg, self.spec.to_json(), str(self.inputs), str(self.exec_log),
                                                     str(self.events), self.store, max_steps), daemon=True)
        proc.start()
        return proc

    def session(self, cause: str, max_steps: int | None, after_corruption: bool = False) -> Session:
        """Run one worker to its end (or SIGKILL it on schedule) and read what it did."""
        s = Session(cause, after_corruption=after_corruption)
        offset = self.events.stat().st_size if self.events.exists() else 0
        lines_before = len(_exec_lines(self.exec_log))
        proc = self._worker(max_steps)
        events: list[dict[str, Any]] = []
        pos = offset
        killed = False
        while True:
            new, pos = _read_events(self.events, pos)
            for e in new:
                events.append(e)
                if e["kind"] == "step_start":
                    self.executions += 1
                    if self.kills and self.kills[0].step <= self.executions and not killed:
                        time.sleep(self.kills[0].delay_ms / 1000)
                        if proc.is_alive():  # else it stays due: the next session's first step gets it
                            os.kill(proc.pid, signal.SIGKILL)
                            self.kills.pop(0)
                            killed = True
            if not proc.is_alive():
                new, pos = _read_events(self.events, pos)
                events.extend(new)
                break
            time.sleep(0.001)
        proc.join()
        if killed or proc.exitcode == -signal.SIGKILL:
            self.trial.kills += 1
            s.status = "killed"
        starts: dict[str, float] = {}
        for e in events:
            k = e["kind"]
            if e.get("checkpoint") and k in ("create", "resume", "step_end", "compaction"):
                s.last_checkpoint = e["checkpoint"]
            if k == "resume":
                s.resumed, s.loaded, s.done_at_start = True, e.get("checkpoint"), e.get("done", 0)
                s.healed = e.get("healed", 0)
            elif k == "step_start":
                starts[e["step"]] = e["t_ms"]
                s.committed_seen = max(s.committed_seen, e.get("done", 0))
                if s.ready_ms is None and s.resumed:
                    s.ready_ms = e["t_ms"]
            elif k == "step_end":
                s.committed_seen = max(s.committed_seen, e.get("done", 0))
                if e["step"] in starts:
                    total = e["t_ms"] - starts[e["step"]]
                    s.step_ms.append(total)
                    if self.config != "naive":
                        s.overhead_ms.append(max(0.0, total - (e.get("duration_ms") or 0.0)))
                if e.get("bytes"):
                    s.bytes.append((e.get("done", 0), e["bytes"]))
            elif k == "drift":
                s.drift.extend(e.get("items", []))
            elif k == "compaction":
                s.compactions += 1
            elif k == "result":
                s.status = e["status"]
                s.error = e.get("error")
                s.committed_seen = max(s.committed_seen, e.get("done", 0))
        lines = _exec_lines(self.exec_log)
        self.trial.sessions.append(s)
        here = len(self.trial.sessions) - 1
        for line in lines[lines_before:]:
            s.executions += 1
            if line in self.last_run:
                s.wasted += 1
                j = self.last_run[line]
                if any(x.after_corruption or x.cause == "restart" for x in self.trial.sessions[j + 1:]):
                    s.corruption_waste += 1
                else:
                    self.trial.sessions[j].caused_waste += 1
            self.last_run[line] = here
        return s

    def _between_days(self, boundary: int, done: int) -> list[dict[str, Any]]:
        """Inject the boundary's drift and corruption; returns the drift injected (for matching)."""
        injected = []
        drift = self.spec.drift[boundary] if boundary < len(self.spec.drift) else None
        if drift is not None:
            kind, k = drift
            if kind == "input":
                path = self.inputs / f"chunk-{k:02d}.txt"
                path.write_text(chunk_text(self.spec.seed, k, edit=boundary + 1))
                injected.append({"component": "inputs", "key": os.path.abspath(path), "relevant": k + 1 < done,
                                 "detected": False, "boundary": boundary})
            else:
                os.environ[FORMAT_ENV] = "text" if os.environ.get(FORMAT_ENV, "md") == "md" else "md"
                injected.append({"component": "env", "key": FORMAT_ENV, "relevant": done >= 1, "detected": False,
                                 "boundary": boundary})
        kind = self.spec.corrupt[boundary] if boundary < len(self.spec.corrupt) else None
        if kind is not None and self.store is not None and self.store["kind"] == "sqlite":
            inj = Faults(self.store["path"], random.Random(f"{self.spec.seed}:{boundary}")).inject(kind, self.spec.id)
            self.trial.corruptions.append({"kind": kind, "bad_head": inj.bad_head, "expected": inj.expected,
                                           "detected": None, "loaded_bad": None, "fell_back_to": None,
                                           "healed": None})
        return injected

    def _descends(self, head: str | None, ancestor: str) -> bool:
        """Is ``ancestor`` on ``head``'s parent chain (or ``head`` itself)? True for stores this
        process cannot open (in-process ``ephemeral`` stores are lost by design)."""
        if self.store is None or self.store["kind"] != "sqlite":
            return True
        from overnight.errors import OvernightError
        from overnight.store.sqlite import SQLiteStore

        with SQLiteStore(self.store["path"]) as st:
            cid = head
            try:
                while cid is not None:
                    if cid == ancestor:
                        return True
                    cid = st.get_checkpoint(cid).parent_id
            except OvernightError:  # the chain is broken: the ancestor is not reachable from the head
                return False
        return False

    def run(self) -> Trial:
        """Run the task's sessions until it completes, overflows, fails or gives up (MAX_SESSIONS),
        injecting the schedule's faults; returns the filled-in :class:`Trial`."""
        t0 = time.perf_counter()
        os.environ[FORMAT_ENV] = "md"
        day, cum = 0, [sum(self.spec.days[:i + 1]) for i in range(len(self.spec.days))]
        cause = "start"
        last_done = 0
        pending_drift: list[dict[str, Any]] = []
        pending_corrupt: dict[str, Any] | None = None
        known: str | None = None  # the newest checkpoint the worker reported committed
        while len(self.trial.sessions) < MAX_SESSIONS:
            last_day = day == len(cum) - 1
            max_steps = None if last_day else max(1, cum[day] - (last_done if self.config != "naive" else 0))
            s = self.session(cause, max_steps, after_corruption=pending_corrupt is not None)
            if pending_corrupt is not None and (s.resumed or s.error or s.status != "killed"):
                # a head healed from its verified ditto copy loads the original bytes, not damaged ones
                pending_corrupt["healed"] = s.healed > 0
                pending_corrupt["loaded_bad"] = s.loaded == pending_corrupt["bad_head"] and not s.healed
                pending_corrupt["detected"] = not pending_corrupt["loaded_bad"]
                pending_corrupt["fell_back_to"] = s.loaded
                pending_corrupt = None
            if cause == "kill" and s.resumed and known is not None and not self._descends(s.loaded, known):
                self.trial.committed_lost += max(1, last_done - s.done_at_start)
            if s.status == "error":
                known = None
            elif s.last_checkpoint:
                known = s.last_checkpoint
            for item in s.drift:
                match = next((d for d in pending_drift if d["component"] == item["component"]
                              and (d["key"] == item["key"] or d["key"] in item["key"])), None)
                if match is not None:
                    match["detected"] = True
                    pending_drift.remove(match)
                elif not any(d["component"] == item["component"] and d["key"] == item["key"]
                             for d in self.trial.drifts if d["detected"]):
                    self.trial.false_alarms += 1
            if s.status == "killed":
                # committed when it was killed: the newest count its step events showed
                last_done = s.committed_seen or (last_done if self.config != "naive" else 0)
                cause = "kill"
                continue
            if s.status == "complete":
                self.trial.status = "complete"
                break
            if s.status == "overflow":
                self.trial.status = "context overflow"
                break
            if s.status == "error":
                if s.error == "NoValidCheckpoint" and self.store is not None:
                    _drop_store(self.store)
                    last_done, cause = 0, "restart"
                    continue
                self.trial.status = f"error: {s.error}"
                break
            # stopped: the day (or session) is over
            last_done = 0 if self.config == "naive" else s.committed_seen
            new = self._between_days(day, last_done)
            self.trial.drifts.extend(new)
            pending_drift.extend(d for d in new if d["relevant"] and self.level == "durable")
            if self.trial.corruptions and self.trial.corruptions[-1]["detected"] is None:
                pending_corrupt = self.trial.corruptions[-1]
            day += 1
            cause = "day"
        self.trial.elapsed_s = time.perf_counter() - t0
        if self.store is not None and self.store["kind"] == "sqlite" and Path(self.store["path"]).exists():
            from overnight.store.sqlite import SQLiteStore

            with SQLiteStore(self.store["path"]) as st:
                self.trial.stored_bytes = st.stored_bytes()
        return self.trial


def _drop_store(store: dict[str, Any]) -> None:
    if store["kind"] == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(store["path"] + suffix).unlink(missing_ok=True)


def warm_up() -> None:
    """Load what every worker needs (the o200k_base vocabulary, the model) once, here, so that the
    forked workers share it: resume latency then measures overnight, not interpreter start-up."""
    import overnight.runtime.runner  # noqa: F401 - imported once, here, not in every worker
    from overnight.models.extractive import ExtractiveModel
    from overnight.tokens import tokenizer_for

    tokenizer_for("o200k_base").count("warm up")
    ExtractiveModel()


def run_trial(config: str, spec: TaskSpec, root: Path) -> Trial:
    """Run ``spec`` through ``config`` (see the module docstring); files go under ``root/config/id``."""
    level = {"naive": "none", "session": "session", "durable": "durable"}.get(config) or routed_level(spec)
    store = None
    if config != "naive":
        store = ({"kind": "memory", "name": spec.id} if level == "ephemeral"
                 else {"kind": "sqlite", "path": str(root / config / spec.id / "store.db")})
    return _TrialRun(config, level, spec, root, store).run()


# -- medium loss ------------------------------------------------------------------------------------

@dataclass
class MediaTrial:
    """Tasks on one medium set, that medium lost mid-run, then resumed.

    ``lost``: tasks that had to start over (their committed steps gone); ``continued``: tasks that
    resumed from a checkpoint. ``overhead_ms``: checkpoint cost per step on this medium (ms).
    """

    case: str
    media: str
    loss: str
    tasks: int = 0
    lost: int = 0
    continued: int = 0
    completed: int = 0
    overhead_ms: list[float] = field(default_factory=list)
    status: str = "measured"
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _media_case(case: str, media: str, loss: str, specs: list[TaskSpec], root: Path, store: dict[str, Any],
                lose: Callable[[], None], after: dict[str, Any] | None = None) -> MediaTrial:
    mt = MediaTrial(case, media, loss, tasks=len(specs))
    runners = []
    for spec in specs:
        r = _TrialRun("media-" + case, "session", spec, root, store)
        s = r.session("start", spec.plan_steps // 2)
        mt.overhead_ms += s.overhead_ms
        runners.append(r)
    lose()
    for r in runners:
        r.store = after or store
        s = r.session("medium-loss", None)
        mt.continued += s.resumed
        mt.lost += not s.resumed
        mt.completed += s.status == "complete"
    return mt


def run_media(specs: list[TaskSpec], root: Path, postgres_url: str | None,
              log: Callable[[str], None] = lambda s: None) -> list[MediaTrial]:
    """Medium-loss trials (local directory deleted; Postgres schema dropped, alone and with an S3
    replica; S3 server stopped under a Postgres primary). A medium that is not reachable gives a
    trial with ``status="not measured"`` and the reason."""
    out = []
    local = root / "media-local-store"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    out.append(_media_case("local", "local (SQLite)", "store directory deleted", specs, root,
                           {"kind": "sqlite", "path": str(local / "store.db")},
                           lambda: (shutil.rmtree(local), local.mkdir())))
    log("media: local done")
    pg, why = _postgres(postgres_url)
    if pg is None:
        for case, media in (("database", "database (Postgres)"), ("critical-db", "database + cloud replica"),
                            ("critical-cloud", "database + cloud replica")):
            out.append(MediaTrial(case, media, "-", status="not measured", detail=why))
        return out
    schema = f"overnight_kpi_{uuid.uuid4().hex[:10]}"
    url = f"{pg}?schema={schema}" if "?" not in pg else f"{pg}&schema={schema}"
    out.append(_media_case("database", "database (Postgres)", "schema dropped", specs, root,
                           {"kind": "url", "url": url}, lambda: _drop_schema(pg, schema)))
    log("media: database done")
    s3 = _start_s3()
    if isinstance(s3, str):
        for case in ("critical-db", "critical-cloud"):
            out.append(MediaTrial(case, "database + cloud replica", "-", status="not measured", detail=s3))
        _drop_schema(pg, schema)
        return out
    server, endpoint = s3
    try:
        for case, loss in (("critical-db", "primary's Postgres schema dropped"), ("critical-cloud", "S3 server stopped")):
            schema2 = f"overnight_kpi_{uuid.uuid4().hex[:10]}"
            pg2 = f"{pg}?schema={schema2}" if "?" not in pg else f"{pg}&schema={schema2}"
            s3url = f"s3://overnight-kpi/{uuid.uuid4().hex[:8]}?endpoint_url={endpoint}&region=us-east-1"
            both = {"kind": "replicated", "urls": [pg2, s3url], "names": ["database", "cloud"]}
            if case == "critical-db":
                mt = _media_case(case, "database + cloud replica", loss, specs, root, both,
                                 lambda: _drop_schema(pg, schema2))
            else:
                mt = _media_case(case, "database + cloud replica", loss, specs, root, both, server.stop,
                                 after={"kind": "url", "url": pg2})
                mt.detail = "resumed on the surviving database medium"
            out.append(mt)
            _drop_schema(pg, schema2)
            log(f"media: {case} done")
    finally:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - already stopped by the trial
            pass
        _drop_schema(pg, schema)
    return out


def _postgres(url: str | None) -> tuple[str | None, str]:
    """``(url, "")`` when the server answers, else ``(None, the reason)``."""
    if not url:
        return None, "not configured (--postgres)"
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means: not measured, with the reason
        return None, f"not reachable: {type(exc).__name__}: {str(exc).strip()[:120]}"
    return url, ""


def _drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _start_s3() -> Any:
    """moto's S3 server on a free local port with bucket ``overnight-kpi``, or the reason why not."""
    try:
        import logging
        import socket

        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        return f"moto/boto3 not installed ({exc.name}); pip install 'overnight[bench]'"
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="overnight-kpi")
    return server, endpoint


# -- summary ----------------------------------------------------------------------------------------

def summarize(trials: list[Trial]) -> dict[str, dict[str, Any]]:
    """Per configuration: the measures of the KPI table (rates in [0, 1], times in ms, bytes).

    Keys: ``tasks``, ``completed``, ``completion``, ``overflow``, ``interruptions`` (kills and
    session/day ends followed by another session), ``continued``, ``continuation``,
    ``wasted_mean``/``wasted_max`` (per task), ``wasted_per_kill_max``, ``committed_lost``,
    ``corrupt_injected``/``corrupt_detected``/``corrupt_loaded``, ``drift_injected`` (relevant),
    ``drift_detected``/``drift_missed``/``false_alarms``, ``overhead_ms``/``overhead_pct`` (mean
    per step), ``resume_ms`` (median)/``resume_p95_ms``, ``stored_bytes`` (mean per task),
    ``compactions``, ``levels`` (tasks per level), ``overflow_by_class`` (class -> [overflowed,
    tasks]), ``no_valid_checkpoint`` (resumes that found nothing verifiable and started over),
    ``corruption_waste`` (re-executions caused by corruption fallbacks), ``cost_s`` (checkpoint overhead plus resume
    latency summed over all tasks, s).
    """
    out: dict[str, dict[str, Any]] = {}
    for config in dict.fromkeys(t.config for t in trials):
        ts = [t for t in trials if t.config == config]
        interrupted = [s for t in ts for s in t.sessions if s.cause in ("kill", "day")]
        wasted = [sum(s.wasted for s in t.sessions) for t in ts]
        per_kill = [s.caused_waste for t in ts for s in t.sessions if s.status == "killed"]
        by_class: dict[str, list[int]] = {}
        for t in ts:
            c = by_class.setdefault(t.task_id.rsplit("-", 1)[-1], [0, 0])
            c[0] += t.status == "context overflow"
            c[1] += 1
        overhead = [x for t in ts for s in t.sessions for x in s.overhead_ms]
        step = [x for t in ts for s in t.sessions for x in s.step_ms]
        resume = [s.ready_ms for t in ts for s in t.sessions if s.ready_ms is not None]
        corr = [c for t in ts for c in t.corruptions if c["detected"] is not None]
        drifts = [d for t in ts for d in t.drifts if d["relevant"]]
        stored = [t.stored_bytes for t in ts if t.stored_bytes]
        levels: dict[str, int] = {}
        for t in ts:
            levels[t.level] = levels.get(t.level, 0) + 1
        out[config] = {
            "tasks": len(ts),
            "completed": sum(t.status == "complete" for t in ts),
            "completion": sum(t.status == "complete" for t in ts) / len(ts),
            "overflow": sum(t.status == "context overflow" for t in ts),
            "overflow_by_class": by_class,
            "no_valid_checkpoint": sum(s.error == "NoValidCheckpoint" for t in ts for s in t.sessions),
            "corruption_waste": sum(s.corruption_waste for t in ts for s in t.sessions),
            "kills": sum(t.kills for t in ts),
            "interruptions": len(interrupted),
            "continued": sum(s.resumed for s in interrupted),
            "continuation": (sum(s.resumed for s in interrupted) / len(interrupted)) if interrupted else None,
            "wasted_mean": fmean(wasted),
            "wasted_max": max(wasted),
            "wasted_per_kill_mean": fmean(per_kill) if per_kill else None,
            "wasted_per_kill_max": max(per_kill) if per_kill else None,
            "committed_lost": sum(t.committed_lost for t in ts),
            "corrupt_injected": len(corr),
            "corrupt_detected": sum(bool(c["detected"]) for c in corr),
            "corrupt_loaded": sum(bool(c["loaded_bad"]) for c in corr),
            "corrupt_healed": sum(bool(c.get("healed")) for c in corr),
            "drift_injected": len(drifts),
            "drift_detected": sum(d["detected"] for d in drifts),
            "drift_missed": sum(not d["detected"] for d in drifts),
            "false_alarms": sum(t.false_alarms for t in ts),
            "overhead_ms": fmean(overhead) if overhead else 0.0,
            "overhead_pct": (100 * sum(overhead) / sum(step)) if overhead and step else 0.0,
            "step_ms": fmean(step) if step else None,
            "resume_ms": median(resume) if resume else None,
            "resume_p95_ms": percentile(resume, 95),
            "stored_bytes": fmean(stored) if stored else None,
            "compactions": sum(s.compactions for t in ts for s in t.sessions),
            "levels": levels,
            "cost_s": (sum(overhead) + sum(resume)) / 1000,
            "elapsed_s": sum(t.elapsed_s for t in ts),
        }
    return out


@dataclass
class KpiRun:
    """Everything one ``overnight bench kpi`` run measured."""

    tasks: int
    seed: int
    trials: list[Trial]
    media: list[MediaTrial]
    summary: dict[str, dict[str, Any]]
    elapsed_s: float
    machine: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "seed": self.seed, "elapsed_s": self.elapsed_s, "machine": self.machine,
                "summary": self.summary, "media": [m.to_json() for m in self.media],
                "trials": [t.to_json() for t in self.trials]}


def run_kpi(tasks: int, seed: int, work: Path, *, postgres_url: str | None = None, media_tasks: int = 3,
            on_trial: Callable[[str], None] = lambda s: None) -> KpiRun:
    """Run the whole benchmark (see the module docstring) with scratch files under ``work``.

    Args:
        tasks: tasks in the workload (each runs through every configuration).
        seed: seed of the workload and its fault schedule.
        work: scratch directory (stores, inputs, event files); left in place for inspection.
        postgres_url: PostgreSQL server for the medium-loss trials (None: not measured).
        media_tasks: tasks per medium-loss trial.
        on_trial: called with a description after each trial (progress).
    """
    t0 = time.perf_counter()
    warm_up()
    specs = make_workload(tasks, seed)
    trials = []
    saved_env = os.environ.get(FORMAT_ENV)
    try:
        for spec in specs:
            for config in CONFIGS:
                trials.append(run_trial(config, spec, work))
                on_trial(f"{config} {spec.id}")
        media_specs = make_workload(media_tasks, seed + 1)
        for s in media_specs:
            s.kills, s.drift, s.corrupt = [], [None] * len(s.drift), [None] * len(s.corrupt)
        media = run_media(media_specs, work, postgres_url, log=on_trial)
    finally:
        if saved_env is None:
            os.environ.pop(FORMAT_ENV, None)
        else:
            os.environ[FORMAT_ENV] = saved_env
    machine = {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
    return KpiRun(tasks, seed, trials, media, summarize(trials), time.perf_counter() - t0, machine)
