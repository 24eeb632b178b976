"""Shared helpers for the dashboard tests: a real task in a real SQLite store, and a real
``overnight ui`` server process (``--port 0``; the URL is read from what it prints)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from _procs import CLI, env

TASK_FILE = '''
import os
import time

import overnight

task = overnight.Task("report", goal="Write a report from notes.txt, part by part", expected_span="3d",
                      data={"parts": 0, "title": "Night report"})

@task.step
def plan(ctx):
    for i in range(int(os.environ.get("UI_PARTS", "6"))):
        ctx.add_step("part", i=i)

@task.step(planned=False)
def part(ctx, i):
    time.sleep(float(os.environ.get("UI_STEP_S", "0")))
    source = ctx.read_input_text("notes.txt") if i == 0 else ctx.read_text("part-0.md")
    reply = ctx.model.complete([{"role": "user", "content": f"Summarise part {i}: {source}"}], max_tokens=48)
    ctx.write_text(f"part-{i}.md", f"# Part {i}\\n{reply.text}\\n")
    previous = ctx.read_text("report.md") if i else ""
    ctx.write_text("report.md", previous + f"## Part {i}\\nline {i}\\n")
    ctx.state["parts"] += 1
    return i
'''

XSS = {
    "script": "<script>alert('task')</script>",
    "img": "<img src=x onerror=alert('artifact') id=pwned-img>",
    "bold": "<b id=pwned-state>state</b><script>alert('state')</script>",
}

XSS_TASK_FILE = f'''
import overnight

task = overnight.Task("xss-probe", goal={XSS["script"]!r}, expected_span="3d", data={{"note": {XSS["bold"]!r}}})

@task.step
def write(ctx):
    ctx.write_text({XSS["img"] + ".txt"!r}, {XSS["script"]!r})
    ctx.state["note"] = {XSS["bold"]!r}
    ctx.state[{XSS["img"]!r}] = "key with markup"
'''


def make_site(root: Path, *, parts: int = 6, step_s: float = 0.0, run: bool = True) -> Path:
    """A directory with the task file, its input and (with ``run``) a store where it completed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "ui_task.py").write_text(TASK_FILE)
    (root / "notes.txt").write_text("The night shift found three things: a leak, a fix and a test.\n")
    if run:
        proc = run_cli(root, "run", "ui_task.py", env_extra={"UI_PARTS": str(parts), "UI_STEP_S": str(step_s)})
        assert proc.returncode == 0, proc.stderr
    return root


def store_url(root: Path) -> str:
    return f"sqlite://{root / 's.db'}"


def run_cli(root: Path, *args: str, env_extra: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m overnight ARGS --store sqlite://ROOT/s.db`` in ``root``."""
    return subprocess.run([*CLI, *args, "--store", store_url(root)], cwd=root, env={**env(), **(env_extra or {})},
                          capture_output=True, text=True, timeout=timeout)


class UiServer:
    """``overnight ui`` running in a child process; ``url`` is where it serves."""

    def __init__(self, root: Path, *args: str) -> None:
        self.log = root / f"ui-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen([*CLI, "ui", "--store", store_url(root), "--port", "0", *args], cwd=root,
                                     env=env(), stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.monotonic() + 30
        while True:
            text = self.log.read_text(errors="replace")
            m = re.search(r"open (http://\S+)", text)
            if m:
                self.url = m.group(1)
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"overnight ui did not start: {text}")
            time.sleep(0.05)
        self.base = re.sub(r"/\?token=.*$", "", self.url).rstrip("/")
        self.token = m.group(1).split("?token=", 1)[1] if "?token=" in self.url else None
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(self.base + "/static/style.css", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise AssertionError("overnight ui does not answer")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # Ctrl-C
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "UiServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


