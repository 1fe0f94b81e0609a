"""The gateway's error kinds (a request refused a slot, an engine attempt failed) and its
OpenAI-shaped error bodies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum

from starlette.responses import JSONResponse


class Rejection(StrEnum):
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_HEALTHY_INSTANCE = "no_healthy_instance"


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
            "type": _TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    code: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status, headers=headers)


def sse_error_event(message: str, code: str) -> bytes:
    """An error event that ends a stream which failed after it began."""
    return b"data: " + json.dumps(error_body(502, message, code)).encode() + b"\n\n"
