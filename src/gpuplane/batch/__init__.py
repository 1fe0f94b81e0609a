"""Offline batch evaluation: versioned stages, prefetch, stage cache, packing and runners.

The public names are imported on first use: `config.py` reads the `batch:` section
(`batch/settings.py`) with every config file, and the gateway or the control plane need not have
the batch tier's dependencies (fsspec) installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuplane.batch.cache import StageCache
    from gpuplane.batch.errors import BatchError
    from gpuplane.batch.packing import BatchDevice, PackingPlan, plan_packing
    from gpuplane.batch.pipeline import CLIP, CachePolicy, Pipeline, Stage, stage

_MODULES = {
    "CLIP": "pipeline",
    "BatchError": "errors",
    "CachePolicy": "pipeline",
    "BatchDevice": "packing",
    "Pipeline": "pipeline",
    "PackingPlan": "packing",
    "Stage": "pipeline",
    "StageCache": "cache",
    "plan_packing": "packing",
    "stage": "pipeline",
}

__all__ = [
    "CLIP",
    "BatchDevice",
    "BatchError",
    "CachePolicy",
    "PackingPlan",
    "Pipeline",
    "Stage",
    "StageCache",
    "plan_packing",
    "stage",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpuplane.batch.{module}"), name)
