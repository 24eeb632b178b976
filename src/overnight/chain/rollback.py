"""No silent rollback: is a branch ref older than what the store or this machine has seen?

A ref is the only mutable thing in a store, and someone who can write the store can point it at
any older checkpoint -- one that verifies, signature and all, because it once was the head.
Loading it would silently run every later step again (side effects included). Two checks catch it:

1. **The chain** (with or without a signing key): a record of the same branch that passes every
   record check (with a key: its signature too), has a higher ``seq``, and descends from the
   checkpoint about to be loaded -- so the branch once stood further on. Records a fallback
   skipped do not count (they failed verification; the fallback reports them).
2. **The high-water mark** (with a signing key): every ref move is a signed record (commits,
   ``fork``, ``rollback``, ``merge`` and an automatic fallback each write one, carrying task,
   branch, its own id and ``seq``), and each machine keeps the newest one it has seen per store,
   task and branch outside the store (:class:`~overnight.keys.HighWater`). A head with a
   lower ``seq`` than the mark is a rollback, also when the newer records were deleted -- unless
   the head's own signed history says why: an automatic fallback that skipped the marked
   checkpoint (its ``rollback`` event names what it skipped). A head of another incarnation of
   the task (the random salt of its signed spec: the task deleted and created again) is a
   replay when the mark lists that incarnation as replaced, or when a checkpoint of its chain
   was created no later than the marked head: a task created again starts after its old head.

Either raises :class:`~overnight.errors.RollbackDetected` naming both checkpoints; ``resume
--allow-rollback`` accepts it (and lowers the mark), ``overnight rollback`` is a deliberate
rollback (a new signed record with a higher ``seq``, so it never trips either check).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from overnight.errors import IntegrityError, RollbackDetected, short_id
from overnight.store.base import Store
from overnight.chain.integrity import LoadedCheckpoint, parse_record
from overnight.keys import HighWater, Mark


@dataclass(frozen=True)
class Rollback:
    """A ref found behind what was seen: ``head`` (what it names, or the checkpoint a fallback
    landed on), ``newer`` (a checkpoint of the branch further on), their ``seq``s, and ``source``:
    ``"chain"`` (a newer verified record is in the store), ``"other branch"`` (the ref names
    another branch's record, older than one of its own) or ``"high-water"`` (this machine saw it)."""

    task_id: str
    branch: str
    head: str
    head_seq: int
    newer: str
    newer_seq: int
    source: str

    def describe(self) -> str:
        where = {"chain": "a newer verified record of the branch descends from it",
                 "other branch": "it is a checkpoint of another branch, and the store holds a newer verified "
                                 "record of this one",
                 "retired incarnation": "it belongs to an earlier incarnation of the task (deleted and created "
                                        "again), which this machine has seen replaced by the newer one (high-water "
                                        "mark)",
                 "older incarnation": "it belongs to another incarnation of the task, created before the newer "
                                      "signed head this machine has seen (high-water mark) -- a task deleted and "
                                      "created again starts after its old head, never before"}.get(
            self.source, "this machine has seen the branch at a newer signed head (high-water mark)")
        return (f"branch {self.branch!r} of task {self.task_id!r} names checkpoint {short_id(self.head)} (seq "
                f"{self.head_seq}), older than {short_id(self.newer)} (seq {self.newer_seq}): {where}")

    def error(self) -> RollbackDetected:
        if self.source.endswith("incarnation"):
            return RollbackDetected(
                f"rollback detected: {self.describe()}; someone put an older copy of the task in its place, and "
                "loading it would run every later step again", task_id=self.task_id, checkpoint_id=self.head,
                head=self.head, newer=self.newer,
                hint=f"if you restored it on purpose: overnight resume {shlex.quote(self.task_id)} --allow-rollback; "
                     f"else restore the task from a copy of the store that holds {short_id(self.newer)} (seq "
                     f"{self.newer_seq})")
        return RollbackDetected(
            f"rollback detected: {self.describe()}; someone moved the ref back, and loading it would run every "
            "later step again", task_id=self.task_id, checkpoint_id=self.head, head=self.head, newer=self.newer,
            hint=f"if you moved it back on purpose: overnight resume {self.task_id} --allow-rollback (or `overnight "
            f"rollback {self.task_id} --to {short_id(self.head)}`, which records it); else restore the ref to "
            f"{short_id(self.newer)}")


def store_identity(store: Store) -> str:
    """The key of ``store`` in the high-water file: its URL without a password; for a
    ``sqlite://`` or ``file://`` store the real path of its file or folder (absolute, symlinks
    resolved, no query), so every spelling of the same store -- relative, through a symlink --
    finds the same mark (an attacker's ``--store`` alias must not skip the check)."""
    url = getattr(getattr(store, "hot", store), "url", "") or ""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("sqlite", "file"):
        path = rest.split("?", 1)[0]
        if path and path != ":memory:":
            return f"{scheme}://{os.path.realpath(path)}"
    return _legacy_identity(store)


def _legacy_identity(store: Store) -> str:
    """The key marks were written under before :func:`store_identity` resolved local paths (the
    URL as given, without a password): still read, so an upgrade keeps the marks it had."""
    url = getattr(getattr(store, "hot", store), "url", "") or ""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        auth, _, host = rest.partition("@")
        url = f"{scheme}://{auth.split(':', 1)[0]}@{host}"
    return url


def _mark(high_water: HighWater | None, store: Store, task_id: str, branch: str) -> Mark | None:
    """This machine's mark of ``store``/``task_id``/``branch``: under its identity, else under the
    key an earlier version wrote it under."""
    hw = high_water or HighWater()
    for key in dict.fromkeys((store_identity(store), _legacy_identity(store))):
        mark = hw.get(key, task_id, branch)
        if mark is not None:
            return mark
    return None


def _incarnation(loaded: LoadedCheckpoint) -> str:
    spec = loaded.doc_tree.get("task", {}).get("spec", {})
    return str(spec.get("salt", "")) if isinstance(spec, dict) else ""


def find_rollback(store: Store, loaded: LoadedCheckpoint, *, key: bytes | None, skipped: set[str] = frozenset(),
                  high_water: HighWater | None = None, named: str | None = None,
                  branch: str | None = None) -> Rollback | None:
    """The rollback of ``loaded``'s branch, or None (see the module docstring).

    Args:
        loaded: the checkpoint about to be used (the verified head, or where a fallback landed).
        branch: the ref ``loaded`` was read through (None: the branch of its record). A ref may
            name another branch's record (a kept diverged head, a rewritten history), but when
            that record is older than a verified record of the ref's own branch, the ref was moved
            back onto it: a rollback too (the chain check of the record's branch cannot see it).
        skipped: checkpoints a fallback skipped (they failed verification: not evidence).
        high_water: the high-water file to consult (with ``key`` only; None: the default one).
        named: what the branch ref named when the caller read it (the head it loaded, or the one
            a fallback went past), for a caller holding no lease (``verify``, ``ls``, ``status``):
            a run may commit between that read and this check, and its newer record is the branch
            moving on, not a rollback. So a rollback is reported only if the ref, read again
            after the newer record was found, still names ``named``; else None (the next check
            sees the ref as it then stands).
    """
    found = _find(store, loaded, key=key, skipped=skipped, high_water=high_water)
    if found is None and branch is not None and branch != loaded.record.branch:
        found = _onto_other_branch(store, loaded, branch, key=key, skipped=skipped, high_water=high_water)
    if found is not None and named is not None \
            and store.get_ref(loaded.record.task_id, branch or loaded.row.branch) != named:
        return None
    return found


def _onto_other_branch(store: Store, loaded: LoadedCheckpoint, branch: str, *, key: bytes | None,
                       skipped: set[str], high_water: HighWater | None) -> Rollback | None:
    """Ref ``branch`` names ``loaded``, a record of another branch: the newest verified record of
    ``branch`` itself with a higher ``seq``, if the store holds one (the ref stood there before);
    else, with ``key``, this machine's high-water mark of ``branch`` above ``loaded``'s ``seq``
    (the newer records of ``branch`` were deleted too)."""
    task_id, seq = loaded.record.task_id, loaded.record.seq
    newer = _verified_after(store, task_id, branch, seq, key=key, skipped=skipped)
    if newer:
        cid, record = max(newer.items(), key=lambda kv: kv[1].seq)
        return Rollback(task_id, branch, loaded.id, seq, cid, record.seq, "other branch")
    if key is None:
        return None
    mark = _mark(high_water, store, task_id, branch)
    return _against_mark(store, loaded, mark, branch, key=key, skipped=skipped)


def _verified_after(store: Store, task_id: str, branch: str, seq: int, *, key: bytes | None,
                    skipped: set[str]) -> dict[str, Any]:
    """``{checkpoint id: record}`` of the records of ``branch`` with a ``seq`` above ``seq`` that
    pass every record check (digest, schema, index columns -- so their branch and seq are the
    record's own -- and with ``key`` the signature), ``skipped`` left out. One store query."""
    newer: dict[str, Any] = {}
    for row in store.checkpoints_after(task_id, branch, seq):
        if row.branch != branch or row.seq <= seq or row.checkpoint_id in skipped:
            continue
        try:
            newer[row.checkpoint_id] = parse_record(row, key=key)
        except IntegrityError:
            continue  # damaged or forged: reported by fallback / verify, never evidence
    return newer


def newer_descendant(store: Store, task_id: str, branch: str, checkpoint_id: str, seq: int, *,
                     key: bytes | None, skipped: set[str] = frozenset()) -> tuple[int, str] | None:
    """``(seq, checkpoint id)`` of the newest record of ``branch`` that passes every record check
    (with ``key``: its signature), has a ``seq`` above ``seq`` and descends from checkpoint
    ``checkpoint_id`` -- the branch once stood further on -- or None. Records in ``skipped`` (a
    fallback found them damaged) are no evidence. One store query (the rows after ``seq``)."""
    newer = _verified_after(store, task_id, branch, seq, key=key, skipped=skipped)
    best: tuple[int, str] | None = None
    for cid, record in newer.items():
        if best is not None and record.seq <= best[0]:
            continue
        walk, hops = record, 0
        while walk is not None and hops <= len(newer):
            if walk.parent_id == checkpoint_id:
                best = (record.seq, cid)
                break
            walk, hops = newer.get(walk.parent_id or ""), hops + 1
    return best


def _find(store: Store, loaded: LoadedCheckpoint, *, key: bytes | None, skipped: set[str],
          high_water: HighWater | None) -> Rollback | None:
    """:func:`find_rollback` without the second look at the ref."""
    task_id, branch, seq = loaded.record.task_id, loaded.record.branch, loaded.record.seq
    ref_branch = loaded.row.branch
    # 1. the chain: verified records of the branch, newer than ``loaded``, descending from it
    best = newer_descendant(store, task_id, ref_branch, loaded.id, seq, key=key, skipped=skipped)
    if best is not None:
        return Rollback(task_id, branch, loaded.id, seq, best[1], best[0], "chain")
    if key is None:
        return None
    # 2. the high-water mark of this machine
    mark = _mark(high_water, store, task_id, ref_branch)
    return _against_mark(store, loaded, mark, branch, key=key, skipped=skipped)


def _against_mark(store: Store, loaded: LoadedCheckpoint, mark: Mark | None, branch: str, *, key: bytes,
                  skipped: set[str]) -> Rollback | None:
    """``loaded`` (the head about to be used) against this machine's mark of its branch: of the
    same incarnation, a lower ``seq`` than the mark's is a rollback unless its signed history
    explains it (:func:`_explained`); of another incarnation -- the task deleted and created again,
    or an old or foreign chain of that id put in its place -- one the mark lists as ``retired``
    is a replay, and so is one with a checkpoint (signed; its chain walked back and verified as
    far as it goes) created no later than the marked head. Marks written before their heads'
    times were kept (no ``created_at``) judge only the retired ones."""
    if mark is None or mark.checkpoint_id in skipped:
        return None
    task_id, seq, incarnation = loaded.record.task_id, loaded.record.seq, _incarnation(loaded)
    if mark.incarnation == incarnation:
        if mark.seq <= seq or _explained(store.list_checkpoints(task_id), loaded, mark, key):
            return None
        return Rollback(task_id, branch, loaded.id, seq, mark.checkpoint_id, mark.seq, "high-water")
    if not incarnation or not mark.incarnation:
        return None  # a chain or a mark of before incarnations: nothing to compare
    if incarnation in mark.retired:
        return Rollback(task_id, branch, loaded.id, seq, mark.checkpoint_id, mark.seq, "retired incarnation")
    born = _earliest_created_at(store.list_checkpoints(task_id), loaded, key)
    if mark.created_at and _utc(born) <= _utc(mark.created_at):
        return Rollback(task_id, branch, loaded.id, seq, mark.checkpoint_id, mark.seq, "older incarnation")
    return None


def _utc(stamp: str) -> datetime:
    try:
        out = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return datetime.max.replace(tzinfo=timezone.utc)  # unreadable: judged newer (no alarm on it)
    return out if out.tzinfo else out.replace(tzinfo=timezone.utc)


def _earliest_created_at(rows: list[Any], loaded: LoadedCheckpoint, key: bytes) -> str:
    """The signed ``created_at`` of the earliest checkpoint of ``loaded``'s chain that can be
    reached from it -- its root, unless a link is missing (a gc) or fails its checks (its
    signature too): then the last verified record before it, at worst ``loaded`` itself. Every
    checkpoint of an incarnation created after a given head is newer than that head, so any of
    them will do; the earliest is the strongest evidence."""
    by_id = {r.checkpoint_id: r for r in rows}
    record, hops = loaded.record, 0
    while record.parent_id is not None and hops <= len(by_id):
        row = by_id.get(record.parent_id)
        if row is None:
            break
        try:
            record = parse_record(row, key=key)
        except IntegrityError:
            break
        hops += 1
    return record.created_at


def _explained(rows: list[Any], loaded: LoadedCheckpoint, mark: Mark, key: bytes) -> bool:
    """Does the signed history of ``loaded`` record an automatic fallback that skipped the
    marked checkpoint (a writer that found it damaged and went back on purpose)?"""
    by_id = {r.checkpoint_id: r for r in rows}
    cid: str | None = loaded.id
    for _ in range(len(by_id) + 1):
        row = by_id.get(cid or "")
        if row is None:
            return False
        try:
            record = parse_record(row, key=key)
        except IntegrityError:
            return False
        ev = record.event
        if ev.kind == "rollback" and (ev.detail or "").startswith(("automatic fallback", "accepted rollback")) and mark.checkpoint_id in (
                ev.detail or ""):
            return True
        cid = record.parent_id
    return False


def see(store: Store, loaded: LoadedCheckpoint, *, key: bytes | None, force: bool = False,
        high_water: HighWater | None = None) -> None:
    """Raise this machine's high-water mark of ``loaded``'s branch to it (with a signing key
    only; ``force``: also lower it -- this machine wrote ``loaded``, or the user accepted a
    rollback)."""
    if key is None:
        return
    (high_water or HighWater()).raise_to(store_identity(store), loaded.record.task_id, loaded.row.branch,
                                         Mark(loaded.id, loaded.record.seq, _incarnation(loaded),
                                              loaded.record.created_at), force=force)


def check(store: Store, loaded: LoadedCheckpoint, *, key: bytes | None, skipped: set[str] = frozenset(),
          allow: bool = False, branch: str | None = None) -> Rollback | None:
    """:func:`find_rollback` (``branch``: the ref ``loaded`` was read through), then raise the
    mark. Raises ``RollbackDetected`` unless ``allow`` (then the rollback found, if any, is
    returned and the mark lowered to ``loaded``)."""
    found = find_rollback(store, loaded, key=key, skipped=skipped, branch=branch)
    if found is not None and not allow:
        raise found.error()
    see(store, loaded, key=key, force=found is not None)
    return found


def refuse_rollback(store: Store, loaded: LoadedCheckpoint, *, key: bytes | None, branch: str, named: str,
                    skipped: set[str] = frozenset()) -> None:
    """For a reader that holds no lease (the adapters, the MCP tools): :func:`find_rollback` of
    ``loaded``, read through ref ``branch`` when it named ``named``; raise its error if found, else
    raise the high-water mark (:func:`see`). A writer committing meanwhile is the branch moving on,
    not a rollback (``named``).

    Raises:
        RollbackDetected: the ref was moved back (the error names both checkpoints).
    """
    found = find_rollback(store, loaded, key=key, skipped=skipped, named=named, branch=branch)
    if found is not None:
        raise found.error()
    see(store, loaded, key=key)


__all__ = ["Rollback", "check", "find_rollback", "newer_descendant", "refuse_rollback", "see", "store_identity"]
