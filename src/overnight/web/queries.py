# Over 600 lines: one query function per dashboard page over the api layer (split by page once the parallel dashboard work lands).
"""The dashboard's query layer: one function per page, each returning plain JSON-ready data.

Every HTML page of ``overnight ui`` is its template applied to what one of these returns, and
its ``.json`` twin is the same data (datasette's rule), so the UI, tests and scripts read the
same thing. Everything is read through :mod:`overnight.api` and the verify layer -- the functions
the CLI uses -- from one open store; nothing here writes.

Records are verified as they are read (``parse_record``: schema, digest, signature; heads with
``load_head``: state, pages and artifact bytes too, falling back as a resume would). Checkpoints are immutable
and addressed by their content, so what was learnt about one (its progress, whether its head
verified) is kept in a :class:`HeadCache` keyed by checkpoint id; "Verify now" clears it, and what
it found is kept there too, per task, while the task's refs are unchanged (the task page labels
each checkpoint with it, the tasks page counts the tasks it found damaged).
"""

from __future__ import annotations

import difflib
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from overnight import api
from overnight.codec.canonical import loads
from overnight.config import load as load_config
from overnight.errors import OvernightError, TaskNotFound, short_id
from overnight.store.task_location import recorded_route
from overnight.store.base import CheckpointRow, Lease, Store
from overnight.store.queue import describe, state_of
from overnight.store.queue_open import queue_for
from overnight.store.blobs import BlobReader
from overnight.store.leases import can_take_over, describe_holder, ended, now_ms
from overnight.chain.read import load_head, served_by_copy
from overnight.chain.integrity import load_checkpoint, parse_record, record_problems, signing_key_from_env

STATUSES = ("queued", "running", "stalled", "interrupted", "in_progress", "failed", "cancelled", "complete")
"""Task statuses the dashboard shows, in the order of its filter. ``in_progress``: a coding-agent
task no agent session holds (``overnight ls`` says :data:`overnight.api.CODING_PAUSED`), which
``overnight resume`` cannot continue -- its agent does (task_resume)."""

RUNNING_WINDOW_S = 60.0
"""Without a lease to read, a task whose newest checkpoint is younger than this (seconds) and
that has steps left is shown as running (a run commits after every step)."""

PER_PAGE = 100
"""Checkpoints per page of a task's timeline."""

TASKS_PER_PAGE = 100
"""Tasks per page of the tasks page."""

TEXT_INLINE_MAX = 256 * 1024
"""Bytes of a text artifact shown inline (and diffed); larger ones are downloads only."""


# --- status ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """A task's status: ``name`` (one of :data:`STATUSES`), why (``reason``), who holds it
    (``holder``), and what it was derived from (``source``: ``lease`` or ``checkpoint age``)."""

    name: str
    reason: str | None = None
    holder: str | None = None
    source: str = "checkpoint age"


def derive_status(*, verified: bool, problem: str | None, done: int, todo: int, steps_committed: int,
                  last_age_s: float | None, leases: list[Lease] | None, now: int | None = None) -> Status:
    """The one place a task's status is decided (the workers' queue, when it lands, is read here).

    Rules, first match wins:

    * ``failed``: no checkpoint of the branch verifies (``problem`` says why).
    * ``complete``: the head verifies and nothing is left to do.
    * with leases (``leases`` not None): a lease with a live holder -> ``running`` (on that
      holder); a lease neither released nor live (expired, or its holder process is gone: the run
      died without releasing it) -> ``stalled``; a lease on ``main`` released by a plain run whose
      step failed for good (or whose drift policy aborted) -> ``failed`` with its reason.
    * without leases: newest checkpoint younger than :data:`RUNNING_WINDOW_S` -> ``running``.
    * ``queued``: no step has committed yet; otherwise ``interrupted`` (resumable).

    Args:
        last_age_s: seconds since the newest checkpoint (None: none).
        leases: the task's lease rows, or None when the store cannot list them.
        now: Unix time in ms by the store's clock (``store.clock_ms()``; default: this machine's).
    """
    if not verified:
        return Status("failed", problem or "no checkpoint verifies")
    if todo == 0:
        return Status("complete")
    now = now_ms() if now is None else now
    failed = None
    if leases is not None:
        for lease in leases:
            if not lease.holder_id:  # released; by a plain run whose step failed for good?
                outcome = ended(lease.holder)
                if outcome is not None and outcome.startswith("failed: ") and lease.branch == "main":
                    failed = outcome[len("failed: "):]
                continue
            who = describe_holder(lease.holder)
            if not can_take_over(lease.holder, lease.expires_at_ms, now):
                return Status("running", holder=who, source="lease")
            return Status("stalled", f"lease on {lease.branch} not renewed (holder gone or expired)", who, "lease")
    elif last_age_s is not None and last_age_s < RUNNING_WINDOW_S:
        return Status("running", reason=f"last checkpoint {last_age_s:.0f} s ago")
    if failed is not None:
        return Status("failed", failed, source="lease")
    if steps_committed == 0:
        return Status("queued", "no step committed yet", source="lease" if leases is not None else "checkpoint age")
    return Status("interrupted", "steps left; `overnight resume` continues it",
                  source="lease" if leases is not None else "checkpoint age")


# --- caching of immutable facts ----------------------------------------------------------------


class HeadCache:
    """What was learnt about a branch head, by checkpoint id (immutable, so never stale unless
    the stored bytes are damaged afterwards: :meth:`clear` after a verify). Thread-safe, bounded."""

    def __init__(self, limit: int = 20_000, big_limit: int = 16) -> None:
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._big: OrderedDict[str, Any] = OrderedDict()
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.limit, self.big_limit = limit, big_limit

    def note_verify(self, task_id: str, refs: dict[str, str], found: dict[str, str], *, damaged: bool,
                    at: str) -> None:
        """What a verify run ("Verify now") found of ``task_id`` whose refs were ``refs`` when it
        started: ``found`` (checkpoint id -> problem) and whether it found the task damaged. Kept
        (not dropped by :meth:`clear`) and used while the task's refs are unchanged."""
        with self._lock:
            self._verified[task_id] = {"refs": _refs_key(refs), "found": dict(found), "damaged": damaged, "at": at}
            self._verified.move_to_end(task_id)
            while len(self._verified) > self.limit:
                self._verified.popitem(last=False)

    def verify_found(self, task_id: str, refs: dict[str, str]) -> dict[str, Any] | None:
        """The last verify run's findings of ``task_id`` (see :meth:`note_verify`), or None when
        none ran since the dashboard started or the task's refs moved since (a commit, fork,
        rollback: what it checked is no longer the whole chain)."""
        with self._lock:
            hit = self._verified.get(task_id)
        return hit if hit is not None and hit["refs"] == _refs_key(refs) else None

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._data[key] = value
            while len(self._data) > self.limit:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._big.clear()

    def chain(self, s: Store, task_id: str, refs: dict[str, str]) -> tuple[list[CheckpointRow], list[Any], list[Any]]:
        """A task's checkpoint rows, journal rows and model calls, read again whenever one of its
        refs moves (every commit, fork, rollback and merge moves one); the last
        :attr:`big_limit` tasks are kept. ``gc`` and ``archive`` move no ref: what they removed
        shows until the next commit or "Verify now"."""
        key = task_id + "\0" + "\0".join(f"{b}={c}" for b, c in sorted(refs.items()))
        with self._lock:
            hit = self._big.get(key)
            if hit is not None:
                self._big.move_to_end(key)
                return hit
        value = (s.list_checkpoints(task_id), s.journal(task_id), s.calls(task_id))
        with self._lock:
            self._big[key] = value
            while len(self._big) > self.big_limit:
                self._big.popitem(last=False)
        return value


def _refs_key(refs: dict[str, str]) -> str:
    return "\0".join(f"{b}={c}" for b, c in sorted(refs.items()))


def _record_checks(s: Store, cache: HeadCache, rows: list[CheckpointRow], key: bytes | None) -> dict[str, str | None]:
    """``checkpoint_id -> problem or None`` for ``rows``: each record, its state document and pages
    verified and its artifact objects present (:func:`~overnight.chain.integrity.record_problems`,
    what ``overnight show`` checks of every row; artifact bytes are hashed only for branch heads and
    by a verify run). Kept per checkpoint id; "Verify now" clears it."""
    out: dict[str, str | None] = {}
    todo = []
    for r in rows:
        hit = cache.get("rec\0" + r.checkpoint_id)
        if hit is None:
            todo.append(r)
        else:
            out[r.checkpoint_id] = hit["problem"]
    if todo:
        try:
            found = record_problems(s, todo, key=key)
            # a damaged original its verified ditto copy serves loads: not damaged, as `verify`,
            # `ls` and `show` count it (`overnight verify --repair` rewrites the original)
            for cid in served_by_copy(s, [r for r in todo if r.checkpoint_id in found], key) if found else ():
                del found[cid]
        except OvernightError as exc:  # the store could not be read: nothing checked, nothing claimed
            problem = f"{type(exc).__name__}: {exc.message}".splitlines()[0]
            return {**out, **{r.checkpoint_id: problem for r in todo}}
        for r in todo:
            problem = found.get(r.checkpoint_id)
            problem = problem.splitlines()[0] if problem else None
            cache.put("rec\0" + r.checkpoint_id, {"problem": problem})
            out[r.checkpoint_id] = problem
    return out


def _head_facts(s: Store, task_id: str, branch: str, head_id: str, cache: HeadCache) -> dict[str, Any]:
    """Progress and integrity of ``branch``'s head as a resume would load it (with fallback)."""
    key = f"{task_id}\0{branch}\0{head_id}"
    hit = cache.get(key)
    if hit is not None:
        return hit
    facts: dict[str, Any] = {"verified": False, "problem": None, "done": 0, "todo": 0, "used": None,
                             "skipped": {}, "accepted_drift": 0, "kind": None}
    try:
        loaded, fallback = load_head(s, task_id, branch, key=signing_key_from_env())  # artifacts hashed, once per head
        spec = loaded.state_tree["task"]["spec"]
        facts.update(verified=True, done=loaded.doc.done.count, todo=loaded.doc.todo.count, used=loaded.id,
                     accepted_drift=len(loaded.record.fingerprint.accepted) if loaded.record.fingerprint else 0,
                     kind=spec.get("kind") if isinstance(spec, dict) else None)  # its spec's kind (coding agent?)
        if fallback is not None:
            facts["problem"] = f"head failed verification; a resume continues from {short_id(loaded.id)}"
            facts["skipped"] = {k.checkpoint_id: f"{k.error}: {k.reason}" for k in fallback.skipped}
    except OvernightError as exc:
        facts["problem"] = f"{type(exc).__name__}: {exc.message}".splitlines()[0]
        skipped = getattr(exc, "fallback", None)
        if skipped is not None:
            facts["skipped"] = {k.checkpoint_id: f"{k.error}: {k.reason}" for k in skipped.skipped}
    cache.put(key, facts)
    return facts


# --- small helpers -----------------------------------------------------------------------------


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def age_s(text: str | None, now: float | None = None) -> float | None:
    """Seconds since an RFC 3339 timestamp (None when it cannot be read)."""
    dt = _parse_time(text)
    if dt is None:
        return None
    return max(0.0, (now if now is not None else time.time()) - dt.timestamp())


def _route(spec: bytes) -> tuple[str | None, list[str]]:
    try:
        route = recorded_route(loads(spec))
    except OvernightError:
        return None, []
    return (route.level, route.media) if route else (None, [])


def _prices() -> dict[str, tuple[float, float] | None]:
    cfg = load_config()

    class _P(dict):
        def __missing__(self, model: str) -> tuple[float, float] | None:
            self[model] = cfg.price(model)
            return self[model]

    return _P()


def _cost(prices: Any, model: str | None, tokens_in: int, tokens_out: int) -> float | None:
    price = prices[model] if model else None
    if price is None:
        return None
    return round(tokens_in / 1e6 * price[0] + tokens_out / 1e6 * price[1], 6)


def task_status(s: Store, cache: HeadCache, t: Any, refs: dict[str, str], *, now: float | None = None,
                clock: int | None = None) -> tuple[Status, dict[str, Any], dict[str, Any], float | None]:
    """A task's status as the tasks page shows it (and the task page, from here too), with what it
    was derived from: ``(status, facts of its main (or first) branch head, chain facts, seconds
    since its newest checkpoint)``. The queue and task lease (``api.task_state``) win over the
    checkpoints' age; a coding-agent task no session holds is ``in_progress``, as ``overnight ls``
    says."""
    now = time.time() if now is None else now
    clock = s.clock_ms() if clock is None else clock
    chain = _chain_facts(s, cache, t, refs)
    branch = "main" if "main" in refs else next(iter(sorted(refs)), None)
    facts = (_head_facts(s, t.task_id, branch, refs[branch], cache) if branch is not None
             else {"verified": False, "problem": "no branch", "done": 0, "todo": 0, "accepted_drift": 0})
    last_age = age_s(chain["last_at"], now) if chain["last_at"] else None
    st = derive_status(verified=facts["verified"], problem=facts["problem"], done=facts["done"],
                       todo=facts["todo"], steps_committed=chain["steps"], last_age_s=last_age,
                       leases=api.leases(t.task_id, store=s), now=clock)
    real = api.task_state(t.task_id, store=s, complete=facts["todo"] == 0, now=clock) if facts["verified"] else None
    if real is not None:  # the queue and the task lease say it, not the checkpoints' age
        name = real.split(" ", 1)[0]
        st = Status(name, real[len(name):].strip(" ()") or None, source="queue")
    if facts["verified"] and api.coding_paused(facts.get("kind"), real or st.name):  # as `overnight ls` says
        st = Status("in_progress", api.CODING_PAUSED_WHY, st.holder, st.source)
    return st, facts, chain, last_age


MEDIUM_OF_SCHEME = {"sqlite": "local", "file": "local", "postgresql": "database", "postgres": "database",
                    "s3": "cloud", "memory": "ephemeral"}
"""The medium a store of each URL scheme is (the router's names: local = SQLite / file,
database = PostgreSQL, cloud = S3)."""


def stored_on(s: Store, media: list[str]) -> dict[str, Any]:
    """Where the dashboard shows a task is kept: its route's media, or -- a route naming none (a
    task run on a store given explicitly: ``--store``, or by a worker on its queue's store) -- the
    medium of the store it is read from. ``{"stored_on": [names], "store_kind": URL scheme,
    "stored_on_source": "route" | "store"}``; what the task recorded is not changed."""
    kind = str(s.url).partition("://")[0].lower() or None
    if media:
        return {"stored_on": list(media), "store_kind": kind, "stored_on_source": "route"}
    return {"stored_on": [MEDIUM_OF_SCHEME.get(kind or "", kind or "this store")], "store_kind": kind,
            "stored_on_source": "store"}


# --- tasks page --------------------------------------------------------------------------------


def tasks_page(s: Store, cache: HeadCache, *, status: str | None = None, q: str | None = None, page: int = 1,
               per_page: int = TASKS_PER_PAGE) -> dict[str, Any]:
    """Every task with its status (:func:`task_status`), progress, level and media (as recorded,
    and ``stored_on``: see :func:`stored_on`), newest checkpoint and its age,
    stored bytes and drift badge (drift accepted on its head) -- a coding-agent task no session
    holds is ``in_progress``, as ``overnight ls`` says (:func:`overnight.api.coding_paused`), not
    ``interrupted`` / ``stalled``; ``status`` filters by status,
    ``q`` keeps task ids (or goals) containing it (case-insensitive); ``per_page`` of those on
    page ``page``, most recently active first.

    Returns ``{"tasks": [...], "counts": {status: n}, "damaged": n (tasks whose head fails
    verification, or in which the last "Verify now" found a damaged checkpoint while their refs
    are unchanged: each row's ``verify_found``), "total": n, "matching": n, "page": n,
    "pages": n, "filter": {...}}``.
    """
    now = time.time()
    clock = s.clock_ms()  # the clock leases and claims are set by (PostgreSQL: the server's), read once
    out, counts, damaged = [], {k: 0 for k in STATUSES}, 0
    seen: set[str] = set()
    needle = (q or "").strip().lower()
    for t in s.list_tasks():
        refs = s.list_refs(t.task_id)
        st, facts, chain, last_age = task_status(s, cache, t, refs, now=now, clock=clock)
        counts[st.name] += 1
        found = cache.verify_found(t.task_id, refs)
        damaged += facts["problem"] is not None or (found is not None and found["damaged"])
        if status and st.name != status:
            continue
        if needle and needle not in t.task_id.lower() and needle not in t.goal.lower():
            continue
        out.append({
            "task_id": t.task_id, "goal": t.goal, "status": st.name, "status_reason": st.reason,
            "holder": st.holder, "status_source": st.source, "done": facts["done"],
            "total": facts["done"] + facts["todo"], "level": chain["level"], "media": chain["media"],
            **stored_on(s, chain["media"]),
            "verify_found": None if found is None else len(found["found"]),
            "branches": sorted(refs), "checkpoints": chain["checkpoints"], "last_checkpoint": chain["last"],
            "last_checkpoint_at": chain["last_at"], "last_checkpoint_age_s": last_age,
            "stored_bytes": chain["stored_bytes"], "accepted_drift": facts["accepted_drift"],
            "head_problem": facts["problem"], "created_at": t.created_at, "entry": None, "submitted_ms": None,
        })
        seen.add(t.task_id)
    try:  # submitted to the workers, no checkpoint yet: as `overnight ls` lists them
        unstarted = api.unstarted(queue_for(s, create=False), seen)
    except OvernightError:
        unstarted = []  # an unreadable queue: the tasks with checkpoints are still listed
    for row in unstarted:
        text = describe(row, None, complete=False, now=clock)
        name = state_of(text) if state_of(text) in counts else "queued"
        counts[name] += 1
        if status and name != status:
            continue
        if needle and needle not in row.task_id.lower() and needle not in (row.entry or "").lower():
            continue
        out.append({
            "task_id": row.task_id, "goal": "", "status": name, "status_reason": text[len(name):].strip(" ()") or None,
            "holder": None, "status_source": "queue", "done": 0, "total": 0, "level": None, "media": [],
            **stored_on(s, []), "verify_found": None, "branches": [], "checkpoints": 0, "last_checkpoint": None,
            "last_checkpoint_at": None, "last_checkpoint_age_s": None, "stored_bytes": 0, "accepted_drift": None,
            "head_problem": None,
            "created_at": datetime.fromtimestamp(row.submitted_ms / 1000, timezone.utc).isoformat(timespec="microseconds"),
            "entry": row.entry, "submitted_ms": row.submitted_ms,
        })
    out.sort(key=lambda d: d["last_checkpoint_at"] or d["created_at"], reverse=True)
    pages = max(1, -(-len(out) // per_page))
    page = min(max(1, page), pages)
    return {"tasks": out[(page - 1) * per_page: page * per_page], "counts": counts, "damaged": damaged,
            "total": sum(counts.values()),
            "matching": len(out), "page": page, "pages": pages, "filter": {"status": status, "q": q}, "store": s.url}


def _queue_row(s: Store, task_id: str) -> Any:
    """The workers' queue row of ``task_id``, or None (never submitted, a store kind without a
    queue, or a queue that cannot be read)."""
    try:
        q = queue_for(s, create=False)
        return q.get(task_id) if q is not None else None
    except OvernightError:
        return None


def _chain_facts(s: Store, cache: HeadCache, t: Any, refs: dict[str, str]) -> dict[str, Any]:
    """Checkpoint count, newest checkpoint, bytes stored, steps committed, level and media of a
    task; read again whenever one of its refs moves (every commit, fork and rollback moves one;
    ``gc`` and ``archive`` do not, so counts can lag them until the next commit or "Verify now")."""
    key = "chain\0" + t.task_id + "\0" + "\0".join(f"{b}={c}" for b, c in sorted(refs.items()))
    hit = cache.get(key)
    if hit is not None:
        return hit
    rows = s.list_checkpoints(t.task_id)
    last = max(rows, key=lambda r: r.created_at) if rows else None
    level, media = _route(t.spec)
    facts = {"checkpoints": len(rows), "last": last.checkpoint_id if last else None,
             "last_at": last.created_at if last else None, "stored_bytes": sum(r.stored_bytes for r in rows),
             "steps": sum(1 for r in rows if r.event == "step"), "level": level, "media": media}
    cache.put(key, facts)
    return facts


# --- task page ---------------------------------------------------------------------------------


def _lanes(rows: list[CheckpointRow], refs: dict[str, str]) -> dict[str, int]:
    lanes: dict[str, int] = {}
    if "main" in refs or any(r.branch == "main" for r in rows):
        lanes["main"] = 0
    for r in rows:
        lanes.setdefault(r.branch, len(lanes))
    return lanes


def _graph(rows: list[CheckpointRow], refs: dict[str, str], lanes: dict[str, int],
           merges: dict[str, str]) -> dict[str, Any]:
    """The branch graph of the whole chain, O(branches + forks + merges): one segment per branch
    (its first to its last seq), a connector from a branch's fork point, one per merge, and the
    session bands (seq ranges) and compactions. ``merges``: merge checkpoint -> merged head."""
    by_id = {r.checkpoint_id: r for r in rows}
    seg: dict[str, list[int]] = {}
    for r in rows:
        lo_hi = seg.setdefault(r.branch, [r.seq, r.seq])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], r.seq), max(lo_hi[1], r.seq)
    forks = []
    firsts: dict[str, CheckpointRow] = {}
    for r in rows:
        if r.branch not in firsts or r.seq < firsts[r.branch].seq:
            firsts[r.branch] = r
    for b, first in firsts.items():
        parent = by_id.get(first.parent_id or "")
        if parent is not None and parent.branch != b:
            forks.append({"branch": b, "from_lane": lanes[parent.branch], "from_seq": parent.seq,
                          "to_lane": lanes[b], "to_seq": first.seq})
    merge_lines = []
    for cid, ref in merges.items():
        src, dst = by_id.get(ref), by_id.get(cid)
        if src is not None and dst is not None:
            merge_lines.append({"from_lane": lanes[src.branch], "from_seq": src.seq,
                                "to_lane": lanes[dst.branch], "to_seq": dst.seq})
    sessions: dict[str, list[int]] = {}
    for r in rows:
        lo_hi = sessions.setdefault(r.session, [r.seq, r.seq])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], r.seq), max(lo_hi[1], r.seq)
    max_seq = max((r.seq for r in rows), default=0)
    return {"max_seq": max_seq, "lanes": [{"branch": b, "lane": i, "from": seg.get(b, [0, 0])[0],
                                           "to": seg.get(b, [0, 0])[1], "head": refs.get(b)}
                                          for b, i in lanes.items()],
            "forks": forks, "merges": merge_lines,
            "sessions": [{"session": k, "from": v[0], "to": v[1]} for k, v in sessions.items()],
            "compactions": sorted({r.seq for r in rows if r.event == "compaction"})}


def _replayed(s: Store, cache: HeadCache, checkpoint_id: str) -> dict[tuple[int, str], int]:
    """``(seq, step) -> tokens replayed from the call journal`` from a checkpoint's done list."""
    hit = cache.get("replayed\0" + checkpoint_id)
    if hit is not None:
        return hit["map"]
    out: dict[tuple[int, str], int] = {}
    try:
        loaded = load_checkpoint(s, checkpoint_id, key=signing_key_from_env(), deep=False)
        out = {(d["seq"], d["name"]): d["replayed_tokens"] for d in loaded.state_tree["done"]
               if d.get("replayed_tokens")}
    except OvernightError:
        pass
    cache.put("replayed\0" + checkpoint_id, {"map": out})
    return out


def task_page(s: Store, cache: HeadCache, task_id: str, *, page: int = 1, per_page: int = PER_PAGE,
              branch: str | None = None) -> dict[str, Any]:
    """A task's chain as a timeline, newest first, ``per_page`` checkpoints per page (only the
    page's records are parsed and verified), with the branch graph of the whole chain.

    Each timeline entry: seq, id, branch, event, step, session (number), time, duration (ms),
    tokens in/out, tokens replayed from the call journal, cost (USD, when ``[prices]`` has the
    step's model), bytes added, and integrity, saying what was checked (``checked_by``):
    ``damaged`` with the reason (its record, state or pages fail, a branch's resume skips it, or
    the last verify run found it damaged); ``verified`` (its artifact bytes hashed too: the
    checkpoint a branch's resume loads, or every checkpoint a verify run checked while the refs
    are unchanged); else ``record verified`` (record, state document and pages verified and its
    artifact objects present, as ``overnight show`` checks every row; artifact bytes not hashed).
    ``fallback`` marks the checkpoint a resume of that branch lands on when its head is damaged.
    Also the task's ``status`` (with ``status_reason`` / ``status_source`` / ``holder``), derived
    as the tasks page derives it (:func:`task_status`), and ``verify``: what the last "Verify
    now" found (None: none since the refs last moved).

    Raises:
        TaskNotFound: no such task.
    """
    try:
        t = s.get_task(task_id)
    except TaskNotFound as exc:
        row = _queue_row(s, task_id)
        if row is not None:  # listed on the tasks page: say why it has no page yet
            exc.message = f"task {task_id!r} has no checkpoint yet: it is {describe(row, None, complete=False)}"
            exc.hint = (f"submitted to the workers (code {row.entry}); its page appears with its first checkpoint, "
                        "once `overnight worker` starts it")
        raise
    refs = s.list_refs(task_id)
    rows, journal_rows, calls = cache.chain(s, task_id, refs)
    if branch:
        rows = [r for r in rows if r.branch == branch]
    rows_desc = sorted(rows, key=lambda r: (r.seq, r.created_at), reverse=True)
    pages = max(1, -(-len(rows_desc) // per_page))
    page = min(max(1, page), pages)
    shown = rows_desc[(page - 1) * per_page: page * per_page]
    lanes = _lanes(sorted(rows, key=lambda r: (r.seq, r.created_at)), refs)
    heads: dict[str, list[str]] = {}
    for b, cid in refs.items():
        heads.setdefault(cid, []).append(b)
    branch_facts = {b: _head_facts(s, task_id, b, cid, cache) for b, cid in sorted(refs.items())}
    skipped: dict[str, str] = {}
    landed: dict[str, list[str]] = {}
    for b, f in branch_facts.items():
        skipped.update(f["skipped"])
        if f["skipped"] and f["used"]:
            landed.setdefault(f["used"], []).append(b)
    journal = {j.checkpoint_id: j for j in journal_rows}
    model_of: dict[str, str] = {}
    for c in calls:
        model_of.setdefault(c.step_key, c.model)
    prices = _prices()
    key = signing_key_from_env()
    # tokens replayed per step: from the main (or first) branch head's done list
    main = "main" if "main" in refs else next(iter(sorted(refs)), None)
    replayed = _replayed(s, cache, branch_facts[main]["used"]) if main is not None and branch_facts[main]["verified"] \
        else {}
    merges: dict[str, str] = {}
    for r in rows:
        if r.event == "merge":
            try:
                rec = parse_record(r, key=key)
                if rec.event.ref:
                    merges[r.checkpoint_id] = rec.event.ref
            except OvernightError:
                pass
    session_band: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: (r.seq, r.created_at)):
        session_band.setdefault(r.session, len(session_band))
    # what each shown row's label claims is what was checked (as `overnight show` marks rows): its
    # record, state and pages (every row); artifact bytes too for the checkpoint a branch's resume
    # loads, and for every checkpoint a verify run since the last ref move checked
    checked = _record_checks(s, cache, shown, key)
    found = cache.verify_found(task_id, refs)
    loaded_heads = {f["used"] for f in branch_facts.values() if f["verified"] and f["used"]}
    entries = []
    for r in shown:
        valid, problem, session_n, ref, detail = True, None, None, None, None
        try:
            rec = parse_record(r, key=key)
            session_n, ref, detail = rec.session.n, rec.event.ref, rec.event.detail
        except OvernightError as exc:
            valid, problem = False, f"{type(exc).__name__}: {exc.message}".splitlines()[0]
        checked_by = "record check"
        if valid and checked.get(r.checkpoint_id):
            valid, problem = False, checked[r.checkpoint_id]
        if valid and r.checkpoint_id in skipped:
            valid, problem, checked_by = False, skipped[r.checkpoint_id], "head load"
        if valid and found is not None and r.checkpoint_id in found["found"]:
            valid, problem, checked_by = False, found["found"][r.checkpoint_id], "verify run"
        if valid and r.checkpoint_id in loaded_heads:
            checked_by = "head load"
        elif valid and found is not None:
            checked_by = "verify run"
        integrity = "damaged" if not valid else "record verified" if checked_by == "record check" else "verified"
        j = journal.get(r.checkpoint_id)
        model = model_of.get(j.step_key) if j else None
        entries.append({
            "seq": r.seq, "checkpoint_id": r.checkpoint_id, "short_id": short_id(r.checkpoint_id),
            "parent_id": r.parent_id, "branch": r.branch, "lane": lanes.get(r.branch, 0), "event": r.event,
            "step": r.step, "session": session_n, "session_band": session_band.get(r.session, 0) % 2,
            "created_at": r.created_at, "duration_ms": j.duration_ms if j else None,
            "tokens_in": j.tokens_in if j else 0, "tokens_out": j.tokens_out if j else 0,
            "replayed_tokens": replayed.get((r.seq, r.step or ""), 0), "model": model,
            "cost_usd": _cost(prices, model, j.tokens_in, j.tokens_out) if j else None,
            "stored_bytes": r.stored_bytes, "integrity": integrity, "checked_by": checked_by, "problem": problem,
            "fallback_for": landed.get(r.checkpoint_id, []), "heads": heads.get(r.checkpoint_id, []),
            "ref": ref, "detail": detail,
        })
    level, media = _route(t.spec)
    calls = s.calls(task_id)
    main_facts = branch_facts.get(main or "", {"done": 0, "todo": 0, "verified": False, "problem": "no branch"})
    st = task_status(s, cache, t, refs)[0]  # as the tasks page says it
    return {
        "task_id": task_id, "goal": t.goal, "entry": t.entry, "created_at": t.created_at,
        "status": st.name, "status_reason": st.reason, "status_source": st.source, "holder": st.holder,
        "verify": None if found is None else {"at": found["at"], "damaged": found["damaged"],
                                              "checkpoints_damaged": len(found["found"])},
        "level": level, "media": media, **stored_on(s, media), "branches": {b: {"head": cid, "lane": lanes.get(b, 0), "verified": branch_facts[b]["verified"],
                                         "used": branch_facts[b]["used"], "problem": branch_facts[b]["problem"],
                                         "done": branch_facts[b]["done"],
                                         "total": branch_facts[b]["done"] + branch_facts[b]["todo"]}
                                     for b, cid in sorted(refs.items())},
        "done": main_facts["done"], "total": main_facts["done"] + main_facts["todo"],
        "checkpoints": len(rows), "stored_bytes": sum(r.stored_bytes for r in rows),
        "page": page, "pages": pages, "per_page": per_page, "branch": branch, "timeline": entries,
        "graph": _graph(rows, refs, lanes, merges),
        # every call the task made, compactions included (as `overnight show` counts them)
        "tokens_in": sum(c.tokens_in for c in calls), "tokens_out": sum(c.tokens_out for c in calls),
        "actions": task_actions(s, cache, task_id),
    }


# --- what the task page's actions may do -------------------------------------------------------


CANCELLABLE = api.CANCELLABLE
"""Queue row statuses a cancel acts on (``overnight cancel``); any other has nothing to cancel."""


def task_actions(s: Store, cache: HeadCache, task_id: str) -> dict[str, Any]:
    """Whether "Resume on the workers" and "Cancel" apply to ``task_id`` now, read in one place for
    the task page (which shows only the buttons that apply) and the POSTs (which refuse the others).

    Returns ``{"queue": status of its workers' queue row (None: never submitted, or a store
    without a queue), "has_queue": the store has one, "complete": its main head verifies with
    nothing left to do, "resume": None or the refusal, "cancel": None or the refusal}``; a
    refusal is ``{"message", "hint"}``. Resume is refused for a complete task (as ``overnight
    resume`` of it runs no step) and for a coding-agent task (its agent continues it with
    task_resume: it has no overnight steps to run or queue, as ``overnight resume`` says) and for a
    task running now (a live process -- ``overnight run`` in a terminal, or a worker -- holds its
    lease on main: ``overnight resume`` would fail busy; the refusal says ``running (...)`` as
    ``overnight ls`` does, with ``"running": True``); cancel
    for a task without a ``queued`` or ``running`` queue row (a task run in a terminal stops with
    Ctrl-C there).

    Raises:
        TaskNotFound: no such task.
    """
    s.get_task(task_id)
    refs = s.list_refs(task_id)
    complete = coding = False
    if "main" in refs:
        facts = _head_facts(s, task_id, "main", refs["main"], cache)
        complete = facts["verified"] and facts["todo"] == 0
        coding = facts["verified"] and api.is_coding_task(facts.get("kind"))
    q = queue_for(s)
    row = None
    if q is not None:
        try:
            row = q.get(task_id)
        except OvernightError:  # an unreadable queue row: nothing to act on from here
            row = None
    queue = row.status if row is not None else None
    resume = None
    running = None if complete or coding else running_now(s, task_id, row)
    if complete:
        resume = {"message": f"task {task_id!r} is complete: nothing to resume (every step is done)",
                  "hint": "a resume of it runs no step unless its world drifted since (see Drift preview; "
                          f"then `overnight resume {task_id}` recomputes what changed here; the workers are "
                          "given no complete task); to run steps again, fork it at an earlier checkpoint "
                          "(timeline > open > Fork) or roll a branch back"}
    elif coding:  # as `overnight resume` refuses it: no overnight step of it to run, here or on a worker
        resume = {"message": f"task {task_id!r} is {api.CODING_PAUSED}: a coding-agent task (MCP tools / hooks) "
                             "has no overnight steps to resume or queue",
                  "hint": "the agent continues it: task_resume (or the session-start hook) loads its control "
                          "point; `overnight status TASK --drift` shows what changed"}
    elif running is not None:  # its lease is held: `overnight resume` would fail busy, a queued run would wait
        by_worker = row is not None and row.status == "running" and bool(row.worker_id)
        resume = {"message": f"task {task_id!r} is {running}: it holds its lease, so it cannot be resumed "
                             "while it runs",
                  "hint": (f"it is running; wait for it to finish (`{api.command('status', task_id, s.url)}` shows "
                           "its progress), or stop it -- "
                           + (f"`{api.command('cancel', task_id, s.url)}` stops the worker at its next step boundary"
                              if by_worker else "Ctrl-C in the terminal running it")
                           + " -- and resume it then"),
                  "running": True}
    if coding:  # not `overnight resume --submit`, which refuses it
        terminal = ("a coding-agent task is worked on in its agent's sessions (MCP tools / hooks), never by the "
                    "workers: it stops when its session does, and task_resume in the agent continues it")
    else:
        terminal = (f"a task run in a terminal (`overnight run` / `overnight resume`) stops with Ctrl-C in that "
                    f"terminal; cancel acts on a task queued for `overnight worker` (`overnight resume {task_id} "
                    f"--submit`)")
    cancel = None
    if q is None:
        cancel = {"message": f"task {task_id!r} is not on the workers' queue: this store ({s.url}) has none, "
                             "nothing to cancel here", "hint": terminal}
    elif queue is None:
        cancel = {"message": f"task {task_id!r} is not on the workers' queue (it was never submitted to them): "
                             "nothing to cancel here", "hint": terminal}
    elif queue not in CANCELLABLE:
        cancel = {"message": f"task {task_id!r} is already {queue} on the workers' queue: nothing to cancel",
                  "hint": terminal}
    return {"queue": queue, "has_queue": q is not None, "complete": complete, "resume": resume, "cancel": cancel}


def running_now(s: Store, task_id: str, row: Any = None) -> str | None:
    """What ``overnight ls`` / ``status`` say of ``task_id`` while a live process holds its task
    lease on ``main`` -- ``running (pid P on HOST, heartbeat N s ago)``, ``running (worker W on
    HOST, ...)`` -- or None when no one holds it (released, expired, or its holder is gone: a
    resume may take it over). ``row``: its queue row, when already read."""

    clock = s.clock_ms()
    try:
        lease = s.read_lease(task_id, "main")
    except OvernightError:  # an unreadable lease: nothing known to be running
        return None
    if lease is None or not lease.holder_id or can_take_over(lease.holder, lease.expires_at_ms, clock):
        return None
    said = describe(row, lease, complete=False, now=clock)
    return said if said.startswith("running") else f"running (held by {describe_holder(lease.holder)})"


# --- checkpoint page ---------------------------------------------------------------------------


def _artifact_text(s: Store, ref: Any, name: str) -> str | None:
    if not ref.text or ref.size > TEXT_INLINE_MAX:
        return None
    try:
        return BlobReader(s).get(ref.digest, f"artifact {name!r}").decode("utf-8")
    except (OvernightError, UnicodeDecodeError):
        return None


def _diff_values(old: Any, new: Any, path: str, out: list[dict[str, Any]], depth: int = 0) -> None:
    if old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict) and depth < 3:
        for k in sorted(set(old) | set(new), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in old:
                out.append({"path": p, "change": "added", "old": None, "new": new[k]})
            elif k not in new:
                out.append({"path": p, "change": "removed", "old": old[k], "new": None})
            else:
                _diff_values(old[k], new[k], p, out, depth + 1)
        return
    out.append({"path": path or "(root)", "change": "changed", "old": old, "new": new})


def checkpoint_page(s: Store, task_id: str, ref: str) -> dict[str, Any]:
    """One checkpoint, verified (``load_checkpoint``): its record, its state as a tree, the diff
    against its parent (user-state fields, done/todo steps, artifacts with unified diffs of text
    artifacts up to :data:`TEXT_INLINE_MAX` bytes), its artifacts (size, digest, text inline) and
    its fingerprint. A checkpoint that fails verification is reported as damaged, never shown.

    Raises:
        TaskNotFound, CheckpointNotFound.
    """
    s.get_task(task_id)
    cid = api.resolve_checkpoint(s, task_id, ref)
    row = s.get_checkpoint(cid)
    key = signing_key_from_env()
    base = {"task_id": task_id, "checkpoint_id": cid, "short_id": short_id(cid), "seq": row.seq,
            "branch": row.branch, "event": row.event, "step": row.step, "created_at": row.created_at,
            "parent_id": row.parent_id, "stored_bytes": row.stored_bytes}
    try:
        loaded = load_checkpoint(s, cid, key=key, deep=False)
    except OvernightError as exc:
        return {**base, "integrity": "damaged", "problem": f"{type(exc).__name__}: {exc.message}",
                "state": None, "diff": None, "artifacts": [], "fingerprint": None}
    tree = loaded.state_tree
    artifacts = []
    for name, a in sorted(loaded.artifacts.items()):
        artifacts.append({"name": name, "size": a.size, "digest": a.digest, "text": a.text, "step": a.step,
                          "content": _artifact_text(s, a, name)})
    diff: dict[str, Any] = {"parent": row.parent_id, "state": [], "done_added": [], "todo_added": [],
                            "todo_removed": [], "artifacts": [], "parent_problem": None}
    if row.parent_id:
        try:
            parent = load_checkpoint(s, row.parent_id, key=key, deep=False)
            ptree = parent.state_tree
            _diff_values(ptree.get("data"), tree.get("data"), "", diff["state"])
            pdone = {d["name"] for d in ptree["done"]}
            diff["done_added"] = [d["name"] for d in tree["done"] if d["name"] not in pdone]
            ptodo, todo = [e["name"] for e in ptree["todo"]], [e["name"] for e in tree["todo"]]
            diff["todo_added"] = [n for n in todo if n not in set(ptodo)]
            diff["todo_removed"] = [n for n in ptodo if n not in set(todo)]
            pa = parent.artifacts
            for name in sorted(set(pa) | set(loaded.artifacts)):
                old, new = pa.get(name), loaded.artifacts.get(name)
                if old is not None and new is not None and old.digest == new.digest:
                    continue
                change = "added" if old is None else "removed" if new is None else "changed"
                entry: dict[str, Any] = {"name": name, "change": change, "unified": None,
                                         "old_size": old.size if old else None, "new_size": new.size if new else None}
                a_text = _artifact_text(s, old, name) if old is not None else ""
                b_text = _artifact_text(s, new, name) if new is not None else ""
                if a_text is not None and b_text is not None:
                    entry["unified"] = "".join(difflib.unified_diff(
                        a_text.splitlines(keepends=True), b_text.splitlines(keepends=True),
                        f"{name} @ {short_id(row.parent_id)}", f"{name} @ {short_id(cid)}", n=2))
                diff["artifacts"].append(entry)
        except OvernightError as exc:
            diff["parent_problem"] = f"{type(exc).__name__}: {exc.message}"
    rec = loaded.record
    fingerprint = None
    if rec.fingerprint is not None:
        fingerprint = {"world_digest": rec.fingerprint.world.digest, "world": loaded.world,
                       "exports": dict(rec.fingerprint.exports), "accepted": list(rec.fingerprint.accepted)}
    state = {"task": tree["task"], "data": tree.get("data"), "context": tree.get("context"),
             "todo": [e["name"] for e in tree["todo"]], "done": [d["name"] for d in tree["done"]],
             "recompute": tree.get("recompute")}
    return {**base, "integrity": "verified", "problem": None, "session": rec.session.n,
            "event_detail": {"ref": rec.event.ref, "detail": rec.event.detail, "key": rec.event.key},
            "signature": row.signature is not None, "state": state, "diff": diff, "artifacts": artifacts,
            "fingerprint": fingerprint}


def artifact(s: Store, task_id: str, at: str, name: str) -> tuple[bytes, dict[str, Any]]:
    """The verified bytes of artifact ``name`` at checkpoint ``at`` (``api.cat``), with its
    size, digest and text flag. Raises ArtifactNotFound / CheckpointNotFound / IntegrityError."""
    data = api.cat(task_id, name, store=s, at=at)
    loaded = load_checkpoint(s, api.resolve_checkpoint(s, task_id, at), key=signing_key_from_env(), deep=False)
    ref = loaded.artifacts[name]
    return data, {"name": name, "size": ref.size, "digest": ref.digest, "text": ref.text}


# --- drift preview -----------------------------------------------------------------------------


def drift_page(s: Store, task_id: str, *, check: bool, branch: str = "main") -> dict[str, Any]:
    """The drift preview. Without ``check``, only what is recorded (accepted drift, the last
    checkpoint). With ``check``, the drift report against the world now (``api.status(drift=
    True)``, which imports the task's code from its recorded location, as ``overnight status
    --drift`` does) and, per component and per policy, what a resume would do: the steps that
    would run again and their recorded tokens and cost (from those steps' model calls), and the
    steps re-checked (``may_run``: they read a recomputed step's output, and run again only if
    what they read now differs; ``tokens_upper`` counts them too), as ``status --drift`` says.
    Nothing is written and nothing runs.

    Raises:
        TaskNotFound, BranchNotFound, ConfigError (no code location), IntegrityError.
    """
    from overnight.verify.drift import affected_steps

    t = s.get_task(task_id)
    out: dict[str, Any] = {"task_id": task_id, "goal": t.goal, "entry": t.entry, "branch": branch,
                           "checked": check, "report": None, "policies": [], "error": None}
    if not check:
        return out
    rep = api.status(task_id, store=s, branch=branch, drift=True)
    out["accepted"] = rep.accepted_drift
    drift = rep.drift
    assert drift is not None
    out["report"] = [{"component": i.component, "key": i.key, "was": str(i.old), "now": str(i.new),
                      "steps": i.steps, "warning": i.warning} for i in drift.items]
    out["dependents"] = drift.dependents
    loaded, _ = load_head(s, task_id, branch, key=signing_key_from_env(), deep=False)
    done = loaded.state_tree["done"]
    by_name = {d["name"]: d for d in done}
    model_of: dict[str, str] = {}
    for c in s.calls(task_id):
        model_of.setdefault(c.step_key, c.model)
    prices = _prices()
    def spent(steps: list[str]) -> tuple[int, int, float | None]:
        """Recorded tokens in, out and cost (None: a step's model has no price) of ``steps``."""
        tin = sum(by_name[n].get("tokens_in", 0) for n in steps if n in by_name)
        tout = sum(by_name[n].get("tokens_out", 0) for n in steps if n in by_name)
        costs = [_cost(prices, model_of.get(by_name[n]["key"]), by_name[n].get("tokens_in", 0),
                       by_name[n].get("tokens_out", 0)) for n in steps if n in by_name]
        priced = [c for c in costs if c is not None]
        return tin, tout, round(sum(priced), 6) if priced and len(priced) == len(costs) else None

    for component in drift.components():
        # as `overnight status --drift` says it: the steps that read what drifted run again; those
        # that read their outputs are re-checked, and run again only if what they read now differs
        steps = affected_steps(drift, done, {component}, closure=False)
        may_run = [n for n in affected_steps(drift, done, {component}) if n not in steps]
        tin, tout, cost = spent(steps)
        upper_in, upper_out, _ = spent(steps + may_run)
        out["policies"].append({
            "component": component,
            "recompute": {"steps": steps, "may_run": may_run, "tokens_in": tin, "tokens_out": tout, "cost_usd": cost,
                          "tokens_upper": upper_in + upper_out,
                          "command": f"overnight resume {task_id} --on-drift {component}=recompute"},
            "accept": {"steps": [], "command": f"overnight resume {task_id} --on-drift {component}=accept",
                       "effect": "continue; the drift is recorded on every later checkpoint"},
            "rollback": {"command": f"overnight resume {task_id} --on-drift {component}=rollback",
                         "effect": "resume from the newest checkpoint whose fingerprint matches the world now"},
            "abort": {"command": f"overnight resume {task_id} --on-drift {component}=abort",
                      "effect": "stop with the report (exit 5)"},
        })
    out["plan"] = rep.drift_plan
    return out


# --- journal -----------------------------------------------------------------------------------


def journal_page(s: Store, task_id: str) -> dict[str, Any]:
    """Model calls per step (model, calls, tokens, latency), replay hits (calls a resumed step
    took from the call journal instead of making again) and the tokens and cost they saved.

    Raises:
        TaskNotFound.
    """
    t = s.get_task(task_id)
    names = {j.step_key: j.step_name for j in s.journal(task_id)}
    prices = _prices()
    steps: dict[str, dict[str, Any]] = {}
    for c in s.calls(task_id):
        st = steps.setdefault(c.step_key, {"step": names.get(c.step_key, c.step_key[:19]), "step_key": c.step_key,
                                           "calls": 0, "models": [], "tokens_in": 0, "tokens_out": 0,
                                           "latency_ms": 0.0, "cost_usd": 0.0, "priced": True})
        st["calls"] += 1
        if c.model not in st["models"]:
            st["models"].append(c.model)
        st["tokens_in"] += c.tokens_in
        st["tokens_out"] += c.tokens_out
        st["latency_ms"] = round(st["latency_ms"] + c.latency_ms, 3)
        cost = _cost(prices, c.model, c.tokens_in, c.tokens_out)
        if cost is None:
            st["priced"] = False
        else:
            st["cost_usd"] = round(st["cost_usd"] + cost, 6)
    replay: list[dict[str, Any]] = []
    try:
        loaded, _ = load_head(s, task_id, "main", key=signing_key_from_env(), deep=False)
        for d in loaded.state.done:
            if d.replayed_tokens:
                model = next((c for c in steps.values() if c["step_key"] == d.key), {}).get("models", [None])[0]
                replay.append({"step": d.name, "tokens": d.replayed_tokens, "model": model,
                               "cost_saved_usd": _cost(prices, model, d.replayed_tokens, 0)})
    except OvernightError:
        pass
    for st in steps.values():
        if not st["priced"]:
            st["cost_usd"] = None
    usage = api.usage(task_id, store=s)
    return {"task_id": task_id, "goal": t.goal, "steps": list(steps.values()), "replays": replay,
            "tokens_saved": sum(r["tokens"] for r in replay),
            "cost_saved_usd": (round(sum(r["cost_saved_usd"] for r in replay), 6)
                               if replay and all(r["cost_saved_usd"] is not None for r in replay) else None),
            "usage": usage}


# --- storage -----------------------------------------------------------------------------------


DEDUP_CHECKPOINTS_MAX = 1000
"""The storage page's dedup figure reads the artifact lists of at most this many checkpoints (the
newest first, across tasks); over it, the figure is of those and says so."""


def storage_page(s: Store, *, gc: bool = False) -> dict[str, Any]:
    """Bytes per task (added by its commits) and of the store on its medium, the artifact dedup
    (:func:`artifact_dedup`), growth over each task's chain (cumulative bytes by seq, for the
    chart), and with ``gc`` the ``overnight gc`` dry run (nothing deleted)."""
    tasks, growth, every = [], [], []
    for t in s.list_tasks():
        rows = sorted(s.list_checkpoints(t.task_id), key=lambda r: (r.seq, r.created_at))
        every.extend(rows)
        level, media = _route(t.spec)
        total, points = 0, []
        for r in rows:
            total += r.stored_bytes
            points.append((r.seq, total))
        tasks.append({"task_id": t.task_id, "level": level, "media": media, **stored_on(s, media),
                      "checkpoints": len(rows), "stored_bytes": total})
        step = max(1, len(points) // 200)
        growth.append({"task_id": t.task_id, "points": points[::step] + ([points[-1]] if points and
                                                                      (len(points) - 1) % step else [])})
    stored = s.stored_bytes()
    by_medium: dict[str, int] = {}
    for t in tasks:
        for m in t["stored_on"]:
            by_medium[m] = by_medium.get(m, 0) + t["stored_bytes"]
    report = None
    if gc:
        report = asdict(api.gc(store=s))
    dedup = artifact_dedup(s, every)
    return {"store": s.url, "store_bytes": stored, "tasks": tasks, "by_medium": by_medium,
            "full_copy_bytes": dedup["whole_bytes"], "artifact_stored_bytes": dedup["stored_bytes"],
            "dedup_ratio": dedup["ratio"], "dedup": dedup, "growth": growth, "gc": report}


def artifact_dedup(s: Store, rows: list[CheckpointRow], *, limit: int = DEDUP_CHECKPOINTS_MAX) -> dict[str, Any]:
    """What content addressing and chunking save on artifacts, like with like: ``whole_bytes``,
    the artifact bytes the checkpoints would take if each kept every one of its artifacts whole
    (the sum of their sizes, checkpoint by checkpoint), against ``stored_bytes``, the bytes the
    store holds for the objects those artifacts are made of (each blob, chunk tree, chunk index
    and chunk counted once, as stored: compressed). ``ratio`` = whole / stored (2.0: half the
    bytes), None without artifacts. Read over the ``limit`` newest of ``rows`` (``checkpoints``
    of ``of``); a checkpoint or object that does not load is left out (``skipped``): the
    verify pages say what is damaged."""
    from overnight.store.blobs import BlobReader

    newest = sorted(rows, key=lambda r: r.created_at, reverse=True)[:limit]
    key = signing_key_from_env()
    pages: dict[str, Any] = {}
    whole, digests, skipped = 0, set(), 0
    for r in newest:
        try:
            loaded = load_checkpoint(s, r.checkpoint_id, key=key, deep=False, check_artifacts=False,
                                     lazy_done=True, pages=pages, row=r)
            arts = loaded.artifacts
        except OvernightError:
            skipped += 1
            continue
        whole += sum(a.size for a in arts.values())
        digests.update(a.digest for a in arts.values())
    reader, objects = BlobReader(s), set()
    for d in digests:
        try:
            objects.update(reader.reachable(d, "the storage page"))
        except OvernightError:
            skipped += 1
    stored = 0
    if objects:
        for st in s.iter_object_stats():
            if st.digest in objects:
                stored += st.stored_bytes
    return {"whole_bytes": whole, "stored_bytes": stored,
            "ratio": round(whole / stored, 2) if whole and stored else None,
            "checkpoints": len(newest), "of": len(rows), "artifacts": len(digests), "skipped": skipped}
