"""TensorRT-LLM: `trtllm-serve` on a slice, `/health`, and its load from either metrics form.

`trtllm-serve` answers `/metrics` with JSON iteration statistics (a list of per-iteration objects
with `numActiveRequests`, `numQueuedRequests`, `kvCacheStats`, `maxBatchSizeRuntime`, ...); newer
releases also export Prometheus text with `trtllm_` names at `/prometheus/metrics`. `parse_load`
accepts both. Capacity is `--max_batch_size`, also reported in the iteration statistics.
"""

from __future__ import annotations

import json
from typing import Any

from gpuplane.engines.base import (
    EngineLoad,
    GpuEngineAdapter,
    LaunchTemplate,
    load_from_samples,
    prometheus_samples,
    register,
)


def _latest(payload: Any) -> dict[str, Any]:
    if isinstance(payload, list):
        payload = payload[-1] if payload else {}
    return payload if isinstance(payload, dict) else {}


def parse_trtllm_load(metrics_text: str) -> EngineLoad:
    text = metrics_text.lstrip()
    if text.startswith(("[", "{")):
        stats = _latest(json.loads(text))
        kv = stats.get("kvCacheStats")
        usage = None
        if isinstance(kv, dict) and kv.get("maxNumBlocks"):
            usage = float(kv.get("usedNumBlocks", 0)) / float(kv["maxNumBlocks"])
        running, waiting = stats.get("numActiveRequests"), stats.get("numQueuedRequests")
        return EngineLoad(
            running=running if isinstance(running, int) else None,
            waiting=waiting if isinstance(waiting, int) else None,
            kv_cache_usage=usage,
        )
    return load_from_samples(
        prometheus_samples(metrics_text),
        "trtllm_num_requests_running",
        "trtllm_num_requests_waiting",
        "trtllm_kv_cache_utilization",
    )


@register
class TrtllmAdapter(GpuEngineAdapter):
    """`trtllm-serve` (PyTorch or TensorRT backend)."""

    name = "trtllm"
    health_path = "/health"
    default_capacity = 2048  # trtllm-serve's default max_batch_size

    template = LaunchTemplate(
        command=("trtllm-serve",),
        capacity_flag="--max_batch_size",
        # the KV cache takes this share of the memory left after the weights
        memory_flag="--kv_cache_free_gpu_memory_fraction",
        memory_full=0.9,
        tensor_parallel_flag="--tp_size",
    )

    def parse_load(self, metrics_text: str) -> EngineLoad:
        return parse_trtllm_load(metrics_text)

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        """From one iteration-statistics object (the last element of `/metrics`)."""
        for key in ("maxBatchSizeRuntime", "maxBatchSizeStatic", "max_batch_size"):
            value = info.get(key)
            if isinstance(value, int) and value > 0:
                return value
        return None
