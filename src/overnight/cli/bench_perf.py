"""``overnight bench perf``: issue 14's cost targets judged from one run of every benchmark, with plots."""

from __future__ import annotations

from pathlib import Path

import typer

from overnight.cli.common import DEFAULT_POSTGRES, failing
from overnight.cli import render


def register(bench_app: typer.Typer) -> None:
    """Add the ``perf`` command to ``overnight bench``."""

    @bench_app.command("perf")
    def bench_perf(
        out: Path = typer.Option(Path("bench-results"), "--out", help="Directory for perf.md, perf.json and "
                                 "the PNG plots (created if missing)."),
        quick: bool = typer.Option(False, "--quick", help="Smaller sizes: 20-40 s instead of 5-8 min on 2 cores "
                                   "(the targets are judged at those sizes: a hint, not issue 14's figures)."),
        postgres: str = typer.Option(DEFAULT_POSTGRES, "--postgres",
                                     help="PostgreSQL server for the postgres systems (fresh schemas, dropped "
                                     "afterwards)."),
        no_postgres: bool = typer.Option(False, "--no-postgres", help="Leave out the PostgreSQL systems (no "
                                         "server needed)."),
        as_json: bool = typer.Option(False, "--json", help="Print perf.json's content instead of the tables."),
        directory: Path = typer.Option(Path("."), "--dir", help="The disk to measure: scratch stores (several "
                                       "hundred MB at the default sizes) go in a temporary folder under it, "
                                       "removed at the end, on Ctrl-C and on SIGTERM."),
    ) -> None:
        """Every cost target of issue 14 judged from one run, each against a baseline measured in
        the same run: bytes per checkpoint and storage growth against LangGraph's SqliteSaver;
        commit latency (SQLite, file, PostgreSQL) against SqliteSaver, PostgresSaver and a
        write+fsync floor; resume latency against chain length (10 / 100 / 1,000 / 5,000
        checkpoints) against LangGraph's get_tuple; verify --all throughput (MB/s) against sha256
        in memory; the whole `overnight resume` process to its first step, over a bare `import
        overnight`; the LangGraph and Agents SDK adapters against SqliteSaver and SQLiteSession.
        perf.md starts with the targets table (figure, target, met); writes perf.md, perf.json,
        commit_latency.png, resume_latency.png and resume_process.png into --out. Exit status 0
        whether or not the targets are met."""
        import signal
        import sys

        from overnight.bench.perf import DEFAULT, QUICK, run_perf, write_report
        from overnight.errors import StoreUnavailable

        # SIGTERM (a CI cancel, `timeout`) unwinds like Ctrl-C: scratch folders and schemas are removed
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with failing("bench"):
            # what the runs need, looked up (not imported: the storage run's peak memory is the
            # process's) before any of them: a missing extra is named now, as `[bench]` (a store
            # URL's missing driver would otherwise name `[postgres]` alone)
            import importlib.util

            for module in ("matplotlib", "langgraph.checkpoint.sqlite", "agents",
                           *(() if no_postgres else ("psycopg", "langgraph.checkpoint.postgres"))):
                try:
                    found = importlib.util.find_spec(module)
                except ModuleNotFoundError:  # its parent package is missing
                    found = None
                if found is None:
                    raise ModuleNotFoundError(f"No module named {module!r}", name=module)
            try:
                report = run_perf(QUICK if quick else DEFAULT, postgres_url=None if no_postgres else postgres,
                                  directory=directory)
            except StoreUnavailable as exc:
                exc.hint = f"{exc.hint}; or run without PostgreSQL: --no-postgres" if exc.hint else "--no-postgres"
                raise
            paths = write_report(report, out)
        render.report(report, as_json)
        render.err.print("wrote " + ", ".join(str(p) for p in paths))
