"""Round 37's attacker on the trust boundary, fixed.

1. The high-water mark of a signed task was keyed by the store URL's text, so naming the same
   store another way -- a relative path, a symlinked folder -- found no mark: a ref moved back with
   the newer records deleted read ``interrupted``, and a resume ran the later steps again (then the
   original URL read ``complete``: the rollback laundered). The mark is now keyed by the store's
   real path.

Real ``python -m overnight`` processes on real stores; the attacker edits the database with
``sqlite3``, as anyone with write access to it can.
"""

from __future__ import annotations

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


def _move_ref_back(db: Path, seq: int) -> None:
    """The attacker, without the key: point the ref at the task's checkpoint ``seq`` and delete
    every newer record, so no record in the store shows the branch once stood further on."""
    con = sqlite3.connect(db, isolation_level=None)
    try:
        (old,) = con.execute("SELECT checkpoint_id FROM checkpoints WHERE task_id='job' AND seq=?", (seq,)).fetchone()
        con.executescript(f"""BEGIN; UPDATE refs SET checkpoint_id='{old}' WHERE task_id='job';
            DELETE FROM checkpoints WHERE task_id='job' AND seq>{seq}; COMMIT;""")
    finally:
        con.close()


def test_a_rollback_is_caught_through_every_spelling_of_the_store_path(project: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    env = {"RUNS_FILE": str(project / "runs.txt"), "OVERNIGHT_STATE_DIR": str(tmp_path / "state")}
    cli("run", "job.py", "--store", f"sqlite://{real / 'store.db'}", cwd=project, key=KEY, **env)
    assert runs(project) == ["a", "b", "c", "d"]
    _move_ref_back(real / "store.db", 2)
    for url in (f"sqlite://{real / 'store.db'}", "sqlite://../real/store.db", f"sqlite://{tmp_path / 'link' / 'store.db'}",
                "../link/store.db"):
        status = cli("status", "job", "--store", url, cwd=project, key=KEY, **env)
        assert "rolled back" in status.stdout, (url, status.stdout, status.stderr)
        r = cli("resume", "job", "--store", url, cwd=project, key=KEY, check=3, **env)
        assert "rollback detected" in r.stderr, (url, r.stderr)
    assert runs(project) == ["a", "b", "c", "d"]  # nothing ran again
