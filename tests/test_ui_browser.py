"""``overnight ui`` in a real browser: the distribution's headless Chromium, driven by Selenium
through the distribution's chromedriver (both given by path: nothing is downloaded).

Scenarios from the dashboard issue: the tasks page shows a running task's progress move; a task's
timeline shows every checkpoint and a checkpoint's diff opens; editing an input the task read
makes the drift preview list the steps and tokens; a fork made in the UI is a branch
``overnight log`` shows; a damaged record gets its badge; markup in a task id, an artifact name and
a state value stays text; ``--read-only`` shows no action. Screenshots of the main pages go to
``test-artifacts/ui/`` (git-ignored) and the test's tmp dir.

Outside CI, without /usr/bin/chromium and /usr/bin/chromedriver these tests skip saying so; in
CI (``CI`` set; ``.ci/run`` installs both) they fail instead.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
webdriver = pytest.importorskip("selenium.webdriver")

from _procs import CLI, env, wait_for  # noqa: E402
from _ui import XSS, XSS_TASK_FILE, UiServer, make_site, run_cli, store_url  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from overnight import api  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "ui"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not fetch anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
                 "--window-size=1280,900"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def shot(driver, tmp_path: Path, name: str, width: int = 1280) -> None:
    """Screenshot the whole page at ``width`` px into test-artifacts/ui/ and the test's tmp dir."""
    driver.set_window_size(width, 900)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(max(900, height), 4000))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(tmp_path / f"{name}.png"))
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    driver.set_window_size(1280, 900)


def no_alert(driver) -> bool:
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def _text(driver, css: str) -> str:
    """Text of the first element matching ``css``; "" while the page is replaced (a navigation or an htmx swap
    between finding the element and reading it makes it stale)."""
    try:
        return driver.find_element(By.CSS_SELECTOR, css).text
    except (StaleElementReferenceException, NoSuchElementException):
        return ""


def _progress(driver) -> int | None:
    """Steps done in the report row's progress text (None while htmx swaps the row)."""
    try:
        return int(_text(driver, "tr[data-task=report] .progress-text").split("/")[0])
    except ValueError:
        return None


@pytest.mark.slow
def test_tasks_page_shows_a_running_task_progress(browser, tmp_path):
    site = make_site(tmp_path / "live", run=False)
    run = subprocess.Popen([*CLI, "run", "ui_task.py", "--store", store_url(site)], cwd=site,
                           env={**env(), "UI_PARTS": "40", "UI_STEP_S": "0.4"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # the task must exist before the dashboard opens its store
        wait_for(lambda: (site / "s.db").exists() and api.ls(store=store_url(site)), 60, 0.1, "the task's store")
        with UiServer(site) as srv:
            browser.get(srv.base + "/")
            done0 = wait_for(lambda: _progress(browser) is not None, 20, 0.1, "the task row") and _progress(browser)
            browser.execute_script("window.__same_page = 1")
            # htmx polls every 2 s: the same page, without a reload, shows more steps done
            wait_for(lambda: (_progress(browser) or 0) > done0, 60, 0.2, "progress to move")
            assert browser.execute_script("return window.__same_page") == 1
            assert wait_for(lambda: _text(browser, "tr[data-task=report] .st"), 5, 0.1, "the status cell") == "running"
            shot(browser, tmp_path, "tasks-live")
    finally:
        run.kill()
        run.wait()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("ui-browser"), parts=6)


def test_timeline_counts_checkpoints_and_a_diff_opens(browser, site, tmp_path):
    with UiServer(site) as srv:
        browser.get(srv.base + "/")
        shot(browser, tmp_path, "tasks")
        shot(browser, tmp_path, "tasks-narrow", width=420)
        browser.find_element(By.CSS_SELECTOR, "a.task-link").click()
        rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.cp-row"), 10, 0.1, "the task page")
        assert len(rows) == len(api.show("report", store=store_url(site)).chain)
        assert browser.find_element(By.ID, "checkpoint-count").text == str(len(rows))
        # none damaged: the head "verified" (artifact bytes hashed), the others "record verified"
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.cp-row .integrity.ok")) == 1
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.cp-row .integrity.record-verified")) == len(rows) - 1
        assert not browser.find_elements(By.CSS_SELECTOR, "tr.cp-row .integrity.bad")
        assert browser.find_elements(By.CSS_SELECTOR, ".graph svg circle.head")
        # at 1280 px -- even zoomed to 125 %, as a laptop's display scaling shows it -- the integrity
        # badge of every row is on screen, not scrolled off to the right of the timeline
        browser.execute_script("document.body.style.zoom = '1.25'")
        width = browser.execute_script("return window.innerWidth")
        for badge in browser.find_elements(By.CSS_SELECTOR, "tr.cp-row .integrity"):
            assert badge.rect["x"] + badge.rect["width"] <= width, (badge.rect, width)
        browser.execute_script("document.body.style.zoom = '1'")
        shot(browser, tmp_path, "task")
        shot(browser, tmp_path, "task-narrow", width=420)
        # the newest step checkpoint: its diff adds a part to report.md
        newest_step = next(r for r in rows if "ev-step" in r.find_element(By.CSS_SELECTOR, ".ev").get_attribute("class"))
        newest_step.find_element(By.CSS_SELECTOR, "a.cp-link").click()
        wait_for(lambda: "Diff against parent" in browser.page_source, 10, 0.1, "the checkpoint page")
        diff = "\n".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, "pre.udiff"))
        assert "+++ report.md" in diff and "+## Part 5" in diff and "+# Part 5" in diff
        assert browser.find_elements(By.CSS_SELECTOR, "table.state-diff tr.changed")
        shot(browser, tmp_path, "checkpoint")


def test_drift_preview_lists_steps_and_tokens_after_an_input_edit(browser, tmp_path):
    site = make_site(tmp_path / "drift", parts=4)
    (site / "notes.txt").write_text("The night shift found four things, not three.\n")
    with UiServer(site) as srv:
        browser.get(srv.base + "/drift?task=report")
        assert not browser.find_elements(By.CSS_SELECTOR, "table.drift-report")  # nothing runs until asked
        browser.find_element(By.ID, "check-drift").click()
        report = browser.find_element(By.CSS_SELECTOR, "table.drift-report").text
        assert "notes.txt" in report and "part[i=0]" in report
        recompute = browser.find_element(By.CSS_SELECTOR, "section.policy td.recompute").text
        done = {e.name: e for e in _done(site)}
        # part 0 read notes.txt: it runs again; parts 1-3 read part 0's artifact: re-checked, as
        # `status --drift` says (they run again only if what they read now differs)
        steps = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "section.policy td.recompute .step")]
        direct = [s.text for s in browser.find_elements(By.CSS_SELECTOR,
                                                        "section.policy td.recompute .step:not(.rechecked)")]
        assert sorted(steps) == sorted(n for n in done if n.startswith("part"))
        assert direct == ["part[i=0]"], direct
        tokens = sum(done[n].tokens_in + done[n].tokens_out for n in direct)
        upper = sum(done[n].tokens_in + done[n].tokens_out for n in steps)
        assert 0 < tokens < upper
        assert int(browser.find_element(By.CSS_SELECTOR, "section.policy td.recompute .tokens").text) == tokens
        assert int(browser.find_element(By.CSS_SELECTOR, "section.policy td.recompute .tokens-upper").text) == upper
        assert "1 step(s) run again" in recompute and "re-checks 3" in recompute
        shot(browser, tmp_path, "drift")
    said = run_cli(site, "status", "report", "--drift").stdout  # the CLI says the same
    assert "resume runs 1 step(s): part[i=0]" in said and "re-checks 3" in said, said
    # the preview wrote nothing
    assert run_cli(site, "status", "report").returncode == 0
    assert len(api.show("report", store=store_url(site)).chain) == 6


def _done(site: Path):
    from overnight.store import open_store
    from overnight.chain.read import load_head

    with open_store(store_url(site)) as s:
        loaded, _ = load_head(s, "report", "main")
        return loaded.state.done


def test_fork_from_the_ui_is_a_branch_overnight_log_shows(browser, tmp_path):
    site = make_site(tmp_path / "fork", parts=4)
    with UiServer(site) as srv:
        browser.get(srv.base + "/task?id=report")
        row = browser.find_elements(By.CSS_SELECTOR, "tr.cp-row")[3]
        row.find_element(By.CSS_SELECTOR, ".row-actions summary").click()
        form = row.find_element(By.CSS_SELECTOR, "form.fork-form")
        form.find_element(By.NAME, "branch").send_keys("experiment")
        form.find_element(By.TAG_NAME, "button").click()
        wait_for(lambda: "experiment" in _text(browser, "ul.branches"), 10, 0.1,
                 "the new branch on the page")
        assert len(browser.find_elements(By.CSS_SELECTOR, ".graph svg circle.head")) == 2
        assert browser.find_elements(By.CSS_SELECTOR, ".graph svg path.fork")
        shot(browser, tmp_path, "task-forked")
    log = run_cli(site, "log", "report")
    assert log.returncode == 0 and "experiment" in log.stdout


def test_a_damaged_record_gets_its_badge(browser, tmp_path):
    site = make_site(tmp_path / "damage", parts=3)
    head = api.show("report", store=store_url(site)).branches["main"]
    with sqlite3.connect(site / "s.db") as db:
        (body,) = db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()
        db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?",
                   (bytes(body).replace(b'"seq":', b'"seq":1', 1), head))
        from overnight.chain.ditto import ditto_key  # and its ditto copy: nothing to heal from
        db.execute("DELETE FROM objects WHERE digest=?", (ditto_key(head),))
    with UiServer(site) as srv:
        browser.get(srv.base + "/task?id=report")
        row = browser.find_element(By.CSS_SELECTOR, f"tr.cp-row[data-checkpoint='{head}']")
        assert row.find_element(By.CSS_SELECTOR, ".integrity").text == "damaged"
        assert "DigestMismatch" in row.text or "SchemaError" in row.text or "mismatch" in row.text.lower()
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.cp-row")
        parent = rows[1]
        assert "fallback of main" in parent.text
        assert browser.find_elements(By.CSS_SELECTOR, "ul.branches .badge.bad")
        shot(browser, tmp_path, "damaged")


@pytest.mark.slow
def test_markup_in_ids_names_and_values_stays_text(browser, tmp_path):
    site = tmp_path / "xss"
    site.mkdir()
    (site / "xss_task.py").write_text(XSS_TASK_FILE)
    assert run_cli(site, "run", "xss_task.py").returncode == 0
    # a task id with markup, as a LangGraph thread id can be
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from overnight.adapters.langgraph import OvernightSaver

    class S(TypedDict):
        note: str

    graph = StateGraph(S)
    graph.add_node("w", lambda s: {"note": XSS["bold"]})
    graph.add_edge(START, "w")
    graph.add_edge("w", END)
    with OvernightSaver(store_url(site)) as saver:
        graph.compile(checkpointer=saver).invoke({"note": ""}, {"configurable": {"thread_id": XSS["script"]}})
    with UiServer(site) as srv:
        browser.get(srv.base + "/")
        assert XSS["script"] in browser.find_element(By.CSS_SELECTOR, "table.tasks").text
        pages = [srv.base + "/"]
        for link in browser.find_elements(By.CSS_SELECTOR, "a.task-link"):
            pages.append(link.get_attribute("href"))
        for url in list(pages[1:]):
            browser.get(url)
            pages += [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "a.cp-link")][:3]
        for url in pages + [srv.base + "/storage", srv.base + "/journal?task=xss-probe"]:
            browser.get(url)
            time.sleep(0.2)
            assert no_alert(browser), url
            assert not browser.find_elements(By.ID, "pwned-img"), url
            assert not browser.find_elements(By.ID, "pwned-state"), url
            assert not browser.find_elements(By.CSS_SELECTOR, "img"), url
            scripts = browser.find_elements(By.TAG_NAME, "script")
            assert [s.get_attribute("src").rsplit("/", 1)[-1] for s in scripts] == ["htmx.min.js", "poll.js"], url
        browser.get(next(u for u in pages if "checkpoint" in u and "xss-probe" in u))
        text = browser.find_element(By.TAG_NAME, "main").text
        assert XSS["img"] + ".txt" in text and "<b id=pwned-state>" in text
        shot(browser, tmp_path, "xss")


def test_read_only_shows_no_action(browser, site, tmp_path):
    with UiServer(site, "--read-only") as srv:
        for path in ("/task?id=report", "/storage"):
            browser.get(srv.base + path)
            assert not browser.find_elements(By.CSS_SELECTOR, "form[action^='/actions']")
            assert not [b for b in browser.find_elements(By.TAG_NAME, "button")
                        if b.text.startswith(("Fork", "Rollback", "Verify"))]
        browser.get(srv.base + "/task?id=report")
        browser.find_element(By.CSS_SELECTOR, "a.cp-link").click()
        assert not browser.find_elements(By.CSS_SELECTOR, "form[action^='/actions']")
        assert "read-only" in browser.find_element(By.CSS_SELECTOR, "header").text


def test_rollback_from_the_ui_asks_first(browser, tmp_path):
    site = make_site(tmp_path / "rollback", parts=3)
    with UiServer(site) as srv:
        head = api.show("report", store=store_url(site)).branches["main"]
        browser.get(srv.base + "/task?id=report")
        row = browser.find_elements(By.CSS_SELECTOR, "tr.cp-row")[2]
        row.find_element(By.CSS_SELECTOR, ".row-actions summary").click()
        next(b for b in row.find_elements(By.TAG_NAME, "button") if b.text.startswith("Rollback")).click()
        wait_for(lambda: browser.find_elements(By.ID, "confirm-rollback"), 10, 0.1, "the confirmation page")
        assert api.show("report", store=store_url(site)).branches["main"] == head  # asked, nothing done yet
        shot(browser, tmp_path, "rollback-confirm")
        browser.find_element(By.ID, "cancel-rollback").click()
        assert api.show("report", store=store_url(site)).branches["main"] == head
        browser.back()
        browser.find_element(By.ID, "confirm-rollback").click()
        wait_for(lambda: api.show("report", store=store_url(site)).branches["main"] != head, 10, 0.1, "the rollback")
        wait_for(lambda: "/task" in browser.current_url, 10, 0.1, "the task page after the rollback")


def test_pages_render_and_verify_now_runs(browser, site, tmp_path):
    with UiServer(site) as srv:
        browser.get(srv.base + "/journal?task=report")
        assert browser.find_elements(By.CSS_SELECTOR, "table.journal tbody tr")
        shot(browser, tmp_path, "journal")
        browser.get(srv.base + "/storage")
        browser.find_element(By.ID, "gc-dry-run").click()
        wait_for(lambda: "Dry run (nothing deleted)" in browser.page_source, 10, 0.1, "the dry run's page")
        assert browser.find_elements(By.CSS_SELECTOR, ".graph svg polyline")
        shot(browser, tmp_path, "storage")
        browser.get(srv.base + "/task?id=report")
        browser.find_element(By.CSS_SELECTOR, "details.actions summary").click()
        browser.find_element(By.ID, "verify-now").click()
        # the task page has ok badges too: wait for the verify page before reading one
        WebDriverWait(browser, 30).until(lambda b: b.title.startswith("verify"))
        assert browser.find_element(By.CSS_SELECTOR, "h1 + p .badge.ok").text == "ok"
