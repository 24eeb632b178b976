"""Where a task lives, and opening it there: the one module that decides it.

A task lives on the media its route recorded when it was created (``spec.route``: level, medium
names, store URLs; :class:`Route`); the router (:mod:`overnight.runtime.router`) only *decides* a new
task's route. Everything that opens an existing task by id -- the API, the runner, the CLI, the
adapters -- asks this module:

* :func:`locate` -- which configured medium knows the task (the default store, else the
  configured database, else the cloud medium), opened on every medium it was routed to;
* :func:`open_routed` -- the store a route asks for: in-process for ``ephemeral``, one medium, or a
  :class:`~overnight.store.compose.replicated.ReplicatedStore` over several;
* :func:`medium_for` -- which medium of a replicated task to read (the first that holds it), or
  all of them, brought together first by ``heal``, to write;
* :func:`opened` -- a store URL, a store, or (``None``) the task's own media, wrapped so archived
  history reads through (:class:`~overnight.store.compose.tiered.TieredStore`).

Healing replicas (copying the newest verified head to the media that lack it) deletes nothing but
writes data, so it is an operation (:func:`overnight.ops.repair.repair_task`): callers that write
pass it as ``heal``; this module never imports it.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from overnight.codec.canonical import loads
from overnight.config import Config
from overnight.config import load as load_config
from overnight.errors import ConfigError, NotFound, OvernightError, StoreCorrupt, StoreUnavailable
from overnight.store import default_store_url, exists, location, open_store
from overnight.store.base import Store
from overnight.store.compose.damaged import DamagedMedium
from overnight.store.compose.replicated import ReplicatedStore
from overnight.store.compose.tiered import TieredStore, tiered

Heal = Callable[[ReplicatedStore, str], Any]
"""``heal(replicated, task_id)``: bring every medium of a replicated task to its newest verified
head before writing (:func:`overnight.ops.repair.repair_task` over ``replicated.media``)."""


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


def open_routed(route: Route, task_id: str, *, read_only: bool = False) -> Any:
    """The store a route asks for: in-process for ``ephemeral``, one medium, or a
    :class:`~overnight.store.compose.replicated.ReplicatedStore` over several (the first is primary).

    A medium of several whose store is damaged (:class:`~overnight.errors.StoreCorrupt` on opening)
    is opened as a :class:`~overnight.store.compose.damaged.DamagedMedium`: the others still carry the task,
    and a repair sets it aside and rebuilds it.

    Raises:
        StoreCorrupt: the single medium of a one-medium route is damaged.
    """
    if route.level == "ephemeral" or not route.urls:
        # imported only here: a resume of a stored task never needs it
        from overnight.store.memory import MemoryStore

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


@contextmanager
def opened(store: Store | str | None, *, task_id: str | None = None, write: bool = False,
           read_only: bool = False, heal: Heal | None = None) -> Iterator[TieredStore]:
    """The store, wrapped so archived history reads through to its cold store. A store that does
    not exist yet is a ConfigError, never created (only running a task creates one).

    With ``store=None`` and a ``task_id``, the task is looked up where the router may have put it:
    the default store, else the configured database and cloud media, as ``overnight resume`` does.
    A replicated task is read from the first medium that holds it; to ``write``, every medium is
    first brought up to the newest verifiable head (``overnight repair``) and written together.
    ``read_only`` (reading commands) opens a store URL without writing to it, so they work on a
    read-only file, folder or file system."""
    if store is None and task_id is not None:
        found = locate(task_id, load_config(), read_only=read_only)
        if found is not None:
            s = tiered(medium_for(found[0], task_id, write=write, heal=heal), own=False)
            try:
                yield s
            finally:
                s.close()  # the cold stores it opened
                found[0].close()
            return
    if store is not None and hasattr(store, "commit"):
        s = tiered(store, own=False)  # type: ignore[arg-type]
        try:
            yield s
        finally:
            if s is not store:
                s.close()  # only the cold stores it opened
        return
    if not exists(store):  # type: ignore[arg-type]
        url = str(store) if store is not None else default_store_url()
        where = location(url)
        raise ConfigError(f"no store at {url}" + (f" ({where})" if where != url else "") + " yet", task_id=task_id,
                          hint=(store is None and further_up_hint(url)) or
                          "a store is created by the first run or submit (`overnight demo`, `overnight run "
                          "FILE.py`, `overnight submit FILE.py`), or pass --store / set OVERNIGHT_STORE")
    s = tiered(open_store(store, read_only=read_only))  # type: ignore[arg-type]
    try:
        yield s
    finally:
        s.close()


def store_further_up(url: str, start: Path | None = None) -> Path | None:
    """The nearest SQLite file at ``url``'s relative path (the default ``.overnight/overnight.db``)
    in a parent folder of ``start`` (default: the current directory), or None: a command run in a
    project's subfolder finds no store where it looks (paths are relative to the current
    directory), and this names the one the user probably meant. Only a relative ``sqlite://`` URL
    is looked for; nothing is opened (a file that exists, not a store that verifies)."""
    if not url.startswith("sqlite://"):
        return None
    rel = Path(url[len("sqlite://"):])
    if not str(rel) or rel.is_absolute() or ".." in rel.parts:
        return None
    here = (start or Path.cwd()).resolve()
    for folder in here.parents:
        candidate = folder / rel
        try:
            if candidate.is_file():
                return candidate
        except OSError:
            return None  # an unreadable parent: stop looking, the hint is only a hint
    return None


def project_further_up(url: str) -> tuple[Path, Path] | None:
    """``(store file, project folder)`` of :func:`store_further_up` of ``url`` (the default store's
    URL, which does not exist here): the folder a command run there would find it from; None when
    there is none."""
    up = store_further_up(url)
    if up is None:
        return None
    folder = up
    for _ in Path(url[len("sqlite://"):]).parts:  # the folder the relative path starts from
        folder = folder.parent
    return up, folder


def further_up_hint(url: str) -> str | None:
    """The hint naming :func:`store_further_up` of ``url`` (the default store's URL, which does
    not exist here) and the ``--store`` that reaches it; None when there is none."""
    found = project_further_up(url)
    if found is None:
        return None
    up, folder = found
    return (f"a store exists further up, at {up}: run the command in {folder}, or pass --store "
            f"{shlex.quote(f'sqlite://{up}')}")


def medium_for(located: Store, task_id: str, *, write: bool, heal: Heal | None = None) -> Store:
    """The store to use for ``task_id`` found by :func:`~overnight.runtime.router.locate`."""
    if not isinstance(located, ReplicatedStore):
        return located
    if write:
        if heal is not None:
            heal(located, task_id)
        return located
    for medium in located.media:
        try:
            if medium.list_refs(task_id):
                return medium
        except OvernightError:
            continue  # an unavailable medium: read another
    return located
