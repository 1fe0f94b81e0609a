"""Engine adapters, one module per engine, registered by name."""

from gpuplane.serve.engines.base import EngineAdapter, EngineLoad, get_adapter, register

__all__ = ["EngineAdapter", "EngineLoad", "get_adapter", "register"]
