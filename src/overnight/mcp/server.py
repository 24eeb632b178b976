"""``overnight mcp``: the MCP server, a thin shell over :class:`overnight.mcp.tasks.CodingTasks`.

Built on the official MCP Python SDK (``pip install 'overnight[mcp]'``): ``MCPServer`` (the SDK's
``FastMCP``, renamed in mcp 2). Each tool is a typed function whose docstring is its description
and whose JSON input schema comes from the types; it returns a compact text (the control point
within a token budget, counted with the real ``o200k_base`` tokenizer) and the same facts as
structured content. Every failure -- an unknown task id, a path outside the project, a busy or
damaged store, anything unexpected -- comes back as a tool error (``isError: true``) with the
message and a hint; the server keeps running. A checkpoint is durable before its call returns,
so killing the server loses nothing it acknowledged.
"""

from __future__ import annotations

import functools
import inspect
import logging
import secrets
import sys
from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, Field, model_validator

from overnight.errors import ConfigError, OvernightError, TaskNotFound, short_id
from overnight.mcp.budget import CONTINUATION_TOKENS, read_part
from overnight.mcp.tasks import ArtifactIn, CodingTasks, read_pointer, render_control_point
from overnight.verify.coding_world import utf8_safe

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, TextContent, ToolAnnotations
except ImportError as _exc:  # pragma: no cover - the extra is part of the test environment
    raise ConfigError(f"overnight mcp needs the 'mcp' package ({_exc})", hint="pip install 'overnight[mcp]'") from _exc

__all__ = ["Artifact", "build_server", "run"]

log = logging.getLogger("overnight.mcp")

INSTRUCTIONS = """\
overnight keeps a long coding task durable across context compactions, crashes and nights.
Call task_start once with the goal and plan; call task_checkpoint whenever you finish an item,
decide something or change the plan (done/todo/decisions/notes, artifacts as text or project
files). After a compaction, a restart or the next morning call task_resume: it returns the
control point (goal, done, todo, decisions, last notes, artifacts) and what changed in the
repository since the last checkpoint (commits, edited files, lock files, env). Every checkpoint
is verified on load; task_verify checks the whole history."""

DEFAULT_BUDGET_TOKENS = 1500
"""Tokens of text a tool result may take (the structured content carries everything)."""


class Artifact(BaseModel):
    """An artifact to store with a checkpoint: ``text`` under ``name``, or a project file by ``path``."""

    name: Annotated[str | None, Field(description="Artifact name, e.g. 'notes/design.md'. Default for a "
                                      "file: 'files/<project-relative path>'.")] = None
    text: Annotated[str | None, Field(description="The content, as text.")] = None
    path: Annotated[str | None, Field(description="A file inside the project (relative to its root, or "
                                      "absolute); its bytes are stored.")] = None

    @model_validator(mode="after")
    def _one(self) -> "Artifact":
        if (self.text is None) == (self.path is None):
            raise ConfigError("give exactly one of text and path")
        if self.text is not None and not self.name:
            raise ConfigError("a text artifact needs a name")
        return self


TaskId = Annotated[str, Field(description="The task id task_start returned (task_list shows them).")]
OptTaskId = Annotated[str | None, Field(description="The task id; default: the project's current task "
                                        "(the last one started or resumed here).")]
OptBranch = Annotated[str | None, Field(description="Branch of the task's history (task_fork makes new ones); "
                                       "default: main, or the branch task_resume made current for this task.")]
Items = list[str] | None


def _suggest(tasks: CodingTasks, exc: TaskNotFound) -> None:
    """"did you mean" the coding tasks whose ids are closest to the one not found."""
    import difflib

    try:
        ids = [r["task_id"] for r in tasks.list()]
    except Exception:  # noqa: BLE001 - a suggestion is a courtesy, never a second error
        return
    close = difflib.get_close_matches(exc.task_id or "", ids, n=3, cutoff=0.6)
    if close:
        exc.hint = f"did you mean {' or '.join(close)}? task_list shows the coding tasks in this store"


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, TaskNotFound) and "did you mean" not in (exc.hint or ""):
        exc.hint = "task_list shows the coding tasks in this store"
    if isinstance(exc, OvernightError):
        text = f"{type(exc).__name__}: {exc.message}"
        if exc.task_id and exc.task_id not in exc.message:
            text += f" (task {exc.task_id})"
        return text + f"\nhint: {exc.hint}" if exc.hint else text
    return (f"{type(exc).__name__}: {exc}\nhint: the server is still running and nothing acknowledged was lost; "
            "check the store (`overnight verify --all`) and retry")


def _result(text: str, data: dict[str, Any] | None = None, *, is_error: bool = False) -> CallToolResult:
    """A tool result. Every string in it has its lone surrogates escaped (:func:`utf8_safe`): stored
    values (a forged spec, a non-UTF-8 file name git reports) may hold them, and the SDK cannot
    send them (it stops answering)."""
    return CallToolResult(content=[TextContent(type="text", text=utf8_safe(text))],
                          structured_content=utf8_safe(data), is_error=is_error)


def build_server(tasks: CodingTasks, *, budget_tokens: int = DEFAULT_BUDGET_TOKENS) -> MCPServer:
    """The MCP server with the ``task_*`` tools and ``artifact_read`` on ``tasks``."""
    server: MCPServer = MCPServer("overnight", instructions=INSTRUCTIONS, version=_version())
    count_cache: list[Callable[[str], int]] = []

    def count(text: str) -> int:
        if not count_cache:
            from overnight.tokens import tokenizer_for

            count_cache.append(tokenizer_for().count)
        return count_cache[0](text)

    def tool(fn: Callable[..., tuple[str, dict[str, Any]]], *, read_only: bool = False) -> None:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> CallToolResult:
            try:
                text, data = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every failure is a tool error, never a dead server
                if isinstance(exc, TaskNotFound):
                    _suggest(tasks, exc)
                # returned, not raised: the SDK would log a raised error as a traceback on stderr
                log.info("%s failed: %s", fn.__name__, type(exc).__name__)
                return _result(_error_text(exc), is_error=True)
            return _result(text, data)

        wrapper.__signature__ = inspect.signature(fn, eval_str=True).replace(  # type: ignore[attr-defined]
            return_annotation=CallToolResult)
        server.add_tool(wrapper, name=fn.__name__, description=fn.__doc__,
                        annotations=ToolAnnotations(readOnlyHint=read_only, destructiveHint=False,
                                                    idempotentHint=read_only, openWorldHint=False))

    def current(task_id: str | None) -> tuple[str, str | None]:
        if task_id:
            return task_id, None
        found = read_pointer(tasks.project)
        if found is None:
            raise ConfigError("no task_id given and the project has no current task",
                              hint="call task_start, or pass task_id (task_list shows the tasks)")
        return found[1]["task_id"], found[1].get("branch")

    def branch_of(task_id: str, branch: str | None) -> str:
        """``branch`` if given; else the branch the project's current-task pointer names when it
        names this task (``task_resume(branch=...)`` moved it there, and the hooks checkpoint
        there too); else ``main``."""
        if branch:
            return branch
        found = read_pointer(tasks.project)
        if found is not None and found[1].get("task_id") == task_id:
            return found[1].get("branch") or "main"
        return "main"

    def task_start(goal: Annotated[str, Field(description="What the task is for, in one sentence.")],
                   plan: Annotated[Items, Field(description="The planned items, in order: the first todo list.")] = None,
                   expected_span: Annotated[str | None, Field(description="How long it should take: '90m', '3h', '2d'.")] = None,
                   criticality: Literal["normal", "important", "critical"] = "normal",
                   inputs: Annotated[Items, Field(description="Project files the task depends on (specs, fixtures): "
                                                  "a change to one is reported as drift.")] = None,
                   env: Annotated[Items, Field(description="Environment variable names the task depends on "
                                               "(recorded as keyed digests, never values).")] = None,
                   ) -> tuple[str, dict[str, Any]]:
        """Start a durable coding task: commits its first checkpoint (goal, plan as the todo list, the
        repository's world) and makes it the project's current task. Returns the task id."""
        cp = tasks.start(goal, plan=plan, expected_span=expected_span, criticality=criticality, inputs=inputs, env=env)
        text = (f"started task {cp.task_id} (checkpoint {short_id(cp.checkpoint_id)}); it is the project's current "
                f"task.\nCall task_checkpoint(task_id={cp.task_id!r}, done=[...], todo=[...], notes=...) as you go.\n"
                + render_control_point(cp, budget_tokens=budget_tokens, count=count))
        return text, {"task_id": cp.task_id, "control": cp.to_json()}

    def task_checkpoint(task_id: TaskId,
                        done: Annotated[Items, Field(description="Items finished since the last checkpoint.")] = None,
                        todo: Annotated[Items, Field(description="The todo list now (replaces the stored one; "
                                                     "omit to keep it minus the done items).")] = None,
                        notes: Annotated[str | None, Field(description="Where the work stands, for whoever resumes "
                                                           "(replaces the last notes).")] = None,
                        decisions: Annotated[Items, Field(description="Decisions taken, with their reason.")] = None,
                        artifacts: Annotated[list[Artifact] | None, Field(description="Text or project files to store "
                                                                          "(content-addressed).")] = None,
                        branch: OptBranch = None) -> tuple[str, dict[str, Any]]:
        """Commit a verified checkpoint of the task's control point (done, todo, notes, decisions,
        artifacts) and of the repository's world (HEAD, branch, edited files, lock files). Durable
        when this returns."""
        arts = [ArtifactIn(a.name, a.text, a.path) for a in artifacts or []]
        r = tasks.checkpoint(task_id, branch=branch_of(task_id, branch), done=done, todo=todo, notes=notes, decisions=decisions,
                             artifacts=arts)
        return r.describe(), r.to_json()

    def task_resume(task_id: OptTaskId = None, branch: Annotated[str | None, Field(
            description="Branch (default: main, or the current task's branch).")] = None) -> tuple[str, dict[str, Any]]:
        """Load the task's newest checkpoint that verifies (every artifact hashed) and report what
        changed in the repository since: the control point to continue from, and the drift in words
        (commits, edited files, lock files, env; todo items that mention changed files)."""
        tid, _ = current(task_id)
        r = tasks.resume(tid, branch=branch_of(tid, branch))
        text = render_control_point(r.control, drift_report=r.drift, fallback=r.fallback, budget_tokens=budget_tokens,
                                    count=count)
        return text, r.to_json()

    def task_status(task_id: OptTaskId = None, branch: Annotated[str | None, Field(
            description="Branch (default: main, or the current task's branch).")] = None) -> tuple[str, dict[str, Any]]:
        """Where the task stands: counts, head checkpoint, branches and drift since the head (no
        deep artifact check; does not change the current task)."""
        tid, _ = current(task_id)
        r = tasks.status(tid, branch=branch_of(tid, branch))
        cp = r.control
        branches = sorted(tasks.store().list_refs(tid))
        lines = [f"{tid} ({cp.branch}): {len(cp.done)} done, {len(cp.todo)} todo, {len(cp.decisions)} decisions, "
                 f"{len(cp.artifacts)} artifacts; head {short_id(cp.checkpoint_id)} seq {cp.seq} at {cp.created_at[:19]}",
                 f"goal: {cp.goal}", f"branches: {', '.join(branches)}",
                 "drift: " + ("; ".join(r.drift.lines) if r.drift.lines else "none")]
        if cp.project_moved:
            lines.insert(2, cp.moved_line())
        if cp.todo:
            lines.append("next: " + cp.todo[0])
        return "\n".join(lines), {**r.to_json(), "branches": branches}

    def task_list() -> tuple[str, dict[str, Any]]:
        """The coding tasks in the store, newest first; the current one is marked '*'."""
        rows = tasks.list()
        lines = [f"{'*' if r['current'] else ' '} {r['task_id']}  {r['goal'][:80]}  (updated {str(r['updated_at'])[:16]}, "
                 f"branches {', '.join(r['branches'])})" for r in rows] or ["no coding tasks yet: call task_start"]
        return "\n".join(lines), {"tasks": rows}

    def task_log(task_id: OptTaskId = None,
                 limit: Annotated[int, Field(ge=1, le=500, description="At most this many checkpoints.")] = 20,
                 ) -> tuple[str, dict[str, Any]]:
        """The task's history, newest first, all branches: seq, checkpoint id, branch, event, detail,
        time; checkpoints that fail verification are marked INVALID."""
        tid, _ = current(task_id)
        entries = tasks.log(tid)
        rows = []
        for e in entries[:limit]:
            r = e.row
            rows.append({"seq": r.seq, "checkpoint_id": r.checkpoint_id, "branch": r.branch, "event": r.event,
                         "step": r.step, "created_at": r.created_at, "heads": e.heads, "valid": e.valid,
                         "problem": e.problem})
        lines = [f"{x['seq']:>4} {short_id(x['checkpoint_id'])} {x['branch']:<12} {x['event']:<10} {x['step'] or '':<16} "
                 f"{x['created_at'][:19]}{' <- ' + ','.join(x['heads']) if x['heads'] else ''}"
                 f"{'' if x['valid'] else '  INVALID: ' + str(x['problem'])}" for x in rows]
        if len(entries) > limit:
            lines.append(f"(+{len(entries) - limit} older: raise limit)")
        return "\n".join(lines), {"task_id": tid, "checkpoints": rows, "total": len(entries)}

    def task_fork(task_id: TaskId, branch: Annotated[str, Field(description="Name of the new branch.")],
                  at: Annotated[str | None, Field(description="Checkpoint id (or unique prefix) or branch to fork "
                                                  "from; default: the head of main, or of the branch task_resume "
                                                  "made current for this task.")] = None) -> tuple[str, dict[str, Any]]:
        """Start a new branch of the task at a checkpoint; both branches go on independently
        (task_checkpoint/task_resume with branch=...)."""
        cid = tasks.fork(task_id, branch, at=at or branch_of(task_id, None))
        return (f"branch {branch!r} of {task_id} created at checkpoint {short_id(cid)}; continue it with "
                f"task_resume(task_id={task_id!r}, branch={branch!r})"), {"task_id": task_id, "branch": branch,
                                                                          "checkpoint_id": cid}

    def task_rollback(task_id: TaskId, to: Annotated[str, Field(description="Checkpoint id or unique prefix "
                                                                "(task_log lists them).")],
                      branch: OptBranch = None) -> tuple[str, dict[str, Any]]:
        """Give the branch a new head with the state of one of its earlier checkpoints; the newer
        checkpoints stay in the history (task_log)."""
        branch = branch_of(task_id, branch)
        cid = tasks.rollback(task_id, to, branch=branch)
        return (f"{task_id}/{branch} rolled back: new head {short_id(cid)} has the state of {to}"), {
            "task_id": task_id, "branch": branch, "checkpoint_id": cid}

    def task_verify(task_id: OptTaskId = None) -> tuple[str, dict[str, Any]]:
        """Check every checkpoint and object of the task (digests, schema, signatures, every blob),
        as `overnight verify TASK_ID` does."""
        tid, _ = current(task_id)
        rep = tasks.verify(tid)
        problems = [str(p) for p in rep.problems]
        text = (f"{tid}: {'OK' if rep.ok else 'DAMAGED'}: {rep.checkpoints} checkpoints, {rep.objects_checked} objects, "
                f"{rep.bytes_verified} bytes verified" + "".join(f"\n- {p}" for p in problems[:20]))
        return text, {"task_id": tid, "ok": rep.ok, "checkpoints": rep.checkpoints,
                      "checkpoints_invalid": rep.checkpoints_invalid, "objects_checked": rep.objects_checked,
                      "problems": problems}

    def artifact_read(task_id: OptTaskId = None, name: Annotated[str, Field(description="Artifact name "
                                                                          "(task_resume lists them).")] = "",
                      at: Annotated[str | None, Field(description="Checkpoint id/prefix or branch; default: the "
                                                      "head of main, or of the branch task_resume made current "
                                                      "for this task.")] = None,
                      offset: Annotated[int, Field(ge=0, description="First byte to return (the next_offset of "
                                                   "the previous call).")] = 0,
                      max_bytes: Annotated[int, Field(ge=1, le=1_000_000, description="At most this many bytes.")] = 16_000,
                      ) -> tuple[str, dict[str, Any]]:
        tid, _ = current(task_id)
        if not name:
            raise ConfigError("artifact_read needs a name", task_id=tid, hint="task_resume lists the artifacts")
        data = tasks.artifact(tid, name, at=at, branch=branch_of(tid, None))
        part = read_part(data, offset, max_bytes, budget_tokens=max(budget_tokens - CONTINUATION_TOKENS, 1),
                         count=count)
        text = part.text
        if part.next_offset is not None:
            text += (f"\n[... {len(data) - part.next_offset} more bytes: artifact_read(task_id={tid!r}, name={name!r}, "
                     f"offset={part.next_offset})]")
        return text, {"task_id": tid, "name": name, "size": len(data), "offset": offset, "returned": part.returned,
                      "next_offset": part.next_offset, "tokens": count(text), "binary": part.binary}

    artifact_read.__doc__ = (f"An artifact's content, verified against its digest, from byte ``offset``: at most "
                             f"``max_bytes`` and at most {budget_tokens} tokens of text; when there is more, the "
                             "result ends with the call that reads the next part (``next_offset``). Binary content "
                             "is returned as a note, not as text.")

    for fn in (task_start, task_checkpoint):
        tool(fn)
    for fn in (task_resume, task_status, task_list, task_log, task_verify, artifact_read):
        tool(fn, read_only=fn is not task_resume)
    tool(task_fork)
    tool(task_rollback)
    return server


def plain_logging(level: int = logging.WARNING) -> None:
    """Log plain lines on stderr (``overnight mcp: WARNING mcp.x: ...``), warnings and worse only:
    stdout is the protocol, and the client shows stderr as the server's log. Tool failures are
    not logged as errors -- they go back to the client as tool errors (``isError``). Replaces
    the SDK's rich handlers (boxes, colours, tracebacks) on the ``mcp`` logger and the root logger."""
    fmt = logging.Formatter("overnight mcp: %(levelname)s %(name)s: %(message)s")
    for name in ("mcp", "overnight", ""):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if not getattr(h, "_overnight_plain", False) and (name or "rich" in type(h).__module__):
                lg.removeHandler(h)
        if name and not lg.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(fmt)
            h._overnight_plain = True  # type: ignore[attr-defined]
            lg.addHandler(h)
        if name:
            lg.setLevel(level)
            lg.propagate = False


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("overnight")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def run(*, store: str | None = None, project: str | None = None, http: bool = False, host: str = "127.0.0.1",
        port: int = 8766, token: str | None = None, budget_tokens: int = DEFAULT_BUDGET_TOKENS) -> None:
    """Serve until the client disconnects (stdio) or the process is stopped (HTTP).

    HTTP (streamable HTTP at ``/mcp``) binds to ``host`` (127.0.0.1 unless asked otherwise) and
    requires ``Authorization: Bearer TOKEN`` on every request; without ``token`` a random one is
    made and printed on stderr. ``port`` 0 picks a free port; the URL printed on stderr names the
    port it serves on.
    """
    plain_logging()
    tasks = CodingTasks(store, project=project)
    server = build_server(tasks, budget_tokens=budget_tokens)
    plain_logging()  # an SDK that configured its own (rich) handlers while building loses them
    try:
        if not http:
            server.run("stdio")
            return
        import uvicorn

        token = token or secrets.token_urlsafe(24)
        if not token.strip():
            raise ConfigError("--token must not be empty")
        sock = _listen(host, port)  # bound here, so port 0 is a free port and the URL says which
        port = sock.getsockname()[1]
        sys.stderr.write(f"overnight mcp: streamable HTTP on {http_url(host, port)} "
                         f"(Authorization: Bearer {token})\n")
        sys.stderr.flush()
        app = _require_token(server.streamable_http_app(), token)
        uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
    finally:
        tasks.close()


def http_url(host: str, port: int) -> str:
    """The ``/mcp`` URL of a server bound to ``host``:``port`` (an IPv6 literal bracketed; a
    wildcard bind -- ``0.0.0.0``, ``::`` -- reached at ``127.0.0.1``)."""
    h = host.strip("[]")
    shown = "127.0.0.1" if h in ("0.0.0.0", "::", "") else f"[{h}]" if ":" in h else h
    return f"http://{shown}:{port}/mcp"


def _listen(host: str, port: int) -> Any:
    """A socket bound to ``host``:``port`` as uvicorn binds (``SO_REUSEADDR``); ``port`` 0 picks a
    free one. A port in use is a ConfigError (exit 2), before anything is announced."""
    import errno
    import socket

    bare = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bare, port))
    except OSError as exc:
        sock.close()
        what = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise ConfigError(f"cannot listen on {host}:{port}: {what}",
                          hint="pick another --port (0 picks a free one; the default is 8766, "
                          "`overnight ui` uses 8765)") from exc
    return sock


def _require_token(app: Any, token: str) -> Any:
    """ASGI middleware: HTTP requests without ``Authorization: Bearer TOKEN`` get 401."""
    import hmac

    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await app(scope, receive, send)

    return guarded
