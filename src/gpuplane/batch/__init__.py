"""Offline batch evaluation: versioned stages, prefetch, stage cache, packing and runners."""

from gpuplane.batch.cache import StageCache
from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import Device, Plan, plan_packing
from gpuplane.batch.pipeline import CLIP, CachePolicy, Pipeline, Stage, stage

__all__ = [
    "CLIP",
    "BatchError",
    "CachePolicy",
    "Device",
    "Pipeline",
    "Plan",
    "Stage",
    "StageCache",
    "plan_packing",
    "stage",
]
