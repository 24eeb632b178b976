"""The session's context window: a token budget, model calls through a journal, compaction.

A session is one contiguous run with one context window. Steps call the model through
``ctx.model`` (:class:`ModelGateway`); what they send is tracked against the session's budget:

* every prompt starts with the **control point** -- goal, current step, next steps, artifacts,
  and the summary of earlier sessions -- verbatim from the checkpointed state, never from a model;
* then as many of this session's earlier exchanges as fit, newest first (a call never overflows
  the window: the oldest exchanges are left out of its prompt, though kept for the summary);
* then the step's own messages. A call that alone does not fit raises
  :class:`~overnight.errors.ContextOverflow` (split the work; ``ctx.model.fits()`` tells).

Every call is recorded in the store's call journal (request digest, response, tokens, latency)
**before** it returns to the step, so a step that runs again after a crash replays the recorded
response instead of calling -- and paying -- again.

At a step boundary, when the session's exchanges reach ``threshold`` x ``max_context_tokens``, the
runner compacts: the model summarises them, the summary (with goal, todo and current step kept
verbatim in the state) is committed as a ``compaction`` checkpoint, and only then is the old
context dropped and a new session started. A compaction that fails or is killed leaves the
previous checkpoint as head, and is retried.

Token counts come from a real tokenizer (:mod:`overnight.tokens`) for the model in use.
"""

from __future__ import annotations

import time
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from overnight.codec import digest
from overnight.codec.canonical import dumps_sorted, loads
from overnight.errors import ContextOverflow, ModelCallFailed
from overnight.models.base import Completion, Message
from overnight.runtime.call_journal import response_bytes
from overnight.store.base import CallRecord
from overnight.tokens import Tokenizer, count_messages, tokenizer_for
from overnight.tokens_lazy import lazy_tokenizer_for
from overnight.verify.fingerprint import model_identity

if TYPE_CHECKING:
    from overnight.models.base import Model
    from overnight.runtime.state import SessionState
    from overnight.runtime.task import Task
    from overnight.store.base import Store


class GatewayHost(Protocol):
    """What the model gateway and the compaction summary need of the session running them (the
    runner provides it): the model, the window's budget, the checkpointed state (read only), the
    call journal, and this session's context."""

    task: "Task"
    store: "Store"
    model: "Model"
    tokenizer: Tokenizer
    model_identity: dict[str, Any]
    budget: "Budget"
    state: "SessionState"
    key: bytes | None
    """The signing key: call journal rows are signed and checked with it (None: no key)."""

    def recorded_call(self, key: str, seq: int, request: str) -> CallRecord | None: ...

    def context_messages(self) -> list[list[dict[str, str]]]: ...

    def context_add(self, messages: list[dict[str, str]], reply: str) -> None: ...

DEFAULT_MAX_CONTEXT_TOKENS = 8_000
DEFAULT_THRESHOLD = 0.8
SUMMARY_MAX_TOKENS = 600


def summary_tokens(window: int) -> int:
    """Longest compaction summary (tokens): 600, or a fifth of a small window."""
    return min(SUMMARY_MAX_TOKENS, window // 5)


SUMMARY_SYSTEM = ("You keep a long task going across context windows. Summarise the work below for your "
                  "future self: what was done, what was decided, what was learned. Be brief and factual; the goal, "
                  "the plan and the current step are kept separately and need not be repeated.")


@dataclass(frozen=True)
class Budget:
    """A session's context budget: ``max_tokens`` in the window, compaction at ``threshold`` of it."""

    max_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    threshold: float = DEFAULT_THRESHOLD

    @property
    def compact_at(self) -> int:
        return int(self.max_tokens * self.threshold)


def request_digest(model: str, messages: Sequence[Message], max_tokens: int, temperature: float) -> str:
    """``sha256`` of the canonical request: a replay must match it exactly."""
    return digest.sha256(dumps_sorted({"model": model, "messages": [dict(m) for m in messages],
                                       "max_tokens": max_tokens, "temperature": temperature}))


def control_point(state: "SessionState", current: str | None, *, with_summary: bool = True) -> str:
    """The system message every prompt starts with, built from the checkpointed state only."""
    todo = [e["name"] for e in state.todo]
    if current in todo:
        todo.remove(current)
    arts = sorted(state.artifacts)
    lines = [f"Goal: {state.task.goal}"]
    if current:
        lines.append(f"Current step: {current}")
    if todo:
        lines.append(f"Next steps ({len(todo)}): " + ", ".join(todo[:10]) + (" ..." if len(todo) > 10 else ""))
    lines.append(f"Steps done: {len(state.done)}")
    if arts:
        lines.append(f"Artifacts ({len(arts)}): " + ", ".join(arts[:20]) + (" ..." if len(arts) > 20 else ""))
    summary = state.context.summary
    if summary and with_summary:
        lines.append(f"Summary of earlier sessions:\n{summary}")
    return "\n".join(lines)


class ModelGateway:
    """``ctx.model``: the task's model, behind the session budget and the call journal.

    Attributes:
        name: the model's spec.
    """

    def __init__(self, runner: GatewayHost, step_name: str, step_key: str, *, with_summary: bool = True) -> None:
        self._runner = runner
        self._with_summary = with_summary
        self._step, self._key = step_name, step_key
        self._seq = 0
        self.name = runner.model.name
        self.tokens_in = self.tokens_out = 0
        self.replayed_tokens = 0
        self.calls_made = self.calls_replayed = 0

    @property
    def tokenizer(self) -> Tokenizer:
        return self._runner.tokenizer

    def control_frame(self) -> list[dict[str, str]]:
        """The system message every prompt of this gateway starts with (the control point)."""
        return self._base()

    def _base(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": control_point(self._runner.state, self._step,
                                                            with_summary=self._with_summary)}]

    def room(self, messages: Sequence[Message]) -> int:
        """Tokens left for the reply if these messages were sent with no earlier context (may be
        negative): the largest ``max_tokens`` a call with them can ask for."""
        return self._runner.budget.max_tokens - count_messages([*self._base(), *messages], self.tokenizer)

    def fits(self, messages: Sequence[Message], max_tokens: int = 512) -> bool:
        """Would a call with these messages (and no earlier context) fit in the window?"""
        return self.room(messages) >= max_tokens

    def complete(self, messages: Sequence[Message], *, max_tokens: int = 512, temperature: float = 0.0,
                 _history: bool = True, _remember: bool = True) -> Completion:
        """Call the model (or replay the recorded call); see the module docstring.

        Raises:
            ContextOverflow: the control point, the messages and ``max_tokens`` exceed the window.
            ModelCallFailed: the model could not answer.
        """
        runner = self._runner
        msgs = [dict(m) for m in messages]
        # the endpoint is part of the request: a response recorded from one server (or model) is
        # never replayed for another that has the same spec
        base = runner.model_identity.get("base_url") if getattr(runner, "model_identity", None) else None
        req = request_digest(self.name + (f" @ {base}" if base else ""), msgs, max_tokens, temperature)
        seq, self._seq = self._seq, self._seq + 1
        recorded = runner.recorded_call(self._key, seq, req)
        if recorded is not None:
            body = loads(recorded.response)
            completion = Completion(body["text"], recorded.tokens_in, recorded.tokens_out, recorded.model, 0.0,
                                    body.get("finish_reason"))
            self.calls_replayed += 1
            self.replayed_tokens += recorded.tokens_in + recorded.tokens_out
            if _remember:
                runner.context_add(msgs, completion.text)
            return completion
        base = self._base()
        fixed = count_messages([*base, *msgs], self.tokenizer) + max_tokens
        window = runner.budget.max_tokens
        if fixed > window:
            raise ContextOverflow(
                f"step {self._step!r}: a call needs {fixed} tokens (control point, messages and max_tokens "
                f"{max_tokens}), more than the {window}-token context window",
                task_id=runner.task.id, hint="split the work into smaller calls (ctx.model.fits() tells), "
                "lower max_tokens, or raise max_context_tokens")
        history: list[dict[str, str]] = []
        room = window - fixed
        for exchange in reversed(runner.context_messages() if _history else []):
            cost = count_messages(exchange, self.tokenizer)
            if cost > room:
                break
            history[:0] = exchange
            room -= cost
        t0 = time.perf_counter()
        completion = runner.model.complete([*base, *history, *msgs], max_tokens=max_tokens, temperature=temperature)
        latency = (time.perf_counter() - t0) * 1000
        runner.store.record_call(CallRecord(
            runner.task.id, self._key, seq, req, completion.model,
            response_bytes(getattr(runner, "key", None), runner.task.id, self._key, seq, req, completion.model,
                           completion.text, completion.finish_reason, completion.tokens_in, completion.tokens_out),
            completion.tokens_in, completion.tokens_out, latency, utc_now()))
        self.calls_made += 1
        self.tokens_in += completion.tokens_in
        self.tokens_out += completion.tokens_out
        if _remember:
            runner.context_add(msgs, completion.text)
        return completion


def summarize(runner: GatewayHost, exchanges: list[list[dict[str, str]]], key: str) -> tuple[Completion, ModelGateway]:
    """The compaction summary of this session's exchanges (journaled under ``key``, so a
    compaction killed after the model answered does not pay for the summary again), and the
    gateway that made the call (its usage)."""
    previous = runner.state.context.summary
    transcript = "\n\n".join(f"{m['role']}: {m['content']}" for ex in exchanges for m in ex)
    if previous:
        transcript = f"(summary of earlier sessions)\n{previous}\n\n{transcript}"
    gateway = ModelGateway(runner, "(compaction)", key, with_summary=False)  # the summary is in the transcript
    messages, reply = summary_request(runner.tokenizer, runner.budget.max_tokens, transcript, gateway.control_frame(),
                                      task_id=runner.task.id)
    last: Exception | None = None
    for attempt in range(3):
        try:
            return gateway.complete(messages, max_tokens=reply, _history=False, _remember=False), gateway
        except ModelCallFailed as exc:
            last = exc
            time.sleep(0.2 * 2 ** attempt)
    raise ModelCallFailed(f"compaction failed after 3 attempts: {last}", model=runner.model.name,
                          hint="the previous checkpoint is still the head; resume to retry the compaction") from last


def summary_request(tokenizer: Tokenizer, window: int, transcript: str, frame: Sequence[Message] = (), *,
                    task_id: str | None = None) -> tuple[list[dict[str, str]], int]:
    """The compaction request for ``transcript`` in a ``window``-token context window.

    Args:
        tokenizer: counts the tokens.
        window: the context window (tokens).
        transcript: what to summarise; only its newest part that fits is sent.
        frame: messages sent before the request (the control point), counted against the window.
        task_id: named in the error.

    Returns:
        ``(messages, max_tokens)``: the summary instruction and the transcript, and the longest
        reply allowed (:func:`summary_tokens` of the window, in tokens).

    Raises:
        ContextOverflow: the frame leaves fewer than 64 tokens for the transcript.
    """
    reply = summary_tokens(window)
    fixed = count_messages([*frame, {"role": "system", "content": SUMMARY_SYSTEM},
                            {"role": "user", "content": ""}], tokenizer)
    budget = window - reply - fixed - 16
    if budget < 64:
        raise ContextOverflow(f"a {window}-token context window leaves no room to summarise "
                              "(the goal and the todo list alone fill it)", task_id=task_id,
                              hint="raise max_context_tokens")
    return [{"role": "system", "content": SUMMARY_SYSTEM},
            {"role": "user", "content": newest_tokens(tokenizer, transcript, budget)}], reply


def newest_tokens(tokenizer: Tokenizer, text: str, limit: int) -> str:
    """The end of ``text`` that counts at most ``limit`` tokens (all of it when it fits)."""
    if tokenizer.count(text) <= limit:
        return text
    decode = getattr(tokenizer, "decode", None)
    if decode is not None:
        ids = tokenizer.encode(text)
        keep = limit
        while keep > 0:  # re-encoding a cut can merge tokens differently: check, and cut more if needed
            tail = decode(ids[-keep:])
            if tokenizer.count(tail) <= limit:
                return tail
            keep -= 16
        return ""
    lo, hi = 0, len(text)  # no decoder: the longest suffix by characters that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokenizer.count(text[-mid:]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return text[-lo:] if lo else ""


def utc_now() -> str:
    from overnight.chain.write import utc_now as now

    return now()


def identity_of(model: Model, tokenizer: Any) -> dict[str, Any]:
    """The fingerprint component ``model`` of a model client (spec, its own name, base URL,
    tokenizer): :func:`~overnight.verify.fingerprint.model_identity`."""
    path, own, url = getattr(model, "model_path", None), getattr(model, "model", None), getattr(model, "base_url", None)
    return model_identity(model.name, name=own if isinstance(own, str) else (Path(path).name if path else None),
                          base_url=url if isinstance(url, str) else None, tokenizer=getattr(tokenizer, "name", None))


def tokenizer_of(model: Model) -> Any:
    """The tokenizer that counts what ``model`` reads: its GGUF vocabulary for a local model, the
    OpenAI encoding for ``openai:`` models it knows (else an approximate count, with a warning),
    ``o200k_base`` for the extractive writer."""
    path = getattr(model, "model_path", None)
    if path is not None:
        return tokenizer_for(str(path))
    name = model.name  # an OpenAI encoding loads at its first count: a resume without model calls never does
    if name == "extractive":
        return lazy_tokenizer_for("o200k_base")
    return lazy_tokenizer_for(name.split(":", 1)[1] if name.startswith("openai:") else name)
