"""The router: persistence level and storage media, from a task's span, its nights, and criticality.

=========================================== ==========================
expected span (local calendar)              level
=========================================== ==========================
under ``session_hours`` (2 h), same day      ``ephemeral`` (in-process only)
``session_hours`` .. ``durable_hours``       ``session`` (a checkpoint per step, verified resume)
  (2-24 h), same day
over ``durable_hours`` (24 h), or crossing   ``durable`` (plus fingerprints and drift checks on
  a local midnight                           resume, and the media below)
=========================================== ==========================

A task "crosses a night" when a local midnight falls strictly inside ``[start, start + span)``:
a 3-hour task started at 22:00 is durable, a 24-hour task started exactly at 00:00 is not.
An ``important`` or ``critical`` task is never ``ephemeral`` (at least ``session``).

Criticality picks the media (``[criticality]`` in ``overnight.toml``): ``normal`` -> local
(SQLite or a directory), ``important`` -> database (PostgreSQL when configured), ``critical`` ->
database plus a cloud replica (S3). A medium that is not configured falls back to the local store,
and the decision says so. Thresholds are configurable (``[router]``).

A spec with no span, or less complete than ``min_completeness`` (0.3), is refused with a
:class:`~overnight.errors.SpecError` listing what is missing. Completeness is the share of
these filled in: goal (at least 3 words), expected span, a plan (at least one planned step),
an explicit criticality, declared world (any of ``env``/``inputs``/``deps`` list/``exports``),
acceptance criteria (``Task(done_when=...)``) -- unless the task states its completeness itself
(``Task(completeness=0.8)``, e.g. a planner's own estimate).
"""

from __future__ import annotations

from datetime import datetime, time, timedelta

from overnight.config import Config
from overnight.errors import SpecError
from overnight.runtime.task import Task
from overnight.store.task_location import Route

LEVELS = ("ephemeral", "session", "durable")


def completeness(task: Task) -> tuple[float, list[str]]:
    """``(share of spec items present, names of the missing ones)`` (see the module docstring)."""
    items = {
        "goal": len(task.goal.split()) >= 3,
        "expected_span": task.span_s is not None,
        "plan": any(s.planned for s in task.steps.values()),
        "criticality": task.criticality_explicit,
        "world": bool(task.env or task.inputs or task.exports or (task.deps != "all")),
        "done_when": bool(task.done_when),
    }
    missing = [k for k, ok in items.items() if not ok]
    if task.completeness is not None:
        return float(task.completeness), missing
    return (len(items) - len(missing)) / len(items), missing


def crosses_night(start: datetime, span_s: float) -> bool:
    """Does a local midnight fall strictly inside ``[start, start + span)``?"""
    next_midnight = datetime.combine(start.date() + timedelta(days=1), time(0), tzinfo=start.tzinfo)
    return start + timedelta(seconds=span_s) > next_midnight


def route(task: Task, config: Config, *, now: datetime | None = None) -> Route:
    """Decide level and media for ``task`` started ``now`` (local time).

    Raises:
        SpecError: no expected span, or spec completeness under the threshold (``missing``
            lists what to add).
    """
    score, missing = completeness(task)
    if task.span_s is None:
        raise SpecError(f"task {task.id!r} has no expected span: it cannot be routed", task_id=task.id,
                        missing=missing, hint="add expected_span='3h' (or '2d', ...) to the Task; missing: "
                        + ", ".join(missing))
    min_score = float(config.get("router.min_completeness"))
    if score < min_score:
        raise SpecError(f"task {task.id!r} spec is {score:.0%} complete, under the {min_score:.0%} needed to "
                        f"route it; missing: {', '.join(missing)}", task_id=task.id, missing=missing,
                        hint="fill in the missing items (see `overnight route --help`)")
    start = (now or datetime.now()).astimezone()
    hours = task.span_s / 3600
    night = crosses_night(start, task.span_s)
    session_h, durable_h = float(config.get("router.session_hours")), float(config.get("router.durable_hours"))
    reasons = []
    if hours > durable_h:
        level = "durable"
        reasons.append(f"span {hours:g} h > {durable_h:g} h: durable")
    elif night:
        level = "durable"
        reasons.append(f"span {hours:g} h from {start:%H:%M} crosses local midnight: durable")
    elif hours >= session_h:
        level = "session"
        reasons.append(f"span {hours:g} h in [{session_h:g} h, {durable_h:g} h], same day: session")
    else:
        level = "ephemeral"
        reasons.append(f"span {hours:g} h < {session_h:g} h, same day: ephemeral")
    if level == "ephemeral" and task.criticality != "normal":
        level = "session"
        reasons.append(f"criticality {task.criticality}: never ephemeral, raised to session")

    wanted = list(config.get(f"criticality.{task.criticality}"))
    media, urls = [], []
    for name in wanted:
        url = config.medium(name)
        if url is None:
            reasons.append(f"criticality {task.criticality} wants medium {name!r}, which is not configured "
                           f"(set media.{name} in overnight.toml or $OVERNIGHT_MEDIA_{name.upper()}): using local")
            name, url = "local", config.medium("local")
        if name not in media:
            media.append(name)
            urls.append(url)
    reasons.append(f"criticality {task.criticality}: media {', '.join(media)}")
    decision = Route(level, media, urls if level != "ephemeral" else [], reasons, score, night, missing=missing)
    if task.level or task.media:
        decision.overridden = True
        if task.level:
            decision.level = task.level
            decision.reasons.append(f"level overridden by the task: {task.level}")
        if task.media:
            decision.media = list(task.media)
            decision.urls = [config.medium(m) or m for m in task.media]
            decision.reasons.append(f"media overridden by the task: {', '.join(task.media)}")
        if decision.level == "ephemeral":
            decision.urls = []
    return decision
