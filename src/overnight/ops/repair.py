"""Replica repair: make a task's copies on several media agree again, from a healthy copy.

The media are those of a :class:`~overnight.store.compose.replicated.ReplicatedStore`.
:func:`repair_task` makes the media agree again after a medium was lost, emptied, corrupted, left
behind or went on alone: for each branch it finds the medium holding the newest checkpoint that
verifies (by ``seq``, after each medium's own fallback), and copies what the others lack -- the
task record, the checkpoints on that head's lineage, every object missing or damaged -- then moves
their refs. A head the chosen one does not contain (the media diverged) is kept on a branch
``<branch>@<medium>``, never dropped; a medium whose store cannot be read is set aside (its files
renamed, never deleted) and rebuilt. The runner calls it before every resume of a replicated
task, so resume reads from the first healthy copy and heals the others; ``overnight repair`` runs
it on demand and reports what it found. Stored names: ``docs/FORMAT.md``, "Replicas".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from overnight.errors import (
    TaskNotFound,
    CheckpointNotFound,
    ConfigError,
    IntegrityError,
    NoValidCheckpoint,
    NotFound,
    OvernightError,
    StoreCorrupt,
    short_id,
)
from overnight.store.base import CheckpointRow, Commit, Store, TaskRow
from overnight.store.compose.damaged import DamagedMedium
from overnight.store.compose.replicated import replicated_under
from overnight.chain.branches import check_branch_name
from overnight.chain.read import Fallback, Skipped, load_head
from overnight.chain.integrity import LoadedCheckpoint, load_checkpoint
from overnight.chain.reachability import first_parent_chain, lineage


@dataclass
class MediumRepair:
    """What :func:`repair_task` found and did on one medium.

    ``status``: ``ok`` (nothing to do) | ``repaired`` (copies made or refs moved) | ``diverged``
    (repaired, and a head of its own that the newest head does not contain was kept on a branch
    named in ``kept``) | ``damaged`` (its store could not be read: the files were moved aside --
    ``detail`` says where -- and the medium rebuilt from a replica) | ``unavailable`` (could not
    be reached or read; left as it is) | ``failed`` (the repair itself failed; ``detail``).
    ``heads``: branch -> state before the repair: ``ok`` / ``missing`` / ``invalid`` (its head
    failed verification) / ``behind`` (an ancestor of the newest head) / ``diverged``.
    ``kept``: branch created on this medium -> the checkpoint it keeps (a diverged head).
    """

    name: str
    status: str = "ok"
    heads: dict[str, str] = field(default_factory=dict)
    checkpoints_copied: int = 0
    objects_copied: int = 0
    detail: str | None = None
    kept: dict[str, str] = field(default_factory=dict)


REPAIRED = ("repaired", "diverged", "damaged")
"""Statuses of a medium :func:`repair_task` changed."""


@dataclass
class RepairReport:
    """Per medium, for one task: the source of each branch and what was copied where.

    ``skipped``: branch -> the newer checkpoints passed over because they verify on no medium
    (``checkpoint_id``, ``seq``, ``step``, ``medium``, ``error``, ``reason``); the branch continues from the
    newest one that does, and those steps run again.
    """

    task_id: str
    sources: dict[str, str] = field(default_factory=dict)  # branch -> medium name
    media: list[MediumRepair] = field(default_factory=list)
    skipped: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    @property
    def repaired(self) -> bool:
        return any(m.status in REPAIRED for m in self.media)

    @property
    def diverged(self) -> bool:
        """Some medium held work the chosen head does not contain (now kept on a branch)."""
        return any(m.kept for m in self.media)

    def fallback(self, branch: str, used_id: str) -> Fallback | None:
        """The repair's moving ``branch`` back to ``used_id`` as a resume's
        :class:`~overnight.chain.read.Fallback` (the checkpoints that verify on no medium,
        newest first, each once), or None when nothing on ``branch`` was skipped. A session that
        resumes after the repair passes these to the rollback check -- they failed verification,
        so they are no evidence of a rollback -- and records the automatic fallback, as on one
        medium."""
        seen: dict[str, Skipped] = {}
        for s in self.skipped.get(branch, []):
            cid = str(s["checkpoint_id"])
            if cid not in seen:
                seq = s["seq"]
                seen[cid] = Skipped(cid, seq if isinstance(seq, int) else None, str(s["step"]) if s["step"] else None,
                                    str(s["error"]), str(s["reason"]))
        if not seen:
            return None
        skipped = sorted(seen.values(), key=lambda k: -1 if k.seq is None else k.seq, reverse=True)
        return Fallback(head_id=skipped[0].checkpoint_id, used_id=used_id, skipped=skipped)

    def describe(self) -> str:
        parts = []
        for m in self.media:
            if m.status in REPAIRED:
                text = f"{m.name}: {m.status}"
                if m.checkpoints_copied or m.objects_copied:
                    text += (f", copied {m.checkpoints_copied} checkpoint(s) and {m.objects_copied} object(s) from "
                             f"{', '.join(sorted(set(self.sources.values()) - {m.name}))}")
                parts.append(text + (f" ({m.detail})" if m.detail else ""))
            elif m.status != "ok":
                parts.append(f"{m.name}: {m.status}" + (f" ({m.detail})" if m.detail else ""))
        for branch, skipped in self.skipped.items():
            parts.append(f"{branch}: skipped " + ", ".join(
                f"{short_id(str(s['checkpoint_id']))} (step {s['step']}, on {s['medium']}: {s['error']}: {s['reason']})"
                for s in skipped) + " -- verifies on no medium")
        return "; ".join(parts) or "all media agree"


def _copy_objects(src: Store, dst: Store, digests: Iterable[str]) -> int:
    digests = list(dict.fromkeys(digests))
    copied = 0
    for i in range(0, len(digests), 256):
        batch = src.get_objects(digests[i : i + 256])
        if batch:
            dst.put_objects(batch.values())
            copied += len(batch)
    return copied


def _holds(m: Store, task_id: str) -> bool:
    try:
        return bool(m.list_refs(task_id))
    except Exception:  # noqa: BLE001 - a medium that cannot answer holds nothing usable
        return False


def set_aside_damaged(media: list[Store], names: list[str], task_id: str) -> list[str]:
    """Set aside every medium whose store is damaged (:class:`~overnight.store.compose.damaged.DamagedMedium`,
    or reading it raises :class:`~overnight.errors.StoreCorrupt`) while another medium holds
    ``task_id``: its files are moved to ``<name>.damaged-<timestamp>`` (never deleted) and ``media``
    is updated in place to a fresh, empty store at the same place, for :func:`repair_task` to
    fill. A damaged medium that cannot be moved (not a file) or is the only copy is left as it is.
    Returns the names of the media set aside.
    """
    done = []
    for i, (name, m) in enumerate(zip(names, media)):
        if isinstance(m, DamagedMedium):
            if m.moved:
                continue
            error = m.error
        else:
            try:
                m.list_refs(task_id)
                continue
            except StoreCorrupt as exc:
                error = exc
            except Exception:  # noqa: BLE001 - unreachable, not damaged: repair_task reports it
                continue
        if not any(_holds(o, task_id) for j, o in enumerate(media) if j != i):
            continue  # the only copy: moving it would leave nothing to repair from
        if not isinstance(m, DamagedMedium):
            m.close()
            m = media[i] = DamagedMedium(m.url, error)
        try:
            m.set_aside()
        except OvernightError:
            continue  # not a file: reported as unavailable, with its error
        done.append(name)
    return done


def _keep_name(branch: str, medium: str, index: int, refs: dict[str, str]) -> str:
    """A free branch name for a diverged head of ``branch`` found on ``medium``: ``<branch>@<medium>``,
    else ``<branch>@medium-<index>`` (a medium named by a long URL), with ``-2``, ``-3`` ... when taken."""
    try:
        base = check_branch_name(f"{branch}@{medium}")
    except ConfigError:
        base = f"{branch}@medium-{index}"
    name, n = base, 1
    while name in refs:
        n += 1
        name = f"{base}-{n}"
    return name


def repair_task(media: list[Store], names: list[str], task_id: str, *, key: bytes | None,
                max_rounds: int = 64) -> RepairReport:
    """Make every medium hold the newest verifiable head of each branch of ``task_id``.

    For each branch, the source is the medium holding the checkpoint with the highest ``seq`` that
    verifies -- its head, or the newest one its head falls back to (a damaged head loses to an
    intact older checkpoint on the same medium only when no medium has anything newer intact);
    ties go to a head that verifies, then to the earlier medium. Checkpoints newer than it that
    verify nowhere are listed in ``RepairReport.skipped``, and every medium's ref moves to it.
    A medium whose verifiable head is not an ancestor of the source's (the media diverged: each
    went on alone) keeps that head on a new branch ``<branch>@<medium>`` -- copied to every medium,
    so ``overnight merge TASK --from <branch>@<medium>`` can combine the two -- and is reported
    ``diverged``. A medium whose store is damaged is set aside first (:func:`set_aside_damaged`)
    and rebuilt (``damaged``). ``media`` may be updated in place (a set-aside medium).

    Raises:
        NoValidCheckpoint: no medium has a verifiable head for some branch.
        TaskNotFound: no medium knows the task.
    """
    report = RepairReport(task_id)
    status = {n: MediumRepair(n) for n in names}
    report.media = list(status.values())
    set_aside_damaged(media, names, task_id)
    damaged = {n for n, m in zip(names, media) if isinstance(m, DamagedMedium) and m.moved}
    live: list[tuple[str, Store]] = []
    branches: set[str] = set()
    for name, m in zip(names, media):
        try:
            branches |= set(m.list_refs(task_id))
            live.append((name, m))
        except OvernightError as exc:
            status[name].status, status[name].detail = "unavailable", exc.message
        except Exception as exc:  # noqa: BLE001 - a medium that cannot even answer: report, do not crash
            status[name].status, status[name].detail = "unavailable", f"{type(exc).__name__}: {exc}"
    if not branches:
        for _, m in live:
            m.get_task(task_id)  # raises TaskNotFound when no medium has the task
        return report
    todo = sorted(branches, key=lambda b: (b != "main", b))  # main first: it holds the task's root
    while todo:
        branch = todo.pop(0)
        kept = _repair_branch(live, task_id, branch, key, status, report, max_rounds)
        todo.extend(k for k in kept if k not in todo)
    for name in damaged:
        st = status[name]
        if st.status != "failed":
            st.status = "damaged"
        st.detail = "; ".join(x for x in (dict(zip(names, media))[name].describe(), st.detail) if x)  # type: ignore[attr-defined]
    return report


def _repair_branch(live: list[tuple[str, Store]], task_id: str, branch: str, key: bytes | None,
                   status: dict[str, MediumRepair], report: RepairReport, max_rounds: int) -> list[str]:
    """Repair one branch on every live medium; returns the branches created to keep diverged heads."""
    heads: dict[str, tuple[LoadedCheckpoint, Fallback | None]] = {}
    for name, m in live:
        try:
            loaded, fallback = load_head(m, task_id, branch, key=key, deep=True)
            heads[name] = (loaded, fallback)
            status[name].heads[branch] = "ok" if fallback is None else "invalid"
        except NotFound:
            status[name].heads[branch] = "missing"
        except IntegrityError:
            status[name].heads[branch] = "invalid"
    if not heads:
        raise NoValidCheckpoint(f"no medium has a verifiable head of task {task_id!r} branch {branch!r}",
                                task_id=task_id, hint="`overnight verify` on each medium shows what is wrong")
    # rank by what actually verified: a medium whose damaged head fell back to an intact newer
    # checkpoint beats a replica that is merely behind
    source_name, (best, best_fallback) = max(heads.items(), key=lambda kv: (kv[1][0].record.seq, kv[1][1] is None))
    report.sources[branch] = source_name
    src = dict(live)[source_name]
    src_rows = src.list_checkpoints(task_id)
    contained = lineage(src_rows, [best.id])
    lineage_rows = list(reversed(first_parent_chain({r.checkpoint_id: r for r in src_rows}, best.id)))
    task_row = src.get_task(task_id)
    skipped = [dict(checkpoint_id=s.checkpoint_id, seq=s.seq, step=s.step, medium=name, error=s.error, reason=s.reason)
               for name, (_, fb) in heads.items() if fb is not None for s in fb.skipped
               if s.seq is None or s.seq > best.record.seq]
    if skipped:
        report.skipped[branch] = skipped
    if best_fallback is not None:  # the source's own ref names a head that verifies nowhere: move it back
        try:
            src.set_ref(task_id, branch, best.id, best_fallback.head_id)
            status[source_name].status = "repaired"
            status[source_name].detail = (f"{branch} head {short_id(best_fallback.head_id)} verifies on no medium; "
                                          f"{branch} continues from {short_id(best.id)} (seq {best.record.seq})")
        except OvernightError as exc:
            status[source_name].status, status[source_name].detail = "failed", exc.message
    created: list[str] = []
    for index, (name, dst) in enumerate(live):
        if name == source_name:
            continue
        current = heads.get(name)
        if current is not None and current[1] is None and current[0].id == best.id:
            continue
        st = status[name]
        keep = None
        if current is not None and current[0].id not in contained:
            # diverged: this medium went on without the source's work; keep its head on a branch
            try:
                refs = {}
                for _, m in live:
                    refs.update(m.list_refs(task_id))
                held = [b for b, cid in dst.list_refs(task_id).items() if cid == current[0].id and b != branch]
                keep = held[0] if held else _keep_name(branch, name, index, refs)
                if not held:
                    dst.set_ref(task_id, keep, current[0].id, None)
                st.kept[keep] = current[0].id
                created.append(keep)
                st.heads[branch] = "diverged"
            except OvernightError as exc:
                st.status, st.detail = "failed", f"cannot keep its diverged head {short_id(current[0].id)}: {exc.message}"
                continue  # never move a ref past work that is not kept
        elif st.heads[branch] == "ok":
            st.heads[branch] = "behind"
        _repair_medium(src, dst, task_row, lineage_rows, best.id, branch, key, st, max_rounds)
        if keep is not None and st.status != "failed":
            st.status = "diverged"
            note = (f"its {branch} head {short_id(current[0].id)} (seq {current[0].record.seq}) is not in "  # type: ignore[index]
                    f"{short_id(best.id)} from {source_name}: kept on branch {keep!r}; `overnight merge {task_id} "
                    f"--from {keep}` combines them")
            st.detail = "; ".join(x for x in (st.detail, note) if x)
    return created


def _heal_checkpoint(src: Store, dst: Store, checkpoint_id: str, key: bytes | None, st: MediumRepair,
                     max_rounds: int) -> None:
    """Copy from ``src`` each object ``checkpoint_id`` fails on in ``dst``, until it verifies there.

    Raises:
        IntegrityError: it still fails on something that is not an object (the record itself), or
            after ``max_rounds`` objects without verifying."""
    for _ in range(max_rounds):
        try:
            load_checkpoint(dst, checkpoint_id, key=key, deep=True)
            return
        except IntegrityError as exc:
            if not exc.object_digest:
                raise IntegrityError(f"checkpoint {short_id(checkpoint_id)} still fails verification on this medium "
                                     f"after being rewritten: {exc.message}", task_id=exc.task_id,
                                     checkpoint_id=checkpoint_id) from exc
            st.objects_copied += _copy_objects(src, dst, [exc.object_digest])
    raise IntegrityError(f"checkpoint {short_id(checkpoint_id)} still does not verify after {max_rounds} repaired "
                         "objects", checkpoint_id=checkpoint_id)


def _repair_medium(src: Store, dst: Store, task_row: TaskRow, lineage: list[CheckpointRow], head: str, branch: str,
                   key: bytes | None, st: MediumRepair, max_rounds: int) -> None:
    try:
        # every object the source has that the destination lacks (content-addressed: safe to copy)
        missing = dst.missing_objects(src.iter_object_digests())
        st.objects_copied += _copy_objects(src, dst, missing)
        for call in src.calls(task_row.task_id):  # the call journal: replays need it on every medium
            dst.record_call(call)
        # the head's lineage, root first. A record of this branch is committed with the ref's
        # current value as expected head: a missing record is added, a damaged one is rewritten
        # (a SQLite or memory store replaces a body that does not hash to its id; a key-value or
        # PostgreSQL store keeps the row it has), an intact one is left as it is, and the ref follows. A record of another branch (the history a fork or a kept
        # diverged head shares with it) is only inserted when missing -- that branch's ref is
        # never moved here. The ref ends on the head.
        for row in lineage:
            try:
                stored: bytes | None = dst.get_checkpoint(row.checkpoint_id).body
            except CheckpointNotFound:
                stored = None
            journal = [j for j in src.journal(row.task_id) if j.checkpoint_id == row.checkpoint_id]
            if row.branch == branch:
                dst.commit(Commit(row, dst.get_ref(row.task_id, branch), [], journal, None, task_row))
            elif stored is None:
                dst.put_checkpoints([row], journal)
            st.checkpoints_copied += 0 if stored == row.body else 1
        current = dst.get_ref(task_row.task_id, branch)
        if current != head:
            dst.set_ref(task_row.task_id, branch, head, current)
        # heal what is damaged: rewrite each object the destination fails on, until the head
        # verifies there (the head itself, not the branch: when a damaged object is one every
        # checkpoint shares, nothing on the branch verifies to fall back to). On a medium seen
        # damaged, every checkpoint of the head's lineage is healed so, not only the head: the
        # history `overnight verify` checks must verify too.
        damaged = st.heads.get(branch) == "invalid"
        for cid in [row.checkpoint_id for row in lineage if damaged] + [head]:
            _heal_checkpoint(src, dst, cid, key, st, max_rounds)
        if (st.checkpoints_copied or st.objects_copied or st.heads.get(branch) != "ok") and st.status == "ok":
            st.status = "repaired"
    except OvernightError as exc:
        st.status, st.detail = "failed", exc.message


def set_aside_damaged_media(store: Any, task_id: str) -> list[str]:
    """Before a session of a replicated task: move the files of every damaged medium aside (never
    deleted) and open a fresh store there (:func:`set_aside_damaged`); nothing for one medium."""
    replicated = replicated_under(store)
    if replicated is None:
        return []
    return set_aside_damaged(replicated.media, replicated.names, task_id)


def repair_before_resume(store: Any, task_id: str, *, key: bytes | None) -> RepairReport | None:
    """Before a replicated task resumes: bring every medium up to the newest verifiable head, so a
    primary that lost its copy (or holds a damaged one) resumes from a replica instead of starting
    over. None for one medium, or a task no medium has yet."""
    replicated = replicated_under(store)
    if replicated is None:
        return None
    try:
        return repair_task(replicated.media, replicated.names, task_id, key=key)
    except TaskNotFound:
        return None  # a new task: no medium has it yet
