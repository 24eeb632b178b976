"""What a session reports: its progress events (:class:`RunEvent`), its result (:class:`RunResult`),
and the command that resumes it (:func:`resume_command`). The runner (:mod:`overnight.runtime.runner`)
produces them; the CLI, the API and the benchmarks read them."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from overnight.chain.read import Fallback
from overnight.config import load as load_config
from overnight.errors import OvernightError


@dataclass(frozen=True)
class RunEvent:
    """Progress notification passed to ``on_event``.

    ``kind``: ``resume`` / ``create`` / ``step_start`` / ``step_end`` / ``step_retry`` /
    ``skip`` / ``stop_requested`` / ``rollback`` (a moved-back ref accepted with
    ``allow_rollback``) / ``end``. ``done``/``total`` count steps of the whole task.
    """

    kind: str
    task_id: str
    branch: str = "main"
    step: str | None = None
    done: int = 0
    total: int = 0
    checkpoint_id: str | None = None
    duration_ms: float | None = None
    detail: str | None = None


@dataclass
class RunResult:
    """Outcome of one session.

    Attributes:
        status: ``complete`` (todo empty), ``interrupted`` (signal), ``stopped`` (``max_steps``).
        head: checkpoint id of the branch head after the run.
        steps_run: steps executed and committed in this session.
        steps_reused: todo steps whose key was already done (not executed).
        session: session number of this run.
        fallback: set when the head failed verification and an older checkpoint was used.
        created: True when this run created the task.
        level: persistence level of the run (``ephemeral``/``session``/``durable``).
        route: the router's reasons, when the task was routed.
        compactions: context compactions in this run (each started a new session).
        usage: model usage in this run: ``tokens_in``, ``tokens_out``, ``calls`` made, and
            ``replayed_calls``/``replayed_tokens`` served from the call journal instead.
    """

    task_id: str
    branch: str
    status: str
    head: str
    store_url: str
    session: int
    steps_run: int = 0
    steps_reused: int = 0
    done: int = 0
    total: int = 0
    created: bool = False
    fallback: Fallback | None = None
    artifacts: list[str] = field(default_factory=list)
    level: str = "durable"
    route: list[str] = field(default_factory=list)
    compactions: int = 0
    usage: dict[str, int] = field(default_factory=dict)
    resume_file: str | None = None
    """The file defining the task, when the store holds no code location for it (a task created
    by ``overnight.run`` from a script): ``overnight resume`` then needs ``--file`` with it."""
    used_model: bool = True
    """False when the task never used a model, as its head records it: no call made or replayed
    in this run, no compaction ever, nothing in its context window (no tokens, no messages, no
    summary). ``overnight run`` then says "session #N" rather than "context window #N"."""

    @property
    def resumable(self) -> bool:
        """Not complete, and kept somewhere a later process can resume it from (not ``ephemeral``)."""
        return self.status != "complete" and self.level != "ephemeral"


def configured_store_url() -> str | None:
    """The configured default store URL (``overnight.toml``, ``$OVERNIGHT_STORE``), if readable."""
    try:
        return load_config().get("store.url")
    except OvernightError:
        return None


def resume_command(task_id: str, branch: str, store_url: str | None, file: str | None = None) -> str:
    """``overnight resume ID`` with ``--branch``/``--store`` when they are not the defaults
    (``store_url`` None: the default store), and ``--file FILE`` when the store records no code
    location for the task; every value shell-quoted when it needs it."""
    return command("resume", task_id, store_url, branch=branch, file=file)


def shell_word(text: str) -> str:
    """``text`` as one shell word a person can paste: :func:`shlex.quote` when every character is
    printable, else bash's ANSI-C quoting (``$'rtl\u202e'``), which names an invisible or control
    character by its code -- a terminal would hide it, or the printing would escape it into text
    that no longer names the branch."""
    if text.isprintable():
        return shlex.quote(text)
    out = []
    for c in text:
        if c in "\\'":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "$'" + "".join(out) + "'"


def command(verb: str, task_id: str | None, store_url: str | None, *, branch: str = "main",
            file: str | None = None) -> str:
    """``overnight VERB [ID]`` as a hint prints it: with ``--branch``/``--store``/``--file`` as
    :func:`resume_command` says (``store_url`` None, or the configured store: no ``--store``)."""
    cmd = f"overnight {verb}"
    if task_id is not None:
        cmd += f" {shlex.quote(task_id)}"  # quoted: a name with a space or quote pastes as one word
    if branch != "main":
        cmd += f" --branch {shell_word(branch)}"
    if store_url is not None and store_url != configured_store_url() \
            and not store_url.startswith(("memory:", "replicated:")):
        cmd += f" --store {shlex.quote(store_url)}"
    if file:
        cmd += f" --file {shlex.quote(file)}"
    return cmd
