"""overnight for coding agents: coding-agent tasks as ordinary checkpoints, and the MCP server.

* :mod:`overnight.mcp.tasks` -- :class:`~overnight.mcp.tasks.CodingTasks`: start, checkpoint,
  resume, status, list, log, fork, rollback, verify and read artifacts of a task an agent drives
  (no runner: every call commits through :class:`~overnight.chain.write.ChainWriter`);
* :mod:`overnight.verify.coding_world` -- the world of a coding task (git, lock files, env, inputs) and its
  drift in words;
* :mod:`overnight.mcp.server` -- ``overnight mcp``, the tools over the official MCP SDK
  (``pip install 'overnight[mcp]'``; only this module needs it).

The hooks (:mod:`overnight.hooks`) use the first two. Importing this package imports nothing else.
"""
