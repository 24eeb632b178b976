"""The context budget: compaction as a checkpoint boundary, the call journal, real model servers."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import overnight
from overnight.errors import ModelCallFailed
from overnight.models import ExtractiveModel
from overnight.runtime.session import SUMMARY_SYSTEM
from overnight.store import open_store
from overnight.chain.read import load_head
from _procs import free_port, wait_for

HAVE_LLAMA = __import__("importlib.util").util.find_spec("llama_cpp") is not None


def chat_task(n: int = 12, window: int = 1200) -> overnight.Task:
    task = overnight.Task("chatty", goal="answer twelve questions in order", max_context_tokens=window)

    @task.step
    def plan(ctx):
        for i in range(n):
            ctx.add_step("ask", i=i)

    @task.step(planned=False)
    def ask(ctx, i):
        prompt = f"Question {i}: " + " ".join(f"word{j}" for j in range(60)) + "."
        reply = ctx.model.complete([{"role": "user", "content": prompt}], max_tokens=64)
        ctx.write_text(f"answers/{i:02d}.txt", reply.text)
        return reply.tokens_in

    return task


class FlakySummaries(ExtractiveModel):
    """The extractive model, except that summaries fail while ``fail`` is set."""

    def __init__(self, fail: bool) -> None:
        super().__init__()
        self.fail = fail
        self.summary_calls = 0

    def complete(self, messages, *, max_tokens=512, temperature=0.0):
        if any(m["role"] == "system" and m["content"] == SUMMARY_SYSTEM for m in messages):
            self.summary_calls += 1
            if self.fail:
                raise ModelCallFailed("summary endpoint down", model=self.name)
        return super().complete(messages, max_tokens=max_tokens, temperature=temperature)


def test_budget_compacts_into_new_sessions_and_keeps_the_control_point(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    result = overnight.run(chat_task(), url, handle_signals=False)
    assert result.status == "complete" and result.compactions >= 2
    assert result.usage["calls"] == 12 + result.compactions  # every section call and every summary, once
    with open_store(url) as s:
        loaded, _ = load_head(s, "chatty")
        kinds = [r.event for r in s.list_checkpoints("chatty")]
    assert kinds.count("compaction") == result.compactions
    ctx = loaded.state.context
    assert ctx.compactions == result.compactions and ctx.summary
    assert ctx.tokens < 1200  # each session stays inside its window
    assert loaded.record.session.n == 1 + result.compactions
    assert len(loaded.state.artifacts) == 12


def test_H07_failed_compaction_leaves_the_previous_head_and_is_retried(tmp_path):
    url = f"sqlite://{tmp_path / 's.db'}"
    flaky = FlakySummaries(fail=True)
    with pytest.raises(ModelCallFailed) as err:
        overnight.run(chat_task(), url, model=flaky, handle_signals=False)
    assert "compaction failed after 3 attempts" in str(err.value) and flaky.summary_calls == 3
    with open_store(url) as s:
        head, fallback = load_head(s, "chatty")
        assert fallback is None and head.record.event.kind == "step"  # the step before, not a torn compaction
        state = head.state
    assert state.task.goal == "answer twelve questions in order"
    assert state.todo and state.context.messages and state.context.compactions == 0  # nothing was cleared
    # resume with a healthy model: the compaction runs first, then the work goes on
    flaky.fail = False
    result = overnight.run(chat_task(), url, model=flaky, handle_signals=False)
    assert result.status == "complete" and result.compactions >= 1
    with open_store(url) as s:
        events = [r.event for r in s.list_checkpoints("chatty")]
    first = events.index("compaction")
    assert events[first - 1] == "step" and "step" in events[first + 1:]


KILL_TASK = '''
import time, overnight
from overnight.models import ExtractiveModel
from overnight.runtime.session import SUMMARY_SYSTEM

class SlowSummaries(ExtractiveModel):
    def complete(self, messages, **kw):
        if any(m["role"] == "system" and m["content"] == SUMMARY_SYSTEM for m in messages):
            time.sleep(0.15)   # a model writing a summary takes a while
        return super().complete(messages, **kw)

task = overnight.Task("chatty", goal="answer twelve questions in order", max_context_tokens=1200)

@task.step
def plan(ctx):
    for i in range(12):
        ctx.add_step("ask", i=i)

@task.step(planned=False)
def ask(ctx, i):
    prompt = f"Question {i}: " + " ".join(f"word{j}" for j in range(60)) + "."
    ctx.write_text(f"answers/{i:02d}.txt", ctx.model.complete([{"role": "user", "content": prompt}], max_tokens=64).text)

if __name__ == "__main__":
    import sys
    from overnight.cli.render import RunProgress
    with RunProgress(quiet=True, events_path=sys.argv[2]) as p:
        overnight.run(task, sys.argv[1], model=SlowSummaries(), on_event=p)
'''


@pytest.mark.slow
def test_H07_compaction_killed_at_random_moments_never_loses_the_control_point(tmp_path):
    """>= 20 SIGKILLs aimed at compactions: each time the head verifies with goal, todo and
    context intact (old messages, or the summary), and the task still completes."""
    script = tmp_path / "kill_task.py"
    script.write_text(KILL_TASK)
    rng = random.Random(int(os.environ.get("OVERNIGHT_KILL_SEED", "7")))
    url = f"sqlite://{tmp_path / 's.db'}"
    kills = 0
    rounds = 0
    while kills < 20:
        rounds += 1
        assert rounds < 200, "the task kept completing before a compaction could be hit"
        events = tmp_path / f"ev{rounds}.jsonl"
        proc = subprocess.Popen([sys.executable, str(script), url, str(events)], cwd=tmp_path)
        deadline = time.monotonic() + 60
        hit = False
        while proc.poll() is None and time.monotonic() < deadline:
            text = events.read_text() if events.exists() else ""
            if '"compaction_start"' in text:
                time.sleep(rng.uniform(0.0, 0.2))  # somewhere inside the summary call, or just after
                proc.send_signal(signal.SIGKILL)
                hit = True
                break
            time.sleep(0.005)
        proc.wait(timeout=30)
        if hit:
            kills += 1
        with open_store(url) as s:
            head, fallback = load_head(s, "chatty")
        assert fallback is None
        st = head.state
        assert st.task.goal == "answer twelve questions in order"
        done = {d.name for d in st.done}
        assert {e.name for e in st.todo} | done >= {f"ask[i={i}]" for i in range(12)} or "plan" not in done
        assert bool(st.context.messages) or st.context.summary or not done - {"plan"}
        if not st.todo:  # finished: start over in a fresh task id to keep aiming at compactions
            url = f"sqlite://{tmp_path / f's{rounds}.db'}"
    print(f"\ncompaction kills: {kills} in {rounds} runs, head always verified with goal/todo/context")


# --- real models --------------------------------------------------------------------------------


def _server(tmp_path: Path, port: int) -> tuple[subprocess.Popen, Path]:
    from overnight.models.local import smollm2_path

    log = tmp_path / "server.log"
    out = log.open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_path()), "--model_alias", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192"],
        stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).close()
            return server, log
        except OSError:
            assert time.monotonic() < deadline, "llama_cpp.server did not come up in 120 s"
            time.sleep(0.25)


def _requests(log: Path) -> int:
    return log.read_text(errors="replace").count("POST /v1/chat/completions")


@pytest.mark.llm
@pytest.mark.skipif(not HAVE_LLAMA, reason="llama_cpp not installed (bash scripts/ensure-llama-wheel.sh)")
def test_llama_server_demo_sigkill_resume_never_calls_again_for_committed_steps(tmp_path):
    """The demo through the openai client against ``python -m llama_cpp.server`` (SmolLM2), killed
    mid-run: the resumed run makes no model call for any step that was already committed
    (requests counted at the server)."""
    port = free_port()
    server, log = _server(tmp_path, port)
    try:
        store = f"sqlite://{tmp_path / 's.db'}"
        cmd = [sys.executable, "-m", "overnight", "demo", "--package", "email.mime", "--model", "openai:smollm2",
               "--base-url", f"http://127.0.0.1:{port}/v1", "--section-tokens", "16", "--max-context-tokens", "1024",
               "-q", "--store", store,
               "--out", str(tmp_path / "report.md")]
        events = tmp_path / "ev0.jsonl"
        first = subprocess.Popen([*cmd, "--events", str(events)], cwd=tmp_path)
        wait_for(lambda: events.exists() and events.read_text().count('"step_end"') >= 3 or first.poll() is not None,
                 timeout=240)
        first.send_signal(signal.SIGKILL)
        first.wait()
        with open_store(store) as s:
            head, _ = load_head(s, "api-report-email.mime")
            committed = {d.key for d in head.state.done}
            calls_before = len(s.calls("api-report-email.mime"))
        assert committed, "killed before anything was committed"
        before = _requests(log)
        assert before >= calls_before  # every recorded call was a request (the last may be unrecorded)
        from datetime import datetime, timezone

        t_kill = datetime.now(timezone.utc).isoformat(timespec="microseconds")
        proc = subprocess.run([*cmd, "--events", str(tmp_path / "ev1.jsonl")], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        with open_store(store) as s:
            calls = s.calls("api-report-email.mime")
        new = [c for c in calls if c.created_at > t_kill]
        assert not [c for c in new if c.step_key in committed], "a committed step called the model again"
        made = _requests(log) - before
        assert made == len(calls) - calls_before, "requests at the server and the call journal disagree"
        report = (tmp_path / "report.md").read_text()
        assert "## `email.mime.text`" in report and "the model openai:smollm2" in report
        print(f"\nllama server: {before} requests before the kill ({len(committed)} steps committed), "
              f"{made} after; 0 for committed steps")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


@pytest.mark.llm
@pytest.mark.skipif(not HAVE_LLAMA, reason="llama_cpp not installed (bash scripts/ensure-llama-wheel.sh)")
def test_demo_with_local_smollm2_in_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "overnight", "demo", "--package", "email.mime", "--model", "local",
                           "--section-tokens", "16", "--max-context-tokens", "1024", "-q", "--store", f"sqlite://{tmp_path / 's.db'}", "--out",
                           str(tmp_path / "report.md")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "report.md").read_text()
    assert report.count("\n## ") >= 9 and "by the model local" in report
