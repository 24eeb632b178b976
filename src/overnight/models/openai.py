"""``openai:NAME``: any OpenAI-compatible chat-completions endpoint, through the ``openai`` package.

OpenAI itself, or a server on your own machine: vLLM (``vllm serve``), Ollama
(``http://127.0.0.1:11434/v1``), llama.cpp's ``llama-server`` or llama-cpp-python's
``python -m llama_cpp.server``, LM Studio. The only network traffic is to ``base_url``.

Configuration, explicit arguments first:

* ``base_url``: argument, else ``$OPENAI_BASE_URL``, else OpenAI's API;
* ``api_key``: argument, else ``$OPENAI_API_KEY``; a local server needs none (a placeholder is
  sent), OpenAI's API does (:class:`~overnight.errors.ModelNotConfigured` without one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from overnight.errors import ModelCallFailed, ModelNotConfigured
from overnight.models.base import Completion, Message, check_limits, check_messages

NO_KEY = "not-needed"
"""The placeholder key sent to a server that needs none (the openai client insists on one)."""


class OpenAIModel:
    """A chat model behind an OpenAI-compatible endpoint.

    Args:
        model: the model name the server knows (``"gpt-4o-mini"``, ``"qwen2.5:0.5b"``, ...).
        base_url: the endpoint, e.g. ``"http://127.0.0.1:8000/v1"`` (see the module docstring).
        api_key: the key (see the module docstring).
        timeout_s: per-request timeout, seconds.
        max_retries: retries of a failed request (connection errors, 408/409/429/5xx), with backoff.

    ``max_tokens`` is sent as ``max_completion_tokens`` to OpenAI's API (which requires it of
    reasoning models) and as ``max_tokens`` to other servers (which may not know the new name).

    Raises:
        ModelNotConfigured: the ``openai`` package is missing, or OpenAI's API with no key.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout_s: float = 120.0, max_retries: int = 2) -> None:
        if not model:
            raise ModelNotConfigured("openai: no model name given", model="openai:",
                                     hint="use 'openai:NAME', e.g. openai:gpt-4o-mini")
        self.name = f"openai:{model}"
        self.model = model
        try:
            import openai
        except ImportError as exc:
            raise ModelNotConfigured("the openai client is not installed", model=self.name,
                                     hint="pip install 'overnight[llm]' (or pip install openai)") from exc
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if self.base_url is None:
                raise ModelNotConfigured(
                    f"{self.name}: OPENAI_API_KEY is not set", model=self.name,
                    hint="export OPENAI_API_KEY=..., or pass base_url= for a local OpenAI-compatible server")
            key = NO_KEY
        self._official = self.base_url is None or "api.openai.com" in self.base_url
        self._openai = openai
        self._client = openai.OpenAI(api_key=key, base_url=self.base_url, timeout=timeout_s,
                                     max_retries=max_retries)

    def complete(self, messages: Sequence[Message], *, max_tokens: int = 512,
                 temperature: float = 0.0) -> Completion:
        """One chat-completions request; the reply, the server's token usage and the latency.

        ``tokens_in``/``tokens_out`` are the server's ``usage``; a server that reports none gets
        0 (count with :func:`overnight.tokens.count_messages` if needed).

        Raises:
            ModelCallFailed: connection refused or timed out, an HTTP error status, or a reply
                without a message. The hint names the endpoint.
        """
        msgs = check_messages(messages, self.name)
        check_limits(max_tokens, temperature, self.name)
        limit = {"max_completion_tokens" if self._official else "max_tokens": max_tokens}
        where = self.base_url or "OpenAI's API"
        oa = self._openai
        t0 = time.perf_counter()
        try:
            resp = self._client.chat.completions.create(model=self.model, messages=msgs,  # type: ignore[arg-type]
                                                        temperature=temperature, **limit)
        except oa.APITimeoutError as exc:
            raise ModelCallFailed(f"{self.name}: request to {where} timed out", model=self.name,
                                  hint="is the server overloaded? raise timeout_s, or lower max_tokens") from exc
        except oa.APIConnectionError as exc:
            raise ModelCallFailed(f"{self.name}: cannot connect to {where}: {exc}", model=self.name,
                                  hint="is the server running, and is base_url right (it usually ends in /v1)?") from exc
        except oa.APIStatusError as exc:
            hint = {401: "check OPENAI_API_KEY", 403: "check OPENAI_API_KEY and the model's access",
                    404: f"does {where} serve a model named {self.model!r}?",
                    429: "rate limited or out of quota: wait, or lower the request rate"}.get(
                exc.status_code, "see the server's log")
            raise ModelCallFailed(f"{self.name}: {where} answered HTTP {exc.status_code}: {exc.message}",
                                  model=self.name, hint=hint) from exc
        except oa.OpenAIError as exc:
            raise ModelCallFailed(f"{self.name}: {type(exc).__name__}: {exc}", model=self.name) from exc
        latency_ms = (time.perf_counter() - t0) * 1000
        if not resp.choices or resp.choices[0].message is None:
            raise ModelCallFailed(f"{self.name}: {where} returned no choices", model=self.name,
                                  hint="see the server's log")
        choice = resp.choices[0]
        usage = resp.usage
        return Completion(
            text=choice.message.content or "",
            tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
            tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
            model=resp.model or self.model,
            latency_ms=latency_ms,
            finish_reason=choice.finish_reason,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={self.base_url!r})"
