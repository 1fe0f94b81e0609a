"""The simulator's OpenAI wire format: request parsing and response bodies, as plain functions.

Streaming chunks follow OpenAI's `chat.completion.chunk` / `text_completion` shapes exactly (a
role chunk first for chat, one chunk per content piece, a final chunk with `finish_reason`, an
optional usage chunk when `stream_options.include_usage` is set, then `data: [DONE]`). They are
built from a precomputed prefix so that a token costs one `json.dumps` of its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuplane.engines.sim.model import SimRequest

DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    payload: dict[str, Any]
    prompt: str
    max_tokens: int | None
    stream: bool
    include_usage: bool


def parse_request(body: bytes, chat: bool) -> ParsedRequest:
    """The parts of a completion request the simulator uses; ValueError says what is wrong."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ValueError("invalid request: the body must be a JSON object")
    max_tokens = payload.get("max_completion_tokens") or payload.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(
            f"invalid request: max_tokens must be a positive integer, got {max_tokens!r}"
        )
    opts = payload.get("stream_options")
    return ParsedRequest(
        payload=payload,
        prompt=prompt_text(payload, chat),
        max_tokens=max_tokens,
        stream=bool(payload.get("stream")),
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage")),
    )


def prompt_text(payload: dict[str, Any], chat: bool) -> str:
    """The text the simulator tokenises: chat messages joined with their roles, or the prompt."""
    if not chat:
        prompt = payload.get("prompt")
        if prompt is None:
            raise ValueError("invalid request: 'prompt' is required for /v1/completions")
        if isinstance(prompt, list):
            return "".join(str(p) for p in prompt)
        return str(prompt)
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("invalid request: 'messages' must be a non-empty list of messages")
    parts = []
    for m in messages:
        content = m.get("content", "") if isinstance(m, dict) else ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        role = m.get("role", "user") if isinstance(m, dict) else "user"
        parts.append(f"<|{role}|>\n{content}\n")
    return "".join(parts)


def usage(req: SimRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.max_tokens,
        "total_tokens": req.prompt_tokens + req.max_tokens,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


def error(message: str, code: int) -> dict[str, Any]:
    kind = "BadRequestError" if code < 500 else "InternalServerError"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Chunks:
    """SSE chunks of one streamed response."""

    __slots__ = ("_base", "_head", "chat")

    def __init__(self, rid: str, chat: bool, model: str, created: int) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.chat = chat
        self._base = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{created},'
            f'"model":{json.dumps(model)},'
        )
        self._head = self._base + '"choices":[{"index":0,'

    def role(self) -> bytes:
        body = '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
        return (self._head + body + "\n\n").encode()

    def content(self, text: str) -> bytes:
        if self.chat:
            body = '"delta":{"content":' + json.dumps(text) + "}"
        else:
            body = '"text":' + json.dumps(text)
        return (self._head + body + ',"logprobs":null,"finish_reason":null}]}\n\n').encode()

    def finish(self, reason: str = "length") -> bytes:
        body = '"delta":{}' if self.chat else '"text":""'
        return (
            self._head + body + f',"logprobs":null,"finish_reason":"{reason}"}}]}}\n\n'
        ).encode()

    def usage(self, req: SimRequest) -> bytes:
        return (self._base + f'"choices":[],"usage":{json.dumps(usage(req))}}}\n\n').encode()


def completion(rid: str, chat: bool, model: str, created: int, text: str, req: SimRequest) -> bytes:
    """A non-streamed `chat.completion` or `text_completion` body."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    out = {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(req),
    }
    return json.dumps(out).encode()


def model_info(model: str) -> dict[str, Any]:
    """What sglang-router reads from `/model_info` before it routes to a worker."""
    return {
        "model_path": model,
        "tokenizer_path": model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "sim",
        "architectures": ["SimForCausalLM"],
    }


def server_info(model: str, max_num_seqs: int, kv_tokens: int) -> dict[str, Any]:
    """SGLang-style `/server_info`: the capacity under the names routers look for."""
    return {
        "model_path": model,
        "served_model_name": model,
        "max_running_requests": max_num_seqs,
        "max_num_seqs": max_num_seqs,
        "max_total_num_tokens": kv_tokens,
        "tp_size": 1,
        "dp_size": 1,
        "version": "gpuplane-sim",
        "internal_states": [{"max_running_requests": max_num_seqs}],
    }
