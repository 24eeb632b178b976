"""overnight: durable long-horizon agent tasks.

Verified, content-addressed checkpoints after every step; crash-safe resume that repeats at most
the step in flight; fallback to the newest checkpoint that verifies. The public API is what this
module exports; nothing else is promised. The README also documents :mod:`overnight.api` (the
operations behind the CLI), :func:`overnight.store.open_store`, the adapters
(:mod:`overnight.adapters.langgraph`, :mod:`overnight.adapters.openai_agents`),
:func:`overnight.models.model_from_spec` and :mod:`overnight.tokens`. Every other module --
``chain``, ``ops``, ``runtime``, ``verify``, ``store`` internals, ``testing``, ``bench``, ``demo``,
``cli`` -- is internal: importable, documented for readers of the code, not a promised interface.

    import overnight

    task = overnight.Task("report", goal="Write the report", expected_span="3h")

    @task.step
    def outline(ctx):
        ...

    overnight.run(task)          # creates the task, or resumes it from its latest checkpoint
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The exports are loaded on first use (PEP 562): ``import overnight.X`` for one module -- a hook
# run by a coding agent at every turn (overnight.hooks) -- does not pay for the runner and everything
# it imports. ``overnight.Task`` etc. behave exactly as plain imports.
_EXPORTS = {
    "register_codec": "overnight.codec.registry",
    "register_type": "overnight.codec.registry",
    "OvernightError": "overnight.errors",
    "StepContext": "overnight.runtime.context",
    "RunEvent": "overnight.runtime.outcome",
    "RunResult": "overnight.runtime.outcome",
    "Runner": "overnight.runtime.runner",
    "run": "overnight.runtime.runner",
    "Task": "overnight.runtime.task",
    "open_store": "overnight.store",
}

if TYPE_CHECKING:
    from overnight.codec.registry import register_codec, register_type
    from overnight.errors import OvernightError
    from overnight.runtime.context import StepContext
    from overnight.runtime.outcome import RunEvent, RunResult
    from overnight.runtime.runner import Runner, run
    from overnight.runtime.task import Task
    from overnight.store import open_store


_SUBPACKAGES = ("adapters", "api", "bench", "chain", "cli", "codec", "config", "demo", "errors", "hooks", "keys", "mcp",
                "models", "ops", "runtime", "store", "testing", "tokens", "units", "verify")
"""Reachable as attributes (``overnight.store``) without an import, as when the exports were eager."""


def __getattr__(name: str) -> Any:
    import importlib

    module = _EXPORTS.get(name)
    if module is None:
        if name in _SUBPACKAGES:
            return importlib.import_module(f"overnight.{name}")
        raise AttributeError(f"module 'overnight' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

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
