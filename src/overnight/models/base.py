"""The one interface every model client implements, and what a call returns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from overnight.errors import ModelError

Message = Mapping[str, Any]
"""A chat message, the chat-completions shape: ``{"role": "system" | "user" | "assistant",
"content": str}`` (``"name"`` optional)."""


@dataclass(frozen=True)
class Completion:
    """The result of one :meth:`Model.complete` call.

    Attributes:
        text: the reply (the assistant message's content).
        tokens_in: prompt tokens, as the model counted them (its tokenizer and chat template).
        tokens_out: tokens generated.
        model: which model answered (the name the server reports, or the client's name).
        latency_ms: wall-clock time of the call, in milliseconds.
        finish_reason: ``"stop"`` (the model ended its reply), ``"length"`` (cut at
            ``max_tokens``) or ``"repeat"`` (a local model ended at a line that repeats an earlier
            one, cut off); None when the server does not say.
    """

    text: str
    tokens_in: int
    tokens_out: int
    model: str
    latency_ms: float
    finish_reason: str | None = None


@runtime_checkable
class Model(Protocol):
    """A chat model: messages in, one completion out.

    Attributes:
        name: the spec that names this model (``"extractive"``, ``"local"``, ``"openai:gpt-4o"``).
    """

    name: str

    def complete(self, messages: Sequence[Message], *, max_tokens: int = 512,
                 temperature: float = 0.0) -> Completion:
        """Generate the assistant's reply to ``messages``.

        Args:
            messages: the conversation, oldest first (see :data:`Message`).
            max_tokens: most tokens to generate; the reply is cut there (``finish_reason="length"``).
            temperature: sampling temperature; 0 is greedy (as deterministic as the backend allows).

        Raises:
            ModelCallFailed: the call did not produce a completion (hint says what to check).
        """
        ...


def check_messages(messages: Sequence[Message], model: str) -> list[dict[str, Any]]:
    """``messages`` as plain dicts, after checking their shape.

    Raises:
        ModelError: not a non-empty list of mappings with a ``role`` str and ``content`` str.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ModelError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.80}",
                         model=model)
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ModelError(f"messages[{i}] must have a 'role' str and a 'content' str, got {m!r:.80}", model=model)
        out.append(dict(m))
    return out


def check_limits(max_tokens: int, temperature: float, model: str) -> None:
    """Raises ModelError unless ``max_tokens >= 1`` and ``0 <= temperature <= 2``."""
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ModelError(f"max_tokens must be an int >= 1, got {max_tokens!r}", model=model)
    if not 0 <= temperature <= 2:
        raise ModelError(f"temperature must be between 0 and 2, got {temperature!r}", model=model)
