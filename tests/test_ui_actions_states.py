"""The task page's actions follow the task's state, and user text cannot reorder a page.

* Cancel acts on a queue row: a task run in a terminal (no queue row) gets no Cancel button, and a
  cancel posted anyway is refused with what to do instead (Ctrl-C in its terminal), never a 404.
* Resume on the workers on a complete task: no button, and a post is refused (nothing is queued),
  as a plain ``overnight resume`` of it runs nothing.
* Bidirectional control characters (U+202E, U+2066-U+2069, U+200E/F, ...) in a goal, a step key or
  a branch name are shown escaped (``\\u202e`` in a visible span, inside ``<bdi>``), never served raw.

Every test talks to a real ``overnight ui`` process over a socket (httpx), as ``test_ui.py`` does.
"""

from __future__ import annotations

import html
import re

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from _ui import UiServer, make_site, run_cli, store_url  # noqa: E402

import overnight  # noqa: E402
from overnight import api  # noqa: E402
from overnight.store import open_store  # noqa: E402

RLO = "\u202e"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"

DONE_TASK_FILE = '''
import overnight

task = overnight.Task("done", goal="finished in a terminal")

@task.step
def only(ctx):
    ctx.state["x"] = 1
'''


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def _queue_row(root, task_id: str):
    from overnight.store.queue_open import queue_for

    with open_store(store_url(root)) as s:
        return queue_for(s).get(task_id)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A store with: ``report`` (ui_task.py, stopped after 2 steps in a terminal: no queue row),
    ``done`` (complete, in a terminal) and ``bidi`` (bidi controls in its goal, a step key and a
    branch name)."""
    root = make_site(tmp_path_factory.mktemp("ui-actions"), parts=3, run=False)
    stopped = run_cli(root, "run", "ui_task.py", "--max-steps", "2", env_extra={"UI_PARTS": "3"})
    assert stopped.returncode == 75, stopped.stderr

    (root / "done_task.py").write_text(DONE_TASK_FILE)  # a code location, so the workers could run it
    finished = run_cli(root, "run", "done_task.py")
    assert finished.returncode == 0, finished.stderr

    bidi = overnight.Task("bidi", goal=f"safe {RLO}txt.exe{BIDI} tail")

    @bidi.step
    def plan(ctx):
        ctx.add_step("part", name=f"a{RLO}b", x=1)

    @bidi.step(planned=False)
    def part(ctx, x):
        ctx.state["x"] = x

    overnight.run(bidi, store_url(root))
    first = min(api.log("bidi", store=store_url(root)), key=lambda e: e.row.seq).row.checkpoint_id
    api.fork("bidi", first, f"try{RLO}gnp", store=store_url(root))
    return root


@pytest.fixture(scope="module")
def server(site):
    with UiServer(site) as srv:
        yield srv


def test_cancel_of_a_terminal_run_is_refused_with_what_to_do_not_a_404(server, site):
    """No queue row: no Cancel button (the Ctrl-C advice instead); a posted cancel is a 409 page
    saying the task is not on the workers' queue and to press Ctrl-C in its terminal."""
    page = httpx.get(server.base + "/task", params={"id": "report"}).text
    r = httpx.post(server.base + "/actions/cancel", data={"csrf": _csrf(page), "task": "report"})
    assert r.status_code == 409, (r.status_code, r.text[:400])
    assert "not on the workers' queue" in html.unescape(r.text) and "Ctrl-C" in r.text
    assert _queue_row(site, "report") is None
    assert 'id="cancel-task"' not in page
    assert "Ctrl-C" in page and "overnight cancel report" not in page  # (which would refuse too)


def test_resume_of_a_complete_task_is_refused_and_queues_nothing(server, site):
    """A complete task: no "Resume on the workers" button, and a post is refused (409) with the
    reason; no queue row is made."""
    page = httpx.get(server.base + "/task", params={"id": "done"}).text
    r = httpx.post(server.base + "/actions/resume", data={"csrf": _csrf(page), "task": "done"})
    assert r.status_code == 409, (r.status_code, r.text[:400])
    assert "complete" in r.text and "nothing to resume" in r.text
    assert _queue_row(site, "done") is None
    assert 'id="resume-workers"' not in page
    assert "complete" in page


def test_an_interrupted_task_offers_resume_and_cancel_once_queued(server, site):
    """An interrupted task shows "Resume on the workers"; once its queue row is queued, Cancel
    shows and cancels it (303, as before)."""
    page = httpx.get(server.base + "/task", params={"id": "report"}).text
    assert 'id="resume-workers"' in page
    # never submitted: Cancel is refused, and the advice is not `overnight cancel` (which would refuse too)
    refused = page.split('id="cancel-refused"', 1)[1].split("</p>", 1)[0]
    assert "Ctrl-C" in refused and "overnight cancel report" not in refused, refused
    r = httpx.post(server.base + "/actions/resume", data={"csrf": _csrf(page), "task": "report"})
    assert r.status_code == 303, r.text[:400]
    page = httpx.get(server.base + "/task", params={"id": "report"}).text
    assert 'id="cancel-task"' in page
    r = httpx.post(server.base + "/actions/cancel", data={"csrf": _csrf(page), "task": "report"})
    assert r.status_code == 303, r.text[:400]
    assert _queue_row(site, "report").status == "cancelled"
    page = httpx.get(server.base + "/task", params={"id": "report"}).text
    assert 'id="cancel-task"' not in page  # a cancelled row has nothing left to cancel
    r = httpx.post(server.base + "/actions/cancel", data={"csrf": _csrf(page), "task": "report"})
    assert r.status_code == 409 and "already cancelled" in r.text


@pytest.mark.parametrize("path", ["/", "/task?id=bidi", "/task?id=bidi&branch=main"])
def test_bidi_controls_in_user_text_are_never_served_raw(server, path):
    """A goal, a step key and a branch name with bidi controls: no raw control character in the
    served HTML; each shows as a visible escape inside an isolating <bdi>."""
    r = httpx.get(server.base + path)
    assert r.status_code == 200
    raw = [f"U+{ord(c):04X}" for c in BIDI if c in r.text]
    assert not raw, raw
    assert re.search(r"<bdi>safe <span class=\"bidi-ctl\"[^>]*>\\u202e</span>txt\.exe", r.text), r.text[:2000]
    if path.startswith("/task"):
        assert "\\u202e" in r.text.split("Timeline", 1)[1]  # the step key a\u202eb in the timeline
        assert "try<span class=\"bidi-ctl\"" in r.text  # the branch name
    if path == "/task?id=bidi":
        assert ">try\\u202egnp</text>" in r.text  # its label in the branch graph (SVG), written out


def test_bidi_branch_still_round_trips_through_a_form(server, site):
    """The rollback form of a bidi-named branch still names that branch (the hidden value is the
    name itself, sent as a character reference), so the confirmation page finds it."""
    page = httpx.get(server.base + "/task", params={"id": "bidi"}).text
    assert "try&#x202e;gnp" in page
    tl = httpx.get(server.base + "/task.json", params={"id": "bidi"}).json()["timeline"]
    row = next(e for e in tl if e["branch"] == f"try{RLO}gnp")
    r = httpx.get(server.base + "/rollback", params={"task": "bidi", "to": row["checkpoint_id"],
                                                     "branch": row["branch"]})
    assert r.status_code == 200 and RLO not in r.text
