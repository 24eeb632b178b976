"""A store writer without the signing key cannot swap a signed task for an older incarnation.

Deleting a task (``overnight rm``) and creating it again under the same id makes a new
incarnation (a fresh random salt in its signed spec), whose high-water marks start afresh. An
attacker who can write the store, but holds no key, could use that to put back an older signed
chain of the same id -- a copy kept from before the ``rm``, or the same task from another store
signed with the same key -- and have every later step run again on old state (attacker, round
36). Now the high-water mark remembers the incarnations it replaced and the signed time of its
head: a head of a replaced incarnation, or of one whose chain holds a checkpoint created no later
than the marked head, is a rollback (``RollbackDetected``, exit 3) -- and a task deleted and
created again afterwards, here or on another machine, resumes as before.

Real ``python -m overnight`` processes on real SQLite stores; the attacker edits the database
file with ``sqlite3``, as anyone with write access to it can.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from test_attacks import KEY, cli, runs

from overnight.bench.attacks import JOB


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / "project"
    p.mkdir()
    (p / "job.py").write_text(JOB)
    return p


def _transplant(into: Path, source: Path) -> None:
    """The attacker: replace task ``job`` in the SQLite store ``into`` with its chain in ``source``
    (a copy of an earlier store, or another store) -- rows copied as they are; nothing re-signed."""
    db = sqlite3.connect(into, isolation_level=None)
    try:
        db.execute("ATTACH ? AS o", (str(source),))
        db.executescript("""
            BEGIN;
            DELETE FROM refs WHERE task_id='job'; DELETE FROM checkpoints WHERE task_id='job';
            DELETE FROM tasks WHERE task_id='job';
            INSERT INTO tasks SELECT * FROM o.tasks WHERE task_id='job';
            INSERT OR IGNORE INTO objects SELECT * FROM o.objects;
            INSERT INTO checkpoints SELECT * FROM o.checkpoints WHERE task_id='job';
            INSERT INTO refs SELECT * FROM o.refs WHERE task_id='job';
            COMMIT;""")
    finally:
        db.close()


def _copy(db: Path, to: Path) -> None:
    src, dst = sqlite3.connect(db), sqlite3.connect(to)
    src.backup(dst)
    src.close()
    dst.close()


def _refused(project: Path, url: str, env: dict[str, str], why: str) -> None:
    r = cli("resume", "job", "--store", url, cwd=project, key=KEY, check=3, **env)
    said = " ".join(r.stderr.split())
    assert "rollback detected" in said and why in said and "--allow-rollback" in said, said
    assert "someone put an older copy of the task in its place" in said, said
    status = cli("status", "job", "--store", url, cwd=project, key=KEY, **env)
    assert "rolled back" in status.stdout and why in " ".join(status.stdout.split()), status.stdout
    verified = cli("verify", "job", "--store", url, cwd=project, key=KEY, check=3, **env)
    assert "rollback" in verified.stdout, verified.stdout


def test_an_incarnation_kept_from_before_rm_is_refused(project: Path, tmp_path: Path) -> None:
    db, url = tmp_path / "store.db", f"sqlite://{tmp_path / 'store.db'}"
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", url, "--max-steps", "2", cwd=project, key=KEY, check=75, **env)
    _copy(db, tmp_path / "old.db")  # the attacker keeps a copy
    cli("rm", "job", "--yes", "--store", url, cwd=project, key=KEY, **env)
    cli("run", "job.py", "--store", url, cwd=project, key=KEY, **env)  # created again: all four steps
    assert runs(project) == ["a", "b", "a", "b", "c", "d"]

    _transplant(db, tmp_path / "old.db")
    _refused(project, url, env, "earlier incarnation of the task (deleted and created again)")
    assert runs(project) == ["a", "b", "a", "b", "c", "d"]  # nothing ran again
    # deliberate: --allow-rollback takes the old copy (c and d run again), then it is the task
    cli("resume", "job", "--store", url, "--allow-rollback", cwd=project, key=KEY, **env)
    assert runs(project)[6:] == ["c", "d"]
    cli("verify", "job", "--store", url, cwd=project, key=KEY, **env)


def test_the_same_task_from_another_store_created_earlier_is_refused(project: Path, tmp_path: Path) -> None:
    """This machine never saw the other store's incarnation: its checkpoints' signed times, all
    before the head this machine marked, give it away."""
    other_db, other = tmp_path / "other.db", f"sqlite://{tmp_path / 'other.db'}"
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", other, "--max-steps", "2", cwd=project, key=KEY, check=75,
        OVERNIGHT_STATE_DIR=str(tmp_path / "elsewhere"), **env)  # on another machine, earlier
    db, url = tmp_path / "store.db", f"sqlite://{tmp_path / 'store.db'}"
    cli("run", "job.py", "--store", url, cwd=project, key=KEY, **env)

    _transplant(db, other_db)
    _refused(project, url, env, "created before the newer signed head this machine has seen")
    assert runs(project) == ["a", "b", "a", "b", "c", "d"]


def test_a_task_deleted_and_created_again_resumes_here_and_elsewhere(project: Path, tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}"
    env = {"RUNS_FILE": str(project / "runs.txt")}
    cli("run", "job.py", "--store", url, cwd=project, key=KEY, **env)
    # another machine deletes it and starts it again; this machine then resumes that incarnation
    elsewhere = {"OVERNIGHT_STATE_DIR": str(tmp_path / "elsewhere"), **env}
    cli("rm", "job", "--yes", "--store", url, cwd=project, key=KEY, **elsewhere)
    cli("run", "job.py", "--store", url, "--max-steps", "2", cwd=project, key=KEY, check=75, **elsewhere)
    cli("resume", "job", "--store", url, cwd=project, key=KEY, **env)
    assert runs(project) == ["a", "b", "c", "d", "a", "b", "c", "d"]
    # and here: deleted and created again on this machine, twice
    for _ in range(2):
        cli("rm", "job", "--yes", "--store", url, cwd=project, key=KEY, **env)
        cli("run", "job.py", "--store", url, cwd=project, key=KEY, **env)
    assert len(runs(project)) == 16
    marks = json.loads((Path(os.environ["OVERNIGHT_STATE_DIR"]) / "high-water.json").read_text())
    (mark,) = [m["job"]["main"] for u, m in marks.items() if u == url]
    assert len(mark["retired"]) == 3 and mark["incarnation"] not in mark["retired"] and mark["created_at"], mark
