"""The dashboard's ASGI application: :func:`create_app` builds it on one open store.

Every page is a GET that renders :mod:`overnight.web.queries` data with a Jinja2 template;
``PAGE.json`` returns the same data. Actions (fork, rollback, verify, resume, cancel) are POSTs
carrying the CSRF token, and exist only without ``read_only``; resume and cancel are refused (409)
where the task's state leaves nothing to do (:func:`~overnight.web.queries.task_actions`). Security
rules (``overnight ui --help``):

* a token, when set, is required on every request (``Authorization: Bearer``, the
  ``overnight_ui_token`` cookie, or ``?token=`` once, which sets the cookie); without it: 401;
* on a loopback bind only ``Host: 127.0.0.1 / localhost / [::1]`` is served (DNS rebinding);
* templates autoescape everything, and show a bidi control character in stored text written out,
  never raw (:mod:`overnight.web.text`); the SVG charts are built by ElementTree (escaped); a strict
  Content-Security-Policy allows only the packaged script and stylesheet;
* artifacts are served as ``application/octet-stream`` attachments, never rendered; no request
  reads a file except the packaged static assets -- data comes only through the store API.
"""

from __future__ import annotations

import hmac
import json
import secrets
import shlex
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Callable
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from overnight import api
from overnight.units import human_bytes, human_duration
from overnight.errors import ConcurrencyError, ConfigError, NotFound, OvernightError, TaskNotFound, short_id
from overnight.store.base import Store
from overnight.web import queries
from overnight.web.svg import branch_graph, growth_chart, lane_colour
from overnight.web.text import BIDI, BIDI_REFS, bidi_visible, user_text

COOKIE = "overnight_ui_token"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else human_duration(seconds * 1000)


def _no_raw_bidi(value: Any) -> Any:
    """Every ``{{ }}`` output: a bidi control character the templates did not pass through
    :func:`user_text` (a hidden form value that must send the name back unchanged) is served as a
    character reference -- the same document, but never a raw control character in the bytes."""
    if not isinstance(value, str) or not BIDI.search(value):
        return value
    return Markup((value if isinstance(value, Markup) else str(escape(value))).translate(BIDI_REFS))


def _environment() -> Environment:
    root = resources.files("overnight.web") / "templates"
    env = Environment(loader=FileSystemLoader(str(root)), autoescape=select_autoescape(default=True,
                      default_for_string=True), trim_blocks=True, lstrip_blocks=True, finalize=_no_raw_bidi)
    env.filters.update(bytes=human_bytes, age=_age, short=short_id, lane_colour=lane_colour, u=user_text,
                       ua=bidi_visible,
                       # surrogatepass: a stored name with a lone surrogate still makes a link, not a 500
                       q=lambda v: quote(str(v).encode("utf-8", "surrogatepass"), safe=""),
                       shq=lambda v: shlex.quote(str(v)),
                       js=lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str))
    return env


class _Guard(BaseHTTPMiddleware):
    """Token (when set), Host (on a loopback bind) and response security headers."""

    def __init__(self, app: Any, *, token: str | None, loopback: bool) -> None:
        super().__init__(app)
        self.token, self.loopback = token, loopback

    def _authorised(self, request: Request) -> bool:
        if self.token is None:
            return True
        offered = [request.cookies.get(COOKIE, ""), request.query_params.get("token", "")]
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            offered.append(auth[7:].strip())
        return any(o and hmac.compare_digest(o.encode(), self.token.encode()) for o in offered)

    async def dispatch(self, request: Request, call_next: Callable) -> Response:
        host = (request.headers.get("host") or "").rsplit(":", 1)[0] if "]" not in (request.headers.get("host") or "") \
            else (request.headers.get("host") or "").split("]")[0] + "]"
        if self.loopback and host not in LOOPBACK_HOSTS:
            return PlainTextResponse("this dashboard serves 127.0.0.1 / localhost only", status_code=421)
        if not self._authorised(request):
            return PlainTextResponse("401: this dashboard needs its token: open the URL `overnight ui` printed "
                                     "(…/?token=…) or send Authorization: Bearer TOKEN", status_code=401)
        if self.token is not None and request.query_params.get("token") and request.method == "GET":
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            resp: Response = RedirectResponse(request.url.path + ("?" + urlencode(rest) if rest else ""), 303)
            resp.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        else:
            resp = await call_next(request)
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Referrer-Policy"] = "same-origin"  # (no-referrer makes Chrome send Origin: null on POSTs)
        resp.headers.setdefault("Cache-Control", "no-store")
        return resp


class Dashboard:
    """The views, on one open store. See :func:`create_app`."""

    def __init__(self, store: Store, *, read_only: bool, store_arg: str | None) -> None:
        self.store, self.read_only = store, read_only
        self.store_arg = store_arg
        self.cache = queries.HeadCache()
        self.csrf = secrets.token_urlsafe(24)
        self.env = _environment()

    # -- rendering --

    def cli(self, *words: str) -> str:
        """The equivalent CLI command, with ``--store`` when the dashboard was given one."""
        args = ["overnight", *words] + (["--store", self.store_arg] if self.store_arg else [])
        return " ".join(shlex.quote(a) for a in args)

    def html(self, template: str, data: dict[str, Any], request: Request, status: int = 200) -> Response:
        body = self.env.get_template(template).render(
            d=data, read_only=self.read_only, csrf=self.csrf, cli=self.cli, request=request,
            store_url=self.store.url)
        # a lone surrogate in stored text is shown escaped rather than failing the page
        return Response(body.encode("utf-8", "backslashreplace"), status, media_type="text/html; charset=utf-8")

    @staticmethod
    def json(data: Any, status: int = 200) -> Response:
        body = json.dumps(data, ensure_ascii=True, default=str, separators=(",", ":"))
        return Response(body, status, media_type="application/json")

    def error(self, request: Request, exc: OvernightError, as_json: bool) -> Response:
        status = 404 if isinstance(exc, NotFound) else 400 if isinstance(exc, ConfigError) else \
            409 if isinstance(exc, ConcurrencyError) else 500
        if isinstance(exc, TaskNotFound):
            api.suggest(exc, self.store)
        data = {"error": type(exc).__name__, "message": exc.message, "hint": getattr(exc, "hint", None)}
        return self.json(data, status) if as_json else self.html("error.html", data, request, status)

    def refused(self, request: Request, task_id: str, refusal: dict[str, str]) -> Response:
        """A 409 page for an action the task's state refuses (:func:`queries.task_actions`): what
        and why, what to do instead, and a link back to the task."""
        data = {"error": "Refused", "message": refusal["message"], "hint": refusal.get("hint"), "task_id": task_id}
        return self.html("error.html", data, request, 409)

    def page(self, template: str, build: Callable[[Request], dict[str, Any]]) -> Callable:
        async def view(request: Request) -> Response:
            as_json = request.url.path.endswith(".json")
            try:
                data = await _threaded(build, request)
            except OvernightError as exc:
                return self.error(request, exc, as_json)
            if as_json:
                return self.json(data)
            if request.headers.get("hx-request") and request.query_params.get("partial"):
                # htmx stops polling on status 286: nothing running, nothing to watch
                return self.html(template.replace(".html", "_partial.html"), data, request,
                                 200 if data.get("live", True) else 286)
            return self.html(template, data, request)
        return view

    # -- builders: request -> data (JSON twin == template context) --

    @staticmethod
    def _arg(request: Request, name: str) -> str:
        value = request.query_params.get(name)
        if value is None or value == "":
            raise ConfigError(f"missing query parameter {name!r}", hint=f"add ?{name}=...")
        return value

    def tasks(self, request: Request) -> dict[str, Any]:
        status = request.query_params.get("status") or None
        if status is not None and status not in queries.STATUSES:
            raise ConfigError(f"unknown status {status!r}", hint="one of " + ", ".join(queries.STATUSES))
        data = queries.tasks_page(self.store, self.cache, status=status, q=request.query_params.get("q"),
                                  page=self._int(request, "page"))
        data["live"] = any(data["counts"].get(k) for k in ("running", "queued"))
        return data

    @staticmethod
    def _int(request: Request, name: str, default: int = 1) -> int:
        try:
            return int(request.query_params.get(name, default))
        except ValueError:
            return default

    def task(self, request: Request) -> dict[str, Any]:
        data = queries.task_page(self.store, self.cache, self._arg(request, "id"), page=self._int(request, "page"),
                                 branch=request.query_params.get("branch") or None)
        data["commands"] = {"resume": self.cli("resume", data["task_id"]),
                            "submit": self.cli("resume", data["task_id"], "--submit"),
                            "cancel": "`" + self.cli("cancel", data["task_id"]) + "` (a worker's task: at its next "
                                      "step boundary), or Ctrl-C in the terminal running it",
                            "log": self.cli("log", data["task_id"]), "verify": self.cli("verify", data["task_id"])}
        if not request.url.path.endswith(".json"):
            data["graph_svg"] = branch_graph(data["graph"])
        return data

    def checkpoint(self, request: Request) -> dict[str, Any]:
        return queries.checkpoint_page(self.store, self._arg(request, "task"), self._arg(request, "id"))

    def drift(self, request: Request, check: bool = False) -> dict[str, Any]:
        return queries.drift_page(self.store, self._arg(request, "task"), check=check,
                                  branch=request.query_params.get("branch") or "main")

    def journal(self, request: Request) -> dict[str, Any]:
        return queries.journal_page(self.store, self._arg(request, "task"))

    def storage(self, request: Request) -> dict[str, Any]:
        data = queries.storage_page(self.store, gc=request.query_params.get("gc") == "1")
        data["gc_command"] = self.cli("gc")
        if not request.url.path.endswith(".json"):
            data["growth_svg"] = growth_chart(data["growth"])
        return data

    def rollback_confirm(self, request: Request) -> dict[str, Any]:
        """What a rollback would do, for the confirmation step (nothing is written)."""
        task_id, branch = self._arg(request, "task"), request.query_params.get("branch") or "main"
        to = api.resolve_checkpoint(self.store, task_id, self._arg(request, "to"))
        row = self.store.get_checkpoint(to)
        head = self.store.get_ref(task_id, branch)
        newer = sum(1 for r in self.store.list_checkpoints(task_id) if r.branch == branch and r.seq > row.seq) \
            if head else 0
        return {"task_id": task_id, "branch": branch, "to": to, "seq": row.seq, "event": row.event,
                "step": row.step, "created_at": row.created_at, "newer": newer,
                "command": self.cli("rollback", task_id, "--to", to, "--branch", branch)}

    # -- posts --

    async def _form(self, request: Request) -> dict[str, str]:
        form = await request.form()
        fields = {k: str(v) for k, v in form.items()}
        offered = fields.get("csrf") or request.headers.get("x-csrf-token") or ""
        if not hmac.compare_digest(offered.encode(), self.csrf.encode()):
            raise PermissionError("missing or wrong CSRF token")
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("host"):
            raise PermissionError(f"cross-origin POST from {origin}")
        return fields

    async def drift_check(self, request: Request) -> Response:
        as_json = request.url.path.endswith(".json")
        try:
            await self._form(request)
        except PermissionError as exc:
            return PlainTextResponse(f"403: {exc}", status_code=403)
        try:
            data = await _threaded(lambda r: self.drift(r, check=True), request)
        except OvernightError as exc:
            return self.error(request, exc, as_json)
        return self.json(data) if as_json else self.html("drift.html", data, request)

    async def action(self, request: Request) -> Response:
        try:
            f = await self._form(request)
        except PermissionError as exc:
            return PlainTextResponse(f"403: {exc}", status_code=403)
        kind = request.path_params["kind"]
        task_id = f.get("task", "")
        try:
            if kind == "fork":
                await _threaded(lambda _: api.fork(task_id, f.get("at", ""), f.get("branch", ""),
                                                   store=self.store), request)
                self.cache.clear()
                return RedirectResponse(f"/task?id={quote(task_id, safe='')}", 303)
            if kind == "rollback" and f.get("confirm") != "yes":
                return RedirectResponse("/rollback?" + urlencode({k: f.get(k, "") for k in ("task", "to", "branch")}),
                                        303)
            if kind == "rollback":
                await _threaded(lambda _: api.rollback(task_id, f.get("to", ""), branch=f.get("branch") or "main",
                                                       store=self.store), request)
                self.cache.clear()
                return RedirectResponse(f"/task?id={quote(task_id, safe='')}", 303)
            if kind in ("resume", "cancel"):  # refused as the task page says (the buttons it leaves out)
                gate = await _threaded(lambda _: queries.task_actions(self.store, self.cache, task_id), request)
                if gate[kind] is not None:
                    return self.refused(request, task_id, gate[kind])
            if kind == "resume":  # queued for the workers; nothing of the task is imported here
                await _threaded(lambda _: api.enqueue(task_id, store=self.store), request)
                self.cache.clear()
                return RedirectResponse(f"/task?id={quote(task_id, safe='')}", 303)
            if kind == "cancel":  # a task the workers run (its queue row); one run in a terminal: Ctrl-C there
                try:
                    await _threaded(lambda _: api.cancel(task_id, store=self.store), request)
                except TaskNotFound:  # its queue row went meanwhile (overnight rm)
                    gate = await _threaded(lambda _: queries.task_actions(self.store, self.cache, task_id), request)
                    if gate["cancel"] is None:
                        raise
                    return self.refused(request, task_id, gate["cancel"])
                self.cache.clear()
                return RedirectResponse(f"/task?id={quote(task_id, safe='')}", 303)
            if kind == "verify":
                report = await _threaded(lambda _: self.verify(task_id or None), request)
                return self.html("verified.html", verify_data(report, task_id, self.cli("verify", task_id)), request)
        except OvernightError as exc:
            return self.error(request, exc, False)
        return self.not_found(request)

    def verify(self, task_id: str | None) -> Any:
        """``api.verify`` of one task (None: every task), remembered: until a task's refs move, its
        task page labels each checkpoint with what this run found, and the tasks page counts it
        damaged when it found any checkpoint damaged (:meth:`queries.HeadCache.note_verify`). The
        refs are read before the run: one that moves meanwhile leaves nothing remembered."""
        from datetime import datetime, timezone

        ids = [task_id] if task_id else [t.task_id for t in self.store.list_tasks()]
        refs = {t: self.store.list_refs(t) for t in ids}
        report = api.verify(task_id, store=self.store)
        self.cache.clear()
        at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        for t, heads in report.heads.items():
            if t not in refs:
                continue
            mine = [p for p in report.problems if p.task_id == t]
            found: dict[str, str] = {}
            for p in mine:
                if p.checkpoint_id is not None:
                    found.setdefault(p.checkpoint_id, p.detail.splitlines()[0] if p.detail else p.check)
            self.cache.note_verify(t, refs[t], found, at=at,
                                   damaged=any(not p.dangling for p in mine) or any(v != "ok" for v in heads.values()))
        return report

    def not_found(self, request: Request, exc: Exception | None = None) -> Response:
        """A styled 404 naming the path that was not found (JSON for a ``.json`` path)."""
        data = {"error": "NotFound", "message": f"no page {request.url.path!r} in this dashboard",
                "hint": "the pages are / (tasks), /task?id=TASK_ID, /checkpoint, /drift, /journal and /storage"}
        if request.url.path.endswith(".json"):
            return self.json(data, 404)
        return self.html("error.html", data, request, 404)

    async def artifact(self, request: Request) -> Response:
        try:
            data, meta = await _threaded(lambda r: queries.artifact(
                self.store, self._arg(r, "task"), self._arg(r, "at"), self._arg(r, "name")), request)
        except OvernightError as exc:
            return self.error(request, exc, False)
        filename = "".join(c if c.isalnum() or c in "._-" else "_" for c in meta["name"])[-120:] or "artifact"
        # the UTF-8 name too, but only its last part, without controls, bidi overrides or separators
        shown = "".join(c for c in meta["name"].rsplit("/", 1)[-1] if c.isprintable() and c not in '\\"')[-120:]
        utf8 = quote((shown or filename).encode("utf-8", "replace"), safe="")
        return Response(data, media_type="application/octet-stream", headers={
            "Content-Disposition": f"attachment; filename=\"{filename}\"; filename*=UTF-8''{utf8}",
            "X-Content-Digest": meta["digest"]})


def verify_data(report: Any, task_id: str, command: str) -> dict[str, Any]:
    """The "Verify now" page's data from a :class:`~overnight.verify.fsck.VerifyReport`: its counts,
    and each problem as fields (task, checkpoint and its short id, check, detail, object, dangling)
    for the page's table -- never the objects' reprs."""
    problems = [{"task_id": p.task_id, "checkpoint_id": p.checkpoint_id,
                 "short_id": short_id(p.checkpoint_id) if p.checkpoint_id else None, "check": p.check,
                 "detail": p.detail, "object": p.object, "object_short": short_id(p.object) if p.object else None,
                 "dangling": p.dangling} for p in report.problems]
    return {"task_id": task_id, "ok": report.ok, "checkpoints": report.checkpoints,
            "checkpoints_invalid": report.checkpoints_invalid, "objects_checked": report.objects_checked,
            "heads": report.heads, "seconds": round(report.seconds, 3), "problems": problems, "command": command}


async def _threaded(fn: Callable[[Request], Any], request: Request) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, request)


def create_app(store: Store | str | None = None, *, read_only: bool = False, token: str | None = None,
               loopback: bool = True) -> Starlette:
    """The dashboard as an ASGI app on ``store`` (a Store, a URL, or None for the default store),
    opened once for the app's lifetime (``api.reading``: archived history read through).

    Args:
        read_only: no action routes and no action forms (pages and JSON twins only).
        token: when set, every request must carry it (see the module docstring); else 401.
        loopback: serve only ``Host`` names of the loopback interface (the server binds there).

    Raises:
        ConfigError: the store does not exist (it is never created here).
    """
    opened = api.reading(store if store is not None else None)
    s = opened.__enter__()
    store_arg = store if isinstance(store, str) else None
    d = Dashboard(s, read_only=read_only, store_arg=store_arg)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        try:
            yield
        finally:
            opened.__exit__(None, None, None)

    routes: list[Any] = []
    for path, template, build in (("/", "tasks.html", d.tasks),
                                  ("/task", "task.html", d.task), ("/checkpoint", "checkpoint.html", d.checkpoint),
                                  ("/drift", "drift.html", d.drift), ("/journal", "journal.html", d.journal),
                                  ("/storage", "storage.html", d.storage)):
        routes.append(Route(path, d.page(template, build)))
        routes.append(Route(("/tasks" if path == "/" else path) + ".json", d.page(template, build)))
    routes.append(Route("/tasks", d.page("tasks.html", d.tasks)))
    routes.append(Route("/drift", d.drift_check, methods=["POST"]))
    routes.append(Route("/drift.json", d.drift_check, methods=["POST"]))
    routes.append(Route("/artifact", d.artifact))
    if not read_only:
        routes.append(Route("/rollback", d.page("rollback.html", d.rollback_confirm)))
        routes.append(Route("/actions/{kind}", d.action, methods=["POST"]))
    else:  # said, not a bare 404: the action exists, this dashboard does not offer it
        async def refused(request: Request) -> Response:
            return PlainTextResponse("403: this dashboard is read-only (overnight ui --read-only): "
                                     "no action runs from it; the CLI runs them", status_code=403)

        routes.append(Route("/rollback", refused))
        routes.append(Route("/actions/{kind}", refused, methods=["POST"]))
    routes.append(Mount("/static", StaticFiles(directory=str(resources.files("overnight.web") / "static")),
                        name="static"))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: d.not_found},
                    middleware=[Middleware(_Guard, token=token, loopback=loopback)])
    app.state.dashboard = d
    return app
