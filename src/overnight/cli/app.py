# Over 600 lines: one typer app, one thin command function per `overnight` command in --help order (run, resume, inspection, branches, demo, config, ui); command groups with a module of their own: cli/ops.py (gc, rm, archive, restore, repair), cli/coding_agents.py (mcp, hook), cli/bench.py, cli/fleet.py; shared options and helpers in cli/common.py and cli/render.py.
"""``overnight`` command line: a thin shell over :mod:`overnight.api` (same names, same options).

Exit codes (also in ``overnight --help`` and the README):

==  =========================================================================================
0   done: the task is complete (or the command succeeded)
1   a step failed (nothing of it was committed), or an unexpected error
2   usage error: bad option, missing file, unknown task/checkpoint/artifact, bad config
3   integrity: no checkpoint verifies (``overnight verify`` explains)
4   busy: another process holds the task, or the branch moved under this writer
5   drift: the world changed and the drift policy says abort (``overnight status --drift``)
6   store refused: disk full, read-only or permission denied, a folder missing, server unreachable
    (nothing committed is lost; fix the cause and run the command again)
75  resumable: interrupted (SIGINT/SIGTERM) or stopped by ``--max-steps``; run
    ``overnight resume TASK_ID`` to continue
==  =========================================================================================
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from overnight import api
from overnight.cli import coding_agents, ops, render
from overnight.cli.bench import bench_app
from overnight.cli.common import (  # noqa: F401 (EXIT_* re-exported)
    EXIT_BUSY, EXIT_CODES_HELP, EXIT_DRIFT, EXIT_FAILED, EXIT_INTEGRITY, EXIT_OK, EXIT_RESUMABLE, EXIT_STORE,
    EXIT_USAGE,
    BranchOpt,
    JsonOpt,
    PlainQuietOpt,
    StoreOpt,
    check_python_entry,
    exit_code as _exit_code,
    fail as _fail,
    failing,
    need_extra as _need_extra,
    noting_store_further_up,
)
from overnight.cli.exits import report_run
from overnight.cli.fleet import ParamOpt, ParamsOpt, TaskIdOpt, parse_params
from overnight.errors import OvernightError
from overnight.verify.drift import short_value

def _usage_name(self: typer.core.TyperArgument) -> str:
    """An argument in a usage line as click and git write it -- ``TASK_ID``, ``[TASK_ID]`` -- not
    typer's ``{task_id}``."""
    name = self.metavar or (self.name or "").upper()
    return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")


if hasattr(typer.core.TyperArgument, "_usage_display_name"):  # typer >= 0.16 writes required ones as {name}
    typer.core.TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]

_METAVARS = {"store": "URL", "base_url": "URL", "branch": "NAME", "into": "NAME", "source": "NAME", "queue": "NAME",
             "events": "FILE", "output": "FILE", "out_path": "FILE", "out": "DIR", "dir": "DIR", "file": "FILE.py[:NAME]",
             "at": "CHECKPOINT", "to": "CHECKPOINT", "task_id": "ID", "package": "NAME", "host": "HOST",
             "token": "TOKEN", "prefer": "ours|theirs"}
"""The value an option takes, as its help names it (``-s, --store URL``), by parameter name; an
option whose help needs another name gives its own ``metavar``."""


def _option_value(self: typer.core.TyperOption, ctx: Any) -> str | None:
    """What an option takes, as git and click write it -- ``--store URL``, ``--max-steps N`` -- not
    typer's ``<str>`` / ``<int range>``: its own metavar, else by name (:data:`_METAVARS`), else
    ``N`` for a whole number, ``NUMBER`` for a float, the name in capitals for the rest."""
    if self.metavar is not None:
        return self.metavar
    name = _METAVARS.get(self.name or "")
    if name is None:
        kind = getattr(getattr(self, "type_descriptor", None), "annotation", None)
        name = "N" if kind is int else "NUMBER" if kind is float else (self.name or "value").upper()
    return name + ("..." if self.nargs != 1 else "")


if hasattr(typer.core.TyperOption, "display_type_rich"):  # typer >= 0.16: '<str>', '<int range>'
    typer.core.TyperOption.display_type_rich = _option_value  # type: ignore[method-assign]
    # an argument's help row is its name alone (TASK_ID), not 'TASK_ID <str>'
    typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


def _version(value: bool) -> None:
    if value:
        from overnight import __version__

        sys.stdout.write(f"overnight {__version__}\n")
        raise typer.Exit()


app = typer.Typer(
    name="overnight",
    help="Durable long-horizon agent tasks: verified checkpoints after every step, crash-safe resume.\n\n"
    "Store: --store URL, else $OVERNIGHT_STORE, else overnight.toml's [store] url, else\nsqlite://.overnight/overnight.db.\n\n" + EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

MaxStepsOpt = typer.Option(None, "--max-steps", min=1, help="Stop (resumably, exit 75) after N executed steps.")
EventsOpt = typer.Option(None, "--events", help="Append every run event as a JSON line to this file.")
QuietOpt = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary: only results (the demo's "
                        "report path), errors, warnings and, when interrupted, the resume command print.")
ModelOpt = typer.Option(None, "--model", "-m", metavar="SPEC",
                        help="Model for ctx.model: extractive (offline, not an LLM; the default), local (SmolLM2 "
                        "in-process, needs the llm extra), or openai:NAME (any OpenAI-compatible endpoint).")
BaseUrlOpt = typer.Option(None, "--base-url", help="Endpoint of an openai:NAME model, e.g. http://127.0.0.1:8000/v1 "
                          "(key: $OPENAI_API_KEY; none needed for a local server).")
ContextOpt = typer.Option(None, "--max-context-tokens", min=256,
                          help="Context window per session in tokens (default 8000); at 80 % the runner compacts "
                          "(a summary checkpoint, then a new session).")
DriftOpt = typer.Option(None, "--on-drift", metavar="COMPONENT=POLICY,...",
                        help="Drift policies for this run, e.g. deps=recompute,env=accept (components: code, deps, "
                        "env, inputs, artifacts, model, all; policies: recompute, accept, rollback, abort). "
                        "Default: recompute (only steps that read what changed run again); model=accept.")
StatusDriftOpt = typer.Option(None, "--on-drift", metavar="COMPONENT=POLICY,...",
                              help="Predict with these drift policies, as `resume --on-drift` would apply them "
                              "(components: code, deps, env, inputs, artifacts, model, all).")


def _clip(value: object, width: int = 48) -> str:
    """A value for a table cell: long ones (digests, paths) cut in the middle, marked with an ellipsis."""
    text = str(value)
    return text if len(text) <= width else text[: width // 2 - 1] + "…" + text[-(width // 2):]


def _with_status_kind(report) -> dict:
    """A report's JSON with ``status_kind`` after its ``status``: the status's first word, one of a
    fixed set (:data:`overnight.store.queue.STATES`), for scripts -- the status itself is free text."""
    from overnight.store.queue import state_of

    out = {}
    for k, v in render.to_jsonable(report).items():
        out[k] = v
        if k == "status":
            out["status_kind"] = state_of(v)
    return out


def _model(spec: Optional[str], base_url: Optional[str]):
    if spec is None and base_url is None:
        return None
    from overnight.models import model_from_spec

    return model_from_spec(spec or ("openai:default" if base_url else None), base_url=base_url)


def _report_run(result: api.RunResult, *, quiet: bool, resume_with: str | None = None) -> None:
    code = report_run(result, quiet=quiet, resume_with=resume_with)  # shared with the framework-free `resume`
    if code:
        raise typer.Exit(code)


def _run_with_progress(fn, *, quiet: bool, events: Optional[str]) -> api.RunResult:
    with render.RunProgress(quiet=quiet, events_path=events) as progress:
        return fn(progress)


@app.command()
def run(
    file: str = typer.Argument(..., metavar="FILE.py[:TASK]", help="Python file defining the task (NAME if several)."),
    store: Optional[str] = StoreOpt,
    branch: str = BranchOpt,
    max_steps: Optional[int] = MaxStepsOpt,
    events: Optional[str] = EventsOpt,
    quiet: bool = QuietOpt,
    on_drift: Optional[str] = DriftOpt,
    model: Optional[str] = ModelOpt,
    base_url: Optional[str] = BaseUrlOpt,
    max_context_tokens: Optional[int] = ContextOpt,
    task_id: Optional[str] = TaskIdOpt,
    params: Optional[str] = ParamsOpt,
    param: list[str] = ParamOpt,
) -> None:
    """Create the task defined in FILE.py, or resume it from its latest checkpoint, and run it.

    Every step commits a checkpoint. Ctrl-C once: the step in flight finishes and is checkpointed;
    twice: it is abandoned. Either way the task resumes where it stopped (exit 75) -- unless it is
    ephemeral (a short task the router keeps in this process only): then nothing is kept and the
    exit is 1.

    With --param/--params (or --id) the task runs as `overnight submit` would queue it: under the
    definition's id plus a short digest of the params (or --id), each parameter in ctx.params;
    `overnight resume ID` runs it again with the same definition and params.

    Example: overnight run examples/report.py --param topic=storage
    """
    with failing(), noting_store_further_up(store):
        check_python_entry(file, "run")
        given = parse_params(params, param)
        result = _run_with_progress(
            lambda p: api.run(file, store=store, branch=branch, max_steps=max_steps, on_event=p, on_drift=on_drift,
                              model=_model(model, base_url), max_context_tokens=max_context_tokens,
                              params=given, task_id=task_id),
            quiet=quiet, events=events)
    _report_run(result, quiet=quiet)


@app.command()
def resume(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id (see `overnight ls`)."),
    store: Optional[str] = StoreOpt,
    branch: str = BranchOpt,
    file: Optional[str] = typer.Option(None, "--file", help="Load the task code from FILE.py[:NAME] instead of the "
                                       "location recorded at creation."),
    max_steps: Optional[int] = MaxStepsOpt,
    events: Optional[str] = EventsOpt,
    quiet: bool = QuietOpt,
    on_drift: Optional[str] = DriftOpt,
    model: Optional[str] = ModelOpt,
    base_url: Optional[str] = BaseUrlOpt,
    max_context_tokens: Optional[int] = ContextOpt,
    allow_rollback: bool = typer.Option(False, "--allow-rollback", help="Continue from a branch ref that was moved "
                                        "back behind a newer checkpoint of the branch (refused otherwise, exit 3)."),
    submit: bool = typer.Option(False, "--submit", help="Queue it for the workers (`overnight worker`) instead of "
                                "running it here: the code location and params its verified head records."),
) -> None:
    """Resume a stored task from the latest head of its branch (never an older checkpoint,
    unless the head fails verification: then the newest valid one, with a report). With --submit,
    queue it for the workers instead (a failed or cancelled queue row is queued again; a task
    already complete is not: it says so and exits 0).

    A ref moved back behind a newer verified checkpoint of the branch -- or, with a signing key,
    behind the newest signed head this machine has seen -- is refused (RollbackDetected, exit 3)
    unless --allow-rollback. The task's code is imported only from inside the project (the folder
    holding overnight.toml, else the current directory) or from --file; run from outside the project
    while the project still holds the task's code (a step's relative paths are read from the current
    directory), it refuses (exit 2) and names the folder to resume from.

    Before any step runs, the head is compared with the world now (code, deps, env, inputs,
    exported artifacts); drift is handled by policy (--on-drift)."""
    if submit:
        with failing():
            row, now = api.enqueue(task_id, store=store, branch=branch)
        if not now and row.status == "complete":  # as `overnight cancel` of a complete task says
            render.out.print(f"{render.esc(task_id, one_line=True)}: already complete, nothing to queue")
            return
        render.out.print(f"{render.esc(task_id, one_line=True)}: "
                         f"{'queued' if now else render.esc(row.status) + ' already'} "
                         f"(code {render.esc(row.entry)}); `overnight worker` runs it")
        return
    with failing():
        result = _run_with_progress(
            lambda p: api.resume(task_id, store=store, branch=branch, entry=file, max_steps=max_steps, on_event=p,
                                 on_drift=on_drift, model=_model(model, base_url),
                                 max_context_tokens=max_context_tokens, allow_rollback=allow_rollback),
            quiet=quiet, events=events)
    _report_run(result, quiet=quiet)


def _no_plan(status: str) -> bool:
    """Is ``status`` that of an adapter's thread or session (state ``open``), which has no plan,
    so no steps done of a total to show?"""
    from overnight.store.queue import state_of

    return state_of(status) == "open"


def _queued_verb(status: str) -> str:
    """How ``ls`` labels the code location of a submitted task with no checkpoint yet (its goal is
    not known without importing the code, which overnight never does from stored data)."""
    return "queued" if status.startswith("queued") else "submitted"


@app.command("ls")
def ls_(store: Optional[str] = StoreOpt, as_json: bool = JsonOpt) -> None:
    """List the tasks in the store: status, steps done/total, branches, last checkpoint time. Each
    head is checked as a resume checks it (its artifacts' bytes hashed): one that fails shows the
    checkpoint a resume falls back to (`FELL BACK`). Of the other checkpoints each record is
    checked (DAMAGED; `served by its ditto copy` when a copy heals it), not the content behind it:
    that is `overnight verify TASK`'s work, too slow for a listing of many tasks. A LangGraph thread or an Agents SDK session is
    `open` (no plan to complete); a task submitted to the workers with no checkpoint yet shows its
    code (`queued from FILE:TASK`).
    Without --store: the default store and the configured database and cloud media (where the
    router puts important and critical tasks).
    --json: one object per task, null for what a row does not know: created_at and updated_at of a
    submitted task with no checkpoint yet, done and total of a row with no plan (that task, a thread,
    a session: `—` in the table)."""
    with failing():
        tasks = api.ls(store=store)
    if as_json:
        render.print_json([_with_status_kind(t) for t in tasks])
        return
    from overnight.store import default_store_url, location

    here = location(store or default_store_url())
    if not tasks:
        render.err.print(f"no tasks in the store at {render.esc(here)} yet (try `overnight demo`)")
        return
    several = any(t.store != here for t in tasks)  # some are on a configured database or cloud medium
    code = any(t.entry is not None for t in tasks)  # a submitted task's cell is its code location, not a goal
    render.table(None, ["task", "status", "steps", "branches", "checkpoints", "updated",
                        "goal / code" if code else "goal"] + (["store"] if several else []),
                 [(t.task_id, t.status + (" [FELL BACK]" if t.fell_back else ""),
                   # not started: no plan known yet; an adapter's thread or session: no plan at all
                   "—" if t.entry is not None or _no_plan(t.status) else f"{t.done}/{t.total}",
                   ",".join(t.branches), f"{t.checkpoints}" + _damage_words(t.damaged, t.served_by_copy),
                   (t.updated_at or "")[5:16].replace("T", " "),
                   f"{_queued_verb(t.status)} from {t.entry}" if t.entry is not None else t.goal)
                  + ((t.store,) if several else ())
                  for t in tasks],
                 justify={"steps": "right", "checkpoints": "right"}, no_wrap=("task", "updated"))
    for t in tasks:
        if t.fell_back or t.damaged:
            render.err.print(f"[yellow]{render.esc(t.task_id)}:[/] "
                             + render.esc("; ".join(x for x in (t.fell_back, f"{t.damaged} damaged checkpoint "
                                                                "record(s) that no ditto copy heals"
                                                                if t.damaged else None) if x))
                             + render.esc(f" -- `overnight show {t.task_id}` marks them, `overnight verify "
                                          f"{t.task_id}` checks everything"))
        if t.served_by_copy:
            render.err.print(f"[yellow]{render.esc(t.task_id)}:[/] "
                             + render.esc(f"{t.served_by_copy} damaged checkpoint record(s) read from their verified "
                                          "ditto copies (they load and resume as before) -- `overnight verify "
                                          f"--repair {shlex.quote(t.task_id)}` rewrites them"))


def _damage_words(damaged: int, served: int) -> str:
    """What ``ls`` adds to a task's checkpoint count: records no copy heals (``DAMAGED``), and
    damaged records a verified ditto copy serves (not invalid: they load)."""
    parts = ([f"{damaged} DAMAGED"] if damaged else []) \
        + ([f"{served} served by {'its' if served == 1 else 'their'} ditto cop{'y' if served == 1 else 'ies'}"]
           if served else [])
    return f" ({', '.join(parts)})" if parts else ""


@app.command()
def show(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    store: Optional[str] = StoreOpt,
    branch: str = BranchOpt,
    as_json: bool = JsonOpt,
    raw: bool = typer.Option(False, "--raw", help="With --json: include each checkpoint's record as stored "
                             "(\"record\") and the head's state document (\"state\"); "
                             "`overnight cat-object DIGEST` prints any object they name."),
) -> None:
    """Show a task's chain of checkpoints: seq, checkpoint id, session, step, time, size.

    Invalid records (failed verification) are marked and kept for inspection -- with each branch
    head checked as a resume checks it (its artifacts' bytes hashed), so a head a resume would
    skip is marked too."""
    if raw and not as_json:
        render.err.print("[bold red]error:[/] --raw needs --json")
        raise typer.Exit(EXIT_USAGE)
    with failing():
        rep = api.show(task_id, store=store, branch=branch, raw=raw)
    if as_json:
        render.print_json(_with_status_kind(rep))
        return
    render.out.print(f"[bold]{render.esc(rep.task_id, one_line=True)}[/]: {render.esc(rep.goal, one_line=True)}")
    steps = "" if _no_plan(rep.status) else f"{rep.done}/{rep.total} steps; "
    render.out.print(f"status: {render.esc(render.safe(rep.status).replace(chr(10), ' '))}, "
                     f"{steps}stored {render.human_bytes(rep.stored_bytes)}")  # a failure's reason is stored data
    if rep.params:
        from overnight.runtime.task import params_text

        render.out.print(f"params: {render.esc(params_text(rep.params), one_line=True)}")
    render.out.print("branches: " + ", ".join(f"{render.esc(b, one_line=True)} -> {c[7:15]}"
                                              for b, c in rep.branches.items()))
    u = rep.usage
    if u.get("calls"):
        priced = u.get("cost_usd") is not None
        render.out.print(f"model: {u['calls']} call(s), {u['tokens_in']} tokens in, {u['tokens_out']} out"
                         + (f", est. ${u['cost_usd']:.4f}" if priced else ""))
        render.out.print(f"  {u['tokens_saved_by_resume']} tokens saved by resume (replayed, not paid again)")
        if not priced:
            render.out.print(render.esc("  for a cost estimate, set [prices] in overnight.toml"))
    if rep.todo:
        more = f" (+{len(rep.todo) - 5} more)" if len(rep.todo) > 5 else ""
        render.out.print("todo: " + ", ".join(render.esc(n, one_line=True) for n in rep.todo[:5]) + more)
    if rep.fell_back:
        render.out.print(f"[yellow]head {render.esc(rep.fell_back)}[/]")
    if rep.damaged:
        render.out.print(f"[yellow]{rep.damaged} damaged checkpoint(s)[/] (marked INVALID below: no ditto copy heals "
                         "them; a resume never loads them)")
    if rep.served_by_copy:
        render.out.print(f"[yellow]{rep.served_by_copy} checkpoint(s) with a damaged original read from its verified "
                         f"ditto copy[/] (marked HEALED below; they load and resume as before; `overnight verify "
                         f"--repair {render.esc(shlex.quote(rep.task_id))}` rewrites the originals)")
    # fits 80 columns: 8-digit ids (`show --json` has the full ones), times as MM-DD HH:MM (UTC), the
    # branch column only when there are several, notes only when a record has one
    several = len(rep.branches) > 1 or any(c.branch != "main" for c in rep.chain)
    notes = [("<- " + ",".join(c.heads) if c.heads else "") + (" archived" if c.archived else "")
             + (f" ({c.why})" if c.why and c.why != "rollback" else "")
             + ("" if c.valid else f" INVALID: {c.problem}")
             + (f" HEALED: {c.served_by_copy}, read from its ditto copy" if c.served_by_copy else "")
             for c in rep.chain]
    rows = [(c.seq, c.checkpoint_id[7:15]) + ((c.branch,) if several else ())
            + (c.session if c.session is not None else "?", c.event, " ".join(filter(None, [c.step, note.strip()])),
               c.created_at[5:16].replace("T", " "), render.human_bytes(c.stored_bytes))
            for c, note in zip(rep.chain, notes)]
    render.table(None, ["seq", "id"] + (["branch"] if several else []) + ["session", "event", "step", "UTC", "size"], rows,
                 justify={"seq": "right", "session": "right", "size": "right"}, no_wrap=("seq", "id", "session", "UTC", "size"))


@app.command()
def cat(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    artifact: str = typer.Argument(..., help="Artifact name (e.g. report.md)."),
    at: Optional[str] = typer.Option(None, "--at", help="Checkpoint id (or unique prefix) or branch; default: head."),
    store: Optional[str] = StoreOpt,
    branch: str = BranchOpt,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Print an artifact's bytes (verified against its digest) at the head or at --at CHECKPOINT."""
    notes: list[str] = []
    try:
        data = api.cat(task_id, artifact, store=store, at=at, branch=branch, notes=notes)
    except OvernightError as exc:
        for note in notes:
            render.err.print(f"[yellow]note:[/] {render.esc(note)}")
        _fail(exc)
    for note in notes:
        render.err.print(f"[yellow]note:[/] {render.esc(note)}")
    if output is not None:
        output.write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


@app.command("cat-object")
def cat_object(
    object_digest: str = typer.Argument(..., metavar="DIGEST", help="sha256:<64 hex> (or the 64 hex digits)."),
    store: Optional[str] = StoreOpt,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Print the bytes behind a digest, verified (like `git cat-file -p`): an object's content
    (decompressed; a chunked blob's chunks joined) or a checkpoint's record body.

    The digests are in `overnight show TASK --json --raw`: a record's "state", the state
    document's pages, artifacts, the world fingerprint. Exit 3 if the stored bytes do not hash to
    DIGEST; exit 2 if the store has no such object or checkpoint (or DIGEST is not a digest)."""
    with failing():
        data = api.cat_object(object_digest, store=store)
    if output is not None:
        output.write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


@app.command()
def status(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    drift: bool = typer.Option(False, "--drift", help="Compare the head with the world now (no resume, no writes)."),
    store: Optional[str] = StoreOpt,
    branch: str = BranchOpt,
    file: Optional[str] = typer.Option(None, "--file", help="Task code FILE.py[:NAME] (default: recorded location)."),
    on_drift: Optional[str] = StatusDriftOpt,
    model: Optional[str] = typer.Option(None, "--model", "-m", metavar="SPEC",
                                        help="The model a resume would call (default the task's), for the "
                                        "model component."),
    base_url: Optional[str] = BaseUrlOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Where a task stands; with --drift, what changed since its head (which package, file, env
    key, step version, model), which steps read it, what the drift policies would do on resume,
    how the plan in the code differs from the stored one, and which steps the resume runs. The
    head is checked as a resume checks it (its artifacts' bytes hashed): `fell back from X to Y`
    when a resume would skip it."""
    with failing():
        rep = api.status(task_id, store=store, branch=branch, drift=drift, entry=file, on_drift=on_drift,
                         model=_model(model, base_url))
    if as_json:
        out = _with_status_kind(rep)
        out["drift"] = rep.drift.to_json() if rep.drift else None
        render.print_json(out)
        return
    if rep.fell_back:
        render.out.print(f"[yellow]head {render.esc(rep.fell_back)}[/]")
    shown_status = render.esc(render.safe(rep.status).replace("\n", " "))  # a queue row's reason is stored data
    if rep.seq < 0:  # submitted, not started
        render.out.print(f"[bold]{render.esc(rep.task_id)}[/]: {shown_status}, no checkpoint yet "
                         "(a worker has not started it)")
        if rep.queue:
            from overnight.runtime.task import params_text

            q = rep.queue
            ahead = f"; {q['ahead']} task(s) of its queue go first" if rep.status.startswith("queued") else ""
            params = f"; params {render.esc(params_text(q['params']))}" if q["params"] else ""
            render.out.print(f"  queue {render.esc(q['queue'])}, priority {q['priority']}{ahead}; code "
                             f"{render.esc(q['entry'])}{params}; submitted {render.human_duration(q['age_ms'])} ago")
        return
    steps = "" if _no_plan(rep.status) else f"{rep.done}/{rep.total} steps, "
    render.out.print(f"[bold]{render.esc(rep.task_id, one_line=True)}[/] ({render.esc(rep.branch, one_line=True)}): "
                     f"{shown_status}, {steps}head {rep.head[7:19]} (seq {rep.seq})")
    for line in rep.healed:  # as ls and show say it: the head loads, its damaged original is named
        render.out.print(f"[yellow]self-heal:[/] {render.esc(line)}")
    if rep.rollback:
        render.out.print(f"[red]rollback detected[/]: {render.esc(rep.rollback)} (`overnight resume` refuses it "
                         "without --allow-rollback)")
    if rep.next_steps:
        render.out.print("next: " + ", ".join(render.esc(n) for n in rep.next_steps[:5]))
    for a in rep.accepted_drift:  # drift some done steps were computed without (gone once they run again)
        kept = f" (kept from before it: {', '.join(a['steps'][:5])}{' ...' if len(a['steps']) > 5 else ''})" \
            if a.get("steps") else ""
        render.out.print(f"[yellow]accepted drift[/] {render.esc(a['component'])}: {render.esc(a['key'])}: "
                         f"{render.esc(short_value(a.get('old')))} -> {render.esc(short_value(a.get('new')))}"
                         f"{render.esc(kept)}")
    if rep.drift is not None:
        if not rep.drift.items:
            render.out.print("[green]no drift[/]")
            for line in rep.drift_words:  # a coding task measured in a project that moved: says where
                render.out.print(f"- {render.esc(line)}")
            if rep.plan_change:
                render.out.print(f"on resume: {render.esc(rep.drift_plan)}")
        else:
            render.table("drift", ["component", "what", "was", "now", "read by"],
                         [(i.component, i.key + (" (warning)" if i.warning else ""), _clip(short_value(i.old)),
                           _clip(short_value(i.new)),
                           ", ".join(i.steps[:4]) + (" ..." if len(i.steps) > 4 else "")) for i in rep.drift.items])
            if rep.drift.dependents:
                render.out.print("dependents: " + ", ".join(f"{render.esc(k)} (reads {render.esc(v)})"
                                                             for k, v in rep.drift.dependents.items()))
            for line in rep.drift_words:
                render.out.print(f"- {render.esc(line)}")
            render.out.print(f"on resume: {render.esc(rep.drift_plan)}")
        if rep.will_run or rep.may_run or rep.replayed:
            render.out.print(f"resume runs {len(rep.will_run)} step(s): " + render.esc(", ".join(rep.will_run) or "-"))
        if rep.may_run:
            render.out.print(f"re-checks {len(rep.may_run)} (run again only if what they read now differs): "
                             + render.esc(", ".join(rep.may_run)))
        if rep.replayed:
            render.out.print(f"replays {len(rep.replayed)} (nothing they read changed): "
                             + render.esc(", ".join(rep.replayed)))


env_app = typer.Typer(help="The environment a checkpoint was made in.", no_args_is_help=True)
app.add_typer(env_app, name="env")


@env_app.command("export")
def env_export(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    at: Optional[str] = typer.Option(None, "--at", help="Checkpoint id (or unique prefix) or branch; default: head."),
    store: Optional[str] = StoreOpt,
    branch: str = BranchOpt,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Write the recorded dependency pins as a pip requirements file (with lock-file digests, the
    Python version and the declared env-var names -- never values), to rebuild the environment a
    checkpoint was made in: pip install -r FILE, then resume with no drift."""
    with failing():
        text = api.env_export(task_id, store=store, at=at, branch=branch)
    if output is not None:
        output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


@app.command()
def verify(
    task_id: Optional[str] = typer.Argument(None, metavar="TASK_ID", help="Task id; omit with --all."),
    all_tasks: bool = typer.Option(False, "--all", help="Every task, and every object in the store (referenced or not)."),
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
    quiet: bool = PlainQuietOpt,
    ignore_dangling: bool = typer.Option(False, "--ignore-dangling",
                                         help="Exit 0 when only records no branch uses are damaged (they are "
                                         "still listed)."),
    repair: bool = typer.Option(False, "--repair", help="Rewrite damaged or missing records and objects from "
                                "their verified ditto copies (each heal is listed)."),
) -> None:
    """Check every checkpoint and blob of a task (or the whole store), like `git fsck`.

    A damaged or missing record, state document, page, chunk index or fingerprint whose ditto copy
    verifies is reported as healable; --repair rewrites it from the copy and lists it as healed.

    Records: digest, canonical form, format, schema, signature; chain links; state and artifact
    blobs, hashed chunk by chunk; the task's archive catalog rows (--all: every row): each
    manifest, and its pack and copy of the row in the cold store (check "archive").
    Exit 0 when everything verifies, 3 on any problem -- a damaged original that its ditto copy
    serves (listed apart: reads are unaffected, --repair rewrites it) and a damaged
    record that no branch uses any more (skipped by a fallback) included, unless --ignore-dangling. --all checks
    one store (default: the local one); a configured database or cloud medium is checked with
    --store URL. A TASK_ID is looked up on every configured medium. --all also names the tasks
    submitted to the workers that have no checkpoint yet (nothing of them to verify)."""
    if not task_id and not all_tasks:
        render.err.print("[bold red]error:[/] name a TASK_ID or pass --all")
        raise typer.Exit(EXIT_USAGE)
    queued: list[str] = []  # --all: submitted tasks with no checkpoint yet (nothing to verify)
    with failing():
        with render.progress_bar(("verifying checkpoints", "verifying every stored object"),
                                 quiet=quiet or as_json) as update:
            rep = api.verify(task_id if not all_tasks else None, store=store, all_objects=all_tasks, on_progress=update,
                             repair=repair, queued=queued)
    ok = rep.ok if ignore_dangling else not rep.problems
    if as_json:
        render.print_json({**render.to_jsonable(rep), "ok": ok, "queued": queued})
    else:
        render.out.print(
            f"{rep.tasks} task(s), {rep.checkpoints} checkpoint(s) ({rep.checkpoints_invalid} invalid), "
            f"{rep.objects_checked} object(s) verified, {render.human_bytes(rep.bytes_verified)} of artifact content "
            f"hashed, in {rep.seconds:.2f} s"
            + (f"; {rep.dangling_objects} unreferenced object(s)" if all_tasks else "")
        )
        # a damaged original whose verified ditto copy serves every read: the branch is fine, the
        # store still needs `--repair` -- said apart from what no copy can heal, so "ok" and the
        # problem do not read as a contradiction
        healable = [p for p in rep.problems if not p.dangling and p.check == "ditto"]
        broken = [p for p in rep.problems if not p.dangling and p.check != "ditto"]
        dangling = [p for p in rep.problems if p.dangling]
        for task, heads in rep.heads.items():
            served = sum(p.task_id == task for p in healable)
            render.out.print(f"  {render.esc(task, one_line=True)}: "
                             + ", ".join(f"{b} {st}" for b, st in heads.items())
                             + (f" ({served} damaged original(s) served by their ditto copies, below)" if served else ""))
        if queued:
            more = ", …" if len(queued) > 5 else ""
            render.out.print(f"{len(queued)} queued task(s) have no checkpoint yet (not verified): "
                             + ", ".join(render.esc(t, one_line=True) for t in queued[:5]) + more)
        for line in rep.healed:
            render.out.print(f"[green]{render.esc(line)}[/]")
        if broken:
            render.table("problems", ["task", "checkpoint", "check", "detail"], _problem_rows(broken))
        if healable:
            render.out.print(f"[yellow]{len(healable)} damaged original(s) whose verified ditto copy serves every "
                             "read[/] (nothing is lost; exit 3 until they are rewritten, each says how):")
            for p in healable[:10]:
                render.out.print(f"  {render.esc(p.task_id or '', one_line=True)}: {render.esc(p.detail)}")
            if len(healable) > 10:
                render.out.print(f"  … and {len(healable) - 10} more (--json lists every one)")
        if dangling:
            render.out.print(f"[yellow]{len(dangling)} damaged record(s) no branch uses[/] (kept for inspection after a "
                             "fallback; `overnight show` marks them; exit 3 unless --ignore-dangling):")
            for p in dangling[:10]:
                render.out.print(f"  {(p.checkpoint_id or '')[7:19]}: {render.esc(p.detail)}")
        if repair and broken:
            render.err.print(f"[yellow]--repair[/] rewrote {len(rep.healed)} object(s) or record(s); the "
                             f"{len(broken)} problem(s) above are not rewritten (each says why: no verified ditto "
                             "copy, or a branch head this store rewrites only once the branch moves on): "
                             "`overnight resume` falls back past a damaged checkpoint to the newest one that verifies "
                             "and runs the steps after it again")
        if rep.signatures_unchecked:
            render.err.print(f"[yellow]warning:[/] {rep.signatures_unchecked} checkpoint(s) are signed but "
                             "OVERNIGHT_SIGNING_KEY is not set: their signatures were not checked (an edit that also "
                             "recomputed the digest would pass)")
        if not broken:
            render.out.print("[green]ok[/]" if not dangling and not healable else "[yellow]branches ok[/]")
    if not ok:
        raise typer.Exit(EXIT_INTEGRITY)


_SAME_OBJECT_ROWS = 3
"""Problems shown per (task, check, damaged object) before the rest are counted in one row: a
damaged page that every later checkpoint names would otherwise fill the table with one row each."""


def _problem_rows(problems: list[Any]) -> list[tuple[str, str, str, str]]:
    """The rows of ``verify``'s problems table, in the order found: at most
    :data:`_SAME_OBJECT_ROWS` for one damaged object of one task and check (kept together), then
    one row counting the others."""
    groups: dict[Any, list[Any]] = {}
    for p in problems:
        groups.setdefault((p.task_id, p.check, p.object) if p.object is not None else id(p), []).append(p)
    rows: list[tuple[str, str, str, str]] = []
    for same in groups.values():
        rows.extend((p.task_id or "", (p.checkpoint_id or "")[7:19], p.check, p.detail) for p in same[:_SAME_OBJECT_ROWS])
        if len(same) > _SAME_OBJECT_ROWS:
            p = same[0]
            rows.append((p.task_id or "", "", p.check, f"… and {len(same) - _SAME_OBJECT_ROWS} more checkpoint(s) that "
                         f"need object {p.object} (--json lists each)"))
    return rows


@app.command("log")
def log_(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    store: Optional[str] = StoreOpt,
    as_json: bool = JsonOpt,
) -> None:
    """History of a task with its branches, as a graph (newest first), like `git log --graph --all`."""
    with failing():
        entries = api.log(task_id, store=store)
    if as_json:
        render.print_json([{"checkpoint_id": e.row.checkpoint_id, "parents": e.parents, "branch": e.row.branch,
                            "seq": e.row.seq, "event": e.row.event, "step": e.row.step, "created_at": e.row.created_at,
                            "heads": e.heads, "valid": e.valid, "problem": e.problem, "healed": e.healed,
                            "rollback": e.why}
                           for e in entries])
        return
    width = max((len(e.graph.split("\n")[-1]) for e in entries), default=1)
    ev = max((len(e.row.event) for e in entries), default=1)  # "compaction" is the longest today
    for e in entries:
        *joins, line = e.graph.split("\n")
        for j in joins:
            render.out.print(j, markup=False)
        heads = f"  ({', '.join(e.heads)})" if e.heads else ""
        what = e.row.step or (f"({e.why})" if e.why and e.why != "rollback" else "")
        bad = ("" if e.valid else f"  INVALID: {e.problem}") + (f"  [{e.healed}]" if e.healed else "")
        render.out.print(f"{line.ljust(width)}  {e.row.checkpoint_id[7:19]}  seq {e.row.seq:<4} {e.row.event:<{ev}} "
                         f"{render.safe(what)}{render.safe(heads)}{render.safe(bad)}", markup=False)


@app.command()
def fork(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    at: str = typer.Option(..., "--at", help="Checkpoint id (or unique prefix) or branch to fork from."),
    branch: str = typer.Option(..., "--branch", "-b", help="Name of the new branch."),
    store: Optional[str] = StoreOpt,
) -> None:
    """Start a new branch at a checkpoint. Both branches continue independently
    (`overnight resume TASK_ID --branch NAME`) and never see each other's later checkpoints."""
    with failing():
        cid = api.fork(task_id, at, branch, store=store)
    from overnight.runtime.outcome import resume_command

    render.err.print(f"branch [bold]{render.esc(branch)}[/] created at {cid[7:19]}; continue it with: "
                     + render.esc(resume_command(task_id, branch, store)))


@app.command()
def rollback(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    to: str = typer.Option(..., "--to", help="Checkpoint id (or unique prefix) to go back to."),
    branch: str = BranchOpt,
    store: Optional[str] = StoreOpt,
) -> None:
    """Move a branch back to an earlier checkpoint's state. The newer checkpoints stay in the
    history (`overnight log`); the steps after the target run again on the next resume."""
    with failing():
        cid = api.rollback(task_id, to, branch=branch, store=store)
    render.err.print(f"branch [bold]{render.esc(branch)}[/] rolled back to the state of {render.esc(to)}; "
                     f"new head {cid[7:19]} (the newer checkpoints stay in `overnight log`)")


@app.command()
def merge(
    task_id: str = typer.Argument(..., metavar="TASK_ID", help="Task id."),
    source: str = typer.Option(..., "--from", help="Branch to merge."),
    into: str = typer.Option("main", "--into", help="Branch to merge into."),
    prefer: Optional[str] = typer.Option(None, "--prefer", help="Resolve conflicts: ours | theirs."),
    store: Optional[str] = StoreOpt,
) -> None:
    """Merge a branch: union of done steps when no step conflicts (three-way for artifacts and
    state). A conflict is reported with both sides (exit 4); --prefer picks one."""
    with failing():
        res = api.merge(task_id, source, into=into, prefer=prefer, store=store)
    if res.up_to_date:
        render.err.print(f"{render.esc(into)} already contains {render.esc(source)}: nothing to merge")
        return
    render.err.print(f"merged {render.esc(source)} into {render.esc(into)}: {len(res.added_steps)} step(s) added"
                     + (f", {len(res.conflicts)} conflict(s) resolved preferring {prefer}" if res.conflicts else "")
                     + f"; new head {(res.checkpoint_id or '')[7:19]}")


ops.register(app)  # gc, rm, archive, restore, repair


@app.command()
def demo(
    package: str = typer.Option("email", "--package", "-p", help="Installed Python package to document."),
    out_path: Path = typer.Option(Path("report.md"), "--out", "-o", help="Where to write the finished report."),
    task_id: Optional[str] = typer.Option(None, "--task-id", help="Task id (default api-report-<package>)."),
    store: Optional[str] = StoreOpt,
    latency_ms: float = typer.Option(0.0, "--model-latency-ms", min=0,
                                     help="Sleep this long per section, standing in for a model call."),
    max_steps: Optional[int] = MaxStepsOpt,
    events: Optional[str] = EventsOpt,
    quiet: bool = QuietOpt,
    on_drift: Optional[str] = DriftOpt,
    model: Optional[str] = ModelOpt,
    base_url: Optional[str] = BaseUrlOpt,
    max_context_tokens: int = typer.Option(8000, "--max-context-tokens", min=256,
                                           help="Context window per session in tokens; at 80 % the runner "
                                           "compacts (a summary checkpoint, then a new session)."),
    section_tokens: Optional[int] = typer.Option(None, "--section-tokens", min=16,
                                                 help="Most tokens per section reply (default 4096 for the "
                                                 "extractive writer, 400 for a language model)."),
) -> None:
    """The main job: write a Markdown API reference of an installed package, one step per module.

    By default the sections are written by the deterministic offline extractive writer (not an
    LLM); --model local or --model openai:NAME --base-url URL use a real model. The session's
    context window (--max-context-tokens, 8000) fills as sections are written; at 80 % the
    runner compacts and a new session starts. Re-running resumes the same
    task: a module whose source changed since (or a new module) is written again, and the report
    re-assembled; everything else comes from the checkpoints. The report is exported to --out.
    """
    from overnight.demo.api_report import find_package, make_task

    with failing():
        find_package(package)  # a package that is not there: refuse before creating a task
        client = _model(model, base_url)
        task = make_task(task_id, package, latency_ms, out=str(out_path), model=client.name if client else None,
                         max_context_tokens=max_context_tokens, section_tokens=section_tokens)
        result = _run_with_progress(
            lambda p: api.run(task, store=store, max_steps=max_steps, on_event=p, on_drift=on_drift, model=client),
            quiet=quiet, events=events)
    if result.status == "complete":  # the result (the report's path) on stdout, the rest on stderr
        size = out_path.stat().st_size
        render.out.print(f"report: [bold]{render.esc(out_path.resolve())}[/] ({render.human_bytes(size)}, "
                         f"{result.total - 2} module sections)")
        if not quiet:
            render.err.print(f"store:  [bold]{render.esc(result.store_url)}[/]  (task {render.esc(result.task_id)}; "
                             f"`overnight show {render.esc(result.task_id)}` lists its checkpoints)")
    # every option that changes what the run does, as given (not --max-steps, --events, --quiet: this run's
    # limits and output). A plain `overnight resume` rebuilds the task with make_task's defaults (report.md,
    # the 8,000-token window, no --on-drift ...): with any of them given, the resume command is this one again.
    given = {"--package": package if package != "email" else None,
             "--out": str(out_path) if out_path != Path("report.md") else None, "--task-id": task_id,
             "--store": store, "--model": model, "--base-url": base_url,
             "--model-latency-ms": f"{latency_ms:g}" if latency_ms else None,
             "--max-context-tokens": str(max_context_tokens) if max_context_tokens != 8000 else None,
             "--section-tokens": str(section_tokens) if section_tokens is not None else None,
             "--on-drift": on_drift}
    resume_with = None
    if any(v is not None for v in given.values()):
        resume_with = " ".join(["overnight demo", *(f"{k} {shlex.quote(v)}" for k, v in given.items() if v is not None)])
    _report_run(result, quiet=quiet, resume_with=resume_with)


app.add_typer(bench_app, name="bench")


@app.command("route")
def route_(
    file: str = typer.Argument(..., metavar="FILE.py[:TASK]", help="Python file defining the task."),
    at: Optional[str] = typer.Option(None, "--at", metavar="TIME", help="Pretend the task starts at this local time "
                                     "(ISO 8601, e.g. 2026-11-30T22:00); default: now."),
    as_json: bool = JsonOpt,
) -> None:
    """Show the router's decision for a task without running it: persistence level (ephemeral /
    session / durable, from the expected span and whether it crosses a local midnight) and storage
    media (from the criticality), with the reasons. A spec with no span, or under 30% complete, is
    refused with what is missing (exit 2)."""
    from datetime import datetime

    try:
        now = datetime.fromisoformat(at) if at else None
    except ValueError:
        render.err.print(f"[bold red]error:[/] --at {render.esc(at)} is not an ISO 8601 time")
        raise typer.Exit(EXIT_USAGE)
    with failing():
        decision = api.route(file, now=now)
    if as_json:
        render.print_json(decision.to_json())
        return
    render.out.print(f"level: [bold]{decision.level}[/]   media: [bold]{', '.join(decision.media) or '-'}[/]"
                     f"   completeness: {decision.completeness:.0%}")
    for reason in decision.reasons:
        render.out.print(f"  - {render.esc(reason)}")
    if decision.missing:
        render.out.print("  spec could also state: " + ", ".join(decision.missing))


@app.command("config")
def config_(as_json: bool = JsonOpt) -> None:
    """The effective configuration -- store URLs, media per criticality, router thresholds, signing
    key (set or not; never shown) -- and where each value came from (default, overnight.toml, $ENV)."""
    with failing():
        cfg = api.config()
    rows = cfg.shown()
    if as_json:
        render.print_json({"file": str(cfg.file) if cfg.file else None,
                           "values": [{"key": k, "value": v, "source": src} for k, v, src in rows]})
        return
    render.out.print(f"config file: {cfg.file or '(none: defaults and environment)'}")
    render.table(None, ["setting", "value", "from"], rows)


coding_agents.register(app)  # mcp, hook


@app.command("ui")
def ui(
    store: Optional[str] = StoreOpt,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind. Anything but loopback "
                             "(127.0.0.1, ::1, localhost) requires a token."),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="Port (0 picks a free one)."),
    read_only: bool = typer.Option(False, "--read-only", help="Pages only: no fork, rollback or verify buttons."),
    token: Optional[str] = typer.Option(None, "--token", envvar="OVERNIGHT_UI_TOKEN",
                                        help="Require this token on every request. On a non-loopback --host one "
                                        "is generated and printed once when not given."),
) -> None:
    """A dashboard in the browser: tasks with status and progress (live), each task's timeline and
    branch graph, checkpoints (state, diff against the parent, artifacts, fingerprint), drift
    preview (what a resume would recompute and what it would cost, before it runs), the model-call
    journal and storage. Every page has a JSON twin (add .json to its path). Prints the URL to
    open (http://127.0.0.1:PORT/ for a 0.0.0.0 or :: bind); stops on Ctrl-C. Needs the ui extra:
    pip install 'overnight[ui]'."""
    try:
        from overnight.web.server import serve
    except ImportError as exc:
        _need_extra(exc, "ui")
    with failing():
        serve(store, host=host, port=port, read_only=read_only, token=token,
              announce=lambda line: render.err.print(render.esc(line)))


from overnight.cli import fleet as _fleet  # noqa: E402 - submit, worker, workers, retry, cancel
_fleet.register(app, bench_app)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Durable long-horizon agent tasks."""


def _only_invoked(argv: list[str]) -> tuple[list, list] | None:
    """Keep only the command (or command group) ``argv`` invokes in :data:`app`: typer builds the
    click parameters of every registered command at each start (~45 commands, a tenth of a bare
    ``overnight resume``), and one process runs one command. Returns what to restore, or None
    when ``argv`` names no single command (``--help``, ``--version``, a typo: typer then sees them
    all and says so)."""
    if not argv or argv[0].startswith("-"):
        return None
    from typer.main import get_command_name

    cmds = [c for c in app.registered_commands
            if (c.name or get_command_name(c.callback.__name__ if c.callback else "")) == argv[0]]
    groups = [g for g in app.registered_groups if g.name == argv[0]]
    if len(cmds) + len(groups) != 1:
        return None
    kept = (app.registered_commands, app.registered_groups)
    app.registered_commands, app.registered_groups = cmds, groups
    return kept


def main() -> None:
    """Console-script entry point."""
    import warnings

    warnings.formatwarning = lambda message, category, *args, **kw: f"warning: {message}\n"  # type: ignore
    kept = _only_invoked(sys.argv[1:])
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(EXIT_RESUMABLE)
    finally:
        if kept is not None:
            app.registered_commands, app.registered_groups = kept


if __name__ == "__main__":
    main()
