"""Claude Code hooks: ``overnight hook claude-code {pre-compact,session-start,stop,install}``.

Input: the hook JSON on stdin (Claude Code hooks reference: common fields ``session_id``,
``transcript_path``, ``cwd``, ``hook_event_name``; ``PreCompact`` adds ``trigger`` (``manual`` /
``auto``) and ``custom_instructions``; ``SessionStart`` adds ``source`` (``startup``, ``resume``,
``clear``, ``compact``); ``Stop`` adds ``stop_hook_active``). Output, as Claude Code reads it
(JSON on stdout, exit 0):

=============  =================================================================================
event          output
=============  =================================================================================
pre-compact    committed: ``{"systemMessage": "overnight: checkpoint ..."}``; the commit failed (or
               ran past its deadline): ``{"decision": "block", "reason": ...}`` -- the compaction
               does not happen, nothing is lost, the reason says what to fix
session-start  ``{"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext":
               <control point and drift>}}`` (a load failure is put there too, for the agent to see)
stop           nothing; a failure is printed on stderr with exit 1 (Claude Code shows it, the
               agent is never kept from stopping)
=============  =================================================================================

``install`` merges the three hooks into ``.claude/settings.json`` (``--project``, the default) or
``~/.claude/settings.json`` (``--user``) -- other hooks and settings are kept, an entry already
there is not added twice -- and, for a project, registers the MCP server in ``.mcp.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from overnight.hooks import Outcome, run_event

COMMANDS = {"PreCompact": "pre-compact", "SessionStart": "session-start", "Stop": "stop"}
TIMEOUTS_S = {"PreCompact": 60, "SessionStart": 30, "Stop": 30}
"""The ``timeout`` (seconds) written for each hook; the watchdog deadline (45 s) is below the shortest
one that matters (``PreCompact``), so a slow commit blocks the compaction rather than being killed."""


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")


def output(out: Outcome) -> tuple[dict[str, Any] | None, int]:
    """The JSON Claude Code reads (None: print nothing) and the exit code, for one outcome."""
    if out.event == "pre-compact":
        if out.ok:
            return ({"systemMessage": f"overnight: {out.message}"} if out.checkpoint_id else None), 0
        return {"decision": "block",
                "reason": f"overnight could not checkpoint task {out.task_id or '?'} before compacting, so the "
                          f"compaction was blocked (nothing is lost): {out.message}"}, 0
    if out.event == "session-start":
        text = out.context if out.ok else (f"overnight: could not load the current task {out.task_id or ''}: "
                                            f"{out.message}")
        if not text:
            return None, 0
        return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}}, 0
    if not out.ok:
        sys.stderr.write(f"overnight: stop hook could not checkpoint: {out.message}\n")
        return None, 1
    return None, 0


def _print(out: Outcome) -> int:
    if out.skipped:
        sys.stderr.write(f"overnight: {out.message}\n")
    obj, code = output(out)
    if obj is not None:
        _emit(obj)
    return code


def run(event: str, *, store: str | None = None, payload_text: str | None = None) -> int:
    """Run one Claude Code hook event (``pre-compact``, ``session-start``, ``stop``) on the JSON on
    stdin; prints Claude Code's output and returns the exit code (a ``pre-compact`` past its
    deadline prints the block decision)."""
    return _print(run_event(event, payload_text, store=store, on_timeout=_print))


def settings_path(scope: str, cwd: str | os.PathLike | None = None) -> Path:
    """``<project>/.claude/settings.json`` (``project``: the git top level of ``cwd``) or
    ``~/.claude/settings.json`` (``user``)."""
    if scope == "user":
        return Path.home() / ".claude" / "settings.json"
    from overnight.verify.coding_world import project_root

    return project_root(cwd or Path.cwd()) / ".claude" / "settings.json"


def _load(path: Path) -> dict[str, Any]:
    from overnight.errors import ConfigError

    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text("utf-8") or "{}")
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); not changing it",
                          hint="fix the file (or move it aside) and run install again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object; not changing it")
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", "utf-8")
    os.replace(tmp, path)


def install(scope: str = "project", *, command: str = "overnight", cwd: str | os.PathLike | None = None,
            dry_run: bool = False) -> list[str]:
    """Merge the hooks into Claude Code's settings (and, for a project, the MCP server into
    ``.mcp.json``). Idempotent: an event that already runs ``COMMAND hook claude-code EVENT`` is
    left alone, one that runs it with another command (an earlier ``--command``) is changed to this
    one, never added twice; other hooks and keys are kept. Returns one line per change or non-change.

    Raises ConfigError when a settings file exists but is not a JSON object (it is never overwritten)."""
    from overnight.errors import ConfigError

    if scope not in ("project", "user"):
        raise ConfigError(f"scope must be project or user, not {scope!r}")
    path = settings_path(scope, cwd)
    data = _load(path)
    hooks = data.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise ConfigError(f"{path}: 'hooks' is not an object; not changing it")
    lines, changed = [], False
    for event, sub in COMMANDS.items():
        cmd = f"{command} hook claude-code {sub}"
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise ConfigError(f"{path}: hooks.{event} is not a list; not changing it")
        ours = [h for g in groups if isinstance(g, dict) for h in (g.get("hooks") or [])
                if isinstance(h, dict) and str(h.get("command", "")).strip().endswith(f" hook claude-code {sub}")]
        if any(str(h.get("command", "")).strip() == cmd for h in ours):
            lines.append(f"unchanged {path}: hooks.{event} already runs `{cmd}`")
            continue
        if ours:  # installed before with another --command (e.g. a bare `overnight` not on PATH): replace it
            old = str(ours[0].get("command", "")).strip()
            ours[0]["command"] = cmd
            lines.append(f"changed in {path}: hooks.{event} runs `{cmd}` (was `{old}`)")
        else:
            groups.append({"hooks": [{"type": "command", "command": cmd, "timeout": TIMEOUTS_S[event]}]})
            lines.append(f"added to {path}: hooks.{event} runs `{cmd}` (timeout {TIMEOUTS_S[event]} s)")
        changed = True
    if changed and not dry_run:
        _write(path, data)
    if scope == "project":
        mcp_path = path.parent.parent / ".mcp.json"
        mcp = _load(mcp_path)
        servers = mcp.setdefault("mcpServers", {})
        if not isinstance(servers, dict):
            raise ConfigError(f"{mcp_path}: 'mcpServers' is not an object; not changing it")
        entry = {"command": command, "args": ["mcp"]}
        if servers.get("overnight") == entry:
            lines.append(f"unchanged {mcp_path}: mcpServers.overnight runs `{command} mcp`")
        else:
            verb = "changed in" if "overnight" in servers else "added to"
            servers["overnight"] = entry
            lines.append(f"{verb} {mcp_path}: mcpServers.overnight runs `{command} mcp`")
            if not dry_run:
                _write(mcp_path, mcp)
    else:
        lines.append(f"register the MCP server for every project with: claude mcp add --scope user overnight -- "
                     f"{command} mcp")
    if command == "overnight" and shutil.which("overnight") is None:
        here = Path(sys.executable).parent / "overnight"
        lines.append("warning: `overnight` is not on PATH here, and Claude Code runs hooks through PATH: a hook it "
                     "cannot find does not block a compaction. Run install again with --command "
                     + (str(here) if here.exists() else "/path/to/venv/bin/overnight"))
    if dry_run:
        lines = [f"(dry run) {line}" for line in lines]
    return lines
