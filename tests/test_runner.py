"""The runner: steps, the todo list, memoization, failures, fallback to a valid checkpoint."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

import overnight
from overnight import api
from overnight.errors import EncodeError, StepFailed, UnknownStep
from overnight.store import open_store
from overnight.chain.read import load_head


def make_task(calls: list[str], *, fail_on: str | None = None, fails: int = 1, retries: int = 0) -> overnight.Task:
    task = overnight.Task("t", goal="test", expected_span="1h", data={"log": []})
    failures = {"left": fails}

    @task.step
    def plan(ctx):
        calls.append("plan")
        ctx.add_step("work", i=1)
        ctx.add_step("work", i=2)
        ctx.add_step("cleanup", position="end")
        return {"planned": 2}

    @task.step(planned=False, retries=retries)
    def work(ctx, i):
        calls.append(f"work{i}")
        if fail_on == f"work{i}" and failures["left"] > 0:
            failures["left"] -= 1
            ctx.state["log"].append("should never be committed")
            ctx.write_text("junk.txt", "junk")
            raise RuntimeError("model timeout")
        ctx.state["log"].append(i)
        ctx.write_text(f"part{i}.md", f"# part {i}\n")
        return i * 10

    @task.step
    def summary(ctx):
        calls.append("summary")
        total = ctx.outputs["work[i=1]"] + ctx.outputs["work[i=2]"]
        ctx.write_text("summary.md", ctx.read_text("part1.md") + ctx.read_text("part2.md") + f"total {total}\n")
        return total

    @task.step(planned=False)
    def cleanup(ctx):
        calls.append("cleanup")
        return sorted(ctx.artifact_names())

    return task


@pytest.fixture
def url(tmp_path):
    return f"sqlite://{tmp_path / 's.db'}"


def test_runs_plan_in_order_with_added_steps(url):
    calls: list[str] = []
    result = overnight.run(make_task(calls), url)
    # added steps run right after the step that added them; position="end" after the plan
    assert calls == ["plan", "work1", "work2", "summary", "cleanup"]
    assert result.status == "complete" and result.done == result.total == 5 and result.created
    assert api.cat("t", "summary.md", store=url) == b"# part 1\n# part 2\ntotal 30\n"
    with open_store(url) as s:
        loaded, fallback = load_head(s, "t")
    assert fallback is None
    assert loaded.state.data == {"log": [1, 2]}
    assert [d.name for d in loaded.state.done] == ["plan", "work[i=1]", "work[i=2]", "summary", "cleanup"]
    assert loaded.record.seq == 5  # init + 5 steps


def test_resume_runs_only_what_is_left(url):
    calls: list[str] = []
    first = overnight.run(make_task(calls), url, max_steps=2)
    assert first.status == "stopped" and first.resumable
    assert calls == ["plan", "work1"]
    calls.clear()
    second = overnight.run(make_task(calls), url)
    assert calls == ["work2", "summary", "cleanup"]
    assert second.session == 2 and not second.created
    calls.clear()
    third = overnight.run(make_task(calls), url)
    assert calls == [] and third.status == "complete" and third.steps_run == 0


def test_failed_step_commits_nothing_and_resume_retries_it(url):
    calls: list[str] = []
    with pytest.raises(StepFailed) as err:
        overnight.run(make_task(calls, fail_on="work2"), url)
    assert "work[i=2]" in str(err.value) and "model timeout" in str(err.value)
    with open_store(url) as s:
        loaded, _ = load_head(s, "t")
    assert [d.name for d in loaded.state.done] == ["plan", "work[i=1]"]
    assert loaded.state.data == {"log": [1]}
    assert "junk.txt" not in loaded.state.artifacts
    calls.clear()
    overnight.run(make_task(calls), url)
    assert calls == ["work2", "summary", "cleanup"]


def test_retries_then_success(url):
    calls: list[str] = []
    result = overnight.run(make_task(calls, fail_on="work1", fails=2, retries=2), url)
    assert result.status == "complete"
    assert calls.count("work1") == 3
    assert b"should never" not in b"".join(api.cat("t", n, store=url) for n in ("part1.md",))


def test_unencodable_output_is_refused_before_anything_is_written(url):
    task = overnight.Task("bad", goal="g")

    @task.step
    def first(ctx):
        return 1

    @task.step
    def second(ctx):
        ctx.state["items"] = [1, 2, 3, {"when": object()}]
        return "x"

    with pytest.raises(EncodeError) as err:
        overnight.run(task, url)
    assert "state.data.items[3].when" in str(err.value) and "object" in str(err.value)
    with open_store(url) as s:
        loaded, _ = load_head(s, "bad")
    assert [d.name for d in loaded.state.done] == ["first"]


def test_unknown_step_function_is_a_clear_error(url):
    calls: list[str] = []
    overnight.run(make_task(calls), url, max_steps=1)
    task = overnight.Task("t", goal="test")

    @task.step
    def plan(ctx):  # "work" was removed from the code
        pass

    with pytest.raises(UnknownStep) as err:
        overnight.run(task, url)
    assert "'work'" in str(err.value)


def test_memoized_step_is_not_run_again(url):
    runs: list[str] = []
    task = overnight.Task("memo", goal="g")

    @task.step
    def a(ctx):
        runs.append("a")
        ctx.add_step("b", x=1)
        return 1

    @task.step(planned=False)
    def b(ctx, x):
        runs.append("b")
        # re-adding an already-done step (e.g. after a merge) must not run it twice
        return x

    overnight.run(task, url)
    assert runs == ["a", "b"]


def test_corrupt_head_falls_back_to_newest_valid_checkpoint(url, tmp_path):
    calls: list[str] = []
    overnight.run(make_task(calls), url, max_steps=3)
    with open_store(url) as s:
        rows = s.list_checkpoints("t")
        head = s.get_ref("t", "main")
    assert head == rows[-1].checkpoint_id
    db = sqlite3.connect(tmp_path / "s.db")
    body = bytearray(db.execute("SELECT body FROM checkpoints WHERE checkpoint_id=?", (head,)).fetchone()[0])
    body[len(body) // 2] ^= 0x01  # bit flip
    db.execute("UPDATE checkpoints SET body=? WHERE checkpoint_id=?", (bytes(body), head))
    # and its ditto copy: with the copy intact the load heals instead (tests/test_ditto.py)
    from overnight.chain.ditto import ditto_key
    copy = db.execute("SELECT data FROM objects WHERE digest=?", (ditto_key(head),)).fetchone()[0]
    db.execute("UPDATE objects SET data=? WHERE digest=?", (bytes(copy)[:-1] + b"!", ditto_key(head)))
    db.commit()
    db.close()
    calls.clear()
    result = overnight.run(make_task(calls), url)
    assert result.fallback is not None
    assert result.fallback.used_id == rows[-2].checkpoint_id
    assert [s.checkpoint_id for s in result.fallback.skipped] == [head]
    assert result.fallback.redo_steps == ["work[i=2]"]
    assert calls == ["work2", "summary", "cleanup"]
    with open_store(url) as s:
        assert head in {r.checkpoint_id for r in s.list_checkpoints("t")}  # kept for inspection
    report = api.show("t", store=url)
    bad = [c for c in report.chain if c.checkpoint_id == head]
    assert bad and not bad[0].valid and "DigestMismatch" in bad[0].problem


def test_signed_checkpoints_detect_edits_without_the_key(url, tmp_path, monkeypatch):
    from overnight.codec import digest
    from overnight.errors import NoValidCheckpoint

    monkeypatch.setenv("OVERNIGHT_SIGNING_KEY", "k3y")
    calls: list[str] = []
    overnight.run(make_task(calls), url, max_steps=2)
    with open_store(url) as s:
        head = s.get_checkpoint(s.get_ref("t", "main"))
    assert head.signature and head.signature.startswith("hmac-sha256:")
    # forge: edit the head record, recompute its plain digest, point the branch at the forgery
    forged = head.body.replace(b'"n":1', b'"n":7')
    assert forged != head.body
    fid = digest.sha256(forged)
    db = sqlite3.connect(tmp_path / "s.db")
    db.execute("INSERT INTO checkpoints SELECT ?, task_id, parent_id, branch, seq, created_at, session, event, step, ?, "
               "signature, stored_bytes FROM checkpoints WHERE checkpoint_id=?", (fid, forged, head.checkpoint_id))
    db.execute("UPDATE refs SET checkpoint_id=? WHERE task_id='t'", (fid,))
    db.commit()
    db.close()
    calls.clear()
    result = overnight.run(make_task(calls), url)
    assert result.fallback is not None
    assert [(s.checkpoint_id, s.error) for s in result.fallback.skipped] == [(fid, "SignatureError")]
    # the forgery contributes nothing (not its parent pointer): the newest record of the branch that
    # verifies is the real head it was copied from
    assert result.fallback.used_id == head.checkpoint_id
    # a wrong key verifies nothing: refuse to load rather than guess
    monkeypatch.setenv("OVERNIGHT_SIGNING_KEY", "wrong")
    with pytest.raises(NoValidCheckpoint):
        overnight.run(make_task(calls), url)
    # without any key, digests still hold but the forgery passes: verify says signatures went unchecked
    monkeypatch.delenv("OVERNIGHT_SIGNING_KEY")
    report = api.verify("t", store=url)
    assert report.signatures_unchecked >= 4


def test_default_step_names_are_the_same_in_every_process():
    """A set's repr order follows the process's hash seed: a resumed run must still find the step
    it added (same name), so names never depend on it."""
    code = ("from overnight.runtime.task import default_step_name; import datetime, decimal;"
            "print(default_step_name('fetch', {'tags': {'alpha','beta','gamma','delta','eps','zeta','eta','theta'},"
            " 'when': datetime.date(2026, 11, 30), 'n': 3, 'pair': ('a', 1.5), 'opts': {'k': [1, None]},"
            " 'amount': decimal.Decimal('1.10')}))")
    names = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(seed)},
                            capture_output=True, text=True, check=True).stdout.strip() for seed in range(6)}
    assert len(names) == 1, names
    (name,) = names
    assert name.startswith("fetch[amount=#") and "n=3" in name and "pair=('a', 1.5)" in name
    assert "opts={'k': [1, None]}" in name and "tags=#" in name and "when=#" in name
