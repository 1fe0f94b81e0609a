"""The project's exception hierarchy: third-party errors are translated into these at the edges."""


class GpuplaneError(Exception):
    """Base of every error gpuplane raises on purpose; the message says what to do."""


class ConfigError(GpuplaneError):
    """The configuration file or a value in it is invalid."""


class EngineError(GpuplaneError):
    """An engine process could not be started, or died and could not be restarted."""


class ResourceError(GpuplaneError):
    """A resource request is malformed or can never be satisfied."""
