"""Model clients behind one small protocol: :class:`Model` -> :class:`Completion`.

=======================  ===========================================================  ==============
spec                     what                                                         needs
=======================  ===========================================================  ==============
``extractive``           deterministic offline stand-in, **not an LLM** (default)     nothing
``local``                SmolLM2-135M-Instruct in-process via llama.cpp               ``[llm]``
``local:PATH.gguf``      any GGUF chat model in-process via llama.cpp                 ``[llm]``
``openai:NAME``          any OpenAI-compatible endpoint (OpenAI, vLLM, Ollama,        ``openai``
                         llama.cpp server); ``base_url=`` for a local one
=======================  ===========================================================  ==============

Two-line use::

    model = model_from_spec("openai:qwen2.5:0.5b", base_url="http://127.0.0.1:11434/v1")
    model.complete([{"role": "user", "content": "hello"}], max_tokens=64).text

No client downloads anything: model weights come from installed packages or files you name; the
only network traffic is to an ``openai:`` endpoint.
"""

from __future__ import annotations

from typing import Any

from overnight.errors import ModelNotConfigured
from overnight.models.base import Completion, Message, Model
from overnight.models.extractive import ExtractiveModel, section_messages

__all__ = ["Completion", "DEFAULT_MODEL", "ExtractiveModel", "Message", "Model", "model_from_spec",
           "section_messages"]

DEFAULT_MODEL = "extractive"
"""The model used when none is named: needs no install, no network, no key."""

SPECS = "'extractive', 'local', 'local:PATH.gguf' or 'openai:NAME'"


def model_from_spec(spec: str | None = None, *, base_url: str | None = None, api_key: str | None = None,
                    **options: Any) -> Model:
    """The model client named by ``spec`` (default :data:`DEFAULT_MODEL`).

    Args:
        spec: ``"extractive"``, ``"local"``, ``"local:PATH.gguf"`` or ``"openai:NAME"`` (NAME may
            itself contain ``:``, as Ollama's ``qwen2.5:0.5b`` does).
        base_url: the endpoint of an ``openai:`` model (e.g. ``"http://127.0.0.1:8000/v1"``).
        api_key: the key of an ``openai:`` model (default ``$OPENAI_API_KEY``).
        **options: passed to the client's constructor (``latency_ms`` for extractive; ``n_ctx``,
            ``n_threads``, ``seed`` for local; ``timeout_s``, ``max_retries`` for openai).

    Raises:
        ModelNotConfigured: unknown spec, an option the client does not take, or what the client
            needs (package, weights, key) is missing; the hint says what to install or set.
    """
    spec = (spec or DEFAULT_MODEL).strip()
    kind, _, arg = spec.partition(":")
    if (base_url is not None or api_key is not None) and kind != "openai":
        raise ModelNotConfigured(f"base_url/api_key apply to openai: models, not {spec!r}", model=spec)
    try:
        if kind == "extractive" and not arg:
            return ExtractiveModel(**options)
        if kind == "local":
            from overnight.models.local import LocalModel

            return LocalModel(arg or None, **options)
        if kind == "openai" and arg:
            from overnight.models.openai import OpenAIModel

            return OpenAIModel(arg, base_url=base_url, api_key=api_key, **options)
    except TypeError as exc:
        raise ModelNotConfigured(f"bad option for model {spec!r}: {exc}", model=spec) from exc
    raise ModelNotConfigured(f"unknown model spec {spec!r}", model=spec, hint=f"use {SPECS}")
