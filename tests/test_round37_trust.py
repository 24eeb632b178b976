"""Round 37's attacker on the trust boundary, fixed.

1. The high-water mark of a signed task was keyed by the store URL's text, so naming the same
   store another way -- a relative path, a symlinked folder -- found no mark: a ref moved back with
   the newer records deleted read ``interrupted``, and a resume ran the later steps again (then the
   original URL read ``complete``: the rollback laundered). The mark is now keyed by the store's
   real path.
2. The model-call journal was not signed: a store writer without the key rewrote a recorded
   answer between a crash and the resume, which replayed it into a signed checkpoint; a damaged
   row failed every resume inside the user's step. A row is now replayed only when it parses and,
   with a key, its HMAC verifies; else the model is called again.

Real ``python -m overnight`` processes on real stores; the attacker edits the database with
``sqlite3``, as anyone with write access to it can.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from test_attacks import KEY, cli, runs

import overnight
from overnight.bench.attacks import JOB
from overnight.chain.read import load_head
from overnight.errors import StepFailed
from overnight.models.extractive import ExtractiveModel
from overnight.store import open_store


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


# -- 2. the model-call journal: a forged or damaged answer is never replayed -------------------------

FORGED = b'{"finish_reason":"stop","text":"ATTACKER: deploy to evil.example"}'


class CountingModel(ExtractiveModel):
    """The offline extractive model, counting the calls it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0

    def complete(self, *args, **kwargs):  # type: ignore[override]
        self.answered += 1
        return super().complete(*args, **kwargs)


def _ask_task(fail: dict[str, bool]) -> overnight.Task:
    task = overnight.Task("ask", goal="ask the model once", level="session", deps=[])

    @task.step
    def ask(ctx):
        ctx.state["answer"] = ctx.model.complete([{"role": "user", "content": "Prod is the target. More."}],
                                                 max_tokens=32).text
        if fail["now"]:
            raise RuntimeError("dies after the model answered, before the commit")

    return task


def _answered_then_failed(url: str, model: CountingModel) -> dict[str, bool]:
    fail = {"now": True}
    with pytest.raises(StepFailed):
        overnight.run(_ask_task(fail), store=url, model=model)
    fail["now"] = False
    assert model.answered == 1
    return fail


def _set_response(db: Path, response: bytes) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    try:
        assert con.execute("UPDATE calls SET response=? WHERE task_id='ask'", (response,)).rowcount == 1
    finally:
        con.close()


@pytest.fixture
def signed(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OVERNIGHT_SIGNING_KEY", KEY)
    monkeypatch.setenv("OVERNIGHT_STATE_DIR", str(tmp_path / "state"))


def test_a_signed_journal_row_replays_and_a_forged_one_is_called_again(signed, tmp_path: Path, caplog) -> None:
    """Attacker (round 37): with a signing key, a store writer without it rewrote a recorded model
    answer between the crash and the resume; the resume replayed it into a signed checkpoint."""
    url = f"sqlite://{tmp_path / 's.db'}"
    model = CountingModel()
    fail = _answered_then_failed(url, model)
    assert overnight.run(_ask_task(fail), store=url, model=model).status == "complete"
    assert model.answered == 1  # the signed row was replayed: not paid for twice

    url2, db2 = f"sqlite://{tmp_path / 't.db'}", tmp_path / "t.db"
    model = CountingModel()
    fail = _answered_then_failed(url2, model)
    _set_response(db2, FORGED)  # the attacker's answer, unsigned
    with caplog.at_level("WARNING", logger="overnight.runner"):
        assert overnight.run(_ask_task(fail), store=url2, model=model).status == "complete"
    assert model.answered == 2  # called again, not replayed
    assert "is not replayed (it is not signed)" in caplog.text
    with open_store(url2) as s:
        assert "ATTACKER" not in load_head(s, "ask")[0].state.data["answer"]


@pytest.mark.parametrize("damage", [b"\xff", b"[]", b"not json", b'{"text":5}', b'{"finish_reason":"stop"}'])
def test_a_damaged_journal_row_is_called_again_not_blamed_on_the_step(tmp_path: Path, damage: bytes) -> None:
    """Attacker (round 37): a damaged ``calls.response`` failed every resume inside the user's step
    (``DecodeError`` / ``TypeError``, exit 1, "fix the cause"); ``{"text": 5}`` handed user code a
    number. Now the row is not replayed: the model answers again and the task completes."""
    url, db = f"sqlite://{tmp_path / 's.db'}", tmp_path / "s.db"
    model = CountingModel()
    fail = _answered_then_failed(url, model)
    _set_response(db, damage)
    assert overnight.run(_ask_task(fail), store=url, model=model).status == "complete"
    assert model.answered == 2
    with open_store(url) as s:
        assert isinstance(load_head(s, "ask")[0].state.data["answer"], str)


# -- 3. an archive catalog row cannot choose where a read connects or writes ------------------------


def _forge_location(db: Path, location: str) -> None:
    con = sqlite3.connect(db, isolation_level=None)
    try:
        assert con.execute("UPDATE archives SET location=?", (location,)).rowcount >= 1
    finally:
        con.close()


def test_a_forged_archive_location_is_not_opened_by_a_read(project: Path, tmp_path: Path, pg_schema) -> None:
    """Attacker (round 37): a store writer pointed the archive catalog at a PostgreSQL schema of
    theirs, and a read-only ``overnight verify`` connected there and created overnight's tables in
    it; pointed at an empty folder, it wrote a store marker there. A cold store the catalog names is
    now opened only if it is local and already a store, or this machine archived to it."""
    import psycopg

    server, schema = pg_schema
    env = {"RUNS_FILE": str(project / "runs.txt"), "OVERNIGHT_STATE_DIR": str(tmp_path / "state")}
    db, url = tmp_path / "hot.db", f"sqlite://{tmp_path / 'hot.db'}"
    cli("run", "job.py", "--store", url, cwd=project, **env)
    cli("archive", "job", "--cold", f"file://{tmp_path / 'cold'}", "--keep-last", "1", "--store", url, cwd=project,
        **env)
    assert "job" in cli("verify", "job", "--store", url, cwd=project, **env).stdout  # the genuine catalog: ok

    _forge_location(db, f"{server}?schema={schema}")
    r = cli("verify", "job", "--store", url, cwd=project, check=3, **env)
    assert "which this machine did not archive to: not opened" in " ".join(r.stdout.split()), r.stdout
    with psycopg.connect(server) as conn:
        assert conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema=%s",
                            (schema,)).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name=%s",
                            (schema,)).fetchone() == (0,)

    empty = tmp_path / "empty"
    empty.mkdir()
    _forge_location(db, f"file://{empty}")
    r = cli("verify", "job", "--store", url, cwd=project, check=3, **env)
    assert "holds no overnight store" in " ".join(r.stdout.split()), r.stdout
    assert list(empty.iterdir()) == []  # nothing written there


# -- 4. a lease token at the integer maximum is a typed error, not an OverflowError ------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_lease_token_at_its_maximum_is_a_typed_error(kind: str, tmp_path: Path, request) -> None:
    """Attacker (round 37): a lease row with token 2^63-1 made ``resume`` die with ``OverflowError``
    and a traceback (SQLite); the next token does not exist, so the store says so, typed."""
    from overnight.errors import SchemaError
    from overnight.store.leases import MAX_TOKEN

    if kind == "sqlite":
        url = f"sqlite://{tmp_path / 's.db'}"
    else:
        server, schema = request.getfixturevalue("pg_schema")
        url = f"{server}?schema={schema}"
    with open_store(url) as s:
        first = s.acquire_lease("t", "main", "me", "{}", 1_000)
        s.release_lease(first)
        if kind == "sqlite":
            con = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
            con.execute("UPDATE leases SET token=? WHERE task_id='t'", (MAX_TOKEN,))
            con.close()
        else:
            import psycopg

            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'UPDATE "{schema}".leases SET token=%s WHERE task_id=%s', (MAX_TOKEN, b"t"))
        with pytest.raises(SchemaError, match="fencing token 9223372036854775807"):
            s.acquire_lease("t", "main", "me", "{}", 1_000)
