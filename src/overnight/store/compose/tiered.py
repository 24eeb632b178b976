"""Tiered storage: a :class:`~overnight.store.base.Store` over a hot store and the cold stores its
archive catalog names (spec: ``docs/FORMAT.md``, "Tiered storage").

``overnight archive`` moves a task's older history into a cold store -- any store URL: ``s3://``,
``file://``, even ``sqlite://`` -- as one pack per run (:mod:`overnight.store.compose.pack`), and records
each run in the hot store's archive catalog (:meth:`~overnight.store.base.Store.put_archive`).
:class:`TieredStore` wraps the hot store and makes that history readable again without any
caller knowing where it lives:

* ``list_checkpoints`` and ``journal`` list archived checkpoints with the hot ones (from the
  manifests in the catalog: no cold read), ``get_checkpoint`` finds them;
* ``get_objects`` / ``missing_objects`` serve an object missing from hot out of the pack that
  holds it (the pack is fetched whole from its cold store once, verified against its digest, and
  kept in memory for the next reads); what comes back is checked by its reader like any object.
  A pack that is missing or damaged raises :class:`~overnight.errors.MissingObject` /
  :class:`~overnight.errors.DigestMismatch` naming it;
* every write, every deletion and everything else goes to the hot store, unchanged.

Reads go through: reading archived data writes nothing to hot. A *write* that builds on an
archived checkpoint (``fork --at``, ``rollback --to``, a resume that falls back that far) first
brings that checkpoint back (:func:`overnight.ops.archive.ensure_hot`), so every checkpoint in
hot keeps loading from hot alone. ``overnight restore`` brings a task's whole archive back.

The catalog is re-read when a lookup misses and the copy in memory is older than
:data:`CATALOG_TTL_S`, so an archive run by another process is seen within that time.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Iterable

from overnight.errors import CheckpointNotFound, ConfigError, OvernightError
from overnight.store.base import Closing, ArchiveRow, CheckpointRow, JournalRow, ObjectRecord, Store
from overnight.store.compose.pack import Manifest, PackEntry, manifest_of, read_entry
from overnight.store.compose.delegate import forwarding

CATALOG_TTL_S = 1.0
"""Seconds a catalog read is reused before a miss re-reads it."""

PACKS_IN_MEMORY = 2
"""Packs kept in memory after a read-through (each is read whole)."""


def absolute_url(url: str) -> str:
    """``url`` with a relative ``file://`` / ``sqlite://`` path (or bare ``.db`` path) made absolute,
    so a catalog row names the same store from any working directory."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return f"sqlite://{os.path.abspath(url)}" if url.endswith((".db", ".sqlite", ".sqlite3")) else url
    if scheme.lower() in ("file", "sqlite") and rest and not rest.startswith("/"):
        return f"{scheme}://{os.path.abspath(rest)}"
    return url


def shown(url: str, text: str | None = None) -> str:
    """``url`` for messages, a password in it masked (``postgresql://user:***@host/db``); with
    ``text``: ``text`` with every occurrence of ``url`` masked so (an error message naming it)."""
    from overnight.config import mask_password

    masked = mask_password(url)
    return masked if text is None else text.replace(url, masked)


TRUSTED_COLD_FILE = "cold-stores.json"
"""The cold stores this machine archived to (``overnight archive --cold URL``): a JSON list of URLs
in the state folder (:func:`overnight.keys.state_dir`), beside the high-water file."""

TRUSTED_COLD_ENV = "OVERNIGHT_COLD_STORES"
"""More cold stores a reader may open, space-separated URLs (another machine's archives)."""


def trusted_cold() -> set[str]:
    """The non-local cold store URLs an archive catalog row may make overnight open: those this
    machine archived to (:data:`TRUSTED_COLD_FILE`), those in ``$OVERNIGHT_COLD_STORES``, and the
    storage media ``overnight.toml`` configures (``database``, ``cloud``)."""
    import json

    from overnight.config import load as load_config
    from overnight.keys import state_dir

    found: set[str] = set(os.environ.get(TRUSTED_COLD_ENV, "").split())
    try:
        listed = json.loads((state_dir() / TRUSTED_COLD_FILE).read_text(encoding="utf-8"))
        found |= {u for u in listed if isinstance(u, str)} if isinstance(listed, list) else set()
    except (OSError, ValueError):
        pass  # none yet, or unreadable: only what the environment and the configuration name
    try:
        cfg = load_config()
        found |= {u for u in (cfg.medium("database"), cfg.medium("cloud")) if u}
    except OvernightError:
        pass
    return found


def trust_cold(url: str) -> None:
    """Remember that this machine archives to ``url`` (:data:`TRUSTED_COLD_FILE`; a state folder
    that cannot be written only means readers here need ``$OVERNIGHT_COLD_STORES`` or ``--cold``)."""
    import json

    from overnight.keys import state_dir, write_file_atomic

    if _local(url):
        return
    path = state_dir() / TRUSTED_COLD_FILE
    try:
        listed = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        listed = [u for u in listed if isinstance(u, str)] if isinstance(listed, list) else []
        if url not in listed:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomic(path, json.dumps([*listed, url], indent=1).encode("utf-8"), durable=False)
    except (OSError, ValueError):
        pass


def _local(url: str) -> bool:
    scheme, sep, _ = url.partition("://")
    return not sep or scheme.lower() in ("file", "sqlite")


def open_existing(url: str, *, named: bool = False) -> Store:
    """Open a cold store named by an archive catalog row, writing nothing and connecting nowhere
    the user did not name: a ``file://`` folder only when it holds an overnight store (its
    ``overnight.json`` marker: an empty folder is not initialised), an ``sqlite://`` file only when
    it exists (opened read-only); any other scheme (PostgreSQL, S3) only when it is one of
    :func:`trusted_cold` -- the catalog is stored data, and a store writer could otherwise make a
    read connect to a server of theirs (with the user's credentials) or create tables there.

    ``named``: the user named ``url`` (``restore --cold URL``): any scheme is opened.

    Raises:
        ConfigError: the store does not exist, or is not a trusted cold store.
    """
    from overnight.store import open_store
    from overnight.store.layout import META_KEY

    scheme, sep, rest = url.partition("://")
    path = rest if sep and scheme.lower() in ("file", "sqlite") else (url if not sep else None)
    if path is not None:
        marker = os.path.join(path, META_KEY) if scheme.lower() == "file" else path
        if not os.path.exists(marker):
            raise ConfigError(f"cold store {shown(url)} does not exist" + (
                                  " (the folder holds no overnight store)" if os.path.isdir(path) else ""),
                              hint="mount or move it back, or pass `overnight restore --cold URL` with where it is now")
        return open_store(url, read_only=scheme.lower() == "sqlite" or not sep)
    if not named and url not in trusted_cold():
        raise ConfigError(f"the archive catalog names cold store {shown(url)}, which this machine did not archive "
                          f"to: not opened (the catalog is stored data: a store writer could name any server)",
                          hint=f"if it is yours, add it to ${TRUSTED_COLD_ENV} (space-separated URLs), or pass "
                               "`overnight restore --cold URL`")
    return open_store(url)


@forwarding("hot")
class TieredStore(Closing):
    """A hot store plus the cold stores its archive catalog names (see the module docstring). What
    it does not define here (writes, refs, tasks, leases, the call journal) goes to the hot store.

    Args:
        hot: the store everything is written to.
        own_hot: close ``hot`` with this store.

    Attributes:
        hot: the hot store.
        url: the hot store's URL.
    """

    def __init__(self, hot: Store, *, own_hot: bool = True) -> None:
        self.hot = hot
        self.url = hot.url
        self._own_hot = own_hot
        self._lock = threading.RLock()
        self._override: Store | None = None
        self._colds: dict[str, Store] = {}
        self._catalog_at = float("-inf")
        self._rows: dict[str, ArchiveRow] = {}
        self._manifests: dict[str, Manifest] = {}
        self._by_cp: dict[str, tuple[str, CheckpointRow]] = {}
        self._by_obj: dict[str, tuple[str, PackEntry]] = {}
        self._packs: OrderedDict[str, bytes] = OrderedDict()
        self.catalog_errors: list[str] = []

    # -- catalog ------------------------------------------------------------------------------

    def _catalog(self, *, refresh: bool = False) -> None:
        with self._lock:
            if not refresh and time.monotonic() - self._catalog_at < CATALOG_TTL_S:
                return
            rows = {r.archive_id: r for r in self.hot.list_archives()}
            by_cp: dict[str, tuple[str, CheckpointRow]] = {}
            by_obj: dict[str, tuple[str, PackEntry]] = {}
            errors = []
            for aid, row in rows.items():
                m = self._manifests.get(aid)
                if m is None:
                    try:
                        m = self._manifests[aid] = manifest_of(row)
                    except OvernightError as exc:
                        errors.append(f"archive {aid} of task {row.task_id!r}: {exc.message}")
                        continue
                for cp in m.checkpoints:
                    by_cp.setdefault(cp.checkpoint_id, (aid, cp))
                for e in m.objects:
                    by_obj.setdefault(e.digest, (aid, e))
            self._rows, self._by_cp, self._by_obj, self.catalog_errors = rows, by_cp, by_obj, errors
            self._catalog_at = time.monotonic()

    def _fresh_catalog(self) -> None:
        """Re-read the catalog after a miss, unless it was read within :data:`CATALOG_TTL_S`."""
        self._catalog()

    def catalog_problems(self, task_ids: Iterable[str] | None = None, *,
                         cold: bool = True) -> list[tuple[str | None, str, str]]:
        """What is wrong with the archive catalog, read again from the hot store (nothing cached):
        ``(task_id, archive_id, message)`` per damaged row of ``task_ids`` (default: every row), the
        message naming the archive. ``overnight verify`` reports each as a problem (check ``archive``).

        A row is damaged when a cell has the wrong type, when its manifest does not decode or check
        (:func:`~overnight.store.compose.pack.manifest_of`: damaged, forged, hashing to another
        archive id), or when the manifest is of another task than the row's. With ``cold`` (cheap: no
        pack is read) also when its cold store cannot be opened or listed, its pack is missing there,
        or the cold store's copy of the row (what ``restore --cold`` rebuilds a lost catalog from) is
        missing or damaged. A pack that is there but damaged is found by reading what it holds
        (``verify`` of the task's archived checkpoints, ``verify --all --store COLD``).
        """
        if task_ids is None:
            rows = self.hot.list_archives()
        else:
            rows = [r for t in dict.fromkeys(task_ids) for r in self.hot.list_archives(t)]
        out: list[tuple[str | None, str, str]] = []
        cold_rows: dict[tuple[str, str], dict[str, ArchiveRow]] = {}
        unopened: dict[str, str] = {}  # a cold store that cannot be opened: tried once a call
        for row in rows:
            task = row.task_id if type(row.task_id) is str else None
            aid = row.archive_id
            damage = [d for d in (getattr(v, "damage", None) for v in (aid, row.task_id, row.created_at, row.location,
                                                                          row.manifest)) if d]
            if damage:
                out.append((task, aid, (f"archive {aid or '(no id)'} of task {task!r}: its catalog row is damaged "
                                        f"({'; '.join(damage)})")))
                continue
            try:
                m = manifest_of(row)
            except OvernightError as exc:
                out.append((task, aid, exc.message))
                continue
            if m.task_id != row.task_id:
                out.append((task, aid, (f"archive {aid} is filed under task {row.task_id!r} but its manifest is "
                                        f"of task {m.task_id!r} (a forged or misplaced catalog row)")))
                continue
            problem = self._cold_problem(row, m, cold_rows, unopened) if cold else None
            if problem is not None:
                out.append((task, aid, problem))
        return out

    def _cold_problem(self, row: ArchiveRow, m: Manifest, listed: dict[tuple[str, str], dict[str, ArchiveRow]],
                      unopened: dict[str, str]) -> str | None:
        """What is wrong with the cold side of a sound catalog row (see :meth:`catalog_problems`),
        or None; ``listed`` caches the cold stores' rows per ``(location, task)``, ``unopened`` why a
        location could not be opened (so it is tried once). Messages name the location with any
        password masked."""
        where = f"archive {row.archive_id} of task {row.task_id!r}"
        loc = shown(row.location)
        if row.location in unopened:
            return f"{where}: its cold store {loc} cannot be read ({unopened[row.location]})"
        try:
            try:
                store = self.cold(row.location)
            except OvernightError as exc:
                unopened[row.location] = shown(row.location, exc.message)
                raise
            if m.pack is not None and store.missing_objects([m.pack["digest"]]):
                return f"{where}: its pack {m.pack['digest']} is missing from the cold store {loc}"
            key = (row.location, row.task_id)
            if key not in listed:
                listed[key] = {r.archive_id: r for r in store.list_archives(row.task_id)}
            copy = listed[key].get(row.archive_id)
        except OvernightError as exc:
            return f"{where}: its cold store {loc} cannot be read ({shown(row.location, exc.message)})"
        if copy is None:
            return (f"{where}: the cold store {loc} holds no copy of its row (a lost catalog could not be "
                    "rebuilt from there)")
        if copy.manifest != row.manifest:
            try:
                manifest_of(copy)
            except OvernightError as exc:
                return f"{where}: the cold store {loc} holds a damaged copy of its row ({exc.message})"
        return None

    def archives(self, task_id: str) -> list[tuple[ArchiveRow, Manifest]]:
        """The task's archive runs in the hot catalog, oldest first, with their manifests."""
        self._catalog(refresh=True)
        with self._lock:
            return [(r, self._manifests[a]) for a, r in self._rows.items()
                    if r.task_id == task_id and a in self._manifests]

    def archived_rows(self, task_id: str) -> list[CheckpointRow]:
        """Checkpoint records of the task that the catalog lists (some may be in hot too)."""
        self._catalog(refresh=True)
        with self._lock:
            return [row for _, row in self._by_cp.values() if row.task_id == task_id]

    def archived(self, checkpoint_id: str) -> tuple[ArchiveRow, Manifest, CheckpointRow] | None:
        """Where the catalog has ``checkpoint_id``: ``(row, manifest, record)``, or None."""
        self._fresh_catalog()
        with self._lock:
            hit = self._by_cp.get(checkpoint_id)
            if hit is None:
                return None
            return self._rows[hit[0]], self._manifests[hit[0]], hit[1]

    def journal_of(self, checkpoint_id: str) -> list[JournalRow]:
        """The archived journal rows of ``checkpoint_id``."""
        hit = self.archived(checkpoint_id)
        return [] if hit is None else [j for j in hit[1].journal if j.checkpoint_id == checkpoint_id]

    # -- cold stores and packs ----------------------------------------------------------------

    def use_cold(self, cold: Store | str) -> Store:
        """Read every pack from ``cold`` instead of the location the catalog recorded (a cold store
        that moved; ``overnight restore --cold URL``); returns that store."""
        self._override = cold if not isinstance(cold, str) else self._remember(cold, open_existing(cold, named=True))
        return self._override

    def _remember(self, location: str, store: Store) -> Store:
        self._colds[location] = store
        return store

    def cold(self, location: str, *, create: bool = False) -> Store:
        """The cold store at ``location`` (opened once; the override of :meth:`use_cold` wins).

        Raises:
            ConfigError: a ``file://`` or ``sqlite://`` cold store that does not exist, unless
                ``create`` (``archive`` creates it; a reader must not: a cold store that moved or
                is not mounted is an error, not an empty store).
        """
        if self._override is not None:
            return self._override
        with self._lock:
            store = self._colds.get(location)
            if store is None:
                from overnight.store import open_store

                if create:  # `overnight archive --cold URL`: the user named it
                    trust_cold(location)
                store = self._remember(location, open_store(location) if create else open_existing(location))
            return store

    def pack(self, row: ArchiveRow, manifest: Manifest) -> bytes:
        """The pack of an archive run, read whole from its cold store and verified.

        Raises:
            MissingObject / DigestMismatch: the pack is missing from the cold store or damaged.
            ConfigError: the cold store cannot be opened.
        """
        from overnight.store.blobs import BlobReader

        assert manifest.pack is not None
        key = manifest.pack["digest"]
        with self._lock:
            data = self._packs.get(key)
            if data is not None:
                self._packs.move_to_end(key)
                return data
        data = BlobReader(self.cold(row.location)).get(key, f"pack of archive {row.archive_id} (task {row.task_id!r})")
        with self._lock:
            self._packs[key] = data
            while len(self._packs) > PACKS_IN_MEMORY:
                self._packs.popitem(last=False)
        return data

    def _from_packs(self, digests: list[str]) -> dict[str, ObjectRecord]:
        self._fresh_catalog()
        out: dict[str, ObjectRecord] = {}
        with self._lock:
            hits = {d: self._by_obj[d] for d in digests if d in self._by_obj}
        for d, (aid, entry) in hits.items():
            row, m = self._rows[aid], self._manifests[aid]
            # a missing or damaged pack raises (naming it): its objects are damaged, not absent
            out[d] = read_entry(self.pack(row, m), entry)
        return out

    # -- objects ------------------------------------------------------------------------------

    def missing_objects(self, digests: Iterable[str]) -> set[str]:
        missing = self.hot.missing_objects(digests)
        if missing:
            self._fresh_catalog()
            with self._lock:
                missing = {d for d in missing if d not in self._by_obj}
        return missing

    def get_objects(self, digests: Iterable[str]) -> dict[str, ObjectRecord]:
        wanted = list(dict.fromkeys(digests))
        found = self.hot.get_objects(wanted)
        rest = [d for d in wanted if d not in found]
        if rest:
            found.update(self._from_packs(rest))
        return found

    # -- checkpoints and refs -----------------------------------------------------------------

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRow:
        try:
            return self.hot.get_checkpoint(checkpoint_id)
        except CheckpointNotFound:
            hit = self.archived(checkpoint_id)
            if hit is None:
                raise
            return hit[2]

    def list_checkpoints(self, task_id: str) -> list[CheckpointRow]:
        rows = {r.checkpoint_id: r for r in self.hot.list_checkpoints(task_id)}
        for r in self.archived_rows(task_id):
            rows.setdefault(r.checkpoint_id, r)
        return sorted(rows.values(), key=lambda r: (r.seq, r.created_at, r.checkpoint_id))

    def checkpoints_after(self, task_id: str, branch: str, seq: int) -> list[CheckpointRow]:
        rows = {r.checkpoint_id: r for r in self.hot.checkpoints_after(task_id, branch, seq)}
        for r in self.archived_rows(task_id):
            if r.branch == branch and r.seq > seq:
                rows.setdefault(r.checkpoint_id, r)
        return sorted(rows.values(), key=lambda r: (r.seq, r.created_at, r.checkpoint_id))

    # -- tasks and journal --------------------------------------------------------------------

    def journal(self, task_id: str) -> list[JournalRow]:
        rows = self.hot.journal(task_id)
        have = {(j.checkpoint_id, j.step_key) for j in rows}
        self._catalog(refresh=True)
        with self._lock:
            manifests = [self._manifests[a] for a, r in self._rows.items()
                         if r.task_id == task_id and a in self._manifests]
        for m in manifests:
            for j in m.journal:
                if (j.checkpoint_id, j.step_key) not in have:
                    have.add((j.checkpoint_id, j.step_key))
                    rows.append(j)
        return sorted(rows, key=lambda j: j.seq)

    # -- archives -----------------------------------------------------------------------------

    def put_archive(self, row: ArchiveRow) -> None:
        self.hot.put_archive(row)
        self._catalog_at = float("-inf")

    def delete_archive(self, task_id: str, archive_id: str) -> None:
        self.hot.delete_archive(task_id, archive_id)
        self._catalog_at = float("-inf")

    # -- housekeeping -------------------------------------------------------------------------

    def stored_bytes(self) -> int:
        """Bytes of the hot store (cold stores are not counted)."""
        return self.hot.stored_bytes()

    def close(self) -> None:
        for store in list(self._colds.values()):
            store.close()
        self._colds.clear()
        self._packs.clear()
        if self._own_hot:
            self.hot.close()

    def __repr__(self) -> str:
        return f"TieredStore({self.hot!r})"


def tiered(store: Store, *, own: bool = True) -> TieredStore:
    """``store`` wrapped in a :class:`TieredStore` (returned as is if it already is one)."""
    return store if isinstance(store, TieredStore) else TieredStore(store, own_hot=own)
