"""``overnight bench commit``: checkpoint commit latency against LangGraph and the fsync floor.

Writers, interleaved round-robin on the same disk (and the same PostgreSQL server) so that noise
hits all alike, each committing the same ~``state_kb`` KB state ``n`` times (every commit appends a
512-byte message and drops the oldest, so the state keeps its size but changes each time). The
systems, by name (:data:`SYSTEMS`):

* ``overnight sqlite`` / ``overnight file`` / ``overnight postgres`` -- the full write path of one
  checkpoint on that store: encode the user state (canonical JSON), stage the state blob (SHA-256,
  dedup lookup, zstd), build, digest and commit the record with the ref CAS (SQLite: one
  transaction, WAL, ``synchronous=FULL``; file: the commit's temporary files fsynced side by
  side, linked, their folders fsynced side by side, then the ref renamed and its folder fsynced;
  PostgreSQL: one transaction, committed);
* ``LangGraph SqliteSaver`` -- ``SqliteSaver.put`` (langgraph-checkpoint-sqlite; its defaults: WAL
  and SQLite's default ``synchronous=FULL``), timing serialization and the insert;
* ``LangGraph PostgresSaver`` -- ``PostgresSaver.put`` (langgraph-checkpoint-postgres, autocommit
  connection as ``from_conn_string`` makes it) into a fresh schema on the same server;
* ``floor`` -- ``os.write`` of the same state bytes plus ``os.fsync`` on an open file: no durable
  checkpointer can commit faster on this disk.

* ``... (no fsync)`` -- the two SQLite writers again, on their own files, with ``PRAGMA
  synchronous=OFF`` (``overnight bench commit --cpu``): the same work without waiting for the
  disk, so that the rest of each median is the flush. Diagnostic only; never how overnight runs.

Latencies are in milliseconds; ratios are against the medians of the baselines present
(``LangGraph SqliteSaver``, ``LangGraph PostgresSaver``, ``floor``).
"""

from __future__ import annotations

import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from overnight.codec.canonical import dumps, to_tree
from overnight.errors import ConfigError
from overnight.store import Store, open_store
from overnight.chain.write import ChainWriter
from overnight.chain.records import event, initial_state

#: the durable systems :func:`run_commit_bench` can measure, in table order
SYSTEMS = ("overnight sqlite", "overnight file", "overnight postgres", "LangGraph SqliteSaver",
           "LangGraph PostgresSaver", "floor")
NO_FSYNC = " (no fsync)"
#: diagnostic systems: the SQLite writers with ``synchronous=OFF`` (not durable; see the module docstring)
NO_FSYNC_SYSTEMS = ("overnight sqlite" + NO_FSYNC, "LangGraph SqliteSaver" + NO_FSYNC)
#: the ones ``overnight bench commit`` measures by default (no server needed)
LOCAL_SYSTEMS = ("overnight sqlite", "LangGraph SqliteSaver", "floor")
#: ``overnight bench commit --cpu``: those, and the SQLite writers again without the flush
CPU_SYSTEMS = LOCAL_SYSTEMS + NO_FSYNC_SYSTEMS
#: systems whose median is a column of ratios, with the column heading
BASELINES = {"LangGraph SqliteSaver": "vs SqliteSaver", "LangGraph PostgresSaver": "vs PostgresSaver",
             "floor": "vs floor"}
#: the test server (trust auth), as in the test suite (the CLI's default, ``overnight.cli.common``)
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def percentile(xs: list[float], p: float) -> float | None:
    """The ``p``-th percentile of ``xs`` by nearest rank (no interpolation: a value that was
    measured), or None when there are no samples."""
    if not xs:
        return None
    ys = sorted(xs)
    return ys[min(len(ys) - 1, max(0, round(p / 100 * (len(ys) - 1))))]


@dataclass
class Series:
    """Latency samples of one writer (ms) and the bytes it left on its medium."""

    name: str
    samples_ms: list[float] = field(default_factory=list)
    stored_bytes: int = 0

    def pct(self, p: float) -> float:
        """The ``p``-th percentile of the samples (nearest rank, ms)."""
        return percentile(self.samples_ms, p) or 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms)


@dataclass
class CommitBench:
    """Result of :func:`run_commit_bench`; :meth:`markdown` renders the table."""

    n: int
    state_bytes: int
    directory: str
    series: list[Series]

    def baselines(self) -> list[Series]:
        """The baseline series present, in :data:`BASELINES` order."""
        return [s for name in BASELINES for s in self.series if s.name == name]

    def markdown(self) -> str:
        bases = self.baselines()
        lines = [
            f"commit latency, {self.n} commits each, state {self.state_bytes / 1024:.1f} KB, disk {self.directory}",
            "",
            "| writer | median ms | p99 ms | mean ms | " + " | ".join(f"median {BASELINES[b.name]}" for b in bases)
            + " | stored |",
            "|---|---:|---:|---:|" + "---:|" * len(bases) + "---:|",
        ]
        for s in self.series:
            ratios = "".join(f" {s.median / b.median:.2f}x |" for b in bases)
            lines.append(f"| {s.name} | {s.median:.3f} | {s.pct(99):.3f} | {statistics.fmean(s.samples_ms):.3f} |"
                         f"{ratios} {s.stored_bytes / 1024:.0f} KB |")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "state_bytes": self.state_bytes, "directory": self.directory,
                "systems": [{"name": s.name, "median_ms": round(s.median, 4), "p99_ms": round(s.pct(99), 4),
                             "mean_ms": round(statistics.fmean(s.samples_ms), 4), "stored_bytes": s.stored_bytes,
                             **{f"median_{BASELINES[b.name].replace(' ', '_')}": round(s.median / b.median, 4)
                                for b in self.baselines()},
                             "samples_ms": [round(x, 4) for x in s.samples_ms]} for s in self.series]}


_WORDS = ("checkpoint resume session context budget summary artifact module section report step agent model "
          "token drift fingerprint branch chain verify digest store commit write read parse extract function "
          "class method signature docstring package version environment input output result error retry").split()


def message_text(rng: random.Random, size: int) -> str:
    """Pseudo-random prose of about ``size`` bytes (compresses like text, ~3x, not like a repeat)."""
    words: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(_WORDS) + rng.choice(("", "", "", ",", ".", "s", "ed")) + (str(rng.randrange(100)) if rng.random() < 0.1 else "")
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:size]


def _messages(state_bytes: int, rng: random.Random) -> list[dict[str, Any]]:
    count = max(1, state_bytes // 560)
    return [{"role": "user" if i % 2 else "assistant", "content": message_text(rng, 512)} for i in range(count)]


def bench_state(data_tree: Any, task_id: str = "bench") -> dict[str, Any]:
    """A minimal overnight state document (:class:`~overnight.chain.records.TaskState` tree)
    holding ``data_tree`` as the user state."""
    return initial_state(task_id, "bench", {}, data=data_tree)


def drop_pg_schema(url: str, schema: str) -> None:
    """``DROP SCHEMA ... CASCADE`` on the server at ``url`` (bench clean-up)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def langgraph_saver(system: str, stack: ExitStack, tmpdir: Path, postgres_url: str) -> tuple[Any, Callable[[], int]]:
    """Open LangGraph's ``SqliteSaver`` (a file in ``tmpdir``) or ``PostgresSaver`` (a fresh schema,
    dropped when ``stack`` closes), set up. Returns ``(saver, stored_bytes)``.

    Raises:
        ImportError: the langgraph checkpointer package is not installed (the ``bench`` extra).
        ConfigError: the PostgreSQL server is unreachable.
    """
    if system == "LangGraph SqliteSaver":
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = tmpdir / "langgraph.db"
        conn = sqlite3.connect(str(path), check_same_thread=False)

        def close() -> None:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            conn.close()

        stack.callback(close)
        saver = SqliteSaver(conn)
        saver.setup()

        def sqlite_bytes() -> int:  # as SQLiteStore.stored_bytes: the file and its WAL (not the -shm index)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            return sum(p.stat().st_size for p in (path, tmpdir / "langgraph.db-wal") if p.exists())

        return saver, sqlite_bytes
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    schema = f"lg_bench_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(postgres_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        raise ConfigError(f"{system}: cannot connect to PostgreSQL at {postgres_url}: {str(exc).strip()}",
                          hint="start the server or pass another --postgres URL") from exc
    stack.callback(drop_pg_schema, postgres_url, schema)
    pg = psycopg.connect(postgres_url, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                         options=f"-c search_path={schema}")
    stack.callback(pg.close)
    saver = PostgresSaver(pg)
    saver.setup()

    def pg_bytes() -> int:
        row = pg.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS n FROM pg_class c "
                         "JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = %s AND c.relkind = 'r'",
                         (schema,)).fetchone()
        return int(row["n"])

    return saver, pg_bytes


def open_overnight(system: str, tmpdir: Path, postgres_url: str, stack: ExitStack) -> Store:
    """Open the store of an ``overnight <medium>`` system -- a file in ``tmpdir``, a directory in it,
    or a fresh schema on ``postgres_url`` -- closed (and the schema dropped) when ``stack`` closes.

    Raises:
        ConfigError: the PostgreSQL server is unreachable or refuses the login.
    """
    medium = system.split()[-1]
    if medium == "sqlite":
        store = open_store(f"sqlite://{tmpdir / 'overnight.db'}")
    elif medium == "file":
        store = open_store(f"file://{tmpdir / 'overnight-files'}")
    else:
        schema = f"overnight_bench_{uuid.uuid4().hex[:10]}"
        store = open_store(f"{postgres_url}?schema={schema}")
        stack.callback(drop_pg_schema, postgres_url, schema)
    stack.callback(store.close)
    return store


def _writer(system: str, stack: ExitStack, tmpdir: Path, postgres_url: str
            ) -> tuple[Callable[[dict[str, Any], int], None], Callable[[], int]]:
    """``(commit(payload, i), stored_bytes())`` for one system."""
    sync = not system.endswith(NO_FSYNC)
    if not sync:  # its own files, never flushed: what the writer does besides the flush
        system, tmpdir = system[: -len(NO_FSYNC)], tmpdir / "no-fsync"
        tmpdir.mkdir(exist_ok=True)
    if system.startswith("overnight "):
        store = open_overnight(system, tmpdir, postgres_url, stack)
        if not sync:
            store.query("PRAGMA synchronous=OFF")  # type: ignore[attr-defined]  # an SQLiteStore
        chain = ChainWriter(store, "bench", "main", key=None, session_id=uuid.uuid4().hex, session_n=1)

        def commit(payload: dict[str, Any], i: int) -> None:
            chain.commit(bench_state(to_tree(payload, "state.data")), event("step", step=f"s{i}"))

        return commit, store.stored_bytes
    if system.startswith("LangGraph "):
        from langgraph.checkpoint.base import empty_checkpoint

        saver, stored = langgraph_saver(system, stack, tmpdir, postgres_url)
        if not sync:
            saver.conn.execute("PRAGMA synchronous=OFF")
        config: dict[str, Any] = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}

        def put(payload: dict[str, Any], i: int) -> None:
            nonlocal config
            cp = empty_checkpoint()
            cp["channel_values"] = dict(payload)
            cp["channel_versions"] = {"messages": i + 1, "step": i + 1}
            config = saver.put(config, cp, {"source": "loop", "step": i}, {"messages": i + 1, "step": i + 1})

        return put, stored
    path = tmpdir / "floor.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    stack.callback(os.close, fd)

    def write(payload: dict[str, Any], i: int) -> None:
        os.write(fd, dumps(to_tree(payload)))
        os.fsync(fd)

    return write, lambda: path.stat().st_size


def run_commit_bench(n: int = 300, state_kb: float = 10.0, directory: Path | None = None,
                     systems: tuple[str, ...] = LOCAL_SYSTEMS, postgres_url: str = DEFAULT_POSTGRES) -> CommitBench:
    """Run the benchmark; see the module docstring.

    Args:
        n: commits per system (after 5 warm-up rounds, not counted).
        state_kb: size of the state (KB).
        directory: disk to measure (a temporary directory is made under it; default the cwd).
        systems: names from :data:`SYSTEMS` and :data:`NO_FSYNC_SYSTEMS`, measured in that order
            within each round.
        postgres_url: server for the ``postgres`` systems (fresh schemas, dropped afterwards).

    Raises:
        ValueError: an unknown system name.
        ImportError: a langgraph checkpointer is not installed (``pip install 'overnight[bench]'``).
        ConfigError: a PostgreSQL system was asked for and the server is unreachable.
    """
    unknown = [s for s in systems if s not in SYSTEMS + NO_FSYNC_SYSTEMS]
    if unknown:
        raise ConfigError(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS + NO_FSYNC_SYSTEMS)}")
    base = Path(directory) if directory is not None else Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="overnight-bench-", dir=base) as tmp, ExitStack() as stack:
        tmpdir = Path(tmp)
        rng = random.Random(7)
        messages = _messages(int(state_kb * 1024), rng)
        writers = [(Series(name), *_writer(name, stack, tmpdir, postgres_url)) for name in systems]
        state_size = len(dumps(to_tree({"messages": messages})))
        for i in range(n + 5):  # 5 warm-up rounds, not counted
            messages = messages[1:] + [{"role": "assistant", "content": message_text(rng, 512)}]
            payload = {"messages": messages, "step": i}
            for series, commit, _ in writers:
                t0 = time.perf_counter()
                commit(payload, i)
                t1 = time.perf_counter()
                if i >= 5:
                    series.samples_ms.append((t1 - t0) * 1000)
        for series, _, stored in writers:
            series.stored_bytes = stored()
        return CommitBench(n=n, state_bytes=state_size, directory=str(base), series=[s for s, _, _ in writers])
