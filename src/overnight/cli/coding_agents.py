"""The commands for coding agents: ``overnight mcp`` (the MCP server) and ``overnight hook``
(Claude Code's hooks and a generic one), thin shells over :mod:`overnight.mcp` and
:mod:`overnight.hooks`, each imported only inside its command."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Optional

import typer

from overnight.cli import render
from overnight.cli.common import EXIT_USAGE, StoreOpt, failing, need_extra as _need_extra
from overnight.errors import ConfigError


def register(app: typer.Typer) -> None:
    """Add ``mcp`` and the ``hook`` group to ``overnight``."""
    app.command("mcp")(mcp_)
    app.add_typer(hook_app, name="hook")


def mcp_(
    store: Optional[str] = StoreOpt,
    project: Optional[Path] = typer.Option(None, "--project", help="A directory in the project whose coding "
                                           "tasks this server keeps (default: the current one; its git top level)."),
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP at /mcp instead of stdio."),
    host: str = typer.Option("127.0.0.1", "--host", help="HTTP: address to bind (loopback unless you mean it)."),
    port: int = typer.Option(8766, "--port", min=0, max=65535, help="HTTP: port (0 picks a free one; not the "
                             "dashboard's: `overnight ui` and this server run side by side)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="OVERNIGHT_MCP_TOKEN",
                                        help="HTTP: bearer token every request must carry (default: a random one, "
                                        "printed on stderr)."),
) -> None:
    """MCP server for coding agents (stdio): task_start, task_checkpoint, task_resume, task_status, task_list,
    task_log, task_fork, task_rollback, task_verify, artifact_read. Needs the mcp extra."""
    try:
        from overnight.mcp.server import run as serve
    except ImportError as exc:
        _need_extra(exc, "mcp")
    except ConfigError as exc:
        render.err.print(f"[bold red]error:[/] {render.esc(exc)}")
        raise typer.Exit(EXIT_USAGE)
    with failing():
        if http:
            _check_port(host, port)
        serve(store=store, project=str(project) if project else None, http=http, host=host, port=port, token=token)


def _check_port(host: str, port: int) -> None:
    """Refuse a port another process listens on before the server starts, as one typed error
    (uvicorn would only log it and exit 3 after the server had announced its URL). Bound as uvicorn
    binds (``SO_REUSEADDR``), then released for it."""
    import socket

    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bare, port))
        except OSError as exc:
            what = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise ConfigError(f"cannot listen on {host}:{port}: {what}",
                              hint="pick another --port (the default is 8766; `overnight ui` uses 8765)") from exc


hook_app = typer.Typer(help="Hooks for coding agents: checkpoint before a compaction and at the end of a turn, put "
                       "the control point back into a new session. The task is the project's current one "
                       "(.overnight/current-task, written by task_start / task_resume; or $OVERNIGHT_TASK).",
                       no_args_is_help=True)
claude_app = typer.Typer(help="Claude Code hooks: the hook JSON on stdin, Claude Code's JSON on stdout.",
                         no_args_is_help=True)
hook_app.add_typer(claude_app, name="claude-code")
HookStoreOpt = typer.Option(None, "--store", "-s", help="Store URL (default: the store the current-task pointer "
                            "names, else $OVERNIGHT_STORE).")


@claude_app.command("pre-compact")
def cc_pre_compact(store: Optional[str] = HookStoreOpt) -> None:
    """PreCompact: commit a checkpoint (transcript stored, control point updated); if it fails, block the compaction.
    Empty input: nothing to save, no checkpoint (exit 0, the reason on stderr)."""
    from overnight.hooks import claude_code

    raise typer.Exit(claude_code.run("pre-compact", store=store))


@claude_app.command("session-start")
def cc_session_start(store: Optional[str] = HookStoreOpt) -> None:
    """SessionStart: after a compaction or a resume, put the control point and the drift report into the context."""
    from overnight.hooks import claude_code

    raise typer.Exit(claude_code.run("session-start", store=store))


@claude_app.command("stop")
def cc_stop(store: Optional[str] = HookStoreOpt) -> None:
    """Stop: commit a checkpoint at the end of each turn (nothing when nothing changed)."""
    from overnight.hooks import claude_code

    raise typer.Exit(claude_code.run("stop", store=store))


@claude_app.command("install")
def cc_install(
    user: bool = typer.Option(False, "--user", help="~/.claude/settings.json (every project)."),
    project: bool = typer.Option(False, "--project", help=".claude/settings.json of this project (the default), "
                                 "and the MCP server in its .mcp.json."),
    command: str = typer.Option("overnight", "--command", help="How Claude Code should call overnight (e.g. an "
                                "absolute path to the venv's overnight)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would change, change nothing."),
) -> None:
    """Merge the PreCompact, SessionStart and Stop hooks into Claude Code's settings (other hooks kept; idempotent)."""
    from overnight.hooks import claude_code

    if user and project:
        render.err.print("[bold red]error:[/] give --user or --project, not both")
        raise typer.Exit(EXIT_USAGE)
    with failing():
        for line in claude_code.install("user" if user else "project", command=command, dry_run=dry_run):
            render.out.print(render.esc(line))


@hook_app.command("run")
def hook_run(
    event: str = typer.Option(..., "--event", "-e", help="pre-compact, session-start or stop (or PreCompact, "
                              "SessionStart, Stop, SessionEnd, agent-turn-complete)."),
    payload: Optional[str] = typer.Argument(None, help="The event JSON (default: read from stdin)."),
    store: Optional[str] = HookStoreOpt,
) -> None:
    """Generic hook for other agents: session-start prints the control point as text; a failed pre-compact exits 2."""
    from overnight.hooks import run_generic

    with failing():
        code = run_generic(event, payload, store=store)
    raise typer.Exit(code)
