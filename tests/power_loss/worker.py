"""The process that runs a task on a disk that can lose power (``tests/test_power_loss.py``).

Started once with ``LD_PRELOAD`` set to the power-cut shim, it imports overnight once and then
serves JSON commands on stdin, one per line, answering each on stdout:

* ``{"op": "sync", "root": DIR, "shadow": DIR}`` -- fsync every file and directory under ``root``
  (the ``sync`` after a reboot): ``{"ok": true}``;
* ``{"op": "run", "root", "shadow", "url", "events", "steps"}`` -- fork a child that runs the task
  on ``url`` and appends each run event to ``events`` as a JSON line once it has happened (a
  ``step_end`` after its commit returned): ``{"pid": PID}`` at once, ``{"exit": CODE}`` when the
  child ends (``-9`` when it was killed).

Forking saves importing overnight and loading the tokenizer again for every kill (seconds on a
busy machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback

import overnight
from overnight.models.extractive import ExtractiveModel


def make_task(steps: int) -> overnight.Task:
    task = overnight.Task("power", goal="grow a log", level="session", deps=[], data={"n": 0})

    @task.step
    def plan(ctx):
        for i in range(steps):
            ctx.add_step("grow", i=i)

    @task.step(planned=False)
    def grow(ctx, i):
        time.sleep(0.005)
        log = ctx.read_text("log.md") if ctx.has_artifact("log.md") else ""
        ctx.write_text("log.md", log + f"line {i} " * 40 + "\n")
        ctx.state["n"] += 1
        return i

    return task


def sync_all(root: str) -> None:
    for folder, _, files in os.walk(root, topdown=False):
        for name in [*files, None]:
            fd = os.open(folder if name is None else os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def child(cmd: dict) -> None:
    def on_event(e: overnight.RunEvent) -> None:
        with open(cmd["events"], "a") as fh:
            fh.write(json.dumps(dataclasses.asdict(e)) + "\n")

    try:
        overnight.run(make_task(cmd["steps"]), cmd["url"], handle_signals=False, on_event=on_event)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    ExtractiveModel()  # loads the default tokenizer (cached): seconds the forked runs do not repeat
    for line in sys.stdin:
        cmd = json.loads(line)
        os.environ["PL_ROOT"], os.environ["PL_SHADOW"] = cmd["root"], cmd["shadow"]
        if cmd["op"] == "sync":
            sync_all(cmd["root"])
            reply({"ok": True})
        elif cmd["op"] == "run":
            pid = os.fork()
            if pid == 0:
                child(cmd)
            reply({"pid": pid})
            _, status = os.waitpid(pid, 0)
            reply({"exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
