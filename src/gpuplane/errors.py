"""The project's exception hierarchy: third-party errors are translated into these at the edges."""

import difflib
from collections.abc import Iterable


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
