"""The request fields the gateway relies on, checked before any slot is taken.

Pure and cheap on the hot path: plain type and range checks over the orjson-parsed body, one
per field the gateway or every engine reads (no model built per request). Fields not named here
pass through to the engine unchecked; an engine's own refusal is translated by the proxy.
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


def _int_in(low: int, high: int | None) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and low <= v and (high is None or v <= high)


def _number_in(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: _is_number(v) and low <= v <= high


def _stop(v: Any) -> bool:
    if isinstance(v, str):
        return True
    return isinstance(v, list) and len(v) <= MAX_STOP and all(isinstance(s, str) for s in v)


# field -> (accepts a non-null value, what it must be); null means "the default" for each
_OPTIONAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_tokens": (_int_in(1, None), "an integer of at least 1"),
    "max_completion_tokens": (_int_in(1, None), "an integer of at least 1"),
    "temperature": (_number_in(0, 2), "a number from 0 to 2"),
    "top_p": (_number_in(0, 1), "a number from 0 to 1"),
    "stream": (lambda v: isinstance(v, bool), "true or false"),
    "n": (_int_in(1, MAX_N), f"an integer from 1 to {MAX_N}"),
    "stop": (_stop, f"a string or a list of at most {MAX_STOP} strings"),
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
    for name, (accepts, must_be) in _OPTIONAL.items():
        value = body.get(name)
        if value is not None and not accepts(value):
            return Invalid(name, f"{name} must be {must_be}, not {_shown(value)}")
    return None


def _shown(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["MAX_N", "MAX_STOP", "Invalid", "invalid"]
