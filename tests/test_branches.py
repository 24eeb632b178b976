"""Chain operations: fork, rollback, merge, log -- with branches advanced by separate processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import overnight
from overnight import api
from overnight.errors import BranchExists, ConfigError, MergeConflict
from overnight.store import open_store
from overnight.chain.read import load_head

TASK_FILE = '''
import overnight

task = overnight.Task("chain", goal="twelve numbered notes", data={"notes": []})

@task.step
def plan(ctx):
    for i in range(12):
        ctx.add_step("note", i=i)

@task.step(planned=False)
def note(ctx, i):
    import os
    label = os.environ.get("LABEL", "main")
    ctx.state["notes"].append(f"{label}:{i}")
    ctx.write_text(f"note-{i}.txt", f"{label} wrote note {i}")
    return label
'''


def cli(tmp: Path, *args: str, label: str = "main", check: int | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "overnight", *args, "--store", f"sqlite://{tmp / 's.db'}"],
                          cwd=tmp, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LABEL": label, "COLUMNS": "200"})
    if check is not None:
        assert proc.returncode == check, proc.stderr
    return proc


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "chain_task.py").write_text(TASK_FILE)
    return tmp_path


def state_of(tmp: Path, branch: str):
    with open_store(f"sqlite://{tmp / 's.db'}") as s:
        loaded, fallback = load_head(s, "chain", branch)
    assert fallback is None
    return loaded.state


@pytest.mark.slow
def test_H08_fork_then_alternate_branches_in_separate_processes(tmp):
    cli(tmp, "run", "chain_task.py", "--max-steps", "5", "-q", check=75)  # plan + notes 0..3
    show = json.loads(cli(tmp, "show", "chain", "--json", check=0).stdout)
    at = show["chain"][5]["checkpoint_id"]  # checkpoint 5: after note 3
    cli(tmp, "fork", "chain", "--at", at[7:19], "--branch", "B", check=0)
    for _ in range(4):  # alternate, one step at a time, each in its own process
        cli(tmp, "resume", "chain", "--max-steps", "1", "-q", label="main", check=75)
        cli(tmp, "resume", "chain", "--branch", "B", "--max-steps", "1", "-q", label="B", check=75)
    main, b = state_of(tmp, "main"), state_of(tmp, "B")
    common = ["main:0", "main:1", "main:2", "main:3"]
    assert main.data["notes"] == common + ["main:4", "main:5", "main:6", "main:7"]
    assert b.data["notes"] == common + ["B:4", "B:5", "B:6", "B:7"]
    assert api.cat("chain", "note-5.txt", store=f"sqlite://{tmp / 's.db'}") == b"main wrote note 5"
    assert api.cat("chain", "note-5.txt", branch="B", store=f"sqlite://{tmp / 's.db'}") == b"B wrote note 5"
    # each branch's done list holds only its own later steps
    assert [d.output for d in b.done if d.fn == "note"][4:] == ["B", "B", "B", "B"]
    # finish both: still separate
    cli(tmp, "resume", "chain", "-q", label="main", check=0)
    cli(tmp, "resume", "chain", "--branch", "B", "-q", label="B", check=0)
    assert state_of(tmp, "main").data["notes"][-1] == "main:11"
    assert state_of(tmp, "B").data["notes"][-1] == "B:11"
    log = cli(tmp, "log", "chain", check=0).stdout
    assert "(B)" in log and "(main)" in log and "|/" in log and "fork" in log
    rows = [line for line in log.splitlines() if " seq " in line]
    assert rows and all(re.search(r" seq \d+ +[a-z-]+( |$)", line) for line in rows), log  # event apart from step


def test_fork_refuses_existing_branch_and_bad_checkpoint(tmp):
    cli(tmp, "run", "chain_task.py", "--max-steps", "3", "-q", check=75)
    url = f"sqlite://{tmp / 's.db'}"
    with pytest.raises(BranchExists):
        api.fork("chain", "main", "main", store=url)
    err = cli(tmp, "fork", "chain", "--at", "deadbeef", "--branch", "x", check=2).stderr
    assert "no checkpoint or branch 'deadbeef'" in err


@pytest.mark.parametrize("name", ["", " main", "a\nb", "nul\x00", "esc\x1b[31m", "lone\ud800", "x" * 201])
def test_branch_names_a_user_cannot_type_back_are_refused_before_anything_is_written(tmp, name):
    cli(tmp, "run", "chain_task.py", "--max-steps", "2", "-q", check=75)
    url = f"sqlite://{tmp / 's.db'}"
    with open_store(url) as s:
        before = ({r.checkpoint_id for r in s.list_checkpoints("chain")}, s.list_refs("chain"))
    with pytest.raises(ConfigError, match="branch name"):
        api.fork("chain", "main", name, store=url)
    task = api.load_task(str(tmp / "chain_task.py"))
    with pytest.raises(ConfigError, match="branch name"):
        overnight.run(task, url, branch=name)
    with open_store(url) as s:
        assert ({r.checkpoint_id for r in s.list_checkpoints("chain")}, s.list_refs("chain")) == before
    api.fork("chain", "main", "ünïcode-ok 分支", store=url)  # printable non-ASCII names are fine


def test_rollback_keeps_history_and_reruns_later_steps(tmp):
    cli(tmp, "run", "chain_task.py", "--max-steps", "6", "-q", check=75)
    url = f"sqlite://{tmp / 's.db'}"
    chain = api.show("chain", store=url).chain
    target = chain[3].checkpoint_id  # after note 1
    before = {c.checkpoint_id for c in chain}
    head = api.rollback("chain", target, store=url)
    after = api.show("chain", store=url)
    assert before < {c.checkpoint_id for c in after.chain}  # nothing removed
    assert after.branches["main"] == head
    assert state_of(tmp, "main").data["notes"] == ["main:0", "main:1"]
    cli(tmp, "resume", "chain", "--max-steps", "1", "-q", label="again", check=75)
    assert state_of(tmp, "main").data["notes"] == ["main:0", "main:1", "again:2"]
    log = [e for e in api.log("chain", store=url)]
    assert log[1].row.event == "rollback"
    with pytest.raises(ConfigError):  # a checkpoint of another line of history
        api.fork("chain", target, "other", store=url)
        other = api.show("chain", store=url).branches["other"]
        api.rollback("chain", other, store=url)


def test_rollback_and_merge_refuse_while_a_run_holds_the_branch(tmp):
    cli(tmp, "run", "chain_task.py", "--max-steps", "2", "-q", check=75)
    url = f"sqlite://{tmp / 's.db'}"
    store = open_store(url)
    from overnight.store.leases import Holder

    h = Holder.current()
    lease = store.acquire_lease("chain", "main", h.id, h.to_json(), 60_000)
    try:
        other = subprocess.run([sys.executable, "-m", "overnight", "rollback", "chain", "--to",
                                api.show("chain", store=url).chain[1].checkpoint_id[7:19], "--store", url],
                               capture_output=True, text=True, timeout=60)
        # the holder is this (live) test process, on this host: busy, exit 4
        assert other.returncode == 4 and "busy" in other.stderr
    finally:
        store.release_lease(lease)
        store.close()


def test_merge_union_conflicts_and_prefer(tmp):
    url = f"sqlite://{tmp / 's.db'}"
    cli(tmp, "run", "chain_task.py", "--max-steps", "3", "-q", check=75)  # plan, note 0, note 1
    cli(tmp, "fork", "chain", "--at", "main", "--branch", "B", check=0)
    cli(tmp, "resume", "chain", "--branch", "B", "--max-steps", "2", "-q", label="B", check=75)  # notes 2, 3 on B
    # main has not moved: merging B adds its two steps, no conflict
    res = api.merge("chain", "B", store=url)
    assert res.added_steps == ["note[i=2]", "note[i=3]"] and not res.conflicts
    merged = state_of(tmp, "main")
    assert merged.data["notes"] == ["main:0", "main:1", "B:2", "B:3"]
    assert [t.name for t in merged.todo][0] == "note[i=4]"
    assert api.merge("chain", "B", store=url).up_to_date
    # now both advance the same step differently: a conflict, with both sides
    cli(tmp, "resume", "chain", "--max-steps", "1", "-q", label="main", check=75)
    cli(tmp, "resume", "chain", "--branch", "B", "--max-steps", "1", "-q", label="B", check=75)
    with pytest.raises(MergeConflict) as err:
        api.merge("chain", "B", store=url)
    kinds = {(c.kind, c.name) for c in err.value.conflicts}
    assert ("step", "note[i=4]") in kinds and ("artifact", "note-4.txt") in kinds
    out = cli(tmp, "merge", "chain", "--from", "B", check=4)
    assert "note[i=4]" in out.stderr and "--prefer" in out.stderr
    res = api.merge("chain", "B", prefer="theirs", store=url)
    assert res.conflicts
    assert api.cat("chain", "note-4.txt", store=url) == b"B wrote note 4"
    theirs = [d for d in state_of(tmp, "main").done if d.name == "note[i=4]"]
    assert len(theirs) == 1 and theirs[0].output == "B"
