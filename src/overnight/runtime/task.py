"""Task definitions: a goal, a spec, and step functions, registered with ``@task.step``.

    task = overnight.Task("report", goal="Write the API report", expected_span="3h")

    @task.step
    def plan(ctx):
        for module in ["a", "b"]:
            ctx.add_step("section", module=module)   # the todo list grows

    @task.step(planned=False)                         # only run when added
    def section(ctx, module: str) -> str:
        ...

A step's *name* is unique within the task (``"section[module='a']"`` by default); its *key* --
``sha256`` of the step function's name and version, the step name and its arguments -- is what
memoization looks up: a step whose key is in the head checkpoint's done list is never run again.
"""

from __future__ import annotations

import dataclasses

import hashlib
import inspect
import re
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

from overnight.codec.canonical import dumps, dumps_sorted, encode, to_tree
from overnight.errors import ConfigError, SpecError
from overnight.chain import records

CRITICALITY = ("normal", "important", "critical")
TASK_ID_MAX = 200
"""Characters in a task id, at most."""
TASK_ID_RULE = (f"1-{TASK_ID_MAX} ASCII letters (a-z, A-Z), digits, '.', '_' or '-', starting with a letter or "
                "digit")
"""What a task id is made of, as errors state it (:func:`task_id_problem` checks it)."""
_ID_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_ID_REST = _ID_FIRST | frozenset("._-")


def _char(c: str) -> str:
    """A character as an error names it: ``'['``; ``'\\n' (U+000A)`` for one that is not printable
    ASCII (a control, a space, a letter of another script that looks like an ASCII one)."""
    plain = c.isascii() and c.isprintable() and not c.isspace()
    return repr(c) if plain else f"{c!r} (U+{ord(c):04X})"


def task_id_problem(task_id: str) -> str | None:
    """Why ``task_id`` is not a valid task id (:data:`TASK_ID_RULE`) -- ``"it is empty"``,
    ``"it cannot start with '.'"``, ``"'[' is not allowed"`` (the first such character),
    ``"it is longer than 200 characters"`` -- or None when it is one."""
    if not task_id:
        return "it is empty"
    if task_id[0] not in _ID_FIRST:
        return f"it cannot start with {_char(task_id[0])}" if task_id[0] in _ID_REST else \
            f"{_char(task_id[0])} is not allowed"
    bad = next((c for c in task_id if c not in _ID_REST), None)
    if bad is not None:
        return f"{_char(bad)} is not allowed"
    if len(task_id) > TASK_ID_MAX:
        return f"it is longer than {TASK_ID_MAX} characters"
    return None
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hr|d|day|days|w|week|weeks)?\s*$")
_UNIT_S = {None: 3600, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "day": 86400,
           "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}


def parse_span(span: str | float | int | timedelta | None) -> float | None:
    """Expected span in seconds from ``"90m"``, ``"3h"``, ``"2d"``, a number of hours, or a timedelta.

    Raises:
        SpecError: a string in none of those forms, or a negative span.
    """
    if span is None:
        return None
    if isinstance(span, timedelta):
        seconds = span.total_seconds()
    elif isinstance(span, (int, float)) and not isinstance(span, bool):
        seconds = float(span) * 3600
    elif isinstance(span, str) and (m := _SPAN.match(span.lower())):
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise SpecError(f"cannot read expected span {span!r}", missing=["expected_span"],
                        hint="use e.g. '90m', '3h', '2d', a number of hours, or a timedelta")
    if seconds < 0:
        raise SpecError(f"expected span {span!r} is negative")
    return seconds


@dataclass(frozen=True)
class StepDef:
    """A registered step function.

    Attributes:
        fn_name: name the todo list refers to (the function's ``__name__`` unless given).
        fn: ``fn(ctx, **args) -> output``; the output must be encodable (see the codec).
        version: the step's code version; bumping it changes every key of this step.
        retries: extra attempts after an exception before the run stops with ``StepFailed``.
        planned: part of the task's initial plan (in definition order).
        source_digest: ``sha256`` of the function's source (a hint for drift reports).
        inputs, env, packages, sources: what the step reads outside its context (files or
            directories, environment variables, installed distributions, registered input
            sources); recorded with their digests when it runs, so drift there recomputes it.
            Reads through ``ctx`` (``read_input``, ``env``, ``source``, ``outputs``,
            ``read_artifact``) are recorded without declaring them.
    """

    fn_name: str
    fn: Callable[..., Any]
    version: str = "1"
    retries: int = 0
    planned: bool = True
    source_digest: str | None = None
    inputs: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()


def _source_digest(fn: Callable[..., Any]) -> str | None:
    try:
        return "sha256:" + hashlib.sha256(inspect.getsource(fn).encode("utf-8", "surrogatepass")).hexdigest()
    except (OSError, TypeError):
        return None


def _arg_text(value: Any) -> str:
    """How an argument appears in a default step name: ``repr`` for scalars, lists, tuples and dicts
    of them; ``#`` + 12 hex digits of the canonical encoding's SHA-256 for anything else -- a set's
    ``repr`` order changes with the process's hash seed, and an object's ``repr`` may hold its
    address, either of which would make a resumed run see a new step."""
    cls = type(value)
    if value is None or cls in (str, int, float, bool):
        return repr(value)
    if cls is list:
        return "[" + ", ".join(_arg_text(v) for v in value) + "]"
    if cls is tuple:
        return "(" + ", ".join(_arg_text(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if cls is dict and all(type(k) is str for k in value):
        return "{" + ", ".join(f"{k!r}: {_arg_text(v)}" for k, v in value.items()) + "}"
    return "#" + hashlib.sha256(encode(value, "step argument")).hexdigest()[:12]


def default_step_name(fn_name: str, args: dict[str, Any]) -> str:
    """``fn`` alone, or ``fn[a=1, b='x']`` when the step has arguments (sorted by name, so the
    order they were passed in does not make another step). Stable across processes: values other
    than scalars and lists/tuples/dicts of them appear as a digest (``fn[tags=#3f2a9c1b04de]``)."""
    if not args:
        return fn_name
    inner = ", ".join(f"{k}={_arg_text(args[k])}" for k in sorted(args))
    return f"{fn_name}[{inner}]"


def step_key(fn_name: str, version: str, name: str, args_tree: Any) -> str:
    """Memoization key of a step instance: ``sha256`` of canonical ``[fn, version, name, args]``."""
    return "sha256:" + hashlib.sha256(dumps(["overnight.step/1", fn_name, version, name, args_tree])).hexdigest()


@dataclass
class Task:
    """A long-horizon task: what it is for, how long it should take, and its steps.

    Args:
        id: unique id in the store (ASCII letters and digits, ``._-``, 1-200 characters, starting
            with a letter or digit).
        goal: one line saying what the task produces.
        expected_span: how long it should take (``"3h"``, ``"2d"``, hours as a number, timedelta).
        criticality: ``"normal"``, ``"important"`` or ``"critical"``.
        data: initial user state (a dict; must be encodable).
        entry: where the task is defined (``file.py:name``), recorded for ``overnight resume``;
            set by the CLI.
        version: the task's code epoch; bumping it recomputes every step on the next resume.
        deps: installed distributions to fingerprint: ``"all"`` (default) or a list of names.
        env: environment variables to fingerprint (as keyed digests, never values).
        inputs: files or directories the task depends on as a whole.
        exports: ``artifact name -> file path``: the runner writes each committed version there,
            and an edit of the file is drift (component ``artifacts``).
        on_drift: ``component -> policy`` overriding :data:`~overnight.verify.drift.DEFAULT_POLICIES`.
        done_when: acceptance criteria in words (part of the spec's completeness, see the router).
        completeness: the spec's completeness in [0, 1] as judged by whoever wrote it (a planner
            model, say); None lets the router compute it from the fields filled in.
        model: the model steps call through ``ctx.model`` (spec: ``extractive`` (default, offline,
            not an LLM), ``local`` (SmolLM2 in-process), ``openai:NAME``).
        max_context_tokens: the session's context window in tokens (default 8,000).
        compaction_threshold: compact when the session's context reaches this share of the window.
        level, media: override the router's persistence level (``ephemeral``/``session``/
            ``durable``) and storage media (names from the config, or store URLs).

    Raises:
        SpecError: invalid id, criticality, span, level or drift policy.
    """

    id: str
    goal: str
    expected_span: str | float | timedelta | None = None
    criticality: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    entry: str | None = None
    version: str = "1"
    deps: list[str] | str = "all"
    env: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    exports: dict[str, str] = field(default_factory=dict)
    on_drift: dict[str, str] = field(default_factory=dict)
    done_when: str | None = None
    completeness: float | None = None
    model: str | None = None
    max_context_tokens: int = 8_000
    compaction_threshold: float = 0.8
    level: str | None = None
    media: list[str] | None = None
    steps: dict[str, StepDef] = field(default_factory=dict, repr=False)
    sources: dict[str, Callable[[], Any]] = field(default_factory=dict, repr=False)
    params: dict[str, Any] = field(default_factory=dict)
    """Parameters of this submission (``overnight submit --params``), read by steps as
    ``ctx.params``; recorded in the spec, so part of every checkpoint's digest."""
    definition: str | None = None
    """The id of the task definition this task was submitted from, when it runs under another id
    (``overnight submit --id``, or the default id with a digest of the params); recorded in the
    spec, so ``resume`` and ``status --drift`` load that definition and give it this id."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or task_id_problem(self.id) is not None:
            raise SpecError(f"invalid task id {self.id!r}", missing=["id"], hint=f"use {TASK_ID_RULE}")
        self.criticality_explicit = self.criticality is not None
        self.criticality = self.criticality or "normal"
        if self.criticality not in CRITICALITY:
            raise SpecError(f"criticality must be one of {CRITICALITY}, got {self.criticality!r}", task_id=self.id)
        if not (isinstance(self.max_context_tokens, int) and self.max_context_tokens >= 256):
            raise SpecError(f"max_context_tokens must be an int >= 256, got {self.max_context_tokens!r}", task_id=self.id)
        if not 0.1 <= float(self.compaction_threshold) <= 1.0:
            raise SpecError(f"compaction_threshold must be in [0.1, 1], got {self.compaction_threshold!r}",
                            task_id=self.id)
        if self.completeness is not None and not 0.0 <= float(self.completeness) <= 1.0:
            raise SpecError(f"completeness must be in [0, 1], got {self.completeness!r}", task_id=self.id)
        if self.level is not None and self.level not in ("ephemeral", "session", "durable"):
            raise SpecError(f"level must be ephemeral, session or durable, got {self.level!r}", task_id=self.id)
        self.span_s = parse_span(self.expected_span)
        from overnight.verify.drift import parse_policies

        try:
            self.on_drift = parse_policies(self.on_drift)
        except ConfigError as exc:
            raise SpecError(exc.message, task_id=self.id, hint=exc.hint) from exc
        if self.deps != "all" and isinstance(self.deps, str):
            raise SpecError(f"deps must be 'all' or a list of distribution names, got {self.deps!r}", task_id=self.id)

    def step(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        version: str = "1",
        retries: int = 0,
        planned: bool = True,
        inputs: list[str] = (),  # type: ignore[assignment]
        env: list[str] = (),  # type: ignore[assignment]
        packages: list[str] = (),  # type: ignore[assignment]
        sources: list[str] = (),  # type: ignore[assignment]
    ) -> Any:
        """Register a step function (decorator, with or without arguments). See :class:`StepDef`."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            fn_name = name or f.__name__
            if fn_name in self.steps:
                raise SpecError(f"task {self.id!r} already has a step named {fn_name!r}", task_id=self.id)
            self.steps[fn_name] = StepDef(fn_name, f, str(version), int(retries), planned, _source_digest(f),
                                          tuple(str(p) for p in inputs), tuple(env), tuple(packages), tuple(sources))
            return f

        return register(fn) if fn is not None else register

    def source(self, name: str | Callable[[], Any]) -> Any:
        """Register an input source: ``@task.source`` (named after the function) or
        ``@task.source("api-etag")``.

        The callable takes no arguments and returns ``str``, ``bytes`` or a JSON value; steps that
        call ``ctx.source(name)`` record its digest and are recomputed when it changes.
        """
        if callable(name):
            self.sources[name.__name__] = name
            return name

        def register(fn: Callable[[], Any]) -> Callable[[], Any]:
            self.sources[name] = fn
            return fn

        return register

    def submitted_as(self, task_id: str, params: dict[str, Any]) -> "Task":
        """This definition as the task ``task_id`` run with ``params`` (``ctx.params``): a copy with
        that id, those params and, when the id differs, ``definition`` naming this one, so
        ``resume`` loads this definition again (``overnight submit``, ``overnight run --param``).
        Everything else -- steps, sources, the entry, whether criticality was given -- is this one's.

        Raises:
            SpecError: ``task_id`` is not a valid task id.
        """
        out = dataclasses.replace(self, id=task_id, params=dict(params),
                                  definition=self.id if self.id != task_id else self.definition)
        out.criticality_explicit = self.criticality_explicit  # replace() re-ran __post_init__ on "normal"
        return out

    def spec(self) -> dict[str, Any]:
        """The task spec stored with it: span (s), criticality, initial plan, code epoch, what it
        fingerprints (names only), a fresh random salt for keyed environment digests, and where its
        code lives (``entry``: part of every checkpoint, so ``resume`` imports only a verified
        location)."""
        return {
            "expected_span_s": self.span_s,
            "criticality": self.criticality,
            "plan": [s.fn_name for s in self.steps.values() if s.planned],
            "version": self.version,
            "env": sorted(self.env),
            "salt": secrets.token_hex(16),
            "entry": self.entry,
            **({"params": to_tree(self.params, "task params")} if self.params else {}),
            **({"definition": self.definition} if self.definition else {}),
        }

    def initial_todo(self) -> list[dict[str, Any]]:
        """The todo list of a new task: every ``planned`` step, in definition order, no arguments."""
        if not any(s.planned for s in self.steps.values()):
            raise SpecError(f"task {self.id!r} has no planned steps", task_id=self.id, missing=["steps"],
                            hint="decorate at least one function with @task.step")
        return [todo_entry(s.fn_name, s.fn_name, {}, None) for s in self.steps.values() if s.planned]


def params_text(params: Any) -> str:
    """Params (a JSON object) as JSON with keys sorted, cut to 200 characters: how a message names
    them. Text reads as written (``{"who":"Zoë 🐙"}``, not ``\u00eb`` escapes); control characters
    stay escaped, as JSON escapes them, and a lone surrogate (which no terminal can print) makes
    the whole text the canonical ASCII form."""
    import json

    try:
        text = json.dumps(params, ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError: a lone surrogate
        text = dumps_sorted(params).decode("utf-8", "replace")
    return text if len(text) <= 200 else text[:199] + "…"


def todo_entry(name: str, fn_name: str, args: dict[str, Any], added_by: str | None) -> dict[str, Any]:
    """A todo entry as stored (:class:`~overnight.chain.records.TodoEntry`, validated)."""
    return records.todo_entry(name, fn_name, to_tree(args, f"step {fn_name!r} args"), added_by=added_by)


@dataclass
class PlanChange:
    """How the stored plan differs from the task code (:func:`reconcile_plan`).

    Attributes:
        added: ``(step, before)`` for each planned step added to the code since: ``before`` is
            the step it now runs in front of (the next planned step in the code that has not run
            yet), or None when it goes at the end.
        removed: planned steps still to do whose function is no longer in the code.
    """

    added: list[tuple[str, str | None]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)

    def describe(self) -> str:
        """``+ x before c; + z at the end; - y``."""
        return "; ".join([f"+ {n} before {b}" if b else f"+ {n} at the end" for n, b in self.added]
                         + [f"- {n}" for n in self.removed])


def reconcile_plan(todo: list[dict[str, Any]], done: list[dict[str, Any]], task: Task
                   ) -> tuple[list[dict[str, Any]], PlanChange]:
    """The todo list brought up to date with the task code, and what changed.

    * A planned step added to the code since goes where the code puts it: in front of the next
      planned step (in definition order) that is still to do, so a later step that needs it does
      not run without it; at the end when every later planned step has run (or it is the last).
    * A planned step still to do (or one a recompute pass put back) whose function is gone from
      the code leaves the plan. A sub-step added by ``ctx.add_step`` whose function is gone stays
      and fails when reached (:class:`~overnight.errors.UnknownStep`): restoring the function
      lets it run.

    ``todo``/``done`` are state trees (:class:`~overnight.chain.records.TodoEntry` dicts); neither
    is mutated. Used by the runner on resume and by ``overnight status --drift``, so the
    prediction is the plan the resume runs.
    """
    change = PlanChange()
    change.removed = [e["name"] for e in todo if e["fn"] not in task.steps
                      and (e.get("added_by") is None or e.get("previous") is not None)]
    out = [e for e in todo if e["name"] not in change.removed]
    from overnight.chain.integrity import done_named

    known = {e["name"] for e in todo}
    planned = [s.fn_name for s in task.steps.values() if s.planned]
    for i, fn in enumerate(planned):
        if fn in known or done_named(done, fn) is not None:  # the done list by its index: a page or none read
            continue
        names = [e["name"] if e.get("added_by") is None else None for e in out]
        before = next((n for n in planned[i + 1:] if n in names), None)
        entry = todo_entry(fn, fn, {}, None)
        if before is None:
            out.append(entry)
        else:
            out.insert(names.index(before), entry)
        change.added.append((fn, before))
        known.add(fn)
    return out, change
