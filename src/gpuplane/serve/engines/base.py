"""The engine adapter interface and the registry of adapters by name.

An adapter knows one engine's conventions: how to launch it for a model on a slice, which path
answers health probes, how to read its running/waiting load from its metrics, and its capacity.
It does no I/O itself; the gateway's prober and the deployment layer do, and hand it text.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from gpuplane.errors import ConfigError
from gpuplane.resources import Slice


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine says about itself in its metrics."""

    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None  # 0..1


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """A process to start: argv plus extra environment."""

    argv: list[str]
    env: dict[str, str]


class EngineAdapter:
    """Base of every engine adapter; subclasses override the class attributes and methods."""

    name: ClassVar[str] = ""
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str] = "/metrics"
    default_capacity: ClassVar[int] = 1

    def launch(self, model_path: str, host: str, port: int, slice_: Slice, capacity: int) -> LaunchSpec:
        """The command that serves `model_path` on host:port within `slice_`."""
        raise NotImplementedError(f"engine '{self.name}' cannot be launched by gpuplane")

    def parse_load(self, metrics_text: str) -> EngineLoad:
        """Running/waiting counts from the engine's metrics page; unknown fields stay None."""
        return EngineLoad()

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        """The engine's own concurrency limit from its info endpoint, if it reports one."""
        return None


_REGISTRY: dict[str, Callable[[], EngineAdapter]] = {}
_BUILTIN = ("llamacpp", "vllm", "sglang", "lmdeploy", "trtllm", "sim", "openai")


def register(cls: type[EngineAdapter]) -> type[EngineAdapter]:
    """Class decorator: make an adapter available under `cls.name`."""
    _REGISTRY[cls.name] = cls
    return cls


def get_adapter(name: str) -> EngineAdapter:
    """The adapter registered as `name`; an unknown name fails with the valid ones."""
    if name not in _REGISTRY and name in _BUILTIN:
        try:
            importlib.import_module(f"gpuplane.serve.engines.{name}")
        except ModuleNotFoundError:
            pass
    if name not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(_BUILTIN))
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown engine '{name}'{hint}; known engines: {', '.join(known)}")
    return _REGISTRY[name]()
