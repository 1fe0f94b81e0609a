"""Engine adapters, one module (the simulator: one package) per engine, registered by name."""

from gpuplane.engines.base import EngineAdapter, EngineLoad, get_adapter, register

__all__ = ["EngineAdapter", "EngineLoad", "get_adapter", "register"]
