"""The request fields the gateway relies on, checked before any slot is taken.

Pure and cheap on the hot path: plain type and range checks over the orjson-parsed body, one
per field the gateway or every engine reads (no model built per request). Fields not named here
pass through to the engine unchecked; an engine's own refusal is translated by the proxy. Each
check carries its JSON Schema beside it, from which `request_schema` builds the request bodies of
the gateway's OpenAPI document (`openapi.py`): the document says what this module checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

MAX_N = 128
MAX_STOP = 4  # OpenAI's limit on stop sequences


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a request is refused: the field (`param`, None for the body) and what to send."""

    param: str | None
    message: str


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass(frozen=True, slots=True)
class _Rule:
    """An optional field: whether it accepts a non-null value, what it must be (in the
    refusal's words) and the same as JSON Schema (in the OpenAPI document)."""

    accepts: Callable[[Any], bool]
    must_be: str
    schema: dict[str, Any]


# JSON Schema's integer takes 1.0 too; the gateway, as OpenAI's API does, does not
_WHOLE = "an integer written without a fraction (1, not 1.0)"
# the integers the JSON reader (orjson) keeps as integers; beyond, it reads a float
_INT64 = {"minimum": -(2**63), "maximum": 2**64 - 1}


def _int_in(low: int, high: int | None) -> _Rule:
    bounds = {"minimum": low, "maximum": _INT64["maximum"] if high is None else high}
    return _Rule(
        lambda v: _is_int(v) and low <= v and (high is None or v <= high),
        f"an integer of at least {low}" if high is None else f"an integer from {low} to {high}",
        {"type": "integer", **bounds, "description": _WHOLE},
    )


def _number_in(low: float, high: float) -> _Rule:
    return _Rule(
        lambda v: _is_number(v) and low <= v <= high,
        f"a number from {low:g} to {high:g}",
        {"type": "number", "minimum": low, "maximum": high},
    )


def _stop(v: Any) -> bool:
    if isinstance(v, str):
        return True
    return isinstance(v, list) and len(v) <= MAX_STOP and all(isinstance(s, str) for s in v)


# field -> its rule; null means "the default" for each
_OPTIONAL: dict[str, _Rule] = {
    "max_tokens": _int_in(1, None),
    "max_completion_tokens": _int_in(1, None),
    "temperature": _number_in(0, 2),
    "top_p": _number_in(0, 1),
    "stream": _Rule(lambda v: isinstance(v, bool), "true or false", {"type": "boolean"}),
    "n": _int_in(1, MAX_N),
    "stop": _Rule(
        _stop,
        f"a string or a list of at most {MAX_STOP} strings",
        {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
            ]
        },
    ),
}

_MODEL = {"type": "string", "minLength": 1, "description": "a model of GET /v1/models"}
_MESSAGES = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string"},
            "content": {"type": ["string", "array", "null"]},
        },
    },
}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", **_INT64, "description": _WHOLE}}
_PROMPT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}},
        _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS},
    ]
}


def _messages(v: Any) -> Invalid | None:
    if not isinstance(v, list) or not v:
        return Invalid("messages", "messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return Invalid(f"messages.{i}", f"messages[{i}] must be an object with a string role")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            return Invalid(
                f"messages.{i}.content",
                f"messages[{i}].content must be a string or a list of content parts",
            )
    return None


def _prompt(v: Any) -> Invalid | None:
    if isinstance(v, str):
        return None
    if isinstance(v, list) and (
        all(isinstance(p, str) for p in v)
        or all(_is_int(p) for p in v)
        or all(isinstance(p, list) and all(_is_int(t) for t in p) for p in v)
    ):
        return None
    return Invalid(
        "prompt",
        "prompt must be a string, a list of strings, a list of token ids or a list of lists "
        "of token ids",
    )


def invalid(body: Any, chat: bool) -> Invalid | None:
    """Why this chat (`chat`) or text completion body is refused; None when it may go on."""
    if not isinstance(body, dict):
        return Invalid(None, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return Invalid("model", "model must be a non-empty string naming a model (GET /v1/models)")
    refused = _messages(body.get("messages")) if chat else _prompt(body.get("prompt"))
    if refused is not None:
        return refused
    for name, rule in _OPTIONAL.items():
        value = body.get(name)
        if value is not None and not rule.accepts(value):
            return Invalid(name, f"{name} must be {rule.must_be}, not {_shown(value)}")
    return None


def request_schema(chat: bool) -> dict[str, Any]:
    """The JSON Schema (2020-12, as OpenAPI 3.1 uses) of the bodies `invalid` lets through:
    the fields it checks; any other field passes to the engine."""
    first = ("messages", _MESSAGES) if chat else ("prompt", _PROMPT)
    optional = {name: {"anyOf": [r.schema, {"type": "null"}]} for name, r in _OPTIONAL.items()}
    return {
        "type": "object",
        "required": ["model", first[0]],
        "properties": {"model": _MODEL, first[0]: first[1], **optional},
        "additionalProperties": True,
    }


def _shown(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["MAX_N", "MAX_STOP", "Invalid", "invalid", "request_schema"]
