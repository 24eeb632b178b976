# Over 600 lines: the session loop and its commit path (one Runner: start, drift check, step, compaction, commit); the typed state, step staging, recompute, lease and signals, the model gateway and what a session reports are in runtime/state.py, step.py, recompute.py, lease.py, session.py and outcome.py.
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

from overnight.runtime import recompute
from overnight.runtime.step import StepRun, encode_results, state_after
from overnight.runtime.lease import Abandon, LeaseKeeper, StopSignals, failure_reason
from overnight.chain.integrity import verify_artifacts
from overnight.chain.checked import check_done_pages

import inspect
import logging
import os
import time
import traceback
import uuid
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from overnight.codec.canonical import dumps as canonical_dumps
from overnight.codec.canonical import from_tree, to_tree
from overnight.errors import (
    ArtifactNotFound,
    ConfigError,
    EncodeError,
    LeaseLost,
    OutputNotWritable,
    IntegrityError,
    OvernightError,
    StepFailed,
    StoreError,
    UnknownStep,
)
from overnight.models import Model, model_from_spec
from overnight.runtime.context import StepContext
from overnight.runtime.session import Budget, ModelGateway, identity_of, summarize, tokenizer_of
from overnight.store.base import CallRecord
from overnight.tokens import count_messages
from overnight.runtime.task import Task, params_text, reconcile_plan, step_key
from overnight.store import open_store
from overnight.store.base import Store, TaskRow
from overnight.store.blobs import BlobReader, BlobWriter
from overnight.store.leases import DEFAULT_TTL_MS
from overnight.config import load as load_config
from overnight.runtime.task_code import entry_path, main_entry, project_root, same_location
from overnight.runtime.call_journal import replayable
from overnight.runtime.drift_decision import (Decision, check_project, decide, input_paths_for, policies_for,
                                              world_spec, write_export)
from overnight.verify.input_paths import ProjectPaths
from overnight.store.task_location import Route, locate, open_routed
from overnight.runtime.router import route as route_task
from overnight.store.compose.tiered import TieredStore, tiered
from overnight.store.compose.replicated import replicated_under
from overnight.chain.branches import check_branch_name
from overnight.chain import rollback
from overnight.chain.write import ChainWriter, utc_now
from overnight.chain.read import Fallback, load_head
from overnight.verify.drift import WorldNow, accepted_after_run, merge_accepted, parse_policies
from overnight.verify.fingerprint import digest_path, model_label, normalize, world
from overnight.chain.integrity import LoadedCheckpoint, encode_state, load_checkpoint, signing_key_from_env
from overnight.chain.records import event, initial_state
from overnight.runtime.outcome import RunEvent, RunResult, configured_store_url, resume_command
from overnight.runtime.state import Context, SessionState

if TYPE_CHECKING:
    from overnight.ops.repair import RepairReport


LOG = logging.getLogger("overnight.runner")
"""Warnings for Python API users (the CLI shows the same through run events): an ``ephemeral``
task, whose checkpoints a crash loses."""
_WARNED_EPHEMERAL: set[str] = set()


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
        check_drift: compare the head with the world on resume (consistency check); default:
            at the ``durable`` level.
        model: the model steps call through ``ctx.model`` (a :class:`~overnight.models.Model` or a
            spec: ``extractive``, ``local``, ``openai:NAME``); default the task's ``model``.
        max_context_tokens, compaction_threshold: the session's context budget (default the
            task's: 8,000 tokens, compaction at 80 %); see :mod:`overnight.runtime.session`.
        code_moved: the task's code now lives somewhere else than where it was created (an
            existing task is otherwise refused when other code claims its id).
        allow_rollback: continue from a branch ref that is older than a newer verified record of
            the branch or this machine's high-water mark (otherwise ``RollbackDetected``;
            :mod:`overnight.chain.rollback`), and lower the mark to it.
        head: ``(loaded, fallback, verified digests)`` of this branch, as
            :func:`~overnight.chain.read.load_head` returned them (``deep=False``, with this key) to
            a caller that needed the head first (``resume`` reads the code location from it); used
            when the branch ref still names it once the lease is taken -- only its artifacts are
            then hashed (:func:`~overnight.chain.integrity.verify_artifacts`) -- so the head is
            verified once.

    Store and level: with ``store=None`` and an ``expected_span`` on the task, the router picks
    the level and the media (:mod:`overnight.runtime.router`, recorded on the task); with
    ``store=None`` and no span, the default store at the ``durable`` level; with an explicit
    store, that store at the task's ``level`` (default ``durable``).
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
        check_drift: bool | None = None,
        model: Model | str | None = None,
        max_context_tokens: int | None = None,
        compaction_threshold: float | None = None,
        code_moved: bool = False,
        allow_rollback: bool = False,
        head: tuple[LoadedCheckpoint, Fallback | None, set[str]] | None = None,
    ) -> None:
        self._preloaded = head
        self.task = task
        if task.entry is None:  # `python FILE.py`: record the file, as `overnight run FILE.py` does
            task.entry = main_entry(task)
        self.code_moved = code_moved
        self.allow_rollback = allow_rollback
        self.model: Model = model if hasattr(model, "complete") else model_from_spec(model or task.model)  # type: ignore
        self.tokenizer = tokenizer_of(self.model)
        self.model_identity = identity_of(self.model, self.tokenizer)
        self.budget = Budget(max_context_tokens or task.max_context_tokens,
                             compaction_threshold if compaction_threshold is not None else task.compaction_threshold)
        self.policies = policies_for(task, parse_policies(on_drift))
        self.route: Route | None = None
        self._own_store = not hasattr(store, "commit")
        found = locate(task.id, load_config()) if store is None and task.span_s is not None else None
        if found is not None:  # an existing task: where (and how) it was routed when created
            raw, self.route = found
            self._own_store = True
            level = task.level or (self.route.level if self.route else "durable")
        elif store is None and task.span_s is not None:
            self.route = route_task(task, load_config())
            raw = open_routed(self.route, task.id)
            level = self.route.level
        else:
            raw = open_store(store) if self._own_store else store  # type: ignore[assignment]
            level = task.level or "durable"
        self.level = level
        self.check_drift = (level == "durable") if check_drift is None else check_drift
        # archived history reads through to its cold store (a fallback may reach that far)
        self._own_wrapper = not isinstance(raw, TieredStore)
        self.store: Store = tiered(raw, own=self._own_store)
        self.branch = check_branch_name(branch, task.id)
        self.key = signing_key_from_env() if signing_key is None else (signing_key or None)
        self.lease_ttl_ms = lease_ttl_ms
        self.max_steps = max_steps
        self.on_event = on_event or (lambda e: None)
        self.handle_signals = handle_signals
        self.stop_requested = False
        self._in_step = False
        self._keeper: LeaseKeeper | None = None
        self._reader = BlobReader(self.store)
        self.state: SessionState = None  # type: ignore[assignment]  # set by _start, before any step
        self.chain = ChainWriter(self.store, task.id, branch, key=self.key, session_id=uuid.uuid4().hex, session_n=0)
        self.salt = b""
        # input paths inside the project are recorded relative to its root, read under the root of
        # the project it runs in now (set again from the head on resume: an old record's roots)
        self.input_paths = ProjectPaths(str(project_root()))
        self.drift: Decision | None = None
        self._world: dict[str, Any] | None = None
        self._world_ref: dict[str, Any] | None = None
        self._accepted: list[dict[str, Any]] = []
        self._repair: RepairReport | None = None  # what repair_before_resume did (a replicated task)
        self._exported: dict[str, str] = {}
        self._pending_context: list[list[dict[str, str]]] = []
        self._calls: dict[str, list[CallRecord]] = {}
        self.compactions = 0
        self.usage = {"tokens_in": 0, "tokens_out": 0, "replayed_tokens": 0, "calls": 0, "replayed_calls": 0}

    @property
    def head(self) -> str | None:
        """Checkpoint id of the newest valid checkpoint of this run's branch."""
        return self.chain.head

    @property
    def session_n(self) -> int:
        return self.chain.session_n

    # -- the context window ---------------------------------------------------------------------

    def context_messages(self) -> list[list[dict[str, str]]]:
        """This session's exchanges: committed ones, then those of the step in flight."""
        return [*self.state.context.messages, *self._pending_context]

    def context_add(self, messages: list[dict[str, str]], reply: str) -> None:
        """Remember an exchange of the step in flight (committed with the step, dropped if it fails)."""
        self._pending_context.append([*messages, {"role": "assistant", "content": reply}])

    def recorded_call(self, key: str, seq: int, request: str) -> CallRecord | None:
        """A call of step ``key`` recorded in the call journal with this position and request, that
        may be replayed (:func:`~overnight.runtime.call_journal.replayable`: a damaged, forged or,
        with a signing key, unsigned row is not: the model is called again, and a warning says why)."""
        if key not in self._calls:
            self._calls[key] = self.store.calls(self.task.id, key)
        found = next((c for c in self._calls[key] if c.seq == seq and c.request_digest == request), None)
        if found is None:
            return None
        _, problem = replayable(found, self.key)
        if problem is not None:
            LOG.warning("task %s: the recorded model call %d of step %s is not replayed (%s); the model is called "
                        "again", self.task.id, seq, key, problem)
            return None
        return found

    def _context_with(self, exchanges: list[list[dict[str, str]]]) -> Context:
        ctx = self.state.context
        tokens = ctx.tokens + sum(count_messages(ex, self.tokenizer) for ex in exchanges)
        return Context(ctx.summary, ctx.compactions, (*ctx.messages, *exchanges), tokens)

    def _compact(self) -> None:
        """Summarise this session's exchanges, commit that as a checkpoint, then start a new session."""
        ctx = self.state.context
        self._emit("compaction_start", detail=f"this session's exchanges hold {ctx.tokens} tokens, past "
                   f"{self.budget.compact_at} ({self.budget.threshold:.0%} of the {self.budget.max_tokens}-token "
                   "window; each call carried only what fits); a summary replaces them")
        summary, gw = summarize(self, list(ctx.messages), f"compaction:{self.head}")
        self._count(gw)
        self.state = self.state.but(context=Context(summary.text, ctx.compactions + 1))
        n = self.session_n
        self._commit(self.chain.blob_writer(), event(
            "compaction", detail=f"{ctx.tokens} tokens of session {n} -> a {summary.tokens_out}-token summary; "
            f"session {n + 1} starts"), [])
        # only now, with the summary durable, is the old context dropped: a new session begins
        self.chain.session_n, self.chain.session_id = n + 1, uuid.uuid4().hex
        self.compactions += 1
        self._emit("compaction", checkpoint_id=self.head, detail=f"session {n + 1}")

    def _level_note(self) -> str | None:
        if self.route is None:
            return None
        if self.level == "ephemeral":
            return ("checkpoints are kept in this process only: a crash or kill loses this run "
                    f"({'; '.join(self.route.reasons)}). To keep them, pass --store, or set level='session' "
                    "or a longer expected_span on the Task")
        return f"level {self.level}, media {', '.join(self.route.media)} ({'; '.join(self.route.reasons)})"

    def resume_command(self) -> str:
        """The CLI command that resumes this task where this run stands."""
        return resume_command(self.task.id, self.branch, self.store.url, self._resume_file())

    def _resume_file(self) -> str | None:
        """``--file`` for ``overnight resume`` when the store records no code location for the
        task: where this run's task came from (the CLI's entry, else the file of its first step)."""
        try:
            if self.store.get_task(self.task.id).entry:
                return None
        except OvernightError:
            return None
        if self.task.entry:
            return self.task.entry
        first = next(iter(self.task.steps.values()), None)
        try:
            return inspect.getsourcefile(first.fn) if first is not None else None
        except TypeError:
            return None

    # -- recompute passes (runtime/recompute.py) -------------------------------------------------

    def _can_replay(self, entry: dict[str, Any], sdef: Any) -> bool:
        """In a recompute pass: may this step's last run stand (replayed, not run)?"""
        return recompute.can_replay(self.state, entry, sdef.version,
                                    WorldNow(self.salt, dict(self.task.sources), self.model_identity,
                                             self.input_paths).get)

    def _replay(self, entry: dict[str, Any], key: str, writer: BlobWriter) -> bool:
        """Apply a step's recorded effect (:func:`~overnight.runtime.recompute.replayed`) and commit it."""
        old = load_checkpoint(self.store, entry["previous"]["checkpoint"], key=self.key, deep=False,
                              reader=self._reader)
        self.state = recompute.replayed(self.state, entry, old.state_tree, self.chain.seq + 1)
        self._commit(writer, event("step", step=entry["name"], key=key, detail="replayed: nothing it read changed"), [])
        self._emit("replay", step=entry["name"], checkpoint_id=self.head)
        return False

    def _count(self, gw: ModelGateway) -> None:
        for k, v in (("tokens_in", gw.tokens_in), ("tokens_out", gw.tokens_out), ("replayed_tokens", gw.replayed_tokens),
                     ("calls", gw.calls_made), ("replayed_calls", gw.calls_replayed)):
            self.usage[k] += v

    def read_artifact(self, name: str) -> bytes:
        ref = self.state.artifacts.get(name)
        if ref is None:
            raise ArtifactNotFound(f"no artifact {name!r} in task {self.task.id!r}", task_id=self.task.id,
                                   checkpoint_id=self.head)
        return self._reader.get(ref["digest"], f"artifact {name!r}")

    def _emit(self, kind: str, **kw: Any) -> None:
        done, total = self.state.progress if self.state is not None else (0, 0)
        self.on_event(RunEvent(kind, self.task.id, self.branch, done=done, total=total, **kw))

    # -- signals --------------------------------------------------------------------------------

    def _on_stop(self, name: str, count: int) -> None:
        """A stop signal (:class:`~overnight.runtime.lease.StopSignals`): the first lets the step in
        flight finish and commit; a second abandons a running step function."""
        self.stop_requested = True
        if count == 1:
            self._emit("stop_requested", detail=f"{name}: finishing the step in flight, "
                       "then checkpointing (signal again to abandon it)")
        elif self._in_step:  # only a running step function is abandoned; loading and commits finish
            self._emit("stop_requested", detail=f"{name} again: abandoning the step in "
                       "flight (nothing of it is committed; it runs again on resume)")

    def _on_lease_lost(self, exc: LeaseLost) -> None:
        self.stop_requested = True

    # -- commit ---------------------------------------------------------------------------------

    def _declared_reads(self, sdef: Any) -> dict[str, dict[str, str]]:
        """Digests of what a step declared it reads (``@task.step(inputs=..., env=..., ...)``)."""
        now = WorldNow(self.salt, dict(self.task.sources), paths=self.input_paths)
        keys = [self.input_paths.key(p) for p in sdef.inputs]  # relative inside the project
        return {
            "inputs": {k: now.get("inputs", k) for k in keys},
            "env": {n: now.get("env", n) for n in sdef.env},
            "packages": {normalize(n): now.get("packages", n) for n in sdef.packages},
            "sources": {n: now.get("sources", n) for n in sdef.sources},
        }

    def _commit(self, writer: BlobWriter, ev: dict[str, Any], journal: list[dict[str, Any]],
                task_row: TaskRow | None = None) -> str:
        lease = self._keeper.check() if self._keeper is not None else None
        if getattr(self, "_heal_note", None):  # the first commit after a healing load says so (`overnight log`)
            ev = {**ev, "detail": "; ".join(x for x in (ev.get("detail"), self._heal_note) if x)}
            self._heal_note = None
        spec = self.state.task.spec
        if spec.get("project") != self.input_paths.root:  # where the task runs: a moved project says so once
            self.state = self.state.but(task=replace(self.state.task, spec={**spec, "project": self.input_paths.root}))
        cid = self.chain.commit(self.state.tree(), ev, writer=writer, journal=journal, lease=lease,
                                task_row=task_row, fingerprint=self._fingerprint(writer))
        self._export()
        return cid

    # -- fingerprint and exports ----------------------------------------------------------------

    def _fingerprint(self, writer: BlobWriter) -> dict[str, Any]:
        """This session's world (one blob for all its checkpoints), exported artifacts' digests,
        and the drift accepted so far."""
        if self._world is None:
            self._world = world(world_spec(self.task, self.salt, self.model_identity, self.input_paths))
        if self._world_ref is None:
            raw = encode_state(self._world)
            self._world_ref = {"digest": writer.put(raw), "size": len(raw)}
        arts = self.state.artifacts
        return {"world": self._world_ref, "exports": {n: arts[n]["digest"] for n in self.task.exports if n in arts},
                "accepted": self._accepted}

    def _export(self) -> None:
        """Write exported artifacts whose committed version is not on disk yet."""
        for name, path in self.task.exports.items():
            ref = self.state.artifacts.get(name)
            if ref is None or self._exported.get(name) == ref["digest"]:
                continue
            if digest_path(path) != ref["digest"]:
                try:
                    write_export(path, self.read_artifact(name))
                except OSError as exc:
                    raise self._not_exported(name, path, exc) from exc
            self._exported[name] = ref["digest"]

    def _not_exported(self, name: str, path: str, exc: OSError) -> OutputNotWritable:
        """An export that could not be written: the commit before it stands (nothing is lost);
        say so, and how to get the file."""
        done = len(self.state.done)
        where = (f"task {self.task.id!r} is complete ({done} step(s) committed)" if not self.state.todo else
                 f"task {self.task.id!r} has {done} step(s) committed")
        get = f"overnight cat {self.task.id} {name} -o FILE" + (
            f" --store {self.store.url}" if self.level != "ephemeral" and "://" in self.store.url
            and not self.store.url.startswith(("memory:", "replicated:")) and self.store.url != configured_store_url() else "")
        return OutputNotWritable(
            f"{where}, but its artifact {name!r} could not be written to {path}: {exc.strerror or exc}",
            task_id=self.task.id, checkpoint_id=self.head, path=str(path), reason=exc.strerror,
            hint=(f"write it elsewhere with `{get}`, or make {os.path.dirname(os.path.abspath(path))} writable "
                  f"and `{self.resume_command()}`" if self.level != "ephemeral" else
                  "the task is ephemeral (kept in this process only): make the folder writable and run it again"))

    # -- the session ----------------------------------------------------------------------------

    def _start(self) -> tuple[bool, Fallback | None]:
        self._repair_media()
        head = self.store.get_ref(self.task.id, self.branch)
        if head is None and not self._task_exists():
            self._check_queued_params()
            self.chain.session_n = 1
            spec = self.task.spec()
            spec["route"] = self.route.to_json() if self.route else {"level": self.level, "media": [],
                                                                      "urls": [self.store.url], "reasons": ["not routed"]}
            spec["project"] = self.input_paths.root  # what input paths inside it are recorded relative to
            self.state = SessionState.of(initial_state(self.task.id, self.task.goal, spec,
                                                       todo=self.task.initial_todo(),
                                                       data=to_tree(dict(self.task.data), "state.data")))
            self.salt = self.state.salt
            spec = canonical_dumps(self.state.task.spec)
            task_row = TaskRow(self.task.id, utc_now(), self.task.goal, self.task.entry, spec)
            self._commit(self.chain.blob_writer(), event("init"), [], task_row)
            self._emit("create", checkpoint_id=self.head, detail=self._level_note())
            if self.level == "ephemeral" and self.task.id not in _WARNED_EPHEMERAL:
                _WARNED_EPHEMERAL.add(self.task.id)  # once per task and process, as the CLI says it once
                LOG.warning("task %s is ephemeral: %s", self.task.id, self._level_note() or
                            "its checkpoints are kept in this process only")
            return True, None
        row = self.store.get_task(self.task.id)
        if row.entry and self.task.entry and not same_location(row.entry, self.task.entry) and not self.code_moved:
            raise ConfigError(
                f"task {self.task.id!r} already exists, created by {row.entry}; this code is {self.task.entry}",
                task_id=self.task.id,
                hint="give this task another id, or, if the code moved, resume it with "
                f"`overnight resume {self.task.id} --file {self.task.entry}`")
        loaded, fallback = self._head_loaded()
        self._check_params(loaded)
        repaired_back = self._repair.fallback(self.branch, loaded.id) if self._repair and fallback is None else None
        fallback = fallback or repaired_back  # the repair moved the ref back past what verifies on no medium
        accepted = rollback.check(self.store, loaded, key=self.key, allow=self.allow_rollback,
                                  skipped={s.checkpoint_id for s in fallback.skipped} if fallback else set(),
                                  branch=self.branch)
        if accepted is not None:
            self._emit("rollback", checkpoint_id=loaded.id, detail=f"accepted (--allow-rollback): {accepted.describe()}")
        if fallback is not None:
            # imported only here: a resume's first step does not need it (tests/test_resume_cost.py)
            from overnight.ops.archive import ensure_hot

            ensure_hot(self.store, self.task.id, loaded.id)  # fell back into archived history: bring it back
        self.state = SessionState.of(loaded.state_tree)
        self.chain.start_from(loaded, None if repaired_back else fallback)
        self.chain.session_n = loaded.record.session.n + 1
        healed = "\n".join(h.describe(self.task.id) for h in loaded.healed)  # read from ditto copies: always said
        self._heal_note = f"self-healed: {'; '.join(h.describe(self.task.id) for h in loaded.healed)}" if healed else None
        self.input_paths = input_paths_for(loaded.state_tree, loaded.world, Path(self.input_paths.root))
        check_project(self.task.id, loaded.state_tree, self.input_paths,  # not from outside its project
                      entry_path(self.task.entry, Path(self.input_paths.root)))
        moved = self.input_paths.moved_line()  # the next commit records the project here: said once
        self._emit("resume", checkpoint_id=loaded.id,
                   detail="\n".join(x for x in (fallback.describe() if fallback else "", healed, moved) if x) or None)
        self.salt = self.state.salt
        if loaded.record.fingerprint is not None:
            self._accepted = list(loaded.record.fingerprint.accepted)
        if fallback is not None:
            # put the branch back on a valid head at once (the bad records stay, off the branch),
            # recording what was skipped and why
            skipped = ", ".join(f"{s.checkpoint_id} ({s.error})" for s in fallback.skipped)
            self._commit(self.chain.blob_writer(), event("rollback", ref=loaded.id,
                                                         detail=f"automatic fallback: skipped {skipped}"), [])
        elif accepted is not None:
            # record the accepted rollback on the branch: a signed record newer than what it went back from
            self._commit(self.chain.blob_writer(), event("rollback", ref=loaded.id, detail=(
                f"accepted rollback (--allow-rollback) from {accepted.newer} (seq {accepted.newer_seq})")), [])
        if self.check_drift:
            self._consistency(loaded)
        else:
            self._export()
        self._reconcile_plan()
        return False, fallback

    def _check_queued_params(self) -> None:
        """Before creating the task: refuse params other than those of its queue row, when it was
        submitted and no worker has started it yet (``overnight run --id ID --param ...`` of a queued
        task would otherwise create it with params its row does not hold; a worker then refuses it).

        Raises:
            ConfigError: they differ; names both.
        """
        from overnight.store.queue_open import queue_for

        q = queue_for(self.store, create=False)
        row = q.get(self.task.id) if q is not None else None
        if row is not None and row.params != self.task.params:
            raise ConfigError(
                f"task {self.task.id!r} is submitted ({row.status}, not started) with params "
                f"{params_text(row.params)}; this run has {params_text(self.task.params)}", task_id=self.task.id,
                hint="run it with the same params, or let a worker run it (`overnight worker`); for other params, "
                "run with another --id")

    def _check_params(self, loaded: LoadedCheckpoint) -> None:
        """Refuse to run a stored task with params (``ctx.params``) other than those its verified
        head's spec records: ``overnight run --id ID --param ...`` of an existing task, or two param
        sets whose default ids collide (:func:`~overnight.fleet.submit.default_id`).

        Raises:
            ConfigError: they differ; names both.
        """
        recorded = loaded.doc.task.spec.get("params", {})
        given = to_tree(self.task.params, "task params") if self.task.params else {}
        if recorded != given:
            raise ConfigError(
                f"task {self.task.id!r} was created with params {params_text(recorded)}; this run has "
                f"{params_text(given)}",
                task_id=self.task.id, checkpoint_id=loaded.id,
                hint=f"`overnight resume {self.task.id}` runs it with its own params; for other params, "
                "run with another --id")

    def _head_loaded(self) -> tuple[LoadedCheckpoint, Fallback | None]:
        """The branch head, verified: the one the caller loaded (``head=``) if the ref still names
        what it loaded, else loaded now with its done pages read as used; then every done page
        checked (:func:`~overnight.chain.checked.check_done_pages`: the memo look-up and the drift
        check go by the pages' index) and every artifact hashed, once. Anything damaged there:
        loaded again in full (:func:`~overnight.chain.read.load_head`), falling back past it."""
        pre, self._preloaded = self._preloaded, None
        if pre is not None and self.store.get_ref(self.task.id, self.branch) != (
                pre[1].head_id if pre[1] else pre[0].id):
            pre = None  # the ref moved since the caller loaded it
        if pre is None:
            known: set[str] = set()
            loaded, fallback = load_head(self.store, self.task.id, self.branch, key=self.key, deep=False,
                                         verified=known, lazy_done=True)
        else:
            loaded, fallback, known = pre
        seen: set[str] = set()
        try:
            reader = BlobReader(self.store, seen)
            check_done_pages(loaded, reader, self.task.id, self.branch)
            verify_artifacts(loaded, reader)
        except IntegrityError:
            pass  # a damaged page or artifact: load the branch again, falling back past it
        else:
            self.chain.known |= known | seen
            return loaded.with_later_heals(), fallback  # pages read just now may have healed
        return load_head(self.store, self.task.id, self.branch, key=self.key, verified=self.chain.known)

    def _reconcile_plan(self) -> None:
        """Bring the stored plan up to date with the task code (:func:`~overnight.runtime.task.
        reconcile_plan`): a planned step added to the code runs where the code puts it; a planned
        step whose function is gone leaves the plan. Committed as a ``drift`` checkpoint and
        reported as ``plan changed: + x before c; - y``."""
        todo, change = reconcile_plan(self.state.todo, self.state.done, self.task)
        if not change:
            return
        self.state = self.state.but(todo=todo)
        detail = change.describe()
        self._commit(self.chain.blob_writer(), event("drift", detail=f"plan changed: {detail}"), [])
        self._emit("plan", detail=detail)

    def _consistency(self, loaded: LoadedCheckpoint) -> None:
        """Drift check and policies (``abort`` raises ``DriftAbort`` before anything is written)."""
        self._world = world(world_spec(self.task, self.salt, self.model_identity, self.input_paths))
        decision = self.drift = decide(self.store, loaded, self.task, self._world, self.policies, key=self.key)
        found = decision.found or decision.report
        if found.items:
            self._emit("drift", detail=found.describe() + "\n-> " + decision.describe())
        if decision.rollback_to is not None:
            target = decision.rollback_to
            # imported only here: a resume's first step does not need it (tests/test_resume_cost.py)
            from overnight.ops.archive import ensure_hot

            ensure_hot(self.store, self.task.id, target.id)
            self.state = SessionState.of(target.state_tree)
            self._accepted = list(target.record.fingerprint.accepted) if target.record.fingerprint else []
            self._commit(self.chain.blob_writer(), event("rollback", ref=target.id,
                                                         detail="drift: back to the newest checkpoint made in a "
                                                         "world like this one"), [])
        if decision.recomputed or decision.accepted:
            self._accepted = merge_accepted(self._accepted, decision.accepted)
            self.state = SessionState.of(decision.state)
            self._commit(self.chain.blob_writer(), event("drift", detail=decision.describe()), [])
        elif found.drifted and decision.rollback_to is None:
            # drift no step read: nothing to do, but record the world it was seen in, so the next run
            # does not report it again (a task with nothing left to run commits nothing else); a
            # warning alone commits nothing
            self._commit(self.chain.blob_writer(), event("drift", detail="reported: " + "; ".join(
                i.describe() for i in found.items)[:500]), [])
        self._export()

    def _set_aside_damaged(self) -> None:
        """A replicated task whose primary (or another medium) is damaged: its files moved aside
        (:func:`~overnight.ops.repair.set_aside_damaged_media`), rebuilt by :meth:`_repair_media`."""
        if replicated_under(self.store) is None:  # one medium: nothing to set aside (ops.repair not imported)
            return
        from overnight.ops.repair import set_aside_damaged_media

        set_aside_damaged_media(self.store, self.task.id)

    def _repair_media(self) -> None:
        """A replicated task: every medium brought up to the newest verifiable head before one is
        read (:func:`~overnight.ops.repair.repair_before_resume`)."""
        if replicated_under(self.store) is None:  # one medium: nothing to repair (ops.repair not imported)
            self._repair = None
            return
        from overnight.ops.repair import repair_before_resume

        self._repair = repair = repair_before_resume(self.store, self.task.id, key=self.key)
        if repair is not None and (repair.repaired or any(m.status != "ok" for m in repair.media)):
            self._emit("repair", detail=repair.describe())

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
        signals = StopSignals(self._on_stop, lambda: self._in_step)
        if self.handle_signals:
            signals.install()
        first: BaseException | None = None
        result: RunResult | None = None
        try:
            self._set_aside_damaged()  # the lease is taken on the primary: it must be readable
            self._keeper = LeaseKeeper(self.store, self.task.id, self.branch, self.lease_ttl_ms, self._on_lease_lost)
            self._keeper.acquire()
            result = self._session()
            return result
        except StoreError as exc:  # the disk or server said no: name the task it happened to
            if exc.task_id is None:
                exc.task_id = self.task.id
            first = exc
            raise
        except BaseException as exc:
            first = exc
            raise
        finally:
            if self._keeper is not None:
                try:  # while the lease is still held: no worker claims the row between the run's end and this
                    self._settle_queue(result, first)
                finally:
                    self._keeper.release(first)
                    self._keeper = None
            if self._own_wrapper:
                self.store.close()  # the hot store too when this run opened it
            signals.restore()

    def _settle_queue(self, result: RunResult | None, first: BaseException | None) -> None:
        """A run of the main branch that ended ``complete``, or ``failed`` for good
        (:func:`~overnight.runtime.lease.failure_reason`): the task's queue row, when it is parked
        ``failed`` or ``cancelled`` (a run here after `overnight cancel`, or after a worker parked
        it), takes this outcome -- the latest run's outcome is what `overnight status` / `ls`, the
        dashboard and the workers read (:func:`~overnight.store.queue_open.settle_run`). A run that
        completed the task also finishes a ``queued`` row (submitted, no worker claimed it yet)
        ``complete`` -- reason :data:`~overnight.store.queue.COMPLETED_OUTSIDE` -- so no worker
        claims a task with nothing left to do. Called while this run still holds the task lease (a
        claim passes over a task whose lease is live). A row a worker holds (``running``) is left
        alone, a ``queued`` one after a failure too (the workers retry it), and every row after a
        run that stopped early. Never hides the run's outcome: a failure here is a warning."""
        if self.branch != "main" or self.level == "ephemeral":
            return
        if result is not None and result.status == "complete":
            status, reason = "complete", None
        elif failure_reason(first) is not None:
            status, reason = "failed", failure_reason(first)
        else:
            return
        try:
            from overnight.store.queue_open import settle_run

            settle_run(self.store, self.task.id, status, reason)
        except Exception as exc:  # noqa: BLE001 - reported, never raised over the run's outcome
            why = exc.message if isinstance(exc, OvernightError) else str(exc)
            warnings.warn(f"task {self.task.id!r} ended {status}, but its queue row could not be updated "
                          f"({type(exc).__name__}: {why}); `overnight status` may still show it as before",
                          RuntimeWarning, stacklevel=2)

    def _session(self) -> RunResult:
        created, fallback = self._start()
        steps_run = steps_reused = 0
        status = "complete"
        if self.state.context.tokens >= self.budget.compact_at and self.state.todo:
            self._compact()  # a compaction that failed or was killed last time: retried first
        try:
            while self.state.todo:
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
        except Abandon:
            status = "interrupted"
        done, total = self.state.progress
        if status == "complete" and self.stop_requested and self.state.todo:
            status = "interrupted"
        self._emit("end", checkpoint_id=self.head, detail=status)
        return RunResult(
            task_id=self.task.id, branch=self.branch, status=status, head=self.head or "", store_url=self.store.url,
            session=self.session_n, steps_run=steps_run, steps_reused=steps_reused, done=done, total=total,
            created=created, fallback=fallback, artifacts=sorted(self.state.artifacts), level=self.level,
            route=list(self.route.reasons) if self.route else [], compactions=self.compactions,
            usage=dict(self.usage), resume_file=self._resume_file(), used_model=self._used_model(),
        )

    def _used_model(self) -> bool:
        """Whether the task has used a model, from what its head's context window records (and this
        run's calls): a task that never called one has no tokens, messages, summary or compaction."""
        c = self.state.context
        return bool(self.usage.get("calls") or self.usage.get("replayed_calls") or self.compactions
                    or c.compactions or c.tokens or c.messages or c.summary)

    def _run_one(self) -> bool:
        """Run (or reuse) the first todo step and commit its checkpoint. Returns True if it ran."""
        entry = self.state.todo[0]
        sdef = self.task.steps.get(entry["fn"])
        if sdef is None:
            raise UnknownStep(
                f"step {entry['name']!r} calls step function {entry['fn']!r}, which task {self.task.id!r} does not define",
                task_id=self.task.id, checkpoint_id=self.head, step=entry["name"],
                hint=f"restore the function or register it under that name; defined: {sorted(self.task.steps)}",
            )
        key = step_key(sdef.fn_name, sdef.version, entry["name"], entry["args"])
        writer = self.chain.blob_writer()
        if self.state.done_with_key(key, entry["name"]) is not None:
            self.state = self.state.but(todo=self.state.todo[1:])
            self._commit(writer, event("step", step=entry["name"], key=key, detail="reused"), [])
            self._emit("skip", step=entry["name"], checkpoint_id=self.head)
            return False

        if entry.get("previous") is not None and self._can_replay(entry, sdef):
            return self._replay(entry, key, writer)
        args = from_tree(entry["args"], f"step[{entry['name']!r}].args")
        declared = self._declared_reads(sdef)
        self._emit("step_start", step=entry["name"])
        attempt = 0
        while True:
            attempt += 1
            self._pending_context = []
            ctx = StepContext(self, entry, args, attempt, ModelGateway(self, entry["name"], key))
            started_at = utc_now()
            t0 = time.perf_counter()
            try:
                self._in_step = True
                try:
                    output = sdef.fn(ctx, **args)
                finally:
                    self._in_step = False
                break
            except (Abandon, KeyboardInterrupt, SystemExit):
                raise
            except StoreError as exc:  # the store under a model call said no (disk full...): not the step's fault
                exc.task_id = exc.task_id or self.task.id
                exc.checkpoint_id = exc.checkpoint_id or self.head
                raise exc.with_traceback(None) from None
            except Exception as exc:
                if attempt > sdef.retries:
                    raise StepFailed(
                        f"step {entry['name']!r} failed after {attempt} attempt(s): {type(exc).__name__}: {exc}",
                        task_id=self.task.id, checkpoint_id=self.head, step=entry["name"],
                        hint="nothing of this step was committed; fix the cause and " + (
                            f"resume (`{self.resume_command()}`)" if self.level != "ephemeral" else
                            "run it again (level ephemeral: its checkpoints lived in this process, so it starts "
                            "over; give it a longer expected_span, level='session' or --store to keep them)"),
                    ) from exc
                self._emit("step_retry", step=entry["name"], detail="".join(traceback.format_exception_only(exc)).strip())
                time.sleep(min(0.1 * 2 ** (attempt - 1), 5.0))
        duration_ms = (time.perf_counter() - t0) * 1000

        # stage everything the step did; encoding errors surface here, before anything is written
        try:
            output_tree, data_tree = encode_results(entry["name"], output, ctx.state)
        except EncodeError as exc:
            exc.task_id, exc.checkpoint_id = self.task.id, self.head
            exc.hint = f"{exc.hint}; nothing of step {entry['name']!r} was committed"
            raise
        gw = ctx.model
        reads = {kind: ({**declared.get(kind, {}), **got} if isinstance(got, dict) else got)
                 for kind, got in ctx.reads.items()}
        if gw.calls_made or gw.calls_replayed:  # drift component "model" reaches this step
            reads["model"] = {"model": model_label(self.model_identity)}
        ran = StepRun(entry=entry, key=key, version=sdef.version, output=output_tree, data=data_tree,
                      staged=ctx.staged(), reads=reads, started_at=started_at, duration_ms=duration_ms,
                      tokens_in=gw.tokens_in, tokens_out=gw.tokens_out, replayed_tokens=gw.replayed_tokens)
        state, produced = state_after(self.state, ran, writer, seq=self.chain.seq + 1, session=self.session_n)
        self.state = state.but(context=self._context_with(self._pending_context))
        self._pending_context = []
        if self.state.recompute is not None:  # a recompute pass: what this run changed is dirty
            self.state = self.state.but(recompute=recompute.dirtied(self.state, entry, produced))
        journal = [{"step_key": key, "step_name": entry["name"], "started_at": started_at,
                    "duration_ms": duration_ms, "tokens_in": gw.tokens_in, "tokens_out": gw.tokens_out}]
        # it ran in the world now: no result of it was computed without a drift accepted earlier
        self._accepted = accepted_after_run(self._accepted, entry["name"])
        self._commit(writer, event("step", step=entry["name"], key=key), journal)
        self._count(gw)
        self._emit("step_end", step=entry["name"], checkpoint_id=self.head, duration_ms=duration_ms)
        if self.state.context.tokens >= self.budget.compact_at:
            self._compact()
        return True


def run(task: Task, store: Store | str | None = None, **kwargs: Any) -> RunResult:
    """Create or resume ``task`` and run it to completion (or interruption). See :class:`Runner`."""
    return Runner(task, store, **kwargs).run()


__all__ = ["Runner", "run"]
