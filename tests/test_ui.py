"""``overnight ui`` over HTTP: JSON twins carry the page's data, the security rules hold (token on
a non-loopback bind, Host check, CSRF, read-only), artifacts download as attachments.

Every test talks to a real ``overnight ui`` process over a socket (httpx), on a store a real
``overnight run`` wrote. The browser scenarios are in ``test_ui_browser.py``.
"""

from __future__ import annotations

import re

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from _ui import UiServer, make_site, run_cli, store_url  # noqa: E402

from overnight import api  # noqa: E402
from overnight.store import open_store  # noqa: E402


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("ui-site"))


@pytest.fixture(scope="module")
def server(site):
    with UiServer(site) as srv:
        yield srv


def test_tasks_json_twin_has_the_rows_the_page_shows(server, site):
    page = httpx.get(server.base + "/")
    data = httpx.get(server.base + "/tasks.json").json()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    shown = re.findall(r'data-task="([^"]+)"', page.text)
    assert shown == [t["task_id"] for t in data["tasks"]] == ["report"]
    row = data["tasks"][0]
    summary = api.ls(store=store_url(site))[0]
    assert (row["done"], row["total"], row["checkpoints"]) == (summary.done, summary.total, summary.checkpoints)
    assert row["status"] == "complete" and row["level"] == "durable"
    assert f'value="{row["done"]}"' in page.text  # the progress bar
    # filter by status and search by id
    assert httpx.get(server.base + "/tasks.json?status=running").json()["tasks"] == []
    assert httpx.get(server.base + "/tasks.json?q=REP").json()["tasks"][0]["task_id"] == "report"
    assert httpx.get(server.base + "/tasks.json?q=nothing-like-it").json()["tasks"] == []
    assert httpx.get(server.base + "/tasks.json?status=bogus").status_code == 400


def test_task_json_twin_matches_the_timeline(server, site):
    data = httpx.get(server.base + "/task.json", params={"id": "report"}).json()
    page = httpx.get(server.base + "/task", params={"id": "report"}).text
    shown = re.findall(r'data-checkpoint="([^"]+)"', page)
    assert shown == [e["checkpoint_id"] for e in data["timeline"]]
    report = api.show("report", store=store_url(site))
    assert data["checkpoints"] == len(report.chain) == len(shown)
    assert [e["seq"] for e in data["timeline"]] == sorted((c.seq for c in report.chain), reverse=True)
    steps = [e for e in data["timeline"] if e["event"] == "step" and e["step"].startswith("part")]
    # nothing damaged; "verified" only where artifact bytes were hashed (the head), else "record verified"
    assert steps and all(e["integrity"] in ("verified", "record verified") and e["tokens_in"] > 0 for e in steps)
    head = data["branches"]["main"]["head"]
    assert {e["checkpoint_id"] for e in data["timeline"] if e["integrity"] == "verified"} == {head}
    assert sum(e["tokens_in"] for e in data["timeline"]) == report.usage["tokens_in"]
    assert (data["tokens_in"], data["tokens_out"]) == (report.usage["tokens_in"], report.usage["tokens_out"])
    assert "<svg" in page and 'class="head"' in page  # the branch graph, drawn on the server
    missing = httpx.get(server.base + "/task.json", params={"id": "no-such-task"})
    assert missing.status_code == 404 and missing.json()["error"] == "TaskNotFound"


def test_checkpoint_json_has_diff_and_artifacts(server, site):
    tl = httpx.get(server.base + "/task.json", params={"id": "report"}).json()["timeline"]
    second = next(e for e in tl if e["step"] == "part[i=1]")
    cp = httpx.get(server.base + "/checkpoint.json", params={"task": "report", "id": second["checkpoint_id"]}).json()
    assert cp["integrity"] == "verified"
    changed = {a["name"]: a for a in cp["diff"]["artifacts"]}
    assert "report.md" in changed and "+## Part" in changed["report.md"]["unified"]
    assert {"path": "parts", "change": "changed"}.items() <= next(
        c for c in cp["diff"]["state"] if c["path"] == "parts").items()
    names = {a["name"] for a in cp["artifacts"]}
    assert "report.md" in names
    body = httpx.get(server.base + "/artifact",
                     params={"task": "report", "at": second["checkpoint_id"], "name": "report.md"})
    assert body.status_code == 200
    assert body.headers["content-type"] == "application/octet-stream"
    assert body.headers["content-disposition"].startswith("attachment;")
    assert body.content == api.cat("report", "report.md", store=store_url(site), at=second["checkpoint_id"])


def test_security_headers_and_host_check(server):
    r = httpx.get(server.base + "/")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    # DNS rebinding: a loopback server answers only to loopback names
    assert httpx.get(server.base + "/", headers={"Host": "evil.example:8765"}).status_code == 421


def test_posts_need_the_csrf_token(server):
    tl = httpx.get(server.base + "/task.json", params={"id": "report"}).json()["timeline"]
    r = httpx.post(server.base + "/actions/fork", data={"task": "report", "at": tl[-1]["checkpoint_id"],
                                                        "branch": "csrf-probe"})
    assert r.status_code == 403
    page = httpx.get(server.base + "/task", params={"id": "report"}).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    r = httpx.post(server.base + "/actions/fork", headers={"Origin": "http://evil.example"},
                   data={"csrf": csrf, "task": "report", "at": tl[-1]["checkpoint_id"], "branch": "csrf-probe"})
    assert r.status_code == 403
    assert "csrf-probe" not in httpx.get(server.base + "/task.json", params={"id": "report"}).json()["branches"]


def test_non_loopback_bind_requires_the_token(site):
    with UiServer(site, "--host", "0.0.0.0") as srv:
        assert srv.token, "a token is generated and printed when none is given"
        assert srv.url.startswith("http://127.0.0.1:"), srv.url  # a URL to open, not the wildcard bind
        base = srv.base.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(base + "/").status_code == 401
        assert httpx.get(base + "/tasks.json").status_code == 401
        assert httpx.get(base + "/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.get(base + "/tasks.json", headers={"Authorization": f"Bearer {srv.token}"})
        assert ok.status_code == 200 and ok.json()["tasks"][0]["task_id"] == "report"
        with httpx.Client(follow_redirects=True) as client:  # ?token= once sets a cookie, then the URL is clean
            first = client.get(base + f"/?token={srv.token}")
            assert first.status_code == 200 and "overnight_ui_token" in client.cookies
            assert first.url.query == b""  # the token left the address bar
            assert client.get(base + "/tasks.json").status_code == 200
    with UiServer(site, "--host", "0.0.0.0", "--token", "given-token") as srv:
        assert srv.token == "given-token"
        base = srv.base.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(base + "/").status_code == 401
        assert httpx.get(base + "/", headers={"Authorization": "Bearer given-token"}).status_code == 200


def test_read_only_serves_no_action(site):
    with UiServer(site, "--read-only") as srv:
        page = httpx.get(srv.base + "/task", params={"id": "report"}).text
        assert "/actions/" not in page and "Fork" not in page and "Rollback" not in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', httpx.get(srv.base + "/drift?task=report").text).group(1)
        tl = httpx.get(srv.base + "/task.json", params={"id": "report"}).json()["timeline"]
        r = httpx.post(srv.base + "/actions/fork", data={"csrf": csrf, "task": "report",
                                                         "at": tl[-1]["checkpoint_id"], "branch": "nope"})
        assert r.status_code == 403 and "read-only" in r.text  # refused, and said why
        assert api.show("report", store=store_url(site)).branches.keys() == {"main"}  # nothing was forked
        assert httpx.get(srv.base + "/rollback", params={"task": "report"}).status_code == 403
    # Ctrl-C (SIGINT) stopped it within 10 s (UiServer.stop kills it, -9, otherwise); uvicorn
    # re-raises the signal after a graceful shutdown, hence 130 (128 + SIGINT) on newer versions
    assert srv.proc.returncode in (0, 130)


def test_fork_post_makes_a_branch_overnight_log_shows(tmp_path):
    site = make_site(tmp_path / "s", parts=3)
    with UiServer(site) as srv:
        page = httpx.get(srv.base + "/task", params={"id": "report"}).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        tl = httpx.get(srv.base + "/task.json", params={"id": "report"}).json()["timeline"]
        r = httpx.post(srv.base + "/actions/fork", data={"csrf": csrf, "task": "report",
                                                         "at": tl[2]["checkpoint_id"], "branch": "try-b"})
        assert r.status_code == 303
        assert "try-b" in httpx.get(srv.base + "/task.json", params={"id": "report"}).json()["branches"]
    log = run_cli(site, "log", "report")
    assert log.returncode == 0 and "try-b" in log.stdout


def test_ui_refuses_a_store_that_does_not_exist(tmp_path):
    proc = run_cli(tmp_path, "ui", "--port", "0", timeout=30)
    assert proc.returncode == 2 and "no store" in proc.stderr


def test_missing_extra_names_it(tmp_path):
    """Without the ui extra, ``overnight ui`` says which extra to install (a child whose import
    of starlette fails, as on an install without it)."""
    import subprocess
    import sys

    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "starlette").mkdir()
    (blocker / "starlette" / "__init__.py").write_text("raise ImportError('No module named starlette')\n")
    proc = subprocess.run([sys.executable, "-m", "overnight", "ui", "--port", "0"], cwd=tmp_path,
                          env={"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "pip install 'overnight[ui]'" in proc.stderr


def _lease(holder: str, expires_in_ms: int, holder_id: str = "h1"):
    from overnight.store.base import Lease
    from overnight.store.leases import now_ms

    return Lease("t", "main", holder_id, holder, 3, now_ms() + expires_in_ms)


def test_status_is_derived_in_one_place(tmp_path):
    """The rules of ``derive_status``, with real holders: this process (alive) and a process that
    ran and exited (provably gone)."""
    import dataclasses
    import subprocess
    import sys

    from overnight.store.leases import Holder
    from overnight.web.queries import derive_status

    live = Holder.current()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = dataclasses.replace(Holder.current(), pid=child.pid, id="gone")
    base = dict(verified=True, problem=None, done=3, todo=2, steps_committed=3, last_age_s=3600.0)
    assert derive_status(**{**base, "verified": False, "problem": "DigestMismatch"}, leases=None).name == "failed"
    assert derive_status(**{**base, "todo": 0}, leases=None).name == "complete"
    # no lease to read: the newest checkpoint's age decides
    assert derive_status(**{**base, "last_age_s": 5.0}, leases=None).name == "running"
    assert derive_status(**base, leases=None).name == "interrupted"
    assert derive_status(**{**base, "done": 0, "steps_committed": 0}, leases=None).name == "queued"
    # leases: a live holder runs it (whatever the age), a gone or expired one stalled it
    running = derive_status(**base, leases=[_lease(live.to_json(), 30_000)])
    assert running.name == "running" and running.holder == live.describe() and running.source == "lease"
    assert derive_status(**base, leases=[_lease(gone.to_json(), 30_000)]).name == "stalled"
    assert derive_status(**base, leases=[_lease(live.to_json(), -1_000)]).name == "stalled"
    released = _lease("{}", -1, holder_id="")
    assert derive_status(**{**base, "last_age_s": 5.0}, leases=[released]).name == "interrupted"


def test_not_found_pages_are_styled_and_suggest(server):
    """An unknown path and an unknown task are styled pages naming what was not found (JSON for
    a ``.json`` path); a mistyped task id gets "did you mean"."""
    page = httpx.get(server.base + "/no-such-page")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "/static/style.css" in page.text and "/no-such-page" in page.text
    twin = httpx.get(server.base + "/no-such-page.json")
    assert twin.status_code == 404 and twin.json()["error"] == "NotFound"
    task = httpx.get(server.base + "/task", params={"id": "reprot"})
    assert task.status_code == 404 and "/static/style.css" in task.text
    assert "reprot" in task.text and "did you mean report?" in task.text


def test_rollback_asks_first_and_the_tasks_page_counts_damage(tmp_path):
    """Rollback is two steps: the form opens a confirmation page (nothing written) whose POST
    rolls back. The tasks page counts damaged tasks and does not poll when nothing runs (and a
    poll answers 286, htmx's "stop polling"). A checkpoint page has one "Artifacts" section and
    no empty "todo:"."""
    site = make_site(tmp_path / "s", parts=3)
    with UiServer(site) as srv:
        tasks = httpx.get(srv.base + "/")
        assert "damaged 0" in tasks.text and 'hx-trigger="every' not in tasks.text
        assert httpx.get(srv.base + "/tasks.json").json()["damaged"] == 0
        poll = httpx.get(srv.base + "/?partial=1", headers={"HX-Request": "true"})
        assert poll.status_code == 286
        page = httpx.get(srv.base + "/task", params={"id": "report"}).text
        assert 'action="/actions/rollback"' not in page and 'action="/rollback"' in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
        data = httpx.get(srv.base + "/task.json", params={"id": "report"}).json()
        head, old = data["timeline"][0]["checkpoint_id"], data["timeline"][2]["checkpoint_id"]
        ask = httpx.get(srv.base + "/rollback", params={"task": "report", "to": old, "branch": "main"})
        assert ask.status_code == 200 and "Yes, roll back main" in ask.text and "overnight rollback report" in ask.text
        unconfirmed = httpx.post(srv.base + "/actions/rollback",
                                 data={"csrf": csrf, "task": "report", "to": old, "branch": "main"})
        assert unconfirmed.status_code == 303 and unconfirmed.headers["location"].startswith("/rollback?")
        assert api.show("report", store=store_url(site)).branches["main"] == head  # nothing happened yet
        done = httpx.post(srv.base + "/actions/rollback",
                          data={"csrf": csrf, "task": "report", "to": old, "branch": "main", "confirm": "yes"})
        assert done.status_code == 303 and api.show("report", store=store_url(site)).branches["main"] != head
        for e in httpx.get(srv.base + "/task.json", params={"id": "report"}).json()["timeline"]:
            cp = httpx.get(srv.base + "/checkpoint", params={"task": "report", "id": e["checkpoint_id"]}).text
            assert cp.count(">Artifacts<") == 1 and not re.search(r"todo: *</p>", cp), e["event"]


@pytest.mark.slow
def test_resume_and_cancel_from_the_ui_go_through_the_workers_queue(tmp_path):
    """The task page's resume queues the stored task for the workers (its verified head's code
    location and params; the dashboard imports nothing) and cancel cancels its queue row; a worker
    then finishes it. The equivalent commands are shown."""
    site = make_site(tmp_path / "s", parts=3, run=False)
    stopped = run_cli(site, "run", "ui_task.py", "--max-steps", "2", env_extra={"UI_PARTS": "3", "UI_STEP_S": "0"})
    assert stopped.returncode == 75, stopped.stderr
    with UiServer(site) as srv:
        page = httpx.get(srv.base + "/task", params={"id": "report"}).text
        # not submitted yet: its cancel is refused, with Ctrl-C for a run in a terminal
        assert "overnight resume report --submit" in page and "Ctrl-C" in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)

        def act(kind: str) -> str:
            r = httpx.post(srv.base + f"/actions/{kind}", data={"csrf": csrf, "task": "report"})
            assert r.status_code == 303, r.text
            with open_store(store_url(site)) as s:
                return api.task_state("report", store=s, complete=False)

        assert act("resume").startswith("queued")
        assert "overnight cancel report" in httpx.get(srv.base + "/task", params={"id": "report"}).text
        assert act("cancel") == "cancelled"
        assert act("resume").startswith("queued")  # a cancelled row is queued again
    worker = run_cli(site, "worker", "--idle-exit", "2", env_extra={"UI_PARTS": "3", "UI_STEP_S": "0"})
    assert worker.returncode == 0, worker.stderr
    assert [t.status for t in api.ls(store=store_url(site))] == ["complete"]


def test_hostile_artifact_names_make_links_and_safe_downloads(tmp_path):
    """An artifact name with a lone surrogate, a bidi override or a path is stored as given: the
    checkpoint page still renders (200, not 500), and a download's file name is its last part,
    printable and without separators, in both forms of the header."""
    import overnight

    root = tmp_path / "s"
    root.mkdir()
    task = overnight.Task("hostile", goal="odd names")

    @task.step
    def write(ctx):
        ctx.write_text("odd\ud800name.txt", "surrogate")
        ctx.write_text("notes/\u202etxt.exe", "bidi")
        ctx.write_text("../../etc/passwd", "path")

    overnight.run(task, store_url(root))
    with UiServer(root) as srv:
        head = httpx.get(srv.base + "/task.json", params={"id": "hostile"}).json()["timeline"][0]["checkpoint_id"]
        page = httpx.get(srv.base + "/checkpoint", params={"task": "hostile", "id": head})
        assert page.status_code == 200, page.text[:500]
        for name in ("notes/\u202etxt.exe", "../../etc/passwd"):
            got = httpx.get(srv.base + "/artifact", params={"task": "hostile", "at": head, "name": name})
            assert got.status_code == 200
            disposition = got.headers["content-disposition"]
            assert "%E2%80%AE" not in disposition and "%2F" not in disposition and ".." not in disposition.split("''")[1]
