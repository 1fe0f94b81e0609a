"""The gateway's error kinds (a request refused a slot, an engine attempt failed) and its
OpenAI-shaped error bodies: `{"error": {"message", "type", "param", "code"}}`, its own and an
engine's refusals of a request alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from starlette.responses import JSONResponse


class Rejection(StrEnum):
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_HEALTHY_INSTANCE = "no_healthy_instance"
    NOT_LEADER = "not_leader"  # a standby gateway (gateway.ha): another one admits


class Rejected(Exception):
    """The request gets no slot; `reason` and `retry_after_s` feed the HTTP answer."""

    def __init__(self, reason: Rejection, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class FailureKind(StrEnum):
    """Why an attempt on an engine instance failed, as passive health counts it."""

    CONNECT = "connect"  # nothing listens: the instance is down
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    STATUS = "status"  # 5xx


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(
    status: int, message: str, code: str, param: str | None = None
) -> dict[str, dict[str, str | None]]:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error"),
            "param": param,
            "code": code,
        }
    }


def engine_error_body(status: int, raw: bytes) -> dict[str, dict[str, str | None]]:
    """An engine's own 4xx answer (the request's fault: a prompt past its context, a field it
    refuses) in the gateway's shape, with the engine's message, and its code and param where
    they are strings. Read from OpenAI's and vLLM's `{"error": {...}}`, vLLM's older flat
    `{"object": "error", "message": ...}`, `{"error": "..."}` and FastAPI's `{"detail": ...}`;
    an unreadable body is quoted."""
    try:
        data: Any = json.loads(raw)
    except ValueError:
        data = None
    inner = data.get("error") if isinstance(data, dict) else None
    fields: dict[str, Any] = (
        inner if isinstance(inner, dict) else data if isinstance(data, dict) else {}
    )
    message = inner if isinstance(inner, str) else fields.get("message") or fields.get("detail")
    if isinstance(message, list):  # FastAPI's validation errors
        message = "; ".join(
            str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in message
        )
    if not message:
        message = raw.decode("utf-8", "replace")[:300] or "no message"
    code, param = fields.get("code"), fields.get("param")
    return error_body(
        status,
        f"the engine refused the request (HTTP {status}): {message}",
        code if isinstance(code, str) and code else "upstream_invalid_request",
        param if isinstance(param, str) else None,
    )


def error_response(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status, headers=headers)


def sse_error_event(message: str, code: str, status: int = 502) -> bytes:
    """An error event that ends a stream which failed after it began (`status`: the HTTP
    status the error would have had before it, which sets its type)."""
    return b"data: " + json.dumps(error_body(status, message, code)).encode() + b"\n\n"
