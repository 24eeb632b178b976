"""``overnight bench step-bytes``: bytes stored per checkpoint for a step that changes almost nothing.

Two workloads, each a task of ``steps`` steps run by overnight's real
:class:`~overnight.runtime.runner.Runner` on its own SQLite store, in the same run:

* ``trivial`` -- every step sets one small field: ``ctx.state["n"] = i``;
* ``large unchanged`` -- the same, after a first step that puts a ``large_kb`` KB value (pseudo-random
  prose, :func:`overnight.bench.commit.message_text`) in ``ctx.state["big"]``, never changed again.

Measured per workload: the SQLite file (after ``PRAGMA wal_checkpoint(TRUNCATE)``, plus any WAL)
grown over the steps, divided by the steps (bytes per step). The growth is broken down by what the
bytes are: each checkpoint is walked from its record and every object is attributed to the role
in which a checkpoint first referenced it (object ``data`` bytes as stored, compressed):

* ``record`` -- the checkpoint body (and signature);
* ``state doc`` -- the state document blob, or its ``tree`` object when chunked;
* ``state chunks`` / ``chunk index`` -- the chunks and chunk index of a chunked state document;
* ``user state`` -- objects holding ``ctx.state`` values stored outside the state document;
* ``page lists`` -- the blobs listing a collection's inner page references (``middle``);
* ``todo pages``, ``done pages``, ``artifact pages`` -- page blobs (with their chunks if chunked);
* ``artifacts``, ``fingerprint`` -- artifact blobs, the world fingerprint;
* ``ditto`` -- ditto copies (:mod:`overnight.chain.ditto`);
* ``journal`` -- journal rows (approximate: the sum of their column bytes);
* ``sqlite overhead`` -- the rest of the file growth (b-tree pages, overflow chains, free space).

The baseline of the ``large unchanged`` workload is ``trivial`` (the issue's target: at most 100
bytes per step more).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.bench.commit import message_text
from overnight.codec.canonical import loads
from overnight.errors import BenchFailed, ConfigError
from overnight.runtime.runner import Runner
from overnight.runtime.task import Task
from overnight.store import open_store
from overnight.store.base import Store
from overnight.store.blobs import BlobReader

#: roles of the breakdown, in table order (see the module docstring)
ROLES = ("record", "state doc", "state chunks", "chunk index", "user state", "page lists", "todo pages",
         "done pages", "artifact pages", "artifacts", "fingerprint", "ditto", "journal", "sqlite overhead")


@dataclass
class StepBytes:
    """One workload's result.

    Attributes:
        name: the workload.
        steps: steps measured (after the first step, which sets the task up).
        grown: bytes the SQLite file grew over those steps.
        roles: bytes by role over those steps (:data:`ROLES`).
    """

    name: str
    steps: int
    grown: int = 0
    roles: dict[str, int] = field(default_factory=dict)

    @property
    def per_step(self) -> float:
        """Bytes per step (store growth / steps)."""
        return self.grown / self.steps


@dataclass
class StepBytesBench:
    """Result of :func:`run_step_bytes_bench`: the workloads, ``trivial`` first (the baseline)."""

    steps: int
    large_kb: float
    series: list[StepBytes]

    def markdown(self) -> str:
        base = self.series[0]
        lines = [f"bytes per checkpoint: {self.steps} steps on SQLite, each setting one small field of "
                 f"ctx.state (large unchanged: plus a {self.large_kb:.0f} KB value set once)", "",
                 "| workload | bytes / step | vs trivial | " + " | ".join(ROLES) + " |",
                 "|---|---:|---:|" + "---:|" * len(ROLES)]
        for s in self.series:
            extra = "" if s is base else f"+{s.per_step - base.per_step:.0f}"
            lines.append(f"| {s.name} | {s.per_step:.0f} | {extra} | "
                         + " | ".join(f"{s.roles.get(r, 0) / s.steps:.0f}" for r in ROLES) + " |")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "large_kb": self.large_kb, "baseline": self.series[0].name,
                "workloads": [{"name": s.name, "bytes_per_step": round(s.per_step, 1), "grown": s.grown,
                               "roles_per_step": {r: round(s.roles.get(r, 0) / s.steps, 1) for r in ROLES}}
                              for s in self.series]}


def step_task(task_id: str, steps: int, *, large_kb: float) -> Task:
    """The workload as a task: a setup step (which stores the large value when ``large_kb`` > 0),
    then ``steps`` steps each setting ``ctx.state["n"]``."""
    task = Task(task_id, goal="change one small field per step")

    @task.step
    def setup(ctx):
        if large_kb > 0:
            ctx.state["big"] = message_text(random.Random(task_id), int(large_kb * 1024))
        ctx.state["n"] = 0
        for i in range(1, steps + 1):
            ctx.add_step("tick", position="end", i=i)

    @task.step(planned=False)
    def tick(ctx, i):
        ctx.state["n"] = i

    return task


def _attribute(store: Store, task_id: str, after_seq: int) -> dict[str, int]:
    """Bytes of the objects first referenced by checkpoints with ``seq > after_seq``, by role."""
    reader = BlobReader(store)
    seen: set[str] = set()
    roles: dict[str, int] = {}

    def add(role: str, digests: list[str], count: bool) -> None:
        new = [d for d in dict.fromkeys(digests) if d not in seen]
        seen.update(new)
        if count and new:
            objs = store.get_objects(new)
            roles[role] = roles.get(role, 0) + sum(len(o.data) for o in objs.values())

    def blob(role: str, d: str, count: bool, chunk_role: str | None = None) -> None:
        if d in seen:
            return
        parts = reader.reachable(d)
        if len(parts) == 1 or chunk_role is None:
            add(role, parts, count)
            return
        obj = store.get_objects([d])[d]
        index = loads(reader._payload(obj, "bench"))["index"]
        add(role, [d], count)
        add("chunk index", reader.reachable(index), count)
        add(chunk_role, parts, count)

    rows = sorted(store.list_checkpoints(task_id), key=lambda r: r.seq)
    for row in rows:
        count = row.seq > after_seq
        if count:
            roles["record"] = roles.get("record", 0) + len(row.body) + len(row.signature or "")
        rec = loads(row.body)
        blob("state doc", rec["state"]["digest"], count, "state chunks")
        doc = loads(reader.get(rec["state"]["digest"]))
        for kind in ("todo", "done", "artifacts"):
            refs = doc[kind]["pages"]
            if doc[kind].get("middle"):
                blob("page lists", doc[kind]["middle"]["digest"], count)
                refs = [*refs[:1], *loads(reader.get(doc[kind]["middle"]["digest"])), *refs[1:]]
            for ref in refs:
                blob(f"{kind.rstrip('s')} pages" if kind != "artifacts" else "artifact pages", ref["digest"], count)
                if kind == "artifacts":
                    for art in loads(reader.get(ref["digest"])).values():
                        blob("artifacts", art["digest"], count)
        for ref in doc.get("values", {}).values():
            blob("user state", ref["digest"], count)
        if rec["fingerprint"]:
            blob("fingerprint", rec["fingerprint"]["world"]["digest"], count)
    return roles


def _run(name: str, directory: Path, steps: int, large_kb: float) -> StepBytes:
    store = open_store(f"sqlite://{directory / (name.replace(' ', '-') + '.db')}")
    try:
        task_id = "bench-step-bytes"
        out = StepBytes(name, steps)
        sizes: dict[str, int] = {}

        def on_event(ev: Any) -> None:
            if ev.kind == "step_end" and ev.step == "setup":
                sizes["after_setup"] = store.stored_bytes()
                sizes["seq"] = max(r.seq for r in store.list_checkpoints(task_id))
                sizes["ditto"] = _ditto_bytes(store)

        result = Runner(step_task(task_id, steps, large_kb=large_kb), store, handle_signals=False,
                        on_event=on_event).run()
        if result.status != "complete":
            raise BenchFailed(f"bench task ended {result.status}")
        out.grown = store.stored_bytes() - sizes["after_setup"]
        out.roles = _attribute(store, task_id, sizes["seq"])
        out.roles["ditto"] = _ditto_bytes(store) - sizes["ditto"]
        journal = [j for j in store.journal(task_id) if j.seq > sizes["seq"]]
        out.roles["journal"] = sum(len(str(v)) for j in journal for v in dataclasses.astuple(j))
        out.roles["sqlite overhead"] = out.grown - sum(out.roles.values())
        return out
    finally:
        store.close()


def _ditto_bytes(store: Store) -> int:
    return sum(len(o.data) for o in store.get_objects(list(store.iter_object_digests())).values()
               if o.kind == "ditto")


def run_step_bytes_bench(steps: int = 1000, *, large_kb: float = 256.0,
                         directory: Path | None = None) -> StepBytesBench:
    """Run both workloads (see the module docstring) in a temporary directory under ``directory``.

    Raises:
        ConfigError: ``steps`` < 10.
        BenchFailed: a workload's task did not complete.
    """
    if steps < 10:
        raise ConfigError(f"steps must be at least 10, got {steps}")
    base = Path(directory) if directory is not None else Path.cwd()
    tmp = Path(tempfile.mkdtemp(prefix="overnight-bench-step-bytes-", dir=base))
    try:
        series = [_run("trivial", tmp, steps, 0.0), _run("large unchanged", tmp, steps, large_kb)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return StepBytesBench(steps, large_kb, series)
