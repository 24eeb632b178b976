"""``overnight bench mcp``: what the MCP server and the hooks cost a coding agent.

Measured in one run, each against a baseline measured beside it:

* ``task_checkpoint`` through a real stdio client session (the MCP SDK's ``ClientSession`` talking
  to ``overnight mcp`` in a git repository), one committed checkpoint per call, client wall time --
  against a **no-op tool call**: a tool that returns at once, served by the same SDK over the same
  transport (the floor of any MCP tool call);
* the same checkpoint in-process (``CodingTasks.checkpoint``: world fingerprint with ``git``,
  encode, commit with fsync), to show what the transport adds;
* a hook run (``overnight hook claude-code stop`` and ``pre-compact``), wall time of the whole
  process including interpreter start, each run committing a checkpoint (the transcript grows by
  one line) -- against ``python -c pass`` (the interpreter's own start); and the CPU time of the
  same runs (user + sys, ``git`` included), which a busy machine does not inflate by queueing.

Targets (issue 18): ``task_checkpoint`` median <= 20 ms, a hook run <= 300 ms.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overnight.errors import BenchFailed

NOOP_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("noop")

@server.tool()
def noop() -> str:
    \"\"\"Does nothing.\"\"\"
    return "ok"

server.run("stdio")
"""


@dataclass
class Row:
    what: str
    samples_ms: list[float]
    baseline: str | None = None
    target_ms: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def p99(self) -> float:
        s = sorted(self.samples_ms)
        return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


@dataclass
class McpBench:
    rows: list[Row] = field(default_factory=list)
    load: tuple[float, float, float] | None = None
    seconds: float = 0.0

    def row(self, what: str) -> Row:
        return next(r for r in self.rows if r.what == what)

    def markdown(self) -> str:
        lines = ["| measured | n | median ms | p99 ms | baseline | median vs baseline | target |",
                 "|---|---:|---:|---:|---|---:|---|"]
        for r in self.rows:
            base = self.row(r.baseline) if r.baseline else None
            ratio = f"{r.median / base.median:.2f}x" if base else "1.00x"
            target = ""
            if r.target_ms is not None:
                target = f"<= {r.target_ms:g} ms: {'met' if r.median <= r.target_ms else 'NOT met'}"
            lines.append(f"| {r.what} | {len(r.samples_ms)} | {r.median:.2f} | {r.p99:.2f} | {r.baseline or '(itself)'} "
                         f"| {ratio} | {target} |")
        load = f"; 1-min load average {self.load[0]:.2f} at the end" if self.load else ""
        lines.append("")
        lines.append(f"{os.cpu_count()} CPUs{load}; {self.seconds:.0f} s in all. Hook runs are whole processes "
                     f"(interpreter start included); each committed a checkpoint. CPU time is what a "
                     f"process used, whatever else ran: on a busy machine wall time includes waiting for a CPU.")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [{"what": r.what, "n": len(r.samples_ms), "median_ms": r.median, "p99_ms": r.p99,
                          "baseline": r.baseline, "target_ms": r.target_ms} for r in self.rows],
                "load": self.load, "seconds": self.seconds}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", *args], cwd=repo,
                   check=True, capture_output=True)


def _repo(root: Path) -> Path:
    repo = root / "proj"
    (repo / "src").mkdir(parents=True)
    for i in range(40):
        (repo / "src" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    (repo / "uv.lock").write_text("version = 1\n" + "".join(f'[[package]]\nname = "p{i}"\n' for i in range(200)))
    (repo / "README.md").write_text("# bench\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "initial")
    (repo / "src" / "mod1.py").write_text("def f1(x):\n    return x - 1\n")  # one dirty tracked file
    return repo


def _overnight_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "overnight"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "overnight"]


async def _mcp_rows(repo: Path, store: str, calls: int) -> tuple[list[float], list[float], str]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {**os.environ}
    env.pop("OVERNIGHT_STORE", None)
    ours = StdioServerParameters(command=_overnight_cmd()[0], args=[*_overnight_cmd()[1:], "mcp", "--store", store],
                                 cwd=str(repo), env=env)
    noop = StdioServerParameters(command=sys.executable, args=["-c", NOOP_SERVER], cwd=str(repo), env=env)
    with open(os.devnull, "w") as devnull:
        async with stdio_client(ours, errlog=devnull) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool("task_start", {"goal": "bench the MCP server", "plan": [f"item {i}" for i in range(20)]})
            task_id = res.structured_content["task_id"]
            ck = []
            for i in range(calls + 5):
                t0 = time.perf_counter()
                res = await s.call_tool("task_checkpoint", {"task_id": task_id, "notes": f"step {i}",
                                                            "done": [f"done {i}"] if i % 3 == 0 else None})
                dt = (time.perf_counter() - t0) * 1000
                if res.is_error or res.structured_content["unchanged"]:
                    raise BenchFailed(f"task_checkpoint did not commit: {res.content[0].text}")
                if i >= 5:  # warm-up: the first calls load the tokenizer and page caches
                    ck.append(dt)
        async with stdio_client(noop, errlog=devnull) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            base = []
            for i in range(calls + 5):
                t0 = time.perf_counter()
                await s.call_tool("noop", {})
                if i >= 5:
                    base.append((time.perf_counter() - t0) * 1000)
    return ck, base, task_id


def _run(cmd: list[str], *, stdin: str | None, cwd: Path) -> tuple[float, float]:
    """Wall time and CPU time (user + sys of the process and its children, e.g. ``git``) in ms."""
    import resource

    env = {**os.environ}
    env.pop("OVERNIGHT_STORE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, input=stdin, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    dt = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0 or '"decision"' in out.stdout:
        raise BenchFailed(f"{' '.join(cmd)} failed: {out.stdout} {out.stderr}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return dt, cpu


def run_mcp_bench(*, calls: int = 200, hooks: int = 20, directory: Path | None = None) -> McpBench:
    """Run the benchmark in a temporary directory under ``directory`` (default: the current one)."""
    import anyio

    from overnight.mcp.tasks import CodingTasks

    t_start = time.perf_counter()
    result = McpBench()
    with tempfile.TemporaryDirectory(prefix="overnight-bench-mcp-", dir=directory or Path.cwd()) as tmp:
        root = Path(tmp)
        repo = _repo(root)
        store = f"sqlite://{root / 'store.db'}"
        ck, base, task_id = anyio.run(_mcp_rows, repo, store, calls)
        with CodingTasks(store, project=repo) as t:
            inproc = []
            for i in range(calls):
                t0 = time.perf_counter()
                t.checkpoint(task_id, notes=f"in-process {i}")
                inproc.append((time.perf_counter() - t0) * 1000)
            t.resume(task_id)  # the hooks find it through the project's current-task pointer
        transcript = root / "transcript.jsonl"
        lines = [json.dumps({"type": "user", "message": {"role": "user", "content": f"message {i} " * 30}})
                 for i in range(300)]
        transcript.write_text("\n".join(lines) + "\n")
        payload = {"session_id": "bench", "transcript_path": str(transcript), "cwd": str(repo),
                   "hook_event_name": "Stop", "trigger": "auto", "stop_hook_active": False}
        cmd = _overnight_cmd()
        runs: dict[str, list[tuple[float, float]]] = {"stop": [], "pre": [], "bare": []}
        for i in range(hooks + 2):
            with transcript.open("a") as fh:
                fh.write(json.dumps({"type": "assistant", "message": {"role": "assistant", "content": f"turn {i}"}}) + "\n")
            s_ms = _run([*cmd, "hook", "claude-code", "stop"], stdin=json.dumps(payload), cwd=repo)
            with transcript.open("a") as fh:
                fh.write(json.dumps({"type": "user", "message": {"role": "user", "content": f"again {i}"}}) + "\n")
            p_ms = _run([*cmd, "hook", "claude-code", "pre-compact"], stdin=json.dumps(payload), cwd=repo)
            b_ms = _run([sys.executable, "-c", "pass"], stdin=None, cwd=repo)
            if i >= 2:  # warm-up: the page cache
                runs["stop"].append(s_ms)
                runs["pre"].append(p_ms)
                runs["bare"].append(b_ms)
    result.rows = [
        Row("task_checkpoint (MCP stdio round trip)", ck, "no-op tool call (same SDK, stdio)", 20.0),
        Row("no-op tool call (same SDK, stdio)", base),
        Row("task_checkpoint in-process (CodingTasks.checkpoint)", inproc, "no-op tool call (same SDK, stdio)"),
        Row("hook run: overnight hook claude-code stop", [w for w, _ in runs["stop"]], "python -c pass", 300.0),
        Row("hook run: overnight hook claude-code pre-compact", [w for w, _ in runs["pre"]], "python -c pass", 300.0),
        Row("python -c pass", [w for w, _ in runs["bare"]]),
        Row("hook CPU time (user+sys, git included): stop", [c for _, c in runs["stop"]], "python -c pass CPU time"),
        Row("hook CPU time (user+sys, git included): pre-compact", [c for _, c in runs["pre"]],
            "python -c pass CPU time"),
        Row("python -c pass CPU time", [c for _, c in runs["bare"]]),
    ]
    try:
        result.load = os.getloadavg()
    except OSError:
        result.load = None
    result.seconds = time.perf_counter() - t_start
    return result
