"""The runner: load the head (or create the task), run the todo list, checkpoint after every step.

One :meth:`Runner.run` is one *session*:

1. take the lease on ``(task, branch)`` (another live holder: :class:`~overnight.errors.TaskBusy`);
2. load the newest checkpoint that verifies (falling back past a corrupt head), or create the task
   with its initial plan as checkpoint ``seq 0``;
3. pop the todo list: a step whose key is already in the done list is not run again; otherwise run
   it and commit one checkpoint (objects + record + ref CAS + journal row, one transaction);
4. stop when the todo list is empty (``complete``), after ``max_steps`` (``stopped``), or on
   SIGINT/SIGTERM (``interrupted``): the first signal lets the step in flight finish and commit,
   a second abandons it. Both leave the task resumable. After SIGKILL the next run repeats only
   the step that was in flight.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from overnight.codec.canonical import from_tree, to_tree
from overnight.codec.canonical import dumps as canonical_dumps
from overnight.errors import (
    ArtifactNotFound,
    LeaseLost,
    OvernightError,
    StepFailed,
    StoreBusy,
    UnknownStep,
)
from overnight.orchestrate.context import StepContext
from overnight.orchestrate.task import Task, step_key
from overnight.store import open_store
from overnight.store.base import Lease, Store, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.store.leases import DEFAULT_TTL_MS, Holder
from overnight.store.tiered import TieredStore, tiered
from overnight.orchestrate.consistency import Decision, decide, policies_for, salt_of, world_spec, write_export
from overnight.verify.archive import ensure_hot
from overnight.verify.chain import ChainWriter, Fallback, load_head, utc_now
from overnight.verify.drift import WorldNow, parse_policies
from overnight.verify.fingerprint import digest_path, normalize, world
from overnight.verify.integrity import LoadedCheckpoint, encode_state, signing_key_from_env
from overnight.verify.records import FORMAT_VERSION, event


class _Abandon(BaseException):
    """Raised inside a step by a second SIGINT/SIGTERM: drop the step in flight."""


@dataclass(frozen=True)
class RunEvent:
    """Progress notification passed to ``on_event``.

    ``kind``: ``resume`` / ``create`` / ``step_start`` / ``step_end`` / ``step_retry`` /
    ``skip`` / ``stop_requested`` / ``end``. ``done``/``total`` count steps of the whole task.
    """

    kind: str
    task_id: str
    step: str | None = None
    done: int = 0
    total: int = 0
    checkpoint_id: str | None = None
    duration_ms: float | None = None
    detail: str | None = None


@dataclass
class RunResult:
    """Outcome of one session.

    Attributes:
        status: ``complete`` (todo empty), ``interrupted`` (signal), ``stopped`` (``max_steps``).
        head: checkpoint id of the branch head after the run.
        steps_run: steps executed and committed in this session.
        steps_reused: todo steps whose key was already done (not executed).
        session: session number of this run.
        fallback: set when the head failed verification and an older checkpoint was used.
        created: True when this run created the task.
    """

    task_id: str
    branch: str
    status: str
    head: str
    store_url: str
    session: int
    steps_run: int = 0
    steps_reused: int = 0
    done: int = 0
    total: int = 0
    created: bool = False
    fallback: Fallback | None = None
    artifacts: list[str] = field(default_factory=list)

    @property
    def resumable(self) -> bool:
        return self.status != "complete"


class Runner:
    """Runs one session of a task against a store. See the module docstring for the algorithm.

    Args:
        task: the task definition (its step functions).
        store: a :class:`~overnight.store.base.Store`, a store URL, or None for the default.
        branch: the branch to advance (``main``).
        signing_key: HMAC key for signing and verifying checkpoints (default
            ``$OVERNIGHT_SIGNING_KEY``; ``b""`` disables signing).
        lease_ttl_ms: lease expiry; renewed every third of it while the run is alive.
        max_steps: stop (resumably) after this many executed steps.
        on_event: callback receiving :class:`RunEvent` for progress display.
        handle_signals: install SIGINT/SIGTERM handlers (main thread only).
        on_drift: drift policies for this run (``"deps=recompute,env=accept"`` or a dict),
            over the task's ``on_drift`` and :data:`~overnight.verify.drift.DEFAULT_POLICIES`.
        check_drift: compare the head with the world on resume (consistency check).
    """

    def __init__(
        self,
        task: Task,
        store: Store | str | None = None,
        *,
        branch: str = "main",
        signing_key: bytes | None = None,
        lease_ttl_ms: int = DEFAULT_TTL_MS,
        max_steps: int | None = None,
        on_event: Callable[[RunEvent], None] | None = None,
        handle_signals: bool = True,
        on_drift: str | dict[str, str] | None = None,
        check_drift: bool = True,
    ) -> None:
        self.task = task
        self.policies = policies_for(task, parse_policies(on_drift))
        self.check_drift = check_drift
        self._own_store = not hasattr(store, "commit")
        raw: Store = open_store(store) if self._own_store else store  # type: ignore[assignment]
        # archived history reads through to its cold store (a fallback may reach that far)
        self._own_wrapper = not isinstance(raw, TieredStore)
        self.store: Store = tiered(raw, own=self._own_store)
        self.branch = branch
        self.key = signing_key_from_env() if signing_key is None else (signing_key or None)
        self.lease_ttl_ms = lease_ttl_ms
        self.max_steps = max_steps
        self.on_event = on_event or (lambda e: None)
        self.handle_signals = handle_signals
        self.stop_requested = False
        self._signals = 0
        self._in_step = False
        self._lease: Lease | None = None
        self._lease_lost: LeaseLost | None = None
        self._reader = BlobReader(self.store)
        self.state: dict[str, Any] = {}
        self.chain = ChainWriter(self.store, task.id, branch, key=self.key, session_id=uuid.uuid4().hex, session_n=0)
        self.salt = b""
        self.drift: Decision | None = None
        self._world: dict[str, Any] | None = None
        self._world_ref: dict[str, Any] | None = None
        self._accepted: list[dict[str, Any]] = []
        self._exported: dict[str, str] = {}

    @property
    def head(self) -> str | None:
        """Checkpoint id of the newest valid checkpoint of this run's branch."""
        return self.chain.head

    @property
    def session_n(self) -> int:
        return self.chain.session_n

    # -- state helpers --------------------------------------------------------------------------

    def find_step(self, name: str) -> dict[str, Any] | None:
        """The todo or done entry named ``name``, if any."""
        return next((e for e in (*self.state["todo"], *self.state["done"]) if e["name"] == name), None)

    def read_artifact(self, name: str) -> bytes:
        ref = self.state["artifacts"].get(name)
        if ref is None:
            raise ArtifactNotFound(f"no artifact {name!r} in task {self.task.id!r}", task_id=self.task.id,
                                   checkpoint_id=self.head)
        return self._reader.get(ref["digest"], f"artifact {name!r}")

    def _progress(self) -> tuple[int, int]:
        done = len(self.state["done"])
        return done, done + len(self.state["todo"])

    def _emit(self, kind: str, **kw: Any) -> None:
        done, total = self._progress() if self.state else (0, 0)
        self.on_event(RunEvent(kind, self.task.id, done=done, total=total, **kw))

    # -- signals --------------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        self.stop_requested = True
        if self._signals == 1:
            self._emit("stop_requested", detail=f"{signal.Signals(signum).name}: finishing the step in flight, "
                       "then checkpointing (signal again to abandon it)")
        elif self._in_step:  # only a running step function is abandoned; loading and commits finish
            raise _Abandon()

    def _install_signals(self) -> dict[int, Any]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return {}
        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, self._on_signal)
        return old

    # -- lease ----------------------------------------------------------------------------------

    def _heartbeat(self, stop: threading.Event) -> None:
        interval = self.lease_ttl_ms / 3000
        while not stop.wait(interval):
            lease = self._lease
            if lease is None:
                return
            try:
                self._lease = self.store.renew_lease(lease, self.lease_ttl_ms)
            except LeaseLost as exc:
                self._lease_lost = exc
                self.stop_requested = True
                return
            except (StoreBusy, OvernightError):
                continue

    # -- commit ---------------------------------------------------------------------------------

    def _declared_reads(self, sdef: Any) -> dict[str, dict[str, str]]:
        """Digests of what a step declared it reads (``@task.step(inputs=..., env=..., ...)``)."""
        now = WorldNow(self.salt, dict(self.task.sources))
        return {
            "inputs": {os.path.abspath(p): now.get("inputs", os.path.abspath(p)) for p in sdef.inputs},
            "env": {n: now.get("env", n) for n in sdef.env},
            "packages": {normalize(n): now.get("packages", n) for n in sdef.packages},
            "sources": {n: now.get("sources", n) for n in sdef.sources},
        }

    def _commit(self, writer: BlobWriter, ev: dict[str, Any], journal: list[dict[str, Any]],
                task_row: TaskRow | None = None) -> str:
        if self._lease_lost is not None:
            raise self._lease_lost
        cid = self.chain.commit(self.state, ev, writer=writer, journal=journal, lease=self._lease,
                                task_row=task_row, fingerprint=self._fingerprint(writer))
        self._export()
        return cid

    # -- fingerprint and exports ----------------------------------------------------------------

    def _fingerprint(self, writer: BlobWriter) -> dict[str, Any]:
        """This session's world (one blob for all its checkpoints), exported artifacts' digests,
        and the drift accepted so far."""
        if self._world is None:
            self._world = world(world_spec(self.task, self.salt))
        if self._world_ref is None:
            raw = encode_state(self._world)
            self._world_ref = {"digest": writer.put(raw), "size": len(raw)}
        arts = self.state["artifacts"]
        return {"world": self._world_ref, "exports": {n: arts[n]["digest"] for n in self.task.exports if n in arts},
                "accepted": self._accepted}

    def _export(self) -> None:
        """Write exported artifacts whose committed version is not on disk yet."""
        for name, path in self.task.exports.items():
            ref = self.state["artifacts"].get(name)
            if ref is None or self._exported.get(name) == ref["digest"]:
                continue
            if digest_path(path) != ref["digest"]:
                write_export(path, self.read_artifact(name))
            self._exported[name] = ref["digest"]

    # -- the session ----------------------------------------------------------------------------

    def _start(self) -> tuple[bool, Fallback | None]:
        head = self.store.get_ref(self.task.id, self.branch)
        if head is None and not self._task_exists():
            self.chain.session_n = 1
            self.state = {
                "format": FORMAT_VERSION,
                "task": {"id": self.task.id, "goal": self.task.goal, "spec": self.task.spec()},
                "todo": self.task.initial_todo(),
                "done": [],
                "artifacts": {},
                "data": to_tree(dict(self.task.data), "state.data"),
                "context": {"summary": None, "compactions": 0},
            }
            self.salt = salt_of(self.state)
            spec = canonical_dumps(self.state["task"]["spec"])
            task_row = TaskRow(self.task.id, utc_now(), self.task.goal, self.task.entry, spec)
            self._commit(self.chain.blob_writer(), event("init"), [], task_row)
            self._emit("create", checkpoint_id=self.head)
            return True, None
        loaded, fallback = load_head(self.store, self.task.id, self.branch, key=self.key, verified=self.chain.known)
        if fallback is not None:
            ensure_hot(self.store, self.task.id, loaded.id)  # fell back into archived history: bring it back
        self.state = loaded.state_tree
        self.chain.start_from(loaded, fallback)
        self.chain.session_n = loaded.record.session.n + 1
        self._emit("resume", checkpoint_id=loaded.id, detail=fallback.describe() if fallback else None)
        self.salt = salt_of(self.state)
        if loaded.record.fingerprint is not None:
            self._accepted = list(loaded.record.fingerprint.accepted)
        if fallback is not None:
            # put the branch back on a valid head at once (the bad records stay, off the branch),
            # recording what was skipped and why
            skipped = ", ".join(f"{s.checkpoint_id} ({s.error})" for s in fallback.skipped)
            self._commit(self.chain.blob_writer(), event("rollback", ref=loaded.id,
                                                         detail=f"automatic fallback: skipped {skipped}"), [])
        if self.check_drift:
            self._consistency(loaded)
        else:
            self._export()
        return False, fallback

    def _consistency(self, loaded: LoadedCheckpoint) -> None:
        """Drift check and policies (``abort`` raises ``DriftAbort`` before anything is written)."""
        self._world = world(world_spec(self.task, self.salt))
        decision = self.drift = decide(self.store, loaded, self.task, self._world, self.policies, key=self.key)
        if decision.report.items:
            self._emit("drift", detail=decision.report.describe() + "\n-> " + decision.describe())
        if decision.rollback_to is not None:
            target = decision.rollback_to
            ensure_hot(self.store, self.task.id, target.id)
            self.state = target.state_tree
            self._commit(self.chain.blob_writer(), event("rollback", ref=target.id,
                                                         detail="drift: no drift at this checkpoint"), [])
        if decision.recomputed or decision.accepted:
            self._accepted = self._accepted + decision.accepted
            self.state = decision.state
            self._commit(self.chain.blob_writer(), event("drift", detail=decision.describe()), [])
        self._export()

    def _task_exists(self) -> bool:
        try:
            self.store.get_task(self.task.id)
            return True
        except OvernightError:
            return False

    def run(self) -> RunResult:
        """Run one session. Returns a :class:`RunResult`; see the module docstring.

        Raises:
            TaskBusy: another live process holds this task's lease.
            NoValidCheckpoint: nothing on the branch verifies.
            StepFailed: a step raised after its retries (the head is unchanged).
            UnknownStep: the todo list names a step the task does not define.
            LeaseLost / StaleHead: another writer took over; this run stopped writing.
        """
        holder = Holder.current()
        stop_hb = threading.Event()
        hb: threading.Thread | None = None
        old_handlers = self._install_signals()
        try:
            self._lease = self.store.acquire_lease(self.task.id, self.branch, holder.id, holder.to_json(),
                                                   self.lease_ttl_ms)
            hb = threading.Thread(target=self._heartbeat, args=(stop_hb,), name="overnight-lease", daemon=True)
            hb.start()
            return self._session()
        finally:
            stop_hb.set()
            if hb is not None:
                hb.join(timeout=5)
            lease, self._lease = self._lease, None
            if lease is not None:
                try:
                    self.store.release_lease(lease)
                except OvernightError:
                    pass
            if self._own_wrapper:
                self.store.close()  # the hot store too when this run opened it
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)

    def _session(self) -> RunResult:
        created, fallback = self._start()
        steps_run = steps_reused = 0
        status = "complete"
        try:
            while self.state["todo"]:
                if self.stop_requested:
                    status = "interrupted"
                    break
                if self.max_steps is not None and steps_run >= self.max_steps:
                    status = "stopped"
                    break
                ran = self._run_one()
                if ran:
                    steps_run += 1
                else:
                    steps_reused += 1
        except _Abandon:
            status = "interrupted"
        done, total = self._progress()
        if status == "complete" and self.stop_requested and self.state["todo"]:
            status = "interrupted"
        self._emit("end", checkpoint_id=self.head, detail=status)
        return RunResult(
            task_id=self.task.id, branch=self.branch, status=status, head=self.head or "", store_url=self.store.url,
            session=self.session_n, steps_run=steps_run, steps_reused=steps_reused, done=done, total=total,
            created=created, fallback=fallback, artifacts=sorted(self.state["artifacts"]),
        )

    def _run_one(self) -> bool:
        """Run (or reuse) the first todo step and commit its checkpoint. Returns True if it ran."""
        entry = self.state["todo"][0]
        sdef = self.task.steps.get(entry["fn"])
        if sdef is None:
            raise UnknownStep(
                f"step {entry['name']!r} calls step function {entry['fn']!r}, which task {self.task.id!r} does not define",
                task_id=self.task.id, checkpoint_id=self.head, step=entry["name"],
                hint=f"restore the function or register it under that name; defined: {sorted(self.task.steps)}",
            )
        key = step_key(sdef.fn_name, sdef.version, entry["name"], entry["args"])
        previous = next((d for d in self.state["done"] if d["key"] == key), None)
        writer = self.chain.blob_writer()
        if previous is not None:
            self.state = {**self.state, "todo": self.state["todo"][1:]}
            self._commit(writer, event("step", step=entry["name"], key=key, detail="reused"), [])
            self._emit("skip", step=entry["name"], checkpoint_id=self.head)
            return False

        args = from_tree(entry["args"], f"step[{entry['name']!r}].args")
        declared = self._declared_reads(sdef)
        self._emit("step_start", step=entry["name"])
        attempt = 0
        while True:
            attempt += 1
            ctx = StepContext(self, entry, args, attempt)
            started_at = utc_now()
            t0 = time.perf_counter()
            try:
                self._in_step = True
                try:
                    output = sdef.fn(ctx, **args)
                finally:
                    self._in_step = False
                break
            except (_Abandon, KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                if attempt > sdef.retries:
                    raise StepFailed(
                        f"step {entry['name']!r} failed after {attempt} attempt(s): {type(exc).__name__}: {exc}",
                        task_id=self.task.id, checkpoint_id=self.head, step=entry["name"],
                        hint="nothing of this step was committed; fix the cause and resume "
                        f"(`overnight resume {self.task.id}`)",
                    ) from exc
                self._emit("step_retry", step=entry["name"], detail="".join(traceback.format_exception_only(exc)).strip())
                time.sleep(min(0.1 * 2 ** (attempt - 1), 5.0))
        duration_ms = (time.perf_counter() - t0) * 1000

        # stage everything the step did; encoding errors surface here, before anything is written
        output_tree = to_tree(output, f"step[{entry['name']!r}].output")
        data_tree = to_tree(ctx.state, "state.data")
        artifacts = dict(self.state["artifacts"])
        for name, (data, is_text) in ctx._artifacts.items():
            artifacts[name] = {"digest": writer.put(data), "size": len(data), "text": is_text, "step": entry["name"]}
        reads = {kind: ({**declared.get(kind, {}), **got} if isinstance(got, dict) else got)
                 for kind, got in ctx.reads.items()}
        done_entry = {
            "name": entry["name"], "fn": entry["fn"], "key": key, "version": sdef.version, "args": entry["args"],
            "output": output_tree, "reads": reads, "writes": sorted(ctx._artifacts), "seq": self.chain.seq + 1,
            "session": self.session_n, "started_at": started_at, "duration_ms": round(duration_ms, 3),
            "tokens_in": 0, "tokens_out": 0,
        }
        self.state = {
            **self.state,
            "todo": ctx._added + self.state["todo"][1:] + ctx._added_end,
            "done": self.state["done"] + [done_entry],
            "artifacts": artifacts,
            "data": data_tree,
        }
        journal = [{"step_key": key, "step_name": entry["name"], "started_at": started_at,
                    "duration_ms": duration_ms, "tokens_in": 0, "tokens_out": 0}]
        self._commit(writer, event("step", step=entry["name"], key=key), journal)
        self._emit("step_end", step=entry["name"], checkpoint_id=self.head, duration_ms=duration_ms)
        return True


def run(task: Task, store: Store | str | None = None, **kwargs: Any) -> RunResult:
    """Create or resume ``task`` and run it to completion (or interruption). See :class:`Runner`."""
    return Runner(task, store, **kwargs).run()


__all__ = ["RunEvent", "RunResult", "Runner", "run"]
