"""The CLI as a user drives it, and the README examples (executed, so they cannot rot)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def cli(*args: str, cwd: Path, env: dict | None = None, check: int | None = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "overnight", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=120)
    if check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def readme_block(after_heading: str, lang: str) -> str:
    section = README.split(after_heading, 1)[1]
    match = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert match, f"no {lang} block after {after_heading!r}"
    return match.group(1)


def test_readme_starts_with_the_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert "overnight demo" in blocks[0] and "pip install" in blocks[0]
    assert "pytest" in blocks[1] and "pip install" in blocks[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci  # CI extracts and runs exactly that block


def test_readme_python_example_runs(tmp_path):
    code = readme_block("## Python API", "python")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "complete 5 / 5"
    again = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.stdout.strip() == "complete 5 / 5"  # resumes: nothing left, nothing redone


def test_demo_writes_report_and_says_where(tmp_path):
    proc = cli("demo", cwd=tmp_path)
    report = tmp_path / "report.md"
    assert report.exists()
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# API reference: `email`")
    assert "## `email.message`" in text and "## Contents" in text
    assert len(text) > 4 * 8000 * 1.5  # well over an 8,000-token context (~4 bytes/token)
    assert f"report: {report}" in proc.stdout  # the result on stdout; the rest on stderr
    assert "store:" in proc.stderr and ".overnight/overnight.db" in proc.stderr
    # running it again resumes the finished task: nothing is recomputed, same bytes
    before = report.read_bytes()
    again = cli("demo", cwd=tmp_path)
    assert "0 run now" in again.stderr and "context window #" not in again.stderr  # ran and recorded nothing
    assert report.read_bytes() == before


def test_demo_resumed_with_the_printed_command_still_writes_the_report(tmp_path):
    stopped = cli("demo", "--max-steps", "3", cwd=tmp_path, check=75)
    assert "overnight resume api-report-email" in stopped.stderr
    assert not (tmp_path / "report.md").exists()
    cli("resume", "api-report-email", "-q", cwd=tmp_path)
    assert (tmp_path / "report.md").read_text(encoding="utf-8").startswith("# API reference: `email`")


def test_ls_show_cat_json(tmp_path):
    cli("demo", "--max-steps", "3", cwd=tmp_path, check=75)
    tasks = json.loads(cli("ls", "--json", cwd=tmp_path).stdout)
    assert [t["task_id"] for t in tasks] == ["api-report-email"]
    assert tasks[0]["status"] == "interrupted" and tasks[0]["done"] == 3
    show = json.loads(cli("show", "api-report-email", "--json", cwd=tmp_path).stdout)
    assert [c["seq"] for c in show["chain"]] == [0, 1, 2, 3]
    assert show["chain"][-1]["heads"] == ["main"]
    assert all(c["valid"] for c in show["chain"])
    section = cli("cat", "api-report-email", "sections/email.md", cwd=tmp_path).stdout
    assert section.startswith("## `email`")
    # --at an older checkpoint (unique prefix) sees the artifacts as they were then
    old = show["chain"][2]["checkpoint_id"][7:15]
    missing = cli("cat", "api-report-email", "sections/email.base64mime.md", "--at", old, cwd=tmp_path, check=2)
    assert "no artifact" in missing.stderr and "hint:" in missing.stderr
    table = cli("show", "api-report-email", cwd=tmp_path).stdout
    assert "section:email" in table and "<- main" in table
    header = next(line for line in table.splitlines() if "event" in line)
    assert header.split()[:6:2] == ["seq", "id", "session"]  # the session column says what it is


def test_run_resume_exit_codes(tmp_path):
    (tmp_path / "job.py").write_text(
        "import overnight\n"
        "task = overnight.Task('job', goal='g')\n"
        "@task.step\n"
        "def a(ctx): return 1\n"
        "@task.step\n"
        "def b(ctx):\n"
        "    import os\n"
        "    if os.environ.get('FAIL'): raise ValueError('boom')\n"
        "    return 2\n"
        "@task.step\n"
        "def c(ctx): return 3\n"
    )
    out = cli("run", "job.py", "--max-steps", "1", cwd=tmp_path, check=75)
    assert "overnight resume job" in out.stderr
    failed = cli("resume", "job", cwd=tmp_path, env={"FAIL": "1"}, check=1)
    assert "step 'b' failed" in failed.stderr and "ValueError: boom" in failed.stderr
    cli("resume", "job", cwd=tmp_path)
    shown = json.loads(cli("show", "job", "--json", cwd=tmp_path).stdout)
    assert shown["status"] == "complete" and shown["done"] == 3


def test_resume_never_imports_code_from_a_location_only_the_store_row_names(tmp_path):
    """The task row's code location is not covered by any digest; the spec in every checkpoint is."""
    (tmp_path / "job.py").write_text("import overnight\ntask = overnight.Task('job', goal='g')\n"
                                     "@task.step\ndef a(ctx): return 1\n@task.step\ndef b(ctx): return 2\n")
    (tmp_path / "evil.py").write_text("import pathlib\npathlib.Path('IMPORTED').write_text('x')\n"
                                      "import overnight\ntask = overnight.Task('job', goal='g')\n"
                                      "@task.step\ndef a(ctx): return 1\n@task.step\ndef b(ctx): return 2\n")
    cli("run", "job.py", "--max-steps", "1", cwd=tmp_path, check=75)
    db = sqlite3.connect(tmp_path / ".overnight" / "overnight.db")
    (entry,) = db.execute("SELECT entry FROM tasks WHERE task_id='job'").fetchone()
    db.execute("UPDATE tasks SET entry=? WHERE task_id='job'", (entry.replace("job.py", "evil.py"),))
    db.commit()
    db.close()
    out = cli("resume", "job", cwd=tmp_path, check=3)
    assert "EntryMismatch" in out.stderr or "unverified location" in out.stderr, out.stderr
    assert not (tmp_path / "IMPORTED").exists()
    cli("resume", "job", "--file", "job.py", cwd=tmp_path)  # naming the code explicitly still works


def test_usage_errors_are_clear(tmp_path):
    err = cli("show", "nope", cwd=tmp_path, check=2).stderr  # read-only commands never create a store
    assert "no store at" in err and not (tmp_path / ".overnight").exists()
    err = cli("ls", "--store", "sqlite:/typo.db", cwd=tmp_path, check=2).stderr
    assert "malformed" in err and not list(tmp_path.iterdir())
    cli("demo", "--max-steps", "1", cwd=tmp_path, check=75)
    err = cli("show", "nope", cwd=tmp_path, check=2).stderr
    assert "no task 'nope'" in err and "overnight ls" in err
    err = cli("run", "missing.py", cwd=tmp_path, check=2).stderr
    assert "missing.py" in err
    (tmp_path / "broken.py").write_text("import overnight\nsyntax error(\n")
    err = cli("run", "broken.py", cwd=tmp_path, check=2).stderr
    assert "SyntaxError" in err and "line 2" in err and "Traceback" not in err
    err = cli("demo", "--package", "no_such_package_xyz", cwd=tmp_path, check=2).stderr
    assert "not installed" in err and "api-report-no" not in cli("ls", "--json", cwd=tmp_path).stdout
    err = cli("resume", "nope", "--store", "bogus://x", cwd=tmp_path, check=2).stderr
    assert "unsupported store URL" in err


def test_help_documents_exit_codes(tmp_path):
    out = cli("--help", cwd=tmp_path).stdout
    for code in ("0 complete", "1 step failed", "3 integrity", "4 busy", "75 resumable"):
        assert code in out


def _commands() -> list[str]:
    import typer.main

    from overnight.cli.app import app

    group = typer.main.get_command(app)
    out = []
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        out += [f"{name} {sub}" for sub in subs] if subs else [name]
    return sorted(out)


@pytest.mark.parametrize("cmd", _commands())
def test_every_command_is_in_the_readme(cmd):
    assert f"overnight {cmd}" in README


@pytest.mark.parametrize("cmd", ["gc", "rm", "archive", "restore"])
def test_housekeeping_commands_document_their_options(cmd, tmp_path):
    out = cli(cmd, "--help", cwd=tmp_path).stdout
    expected = {"gc": ["--apply", "--keep-last", "--older-than", "--task", "--grace", "--json"],
                "rm": ["--yes", "--force", "--grace", "--json"],
                "archive": ["--cold", "--keep-last", "--older-than", "--grace", "--json"],
                "restore": ["--cold", "--json"]}[cmd]
    for option in expected:
        assert option in out


def test_resume_of_an_adapter_task_says_where_it_lives(tmp_path):
    import asyncio

    from langgraph.checkpoint.base import empty_checkpoint

    from overnight.adapters.langgraph import OvernightSaver
    from overnight.adapters.openai_agents import OvernightSession

    url = f"sqlite://{tmp_path / 'a.db'}"
    with OvernightSaver.from_url(url) as saver:
        saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
    session = OvernightSession("s", store=url)
    asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
    session.close()
    for task_id, what in (("langgraph:t", "LangGraph thread"), ("agents.s", "Agents SDK session")):
        for args in (["resume", task_id], ["status", task_id, "--drift"]):
            err = cli(*args, "--store", url, cwd=tmp_path, check=2).stderr
            assert what in err and "--file" not in err, err


def test_demo_cuts_a_class_too_large_for_one_call_between_its_methods(tmp_path):
    pkg = tmp_path / "bigpkg"
    pkg.mkdir()
    methods = "".join(f"    def method_{i}(self, value: int, *, scale: float = 1.0) -> int:\n"
                      f'        """Return value number {i}, scaled. {"Explains the details at length. " * 12}"""\n'
                      "        return value\n\n" for i in range(60))
    (pkg / "__init__.py").write_text('"""A package with one very large class."""\n\n'
                                     f'class Huge:\n    """A class whose API alone outgrows the window."""\n\n{methods}')
    cli("demo", "-p", "bigpkg", "-q", "--max-context-tokens", "2000", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert report.count("### class `Huge`") == 1
    assert all(f"`Huge.method_{i}(" in report for i in range(60))


def test_printed_resume_command_works_for_a_task_created_from_a_script(tmp_path):
    (tmp_path / "slow.py").write_text(
        "import overnight\n"
        "task = overnight.Task('slow', goal='count some things slowly', expected_span='3d')\n"
        "for i in range(4):\n"
        "    task.step(lambda ctx, i=i: i, name=f's{i}')\n"
        "if __name__ == '__main__':\n"
        "    print(overnight.run(task, max_steps=1).status)\n")
    created = subprocess.run([sys.executable, "slow.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert created.stdout.strip() == "stopped", created.stderr  # `python FILE.py` records FILE.py:task
    stopped = cli("run", "slow.py", "--max-steps", "1", cwd=tmp_path, check=75)
    command = next(line for line in stopped.stderr.splitlines() if line.startswith("resume with: "))
    assert command == "resume with: overnight resume slow"  # the recorded location is enough
    args = command.removeprefix("resume with: overnight ").split()
    cli(*args, cwd=tmp_path)
    assert json.loads(cli("ls", "--json", cwd=tmp_path).stdout)[0]["status"] == "complete"


def test_store_url_from_the_environment_is_named_and_ls_keeps_ids_whole(tmp_path):
    """A bad ``OVERNIGHT_STORE`` says it came from that variable; ``ls`` at 80 columns keeps a
    long task id on one line; ``cat`` suggests the artifact name meant."""
    from _procs import cli as run_cli

    bad = run_cli("ls", cwd=tmp_path, extra_env={"OVERNIGHT_STORE": "foo://bar"})
    assert bad.returncode == 2 and "OVERNIGHT_STORE" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    (tmp_path / "t.py").write_text(
        "import overnight\n"
        "task = overnight.Task('nightly-report-for-the-platform-team-2026', goal='a long id', deps=[])\n"
        "@task.step\n"
        "def write(ctx):\n"
        "    ctx.write_artifact('report-final.md', b'hello')\n")
    assert run_cli("run", "t.py", cwd=tmp_path).returncode == 0
    out = run_cli("ls", cwd=tmp_path, extra_env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert "nightly-report-for-the-platform-team-2026" in out.stdout, out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 80, out.stdout
    miss = run_cli("cat", "nightly-report-for-the-platform-team-2026", "report-finl.md", cwd=tmp_path)
    assert miss.returncode == 2 and "did you mean report-final.md?" in miss.stderr, miss.stderr
