"""The model-call journal's responses, and which recorded calls a replay may use.

A step that runs again after a crash replays the model calls it had made (the ``calls`` table, or
``calls/`` objects of a ``file://`` / S3 store) instead of paying for them again. The journal is
written *before* the step commits, so nothing else covers it: a replayed answer goes into the next
checkpoint as if the model had said it. So a recorded call is replayed only when its ``response``
is what overnight writes -- canonical JSON ``{"text": str, "finish_reason": str | null}`` -- and,
with a signing key (``OVERNIGHT_SIGNING_KEY``), when its ``mac`` verifies: HMAC-SHA256 (hex) under
the key over the canonical JSON of the call's task, step key, position, request digest, model,
text, finish reason and token counts. A damaged row, or one a store writer without the key forged
or edited, is not replayed: the model is called again and the run logs why (``overnight.runner``).
A row written without a key carries no ``mac`` and is replayed only by a run without a key.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from overnight.codec.canonical import dumps_sorted, loads
from overnight.store.base import CallRecord


def _mac(key: bytes, task_id: str, step_key: str, seq: int, request_digest: str, model: str, text: str,
         finish_reason: str | None, tokens_in: int, tokens_out: int) -> str:
    signed = dumps_sorted({"task_id": task_id, "step_key": step_key, "seq": seq, "request_digest": request_digest,
                           "model": model, "text": text, "finish_reason": finish_reason,
                           "tokens_in": tokens_in, "tokens_out": tokens_out})
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def response_bytes(key: bytes | None, task_id: str, step_key: str, seq: int, request_digest: str, model: str,
                   text: str, finish_reason: str | None, tokens_in: int, tokens_out: int) -> bytes:
    """The ``response`` a call journal row stores: ``{"text", "finish_reason"}`` as canonical JSON,
    with ``"mac"`` when ``key`` is set (see the module docstring)."""
    body: dict[str, Any] = {"text": text, "finish_reason": finish_reason}
    if key is not None:
        body["mac"] = _mac(key, task_id, step_key, seq, request_digest, model, text, finish_reason,
                           tokens_in, tokens_out)
    return dumps_sorted(body)


def replayable(call: CallRecord, key: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """``(body, None)`` when ``call`` may be replayed -- ``body`` its parsed response, ``text`` a
    str -- else ``(None, why)``: the response is not the JSON object overnight writes, or with
    ``key`` its ``mac`` is missing or does not verify."""
    try:
        body = loads(call.response)
    except Exception as exc:  # any damage: a DecodeError, bytes that are not UTF-8, ...
        return None, f"its response is not JSON ({type(exc).__name__})"
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or \
            not isinstance(body.get("finish_reason"), (str, type(None))):
        return None, "its response is not {text, finish_reason}"
    if key is not None:
        mac = body.get("mac")
        want = _mac(key, call.task_id, call.step_key, call.seq, call.request_digest, call.model, body["text"],
                    body.get("finish_reason"), call.tokens_in, call.tokens_out)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
            return None, "its signature does not verify" if isinstance(mac, str) else "it is not signed"
    return body, None


__all__ = ["replayable", "response_bytes"]
