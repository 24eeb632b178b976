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

from dataclasses import asdict, dataclass, field
from datetime import datetime, time, timedelta
from typing import Any

from overnight.config import Config
from overnight.errors import SpecError
from overnight.run.task import Task

LEVELS = ("ephemeral", "session", "durable")


@dataclass
class Route:
    """A routing decision.

    Attributes:
        level: ``ephemeral`` / ``session`` / ``durable``.
        media: medium names (``local``, ``database``, ``cloud``), the first one primary.
        urls: their store URLs (empty for ``ephemeral``).
        reasons: why, one line each (recorded on the task).
        completeness: spec completeness in [0, 1].
        crosses_night: whether the expected span crosses a local midnight.
    """

    level: str
    media: list[str]
    urls: list[str]
    reasons: list[str]
    completeness: float
    crosses_night: bool
    overridden: bool = False
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


def open_routed(route: Route, task_id: str, *, read_only: bool = False) -> Any:
    """The store a route asks for: in-process for ``ephemeral``, one medium, or a
    :class:`~overnight.store.compose.replicated.ReplicatedStore` over several (the first is primary).

    A medium of several whose store is damaged (:class:`~overnight.errors.StoreCorrupt` on opening)
    is opened as a :class:`~overnight.store.compose.damaged.DamagedMedium`: the others still carry the task,
    and a repair sets it aside and rebuilds it.

    Raises:
        StoreCorrupt: the single medium of a one-medium route is damaged.
    """
    from overnight.errors import StoreCorrupt, StoreUnavailable
    from overnight.store import open_store
    from overnight.store.compose.damaged import DamagedMedium
    from overnight.store.memory import MemoryStore
    from overnight.store.compose.replicated import ReplicatedStore

    if route.level == "ephemeral" or not route.urls:
        return MemoryStore(f"ephemeral-{task_id}")
    if len(route.urls) == 1:
        return open_store(route.urls[0], read_only=read_only)
    stores: list[Any] = []
    for url in route.urls:
        try:
            try:
                stores.append(open_store(url, read_only=read_only))
            except StoreUnavailable:
                if not read_only:
                    raise
                stores.append(open_store(url))  # a medium whose file is gone: opened (empty) as before, the others hold the task
        except StoreCorrupt as exc:
            stores.append(DamagedMedium(url, exc))
    return ReplicatedStore(stores, list(route.media))


def recorded_route(spec: dict[str, Any]) -> Route | None:
    """The route recorded in a task spec at creation, if any."""
    data = spec.get("route")
    if not isinstance(data, dict) or "level" not in data:
        return None
    return Route(level=data["level"], media=list(data.get("media", [])), urls=list(data.get("urls", [])),
                 reasons=list(data.get("reasons", [])), completeness=float(data.get("completeness", 0.0)),
                 crosses_night=bool(data.get("crosses_night", False)), overridden=bool(data.get("overridden", False)))


def locate(task_id: str, config: Config, *, read_only: bool = False) -> tuple[Any, Route | None] | None:
    """Find an existing task: in the default store, else in the configured database or cloud
    medium. Returns ``(store, recorded route)`` -- the store opened on every medium the task was
    routed to (``read_only`` for reading commands: see :func:`~overnight.store.open_store`) -- or
    None when no medium knows the task.

    A damaged local store (:class:`~overnight.errors.StoreCorrupt`) does not end the search: a
    replicated task is found on a replica (its damaged medium then opens as a
    :class:`~overnight.store.compose.damaged.DamagedMedium`, for a repair to set aside and rebuild).

    Raises:
        StoreCorrupt: the local store is damaged and no other medium knows the task.
        ConfigError: the local store cannot be opened for another reason (not an overnight store).
    """
    from overnight.codec.canonical import loads
    from overnight.errors import NotFound, OvernightError, StoreCorrupt
    from overnight.store import exists, open_store

    damaged: StoreCorrupt | None = None
    for name in ("local", "database", "cloud"):
        url = config.medium(name)
        if url is None or not exists(url):
            continue
        store = None
        try:
            store = open_store(url, read_only=read_only)
            spec = loads(store.get_task(task_id).spec)
        except NotFound:
            store.close()  # type: ignore[union-attr]
            continue
        except StoreCorrupt as exc:
            if store is not None:
                store.close()
            if name == "local":
                damaged = exc
            continue
        except OvernightError:
            if name == "local" or store is not None:  # a replica that cannot be opened is skipped
                raise
            continue
        rec = recorded_route(spec) if isinstance(spec, dict) else None
        if rec is not None and rec.level != "ephemeral" and len(rec.urls) > 1:
            store.close()
            return open_routed(rec, task_id, read_only=read_only), rec
        return store, rec
    if damaged is not None:
        raise damaged
    return None
