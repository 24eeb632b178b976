"""The KPI workload: long tasks that do real work, and one worker *session* of such a task.

A task (:class:`TaskSpec`) summarises ``n_chunks`` input files into a report:

* ``setup`` reads the environment variable :data:`FORMAT_ENV` (the report's format) and plans the
  rest of the task;
* ``section[i=K]`` reads ``chunk-K.txt`` (~1.7 KB of prose), counts its terms, writes a notes
  artifact and asks the offline extractive model (:mod:`overnight.models.extractive`) for a
  summary -- each exchange adds ~500 tokens to the session's context;
* ``assemble`` joins the sections into ``report.md`` in the chosen format.

:func:`run_session` is one session of one task under one configuration, meant to run in a worker
process that the driver may SIGKILL at any moment. It appends one JSON line per event to an events
file (``os.write`` on an ``O_APPEND`` descriptor, so a killed worker leaves whole lines, at most a
torn last one) and every step execution to an execution log (``step name``, digest of what the
step read), from which the driver counts wasted steps.

Configurations: ``naive`` (no persistence: a plain agent loop holding the whole conversation in
one 8,000-token window; it restarts from scratch after any interruption, and a full window ends
the session), and the overnight levels ``ephemeral`` (in-process store), ``session`` and
``durable`` through :class:`overnight.runtime.runner.Runner`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from overnight.bench.commit import message_text

FORMAT_ENV = "OVERNIGHT_KPI_FORMAT"
"""Environment variable the ``setup`` step reads (the report format); env drift edits it."""

SIGNING_KEY = b"overnight-kpi-bench"
"""HMAC key the bench signs checkpoints with, so even a re-digested forgery is detected."""

CONTEXT_TOKENS = 8_000
"""Context window of every configuration (tokens), the reference design's 8k."""

REPLY_TOKENS = 160
"""``max_tokens`` of each section's model call."""

_WORD = re.compile(r"[a-z]+")


@dataclass
class Kill:
    """A SIGKILL of the worker: while plan step ``step`` runs, after ``delay_ms`` (a random moment
    in the step, its commit, or just after)."""

    step: int
    delay_ms: float


@dataclass
class TaskSpec:
    """One task of the workload and its fault schedule (the same for every configuration).

    Attributes:
        id: task id.
        span_h: expected span (hours), what the router reads.
        start_hour: local hour the task starts (a span crossing midnight is cross-day).
        n_chunks: section steps; the plan has ``n_chunks + 2`` steps (setup, sections, assemble).
        days: plan steps run per day; a day ends the session (the worker process exits) and the
            next day resumes it. ``len(days)`` days.
        kills: SIGKILLs, by plan step index.
        drift: per day boundary (``len(days) - 1`` of them): ``None``, ``("input", K)`` (chunk K's
            file is edited) or ``("env", 0)`` (:data:`FORMAT_ENV` changes).
        corrupt: per day boundary: ``None`` or a :data:`overnight.testing.faults.KINDS` kind,
            injected into the stored head.
        seed: seed of the task's input text.
    """

    id: str
    span_h: float
    start_hour: int
    n_chunks: int
    days: list[int]
    kills: list[Kill] = field(default_factory=list)
    drift: list[tuple[str, int] | None] = field(default_factory=list)
    corrupt: list[str | None] = field(default_factory=list)
    seed: int = 0

    @property
    def plan_steps(self) -> int:
        return self.n_chunks + 2

    def step_index(self, name: str) -> int:
        """Plan index of a step name (``setup`` 0, ``section[i=K]`` K+1, ``assemble`` last)."""
        if name == "setup":
            return 0
        if name == "assemble":
            return self.n_chunks + 1
        m = re.fullmatch(r"section\[i=(\d+)\]", name)
        return int(m.group(1)) + 1 if m else -1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def chunk_text(seed: int, k: int, edit: int = 0) -> str:
    """Input chunk ``k`` of a task: 4 paragraphs of prose, ~1.7 KB; ``edit`` > 0 is a real edit
    of it (its second paragraph rewritten)."""
    rng = random.Random(f"{seed}:{k}")
    paras = [message_text(rng, 420) + "." for _ in range(4)]
    if edit:
        paras[1] = message_text(random.Random(f"{seed}:{k}:edit{edit}"), 420) + "."
    return "\n\n".join(paras) + "\n"


def write_inputs(spec: TaskSpec, directory: Path) -> None:
    """Write the task's input files (``chunk-K.txt``) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for k in range(spec.n_chunks):
        (directory / f"chunk-{k:02d}.txt").write_text(chunk_text(spec.seed, k))


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def _log_exec(log: Path, name: str, read_digest: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{name}\t{read_digest}\n".encode())
    finally:
        os.close(fd)


def analyse(text: str) -> dict[str, Any]:
    """The real text processing of a section: term counts, sentences, the 8 top terms."""
    words = _WORD.findall(text.lower())
    terms = collections.Counter(w for w in words if len(w) > 3)
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    return {"words": len(words), "sentences": len(sentences), "top": [t for t, _ in terms.most_common(8)]}


def section_prompt(k: int, text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Summarise input chunk {k} for the report.\n\n{text}"}]


def render_report(fmt: str, sections: list[dict[str, Any]]) -> str:
    """The final report from the section outputs, in ``fmt`` (``md`` or ``text``)."""
    head = "# Report\n\n" if fmt == "md" else "REPORT\n\n"
    parts = []
    for k, s in enumerate(sections):
        title = f"## Chunk {k}\n" if fmt == "md" else f"Chunk {k}\n"
        parts.append(f"{title}terms: {', '.join(s['top'])}\n\n{s['summary']}\n")
    return head + "\n".join(parts)


def build_task(spec: TaskSpec, inputs: Path, exec_log: Path, level: str | None) -> Any:
    """The overnight :class:`~overnight.runtime.task.Task` of ``spec`` at ``level``."""
    from overnight.runtime.task import Task

    task = Task(spec.id, goal="Summarise every input chunk into one report", expected_span=f"{spec.span_h}h",
                criticality="normal", deps=[], level=level, max_context_tokens=CONTEXT_TOKENS,
                done_when="report.md holds one section per chunk")

    @task.step
    def setup(ctx):
        fmt = ctx.env(FORMAT_ENV, "md") or "md"
        _log_exec(exec_log, "setup", _digest(fmt))
        for k in range(spec.n_chunks):
            ctx.add_step("section", i=k, position="end")
        ctx.add_step("assemble", position="end")
        return {"format": fmt}

    @task.step(planned=False)
    def section(ctx, i: int):
        text = ctx.read_input_text(str(inputs / f"chunk-{i:02d}.txt"))
        _log_exec(exec_log, f"section[i={i}]", _digest(text))
        facts = analyse(text)
        ctx.write_text(f"notes/{i:02d}.md", f"chunk {i}: {facts['words']} words, {facts['sentences']} sentences; "
                       f"top terms {', '.join(facts['top'])}\n")
        reply = ctx.model.complete(section_prompt(i, text), max_tokens=REPLY_TOKENS)
        return {"top": facts["top"], "summary": reply.text}

    @task.step(planned=False)
    def assemble(ctx):
        fmt = ctx.outputs["setup"]["format"]
        sections = [ctx.outputs[f"section[i={k}]"] for k in range(spec.n_chunks)]
        _log_exec(exec_log, "assemble", _digest(fmt, json.dumps(sections, sort_keys=True)))
        report = render_report(fmt, sections)
        ctx.write_text("report.md", report)
        return {"bytes": len(report.encode())}

    return task


class _Events:
    """Append-only JSON-lines event file, one ``os.write`` per line."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.t0 = time.perf_counter()

    def __call__(self, kind: str, at: float | None = None, **kw: Any) -> None:
        """Append event ``kind`` stamped ``t_ms`` (ms since the session began; ``at``: a
        ``perf_counter()`` reading taken earlier, default now)."""
        kw.update(kind=kind, t_ms=round(((at or time.perf_counter()) - self.t0) * 1000, 3))
        os.write(self.fd, (json.dumps(kw) + "\n").encode())


_STORED = ("SELECT (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM objects)"
           " + (SELECT COALESCE(SUM(LENGTH(body)), 0) FROM checkpoints)"
           " + (SELECT COALESCE(SUM(LENGTH(response)), 0) FROM calls)")


def _store_bytes(store: dict[str, Any]) -> int | None:
    """Bytes the task's SQLite store holds: stored (compressed) objects, checkpoint records and
    recorded model calls -- what the data costs, without SQLite's page slack and WAL."""
    if store["kind"] != "sqlite":
        return None
    import sqlite3

    conn = sqlite3.connect(f"file:{store['path']}?mode=ro", uri=True)
    try:
        return int(conn.execute(_STORED).fetchone()[0])
    finally:
        conn.close()


def _open(store: dict[str, Any]) -> Any:
    from overnight.store import open_store
    from overnight.store.memory import MemoryStore
    from overnight.store.compose.replicated import ReplicatedStore

    if store["kind"] == "memory":
        return MemoryStore(store["name"])
    if store["kind"] == "sqlite":
        return open_store(f"sqlite://{store['path']}")
    if store["kind"] == "replicated":
        return ReplicatedStore([open_store(u) for u in store["urls"]], list(store["names"]))
    return open_store(store["url"])


def run_session(config: str, spec_json: dict[str, Any], inputs: str, exec_log: str, events_path: str,
                store: dict[str, Any] | None, max_steps: int | None) -> None:
    """One session of one task (the worker process's body); see the module docstring.

    Args:
        config: ``naive``, ``ephemeral``, ``session`` or ``durable``.
        spec_json: :meth:`TaskSpec.to_json`.
        inputs, exec_log, events_path: the task's input directory, execution log, events file.
        store: where the task's checkpoints go (``{"kind": "sqlite", "path": ...}``,
            ``{"kind": "memory", "name": ...}``, ``{"kind": "replicated", "urls": [...], "names": [...]}``,
            ``{"kind": "url", "url": ...}``); None for ``naive``.
        max_steps: steps to execute before the session ends (the day's end); None: to completion.

    The last event is ``result`` (status ``complete``/``stopped``/``overflow``/``error``).
    """
    spec = TaskSpec(**{**spec_json, "kills": [Kill(**k) for k in spec_json["kills"]],
                       "drift": [tuple(d) if d else None for d in spec_json["drift"]]})
    ev = _Events(Path(events_path))
    if config == "naive":
        _naive_session(spec, Path(inputs), Path(exec_log), ev, max_steps)
        return
    from overnight.errors import OvernightError
    from overnight.runtime.runner import Runner

    task = build_task(spec, Path(inputs), Path(exec_log), config)
    storage = _open(store)  # type: ignore[arg-type]
    state: dict[str, Any] = {"runner": None}

    def on_event(e: Any) -> None:
        if e.kind == "drift":
            decision = state["runner"].drift
            found = decision.found or decision.report
            ev("drift", items=[{"component": i.component, "key": i.key, "steps": i.steps}
                               for i in found.items if not i.warning])
        elif e.kind in ("step_start", "step_end", "resume", "create", "compaction"):
            at = time.perf_counter()  # before the storage query below, which is the bench's, not the step's
            extra: dict[str, Any] = {}
            if e.kind == "step_end":
                extra = {"duration_ms": e.duration_ms, "bytes": _store_bytes(store)}  # type: ignore[arg-type]
            if e.kind == "resume":  # objects/records read from ditto copies (one "healed ..." line each)
                extra = {"healed": sum(x.startswith("healed ") for x in (e.detail or "").splitlines())}
            ev(e.kind, at=at, step=e.step, done=e.done, total=e.total, checkpoint=e.checkpoint_id, **extra)

    try:
        runner = Runner(task, storage, handle_signals=False, signing_key=SIGNING_KEY, max_steps=max_steps,
                        on_event=on_event, check_drift=(config == "durable"))
        state["runner"] = runner
        result = runner.run()
    except OvernightError as exc:
        ev("result", status="error", error=type(exc).__name__, detail=exc.message)
        return
    finally:
        if hasattr(storage, "close"):
            storage.close()
    ev("result", status=result.status, done=result.done, total=result.total)


def _naive_session(spec: TaskSpec, inputs: Path, exec_log: Path, ev: _Events, max_steps: int | None) -> None:
    """The baseline: one in-memory conversation, no checkpoints, the whole history sent each call."""
    from overnight.models.extractive import ExtractiveModel
    from overnight.tokens import count_messages, tokenizer_for

    model, tok = ExtractiveModel(), tokenizer_for("o200k_base")
    history: list[dict[str, str]] = []
    ev("create", done=0, total=spec.plan_steps)
    fmt = os.environ.get(FORMAT_ENV, "md")
    sections: list[dict[str, Any]] = []
    names = ["setup", *(f"section[i={k}]" for k in range(spec.n_chunks)), "assemble"]
    for n, name in enumerate(names):
        if max_steps is not None and n >= max_steps:
            ev("result", status="stopped", done=n, total=len(names))
            return
        ev("step_start", step=name, done=n, total=len(names))
        t0 = time.perf_counter()
        if name == "setup":
            _log_exec(exec_log, name, _digest(fmt))
        elif name == "assemble":
            _log_exec(exec_log, name, _digest(fmt, json.dumps(sections, sort_keys=True)))
            render_report(fmt, sections)
        else:
            k = n - 1
            text = (inputs / f"chunk-{k:02d}.txt").read_text()
            _log_exec(exec_log, name, _digest(text))
            facts = analyse(text)
            msgs = [*history, *section_prompt(k, text)]
            need = count_messages(msgs, tok) + REPLY_TOKENS
            if need > CONTEXT_TOKENS:
                ev("result", status="overflow", done=n, total=len(names), tokens=need)
                return
            reply = model.complete(msgs, max_tokens=REPLY_TOKENS)
            history = [*msgs, {"role": "assistant", "content": reply.text}]
            sections.append({"top": facts["top"], "summary": reply.text})
        ev("step_end", step=name, done=n + 1, total=len(names),
           duration_ms=round((time.perf_counter() - t0) * 1000, 3), bytes=0)
    ev("result", status="complete", done=len(names), total=len(names))
