"""The project's exception hierarchy: third-party errors are translated into these at the edges."""

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel


class GpuplaneError(Exception):
    """Base of every error gpuplane raises on purpose; the message says what to do."""


class ConfigError(GpuplaneError):
    """The configuration file or a value in it is invalid."""


class EngineError(GpuplaneError):
    """An engine process could not be started, or died and could not be restarted."""


class ResourceError(GpuplaneError):
    """A resource request is malformed or can never be satisfied."""


def unknown_name(what: str, name: str, valid: Iterable[str]) -> str:
    """The message for a name that is not one of `valid`: the nearest one, then all of them."""
    options = sorted(valid)
    close = difflib.get_close_matches(name, options, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {what} '{name}'{hint}; valid: {', '.join(options) or 'none'}"


def explain(error: Any, root: type[BaseModel], *, noun: str = "key", whole: str = "config") -> str:
    """One of pydantic's validation errors against `root` as a sentence; an unknown `noun`
    (a config key, a job spec field) names the nearest valid one, then all of them."""
    loc = ".".join(str(p) for p in error["loc"])
    if error["type"] == "extra_forbidden":
        parent = _model_at(root, error["loc"][:-1])
        key = str(error["loc"][-1])
        hint = ""
        renamed: Mapping[str, str] = getattr(parent, "renamed", {})
        if key in renamed:
            new = ".".join([*map(str, error["loc"][:-1]), renamed[key]])
            return f"the key '{loc}' was renamed '{new}': rename it in your config"
        if parent is not None:
            close = difflib.get_close_matches(key, list(parent.model_fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            hint += f"; valid {noun}s: {', '.join(parent.model_fields)}"
        return f"unknown {noun} '{loc}'{hint}"
    return f"{loc or whole}: {user_message(error)}"


# what pydantic puts before the message of a ValueError or an assert raised in a validator
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def user_message(error: Any) -> str:
    """The message of one of pydantic's validation errors, as a user reads it: without the
    `Value error, ` pydantic prefixes to what a validator raised. The one place the API, the
    CLI and the config loader turn a validation error's text into words."""
    message = str(error["msg"])
    for prefix in _PYDANTIC_PREFIXES:
        message = message.removeprefix(prefix)
    return message


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that a validation error location points into."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
