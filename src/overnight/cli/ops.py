"""The commands that delete or move stored data -- ``gc``, ``rm``, ``archive``, ``restore``,
``repair`` (and ``repair --salvage``) -- thin shells over the :mod:`overnight.ops` layer through
:mod:`overnight.api`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from overnight import api
from overnight.cli import render
from overnight.cli.common import (
    EXIT_BUSY,
    EXIT_INTEGRITY,
    EXIT_OK,
    EXIT_USAGE,
    JsonOpt,
    PlainQuietOpt,
    StoreOpt,
    failing,
)

def register(app: typer.Typer) -> None:
    """Add ``gc``, ``rm``, ``archive``, ``restore`` and ``repair`` to ``overnight`` (in this ``--help`` order)."""
    app.command()(gc)
    app.command()(rm)
    app.command("archive")(archive_)
    app.command()(restore)
    app.command()(repair)


GraceOpt = typer.Option("1h", "--grace", metavar="DURATION",
                        help="Objects stored or refreshed more recently than this stay (a commit running at the "
                        "same time may be about to reference them). Default 1h; 0 only when nothing writes.")


def _unreadable_note(unreadable: list, *, kept_all: str | None = None) -> None:
    """The note after ``gc``/``rm`` when parts of checkpoints could not be read (damaged): with
    ``kept_all`` (the task rm removed, keeping every object of it because of the damage) it says
    no object was deleted because of it."""
    if not unreadable:
        return
    tasks = sorted({u.task_id for u in unreadable})
    which = ", ".join(shlex.quote(t) for t in tasks[:3]) + (", …" if len(tasks) > 3 else "")
    if kept_all:
        render.err.print(f"[yellow]note:[/] {len(unreadable)} part(s) of checkpoints of task(s) {render.esc(which)} are "
                         "damaged and cannot be read, so which objects they need is unknown: rm deleted no object of "
                         f"{render.esc(shlex.quote(kept_all))} because of it (nothing of {render.esc(which)} was "
                         "deleted; `overnight gc --apply` removes those objects once the damage is repaired) -- "
                         "`overnight verify --all` names the damage")
    else:
        render.err.print(f"[yellow]note:[/] {len(unreadable)} part(s) of checkpoints no branch uses (task(s) "
                         f"{render.esc(which)}) are damaged and cannot be read: objects only they name are not kept for "
                         "them (they cannot load anyway) -- `overnight verify --all` names the damage")


def gc(
    apply: bool = typer.Option(False, "--apply", help="Delete (without it: a dry run, reporting what would go)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only report what would go (the default); refused "
                                 "together with --apply."),
    keep_last: Optional[int] = typer.Option(None, "--keep-last", min=0, metavar="N",
                                            help="Keep each task's N newest dangling checkpoints."),
    older_than: Optional[str] = typer.Option(None, "--older-than", metavar="DURATION",
                                             help="Only dangling checkpoints older than this go (e.g. 30d)."),
    task_id: Optional[str] = typer.Option(None, "--task", metavar="ID", help="Only this task's dangling checkpoints, and the "
                                          "objects only they needed."),
    grace: str = GraceOpt,
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
    quiet: bool = PlainQuietOpt,
) -> None:
    """Collect garbage: dangling checkpoints (on no live branch's lineage: records a fallback
    skipped, history of deleted branches) and objects no remaining checkpoint needs.

    A dry run unless --apply. Never removes a branch head, anything on a live branch's lineage,
    or anything a remaining checkpoint needs to load; safe while tasks run (objects younger than
    --grace stay). Works on one store (default: the local one); --store URL for a configured
    database or cloud medium. With --json a dry run says "dry_run": true and lists what would go
    under "would_delete" (each task) and "checkpoints_would_delete" / "objects_would_delete";
    its "deleted" lists and counts stay empty. --apply --json ("dry_run": false) reports what was
    deleted under the same keys. On file:// and s3:// gc also removes what a killed gc, rm or commit
    left that no listing shows, once older than --grace: index entries naming no record, and
    checkpoint records no index entry or branch names ("leftover_records", "leftover_bytes",
    "leftover_entries" in --json; with --task, that task's only); a whole-store gc also removes the
    folder of a task an rm left without branches or index ("leftover_tasks")."""
    if apply and dry_run:  # which one was meant? a deleting command does not guess
        render.err.print("[bold red]error:[/] --apply and --dry-run contradict each other: pass one")
        raise typer.Exit(EXIT_USAGE)
    with failing():
        with render.progress_bar("reading checkpoints", quiet=quiet or as_json) as update:
            rep = api.gc(store=store, apply=apply, keep_last=keep_last, older_than=older_than, task_id=task_id,
                         grace=grace, on_progress=update)
    if as_json:
        render.print_json(_gc_json(rep))
        return
    verb = "deleted" if rep.applied else "would delete"
    if not rep.applied and not quiet:
        render.err.print("[yellow]dry run[/]: nothing deleted (pass --apply to delete)")
    render.table(None, ["task", "checkpoints", "dangling", "kept", verb, "bytes"],
                 [(t.task_id, t.checkpoints, len(t.dangling), len(t.kept), len(t.deleted), render.human_bytes(t.bytes))
                  for t in rep.tasks],
                 justify={c: "right" for c in ("checkpoints", "dangling", "kept", verb, "bytes")})
    render.out.print(f"checkpoints: {rep.checkpoints_deleted} {verb} ({render.human_bytes(rep.checkpoint_bytes)})")
    render.out.print(
        f"objects: {rep.objects} stored, {rep.objects_referenced} referenced, {rep.objects_unreferenced} unreferenced: "
        f"{rep.objects_deleted} {verb} ({render.human_bytes(rep.object_bytes)}), {rep.objects_young} kept as younger "
        f"than the grace period ({render.human_bytes(rep.young_bytes)})")
    if rep.leftover_records or rep.leftover_entries or rep.leftover_tasks:
        render.out.print(f"left by an interrupted gc, rm or commit (file://, s3://): {rep.leftover_records} unlisted "
                         f"checkpoint record(s) {verb} ({render.human_bytes(rep.leftover_bytes)}), "
                         f"{rep.leftover_entries} index entr{'y' if rep.leftover_entries == 1 else 'ies'} naming no "
                         f"record {verb}, {rep.leftover_tasks} folder(s) of removed tasks {verb}")
    _unreadable_note(rep.unreadable)


def _gc_json(rep: "api.GcReport") -> dict:
    """``gc --json``, one shape for both runs: ``"dry_run"``; what went under ``deleted`` (per
    task) and ``checkpoints_deleted`` / ``objects_deleted``, what a dry run would delete under
    ``would_delete`` and ``checkpoints_would_delete`` / ``objects_would_delete`` -- each side empty
    (0) in the other kind of run."""
    out = render.to_jsonable(rep)
    applied = bool(rep.applied)
    for t in out["tasks"]:
        t["would_delete"] = [] if applied else t["deleted"]
        t["deleted"] = t["deleted"] if applied else []
    for what in ("checkpoints", "objects"):
        out[f"{what}_would_delete"] = 0 if applied else out[f"{what}_deleted"]
        out[f"{what}_deleted"] = out[f"{what}_deleted"] if applied else 0
    # leftover_records / leftover_bytes / leftover_entries: what the run deleted, or a dry run would
    return {"dry_run": not applied, **out}


def rm(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(False, "--force", help="Delete even while a live process holds one of its branches."),
    grace: str = GraceOpt,
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
    quiet: bool = PlainQuietOpt,
) -> None:
    """Delete a task: its checkpoints, branches, leases, journal, archive catalog and queue row, then the
    objects no other task needs. A submitted task no worker has started (no checkpoint yet) goes too:
    its queue row, so no worker runs it. Asks first (--yes to skip); refuses while a run or a worker
    holds the task (--force to override; `overnight cancel` stops a worker's run). A cold store it
    was archived to is not touched."""
    with failing():
        plan = api.rm(task_id, store=store, dry_run=True, grace=grace)
        if not yes:
            if plan.queue_status is not None and not plan.checkpoints:
                question = (f"delete submitted task {render.safe(task_id)!r} ({plan.queue_status}, no checkpoint "
                            "yet) from the queue?")
            else:
                question = (f"delete task {render.safe(task_id)!r}: {plan.checkpoints} checkpoint(s), branches "
                            f"{', '.join(plan.branches) or 'none'}, {plan.objects_unreferenced} object(s) only it "
                            "uses" + (f", its queue row ({plan.queue_status})" if plan.queue_status else "") + "?")
            if not sys.stdin.isatty():
                render.err.print(f"[bold red]error:[/] {render.esc(question)} -- not confirmed (no terminal); "
                                 "pass --yes")
                raise typer.Exit(EXIT_USAGE)
            if not typer.confirm(question, default=False, err=True):
                render.err.print("nothing deleted")
                raise typer.Exit(EXIT_OK)
        with render.progress_bar("deleting", quiet=quiet or as_json) as update:
            rep = api.rm(task_id, store=store, force=force, grace=grace, on_progress=update)
    if as_json:
        render.print_json(rep)
        return
    if rep.queue_status is not None and not rep.checkpoints:
        render.err.print(f"deleted submitted task [bold]{render.esc(task_id, one_line=True)}[/] "
                         f"({render.esc(rep.queue_status)}, no checkpoint yet): removed from the queue")
        return
    render.err.print(
        f"deleted task [bold]{render.esc(task_id, one_line=True)}[/]: {rep.checkpoints} checkpoint(s) "
        f"({render.human_bytes(rep.checkpoint_bytes)}), {rep.objects_deleted} object(s) "
        f"({render.human_bytes(rep.object_bytes)})"
        + _young_note(rep.objects_young, rep.grace_s))
    _unreadable_note([u for u in rep.unreadable if u.task_id != task_id], kept_all=task_id if rep.kept_for_damage else None)


def archive_(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    cold: str = typer.Option(..., "--cold", metavar="URL", help="Cold store URL (s3://BUCKET/PREFIX, file://DIR, ...)."),
    keep_last: Optional[int] = typer.Option(None, "--keep-last", min=1, metavar="N",
                                            help="Keep each branch's N newest checkpoints in hot."),
    older_than: Optional[str] = typer.Option(None, "--older-than", metavar="DURATION",
                                             help="Archive checkpoints older than this (e.g. 7d); heads always stay."),
    grace: str = GraceOpt,
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
    quiet: bool = PlainQuietOpt,
) -> None:
    """Move a task's older history to a cold store as one compressed pack, and remove it from the
    hot store. Heads and everything a kept checkpoint needs stay; archived checkpoints remain
    readable (show, log, cat --at, verify) and come back when something builds on them
    (fork --at, rollback --to) or with `overnight restore`."""
    with failing():
        with render.progress_bar("archiving", quiet=quiet or as_json) as update:
            rep = api.archive(task_id, cold=cold, store=store, keep_last=keep_last, older_than=older_than,
                              grace=grace, on_progress=update)
    if as_json:
        render.print_json(rep)
        return
    if not rep.archived:
        render.err.print(f"nothing to archive: all {rep.kept} checkpoint(s) of {render.esc(task_id, one_line=True)} "
                         "are within the policy")
        return
    render.err.print(
        f"archived {len(rep.archived)} checkpoint(s) of [bold]{render.esc(task_id, one_line=True)}[/] "
        f"to {render.esc(rep.cold)}"
        + (f" (archive {rep.archive_id[7:19]}: {rep.objects_packed} object(s), pack "
           f"{render.human_bytes(rep.pack_bytes)})" if rep.archive_id else "")
        + f"; {rep.kept} kept in hot; freed {render.human_bytes(rep.checkpoint_bytes + rep.object_bytes)} "
        f"({rep.objects_deleted} object(s))"
        + _young_note(rep.objects_young, grace))


def _young_note(young: int, grace: str | float) -> str:
    """What ``rm`` and ``archive`` left of the objects only they freed: those stored less than the
    grace period ago (a commit in flight may still name them), and when ``gc`` takes them."""
    if not young:
        return ""
    seconds = grace if isinstance(grace, (int, float)) else api.parse_duration(grace, "--grace")
    return (f"; {young} object(s) stored less than {render.human_duration(seconds * 1000)} ago kept (the grace period): "
            "`overnight gc --apply` deletes them once they are older")


def restore(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    cold: Optional[str] = typer.Option(None, "--cold", metavar="URL", help="Read the packs from this store (default: "
                                       "where each archive run recorded them)."),
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
    quiet: bool = PlainQuietOpt,
) -> None:
    """Bring a task's archived checkpoints (and the objects they need) back into the hot store."""
    with failing():
        with render.progress_bar("restoring", quiet=quiet or as_json) as update:
            rep = api.restore(task_id, store=store, cold=cold, on_progress=update)
    if as_json:
        render.print_json(rep)
        return
    render.err.print(f"restored {rep.checkpoints} checkpoint(s) and {rep.objects} object(s) "
                     f"({render.human_bytes(rep.bytes)}) of [bold]{render.esc(task_id, one_line=True)}[/] from "
                     f"{len(rep.archives)} archive(s)")


def _salvage(path: Path, into: Optional[Path], as_json: bool) -> None:
    with failing():
        rep = api.salvage(path, into=into)
    if as_json:
        render.print_json({**render.to_jsonable(rep), "ok": rep.verify.ok and not rep.verify.problems})
    else:
        render.table(f"salvaged {render.esc(rep.source)} -> {render.esc(rep.target)}", ["table", "rows", "read errors"],
                     [(t, n, rep.errors.get(t, 0)) for t, n in rep.rows.items()])
        for ref, cid in rep.refs_restored.items():
            render.out.print(f"ref {render.esc(ref)} rebuilt -> {cid[7:19]} (the newest verified record of the branch)")
        v = rep.verify
        render.out.print(f"verify: {v.tasks} task(s), {v.checkpoints} checkpoint(s) ({v.checkpoints_invalid} invalid), "
                         f"{v.objects_checked} object(s) checked ({v.objects_invalid} damaged); heads: "
                         + "; ".join(f"{t}: " + ", ".join(f"{b} {st}" for b, st in h.items()) for t, h in v.heads.items()))
        if v.problems:
            render.out.print(f"[yellow]{len(v.problems)} problem(s)[/]: damaged records never load; resume falls back "
                             f"to the newest that verifies (`overnight verify --all --store sqlite://{rep.target}`)")
        else:
            render.out.print("[green]ok[/]: use it with --store sqlite://" + render.esc(rep.target))
    if rep.verify.problems:
        raise typer.Exit(EXIT_INTEGRITY)


def repair(
    task_id: Optional[str] = typer.Argument(None, metavar="TASK_ID", help="Task id; omit with --all."),
    all_tasks: bool = typer.Option(False, "--all", help="Every task in the store."),
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
    salvage: Optional[Path] = typer.Option(None, "--salvage", metavar="FILE.db",
                                           help="Recover what SQLite can still read from a damaged store file "
                                           "into a new file (--into, default FILE.salvaged.db), then verify it. "
                                           "The damaged file is not written."),
    into: Optional[Path] = typer.Option(None, "--into", metavar="NEW.db", help="Where --salvage writes."),
) -> None:
    """Bring every medium a task was routed to (e.g. local + cloud for a critical task) up to the
    newest head that verifies: copy what a lost, emptied, lagging or corrupted medium lacks from a
    healthy one. Without --store the task is looked up on every configured medium, so a task whose
    local copy was lost with its disk is found on a replica and made again locally. The source of a
    branch is the medium with the newest checkpoint that verifies (a damaged head falls back on its
    own medium first); newer checkpoints that verify nowhere are listed as skipped. A damaged SQLite
    file is moved aside to NAME.damaged-TIMESTAMP (never deleted) and rebuilt. Media that diverged
    (each went on alone) keep the losing head on branch BRANCH@MEDIUM: nothing is dropped.
    Exit 0 repaired or nothing to do | 3 a medium is unavailable or cannot be repaired |
    4 media diverged (merge the kept branch: overnight merge TASK_ID --from BRANCH@MEDIUM).

    --salvage FILE.db recovers a damaged SQLite store with Python's sqlite3 module (row by row,
    skipping what errors; `sqlite3 FILE .recover` fails on some systems), rebuilds branch refs
    that were lost from the newest verified record, and verifies the result like `verify --all`:
    exit 0 when all of it verifies, 3 when something salvaged is damaged (it never loads)."""
    if salvage is not None:
        _salvage(salvage, into, as_json)
        return
    if not task_id and not all_tasks:
        render.err.print("[bold red]error:[/] name a TASK_ID or pass --all")
        raise typer.Exit(EXIT_USAGE)
    with failing():
        reports = api.repair(task_id if not all_tasks else None, store=store)
    if as_json:
        render.print_json(reports)
    else:
        for r in reports:
            render.out.print(f"[bold]{render.esc(r.task_id)}[/]: " + ", ".join(
                f"{b} from {m}" for b, m in r.sources.items()))
            render.table(None, ["medium", "status", "heads before", "checkpoints copied", "objects copied", "detail"],
                         [(m.name, m.status, ", ".join(f"{b}: {h}" for b, h in m.heads.items()), m.checkpoints_copied,
                           m.objects_copied, m.detail or "") for m in r.media])
            for branch, skipped in r.skipped.items():
                render.err.print(f"[yellow]{render.esc(branch)}: skipped, verifies on no medium:[/] " + ", ".join(
                    f"{render.esc(str(x['checkpoint_id'])[7:19])} (step {render.esc(x['step'])}, {render.esc(x['medium'])})"
                    for x in skipped))
    if any(m.status in ("failed", "unavailable") for r in reports for m in r.media):
        raise typer.Exit(EXIT_INTEGRITY)
    if any(r.diverged for r in reports):
        raise typer.Exit(EXIT_BUSY)
