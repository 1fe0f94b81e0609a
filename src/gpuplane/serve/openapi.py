"""The gateway's OpenAPI document (`GET /openapi.json`): its routes, their bodies and answers.

Request bodies come from the checks the gateway runs (`validation.request_schema`), so the
document cannot drift from them; the answers are the shapes the gateway itself builds: its
OpenAI error body (`errors.error_body`), the model list, the admin views. A completion's 200 is
the engine's own answer passed through, documented as the part of OpenAI's shape every engine
gpuplane runs keeps. `tests/serve/test_gateway_fuzz.py` holds the document to the gateway with
schemathesis.
"""

from __future__ import annotations

from typing import Any

from gpuplane import __version__
from gpuplane.serve.validation import request_schema

_REF = "#/components/schemas/"
_STRING_OR_NULL = {"type": ["string", "null"]}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string", "description": "what was wrong, what to do"},
                    "type": {"type": "string"},
                    "param": _STRING_OR_NULL,
                    "code": {"type": "string"},
                },
            }
        },
    },
    "ChatCompletionRequest": request_schema(chat=True),
    "CompletionRequest": request_schema(chat=False),
    "Completion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"type": "string"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index"],
                    "properties": {
                        "index": {"type": "integer"},
                        "finish_reason": _STRING_OR_NULL,
                        "text": {"type": "string"},
                        "message": {"type": "object"},
                    },
                },
            },
            "usage": {"type": "object"},
        },
    },
    # one event of a stream: a chunk of the engine's answer (`choices`; the usage chunk's are
    # empty), the gateway's error event when the stream broke (`error`), then `[DONE]`
    "Event": {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            "type": "object",
                            "anyOf": [{"required": ["choices"]}, {"required": ["error"]}],
                        },
                    },
                ]
            }
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "object", "created", "owned_by"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "created": {"type": "integer"},
                        "owned_by": {"type": "string"},
                    },
                },
            },
        },
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
    },
    "State": {
        "type": "object",
        "required": ["instances", "models"],
        "properties": {
            "instances": {"type": "array", "items": {"type": "object"}},
            "models": {"type": "array", "items": {"type": "object"}},
            "ha": {"type": "object"},
        },
    },
    "Usage": {
        "type": "object",
        "required": ["tenants"],
        "properties": {"tenants": {"type": "array", "items": {"type": "object"}}},
    },
}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF + schema}}},
    }


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): _json("Error", _ERROR_CAUSES[s]) for s in statuses}


_ERROR_CAUSES = {
    400: "the request is refused: `param` names the field",
    401: "no API key, or not one this route takes",
    404: "no such model",
    413: "the body is over gateway.max_body_bytes",
    429: "over a tenant's limit (Retry-After says when to try again)",
    502: "the engine failed the request",
    503: "no slot: the queue is full or no instance is healthy",
    504: "the engine did not answer within the request's deadline",
}


def _completion(schema: str, summary: str) -> dict[str, Any]:
    ok = _json("Completion", "the engine's answer")
    ok["content"]["text/event-stream"] = {"schema": {"$ref": _REF + "Event"}}  # `stream: true`
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": _REF + schema}}},
            },
            "responses": {"200": ok, **_errors(400, 401, 404, 413, 429, 502, 503, 504)},
        }
    }


def _get(
    summary: str,
    ok: dict[str, Any],
    *errors: int,
    admin: bool = False,
    more: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A GET answering `ok` (200), the gateway's error body for `errors` and any `more`
    answers by status; `admin`: it takes the bearer key."""
    responses = {"200": ok, **_errors(*errors), **(more or {})}
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if admin:
        operation["security"] = [{"bearer": []}]
    return {"get": operation}


def _text(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


def document() -> dict[str, Any]:
    """The gateway's OpenAPI 3.1 document."""
    unready = _json("Status", "not ready: a standby, or a model without a healthy instance")
    itself = {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {}}}}
    paths = {
        "/v1/chat/completions": _completion("ChatCompletionRequest", "a chat completion"),
        "/v1/completions": _completion("CompletionRequest", "a text completion"),
        "/v1/models": _get("the models served", _json("ModelList", "the models"), 401, admin=True),
        "/healthz": _get("liveness", _json("Status", "the gateway runs")),
        "/readyz": _get("readiness", _json("Status", "ready"), more={"503": unready}),
        "/admin/state": _get("instances and queues", _json("State", "the state"), 401, admin=True),
        "/admin/usage": _get("tenants' usage", _json("Usage", "the usage"), 401, admin=True),
        "/metrics": _get("Prometheus metrics", _text("the metrics"), 401, admin=True),
        "/openapi.json": _get("this document", itself),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpuplane gateway", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


__all__ = ["document"]
