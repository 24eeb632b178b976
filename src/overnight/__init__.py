"""overnight: durable long-horizon agent tasks.

Verified, content-addressed checkpoints after every step; crash-safe resume that repeats at most
the step in flight; fallback to the newest checkpoint that verifies. The public API is what this
module exports; nothing else is promised.

    import overnight

    task = overnight.Task("report", goal="Write the report", expected_span="3h")

    @task.step
    def outline(ctx):
        ...

    overnight.run(task)          # creates the task, or resumes it from its latest checkpoint
"""

from overnight.codec.registry import register_codec, register_type
from overnight.errors import OvernightError
from overnight.orchestrate.context import StepContext
from overnight.orchestrate.runner import RunEvent, RunResult, Runner, run
from overnight.orchestrate.task import Task
from overnight.store import open_store

__version__ = "0.1.0"

__all__ = [
    "OvernightError",
    "RunEvent",
    "RunResult",
    "Runner",
    "StepContext",
    "Task",
    "__version__",
    "open_store",
    "register_codec",
    "register_type",
    "run",
]
