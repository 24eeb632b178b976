"""Round 36: what a new user found in the MCP server and the dashboard.

1. MCP tools given no ``branch`` act on the branch ``task_resume`` made current -- ``task_rollback``
   too (it rolled back ``main``), and ``task_fork`` without ``at`` forks that branch's head.
2. A task running in a terminal (``overnight run`` holding its lease): the task page offers no
   resume (it says the task is running, as ``overnight ls`` does), and a posted resume is refused
   (409), queueing nothing.
3. ``overnight mcp --http --port 0`` picks a free port and prints the URL it serves.
4. The storage page's dedup compares like with like: the artifact bytes stored against the bytes
   every checkpoint's artifacts would take whole (never the whole store file).

Real processes throughout: ``python -m overnight mcp`` over stdio / HTTP, ``overnight run`` in
the background, ``overnight ui`` over a socket.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("mcp")


from _procs import CLI, env  # noqa: E402
from _ui import UiServer, make_site, run_cli, store_url  # noqa: E402
from test_mcp import Agent, repo, session, start_task_over_http  # noqa: E402,F401 - the git repository fixture and stdio client

from overnight.store import open_store  # noqa: E402


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# -- 1. MCP: no branch means the current branch, for every tool ---------------------------------------


def test_rollback_and_fork_without_a_branch_act_on_the_branch_task_resume_made_current(repo: Path,  # noqa: F811 - the fixture
                                                                                         tmp_path: Path) -> None:
    store = tmp_path / "s.db"

    async def body(a: Agent) -> None:
        tools = {t.name: t for t in (await a.session.list_tools()).tools}
        for name, tool in tools.items():  # no tool says "main" is the default branch in its schema
            prop = tool.input_schema.get("properties", {}).get("branch")
            if prop is not None and name != "task_fork":  # task_fork's branch is the new one's name
                assert prop.get("default") in (None,), (name, prop)
        _, started = await a.call("task_start", {"goal": "Try a parser rewrite", "plan": ["a", "b"]})
        tid = started["task_id"]
        _, log = await a.call("task_log", {"task_id": tid})
        seq0 = [c["checkpoint_id"] for c in log["checkpoints"] if c["seq"] == 0][0]
        await a.call("task_checkpoint", {"task_id": tid, "done": ["a"]})
        await a.call("task_fork", {"task_id": tid, "branch": "exp"})
        await a.call("task_resume", {"task_id": tid, "branch": "exp"})
        assert json.loads((repo / ".overnight" / "current-task").read_text())["branch"] == "exp"
        _, c = await a.call("task_checkpoint", {"task_id": tid, "done": ["b"]})
        assert c["branch"] == "exp", c
        _, st = await a.call("task_status", {"task_id": tid, "branch": "main"})
        main_head = st["control"]["checkpoint_id"]

        text, rb = await a.call("task_rollback", {"task_id": tid, "to": seq0})
        assert rb["branch"] == "exp" and f"{tid}/exp rolled back" in text, (text, rb)
        _, st = await a.call("task_status", {"task_id": tid, "branch": "main"})
        assert st["control"]["checkpoint_id"] == main_head, "main was rolled back"
        _, st = await a.call("task_status", {"task_id": tid})
        assert st["control"]["branch"] == "exp" and st["control"]["checkpoint_id"] == rb["checkpoint_id"], st
        assert st["control"]["done"] == [] and st["control"]["todo"] == ["a", "b"], st["control"]

        # task_fork without `at` forks the current branch's head (exp, rolled back), not main's
        await a.call("task_fork", {"task_id": tid, "branch": "exp2"})
        _, st = await a.call("task_status", {"task_id": tid, "branch": "exp2"})
        assert st["control"]["done"] == [] and st["control"]["todo"] == ["a", "b"], st["control"]  # main: done a
        # naming a branch still wins
        _, rb_main = await a.call("task_rollback", {"task_id": tid, "to": seq0, "branch": "main"})
        assert rb_main["branch"] == "main", rb_main

    asyncio.run(session(repo, store, body))


# -- 2. the dashboard and a task running in a terminal --------------------------------------------------


def test_a_task_running_in_a_terminal_offers_no_resume_and_a_posted_resume_is_refused(tmp_path: Path) -> None:
    site = make_site(tmp_path / "live", run=False)
    run = subprocess.Popen([*CLI, "run", "ui_task.py", "--store", store_url(site)], cwd=site,
                           env={**env(), "UI_PARTS": "60", "UI_STEP_S": "0.5"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def running() -> str | None:
            r = run_cli(site, "ls", "--json")
            rows = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else []
            return next((x["status"] for x in rows if x["task_id"] == "report" and
                         x["status"].startswith("running")), None)

        said = wait_for(running, 120, "the run to hold its lease")
        assert said.startswith("running (pid "), said
        busy = run_cli(site, "resume", "report")  # what the offered command would do
        assert busy.returncode == 4 and "busy" in busy.stderr, (busy.returncode, busy.stderr)
        with UiServer(site) as srv:
            page = httpx.get(srv.base + "/task", params={"id": "report"})
            assert page.status_code == 200, page.text[:400]
            text = html.unescape(page.text)
            assert 'class="st st-running"' in text, "the page does not say it is running"
            assert 'id="resume-workers"' not in text, "a resume button for a running task"
            assert "Or resume in a terminal" not in text and "overnight resume report --store" not in text, text
            refused = " ".join(re.sub(r"<[^>]+>", " ", text.split('id="resume-refused"', 1)[1]
                                      .split("</p>", 1)[0]).split())
            assert "is running (pid " in refused and "Ctrl-C" in refused, refused
            actions = httpx.get(srv.base + "/task.json", params={"id": "report"}).json()["actions"]
            assert actions["resume"] is not None and "running (pid" in actions["resume"]["message"], actions
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            r = httpx.post(srv.base + "/actions/resume", data={"csrf": csrf, "task": "report"})
            assert r.status_code == 409, (r.status_code, r.text[:400])
            body = html.unescape(r.text)
            assert "is running (pid " in body and "Ctrl-C" in body, body[:1000]
            from overnight.store.queue_open import queue_for

            with open_store(store_url(site)) as s:
                assert queue_for(s).get("report") is None, "the running task was queued"
    finally:
        run.kill()
        run.wait()


# -- 3. mcp --http --port 0 ------------------------------------------------------------------------


def test_mcp_http_port_0_picks_a_free_port_and_prints_it(repo: Path, tmp_path: Path) -> None:  # noqa: F811 - the fixture
    import httpx2

    log = tmp_path / "mcp.log"
    with open(log, "wb") as errf:
        proc = subprocess.Popen([*CLI, "mcp", "--store", f"sqlite://{tmp_path / 'h.db'}", "--http", "--port", "0",
                                 "--token", "s3cret"], cwd=repo, env=env(), stdout=subprocess.DEVNULL, stderr=errf)
    try:
        m = wait_for(lambda: re.search(r"streamable HTTP on (http://127\.0\.0\.1:(\d+)/mcp)",
                                       log.read_text(errors="replace")) or (proc.poll() is not None and "exited"),
                     60, "the URL")
        assert m != "exited", log.read_text()
        url, port = m.group(1), int(m.group(2))
        assert port != 0
        r = wait_for(lambda: _post(httpx2, url), 30, "the server to listen")
        assert r.status_code == 401

        assert start_task_over_http(url, "s3cret", "Served on a free port").startswith("code.served-on-a-free-port.")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _post(httpx2: Any, url: str) -> Any:
    try:
        return httpx2.post(url, json={}, timeout=5)
    except httpx2.TransportError:
        return None


# -- 4. the storage page's dedup ---------------------------------------------------------------------


def test_storage_dedup_compares_artifact_bytes_stored_with_artifacts_kept_whole(tmp_path: Path) -> None:
    site = make_site(tmp_path / "small", parts=4)
    with UiServer(site) as srv:
        data = httpx.get(srv.base + "/storage.json").json()
        page = html.unescape(httpx.get(srv.base + "/storage").text)
    d = data["dedup"]
    # every checkpoint's artifacts, whole: the report grows part by part, so later checkpoints hold more
    assert d["checkpoints"] == d["of"] > 4 and d["artifacts"] >= 5, d
    assert 0 < d["stored_bytes"] < d["whole_bytes"], d
    assert d["stored_bytes"] < data["store_bytes"], (d, data["store_bytes"])  # artifacts only, not the file
    assert data["dedup_ratio"] == round(d["whole_bytes"] / d["stored_bytes"], 2) and data["dedup_ratio"] > 1, data
    dd = " ".join(re.sub(r"<[^>]+>", " ", page.split('id="artifact-dedup">', 1)[1].split("</dd>", 1)[0]).split())
    assert dd.startswith(f"{data['dedup_ratio']}×") and "stored" in dd and "whole" in dd, dd
