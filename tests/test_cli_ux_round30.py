"""A fresh user's round of CLI problems, each driven as the user met it: real ``python -m overnight``
processes (or typer's CliRunner on the real app) against real SQLite stores in tmp_path, real
sockets for the ports; nothing is mocked."""

from __future__ import annotations

import inspect
import json
import socket
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from _procs import CLI, env

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path, extra_env: dict[str, str] | None = None, stdin: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, env={**env(), **(extra_env or {})}, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def help_text(*args: str) -> str:
    from overnight.cli.app import app

    out = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert out.exit_code == 0, out.output
    return out.output


# 1. `overnight mcp --http` and `overnight ui` on different default ports; a taken port is one clear error


def test_mcp_http_and_ui_default_to_different_ports() -> None:
    from overnight.mcp import server

    assert inspect.signature(server.run).parameters["port"].default == 8766
    assert "8766" in help_text("mcp")
    assert "8765" in help_text("ui") and "8765" not in help_text("mcp")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "overnight mcp --http --port\n8765" not in readme and "8766" in readme


def _taken_port() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_mcp_http_on_a_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    with _taken_port() as sock:
        port = sock.getsockname()[1]
        out = cli("mcp", "--store", f"sqlite://{tmp_path / 's.db'}", "--http", "--port", str(port), "--token", "t",
                  cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "ERROR:" not in out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("error: ") and str(port) in first and "in use" in first, out.stderr
    assert "--port" in out.stderr
    assert "streamable HTTP on" not in out.stderr  # it never said it was serving


def test_ui_on_a_port_in_use_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text('import overnight\ntask = overnight.Task("t", goal="g", expected_span="3d")\n'
                                   "@task.step\ndef a(ctx):\n    pass\n")
    assert cli("run", "t.py", "-q", cwd=tmp_path).returncode == 0
    with _taken_port() as sock:
        port = sock.getsockname()[1]
        out = cli("ui", "--port", str(port), cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("error: ") and str(port) in first and "in use" in first.lower(), out.stderr
    assert "--port" in out.stderr


# 2. the demo's resume hint carries every option that changes what the run does


def _resume_hint(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("resume with: ")).removeprefix("resume with: ")


def test_demo_resume_hint_keeps_latency_and_other_options(tmp_path: Path) -> None:
    out = cli("demo", "--model-latency-ms", "5", "--max-context-tokens", "9000", "--on-drift", "env=accept",
              "--max-steps", "2", "-q", cwd=tmp_path)
    assert out.returncode == 75, out.stderr
    hint = _resume_hint(out.stderr)
    assert hint.startswith("overnight demo"), hint
    assert "--model-latency-ms 5" in hint and "--max-context-tokens 9000" in hint and "--on-drift env=accept" in hint
    assert "--max-steps" not in hint  # a limit of this run, not how the task behaves
    # and the printed command does resume it: pasted as is, it finishes the task
    again = cli(*hint.removeprefix("overnight ").split(), "-q", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "report.md").read_text(encoding="utf-8").startswith("# API reference: `email`")


def test_demo_resume_hint_with_defaults_stays_short(tmp_path: Path) -> None:
    out = cli("demo", "--max-steps", "2", "-q", cwd=tmp_path)
    assert out.returncode == 75, out.stderr
    assert _resume_hint(out.stderr) == "overnight resume api-report-email"


# 3. control characters in a goal do not break `ls` / `show`


GOAL = "line one\nline two\x1b[31m red\u202eevil\u2066x\u2069"


def test_ls_and_show_escape_control_characters_in_a_goal(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("import overnight\n"
                                   f"task = overnight.Task('ctl', goal={GOAL!r}, expected_span='3d')\n"
                                   "@task.step\ndef a(ctx):\n    pass\n")
    assert cli("run", "t.py", "-q", cwd=tmp_path).returncode == 0
    ls = cli("ls", cwd=tmp_path)
    assert ls.returncode == 0, ls.stderr
    rows = [line for line in ls.stdout.splitlines() if line.strip()]
    assert len(rows) == 3, ls.stdout  # header, rule, the one task: the goal's line break does not add a row
    assert "line one\\nline two" in rows[2]
    show = cli("show", "ctl", cwd=tmp_path)
    assert show.returncode == 0, show.stderr
    assert show.stdout.splitlines()[0] == "ctl: line one\\nline two\\x1b[31m red\\u202eevil\\u2066x\\u2069"
    for text in (ls.stdout, show.stdout):
        assert "\x1b" not in text and not any(chr(c) in text for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])
    assert json.loads(cli("ls", "--json", cwd=tmp_path).stdout)[0]["goal"] == GOAL  # JSON keeps the value


# 4. `overnight submit README.md`


def test_submit_a_file_that_is_not_python_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# notes\n")
    out = cli("submit", "README.md", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[0] == ("error: README.md is not a Python file; submit takes FILE.py[:TASK] or "
                                          "module:attr"), out.stderr
    assert "Traceback" not in out.stderr
    # the same with a task name after it, and for `run`
    out = cli("submit", "README.md:task", cwd=tmp_path)
    assert out.returncode == 2 and "README.md is not a Python file" in out.stderr, out.stderr
    out = cli("run", "README.md", cwd=tmp_path)
    assert out.returncode == 2 and "README.md is not a Python file; run takes" in out.stderr, out.stderr
    assert not (tmp_path / ".overnight").exists()  # refused before any store is made


# 5. a mistyped $OVERNIGHT_TASK in a hook


def test_hook_with_a_mistyped_overnight_task_names_it_and_suggests_the_closest(tmp_path: Path) -> None:
    from overnight.mcp.tasks import CodingTasks

    repo = tmp_path / "proj"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    store = f"sqlite://{repo / '.overnight' / 'overnight.db'}"
    with CodingTasks(store, project=repo) as t:
        tid = t.start("Rewrite the parser", plan=["read it"]).task_id
        t.start("Something else entirely", plan=["x"], task_id="zzz-other")
    typo = tid[:-1] + ("x" if tid[-1] != "x" else "y")
    stdin = json.dumps({"session_id": "s1", "cwd": str(repo), "hook_event_name": "Stop"})
    out = cli("hook", "run", "--event", "stop", "--store", store, cwd=repo, stdin=stdin,
              extra_env={"OVERNIGHT_TASK": typo})
    assert out.returncode == 1, out.stderr
    assert typo in out.stderr and f"did you mean {tid}?" in out.stderr, out.stderr
    assert "zzz-other" not in out.stderr
    assert "OVERNIGHT_TASK" in out.stderr
    # Claude Code's hook says the same in its JSON
    cc = cli("hook", "claude-code", "stop", "--store", store, cwd=repo, stdin=stdin,
             extra_env={"OVERNIGHT_TASK": typo})
    assert f"did you mean {tid}?" in cc.stdout + cc.stderr, (cc.stdout, cc.stderr)
