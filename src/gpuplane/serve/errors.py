"""OpenAI-shaped error bodies: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.responses import JSONResponse

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
