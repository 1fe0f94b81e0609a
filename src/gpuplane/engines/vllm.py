"""vLLM: `vllm serve` on a slice, `/health`, `vllm:*` Prometheus metrics, `max_num_seqs`.

vLLM renamed its KV-usage gauge (`vllm:gpu_cache_usage_perc` → `vllm:kv_cache_usage_perc`);
both are read, the newer first.
"""

from __future__ import annotations

import re

from gpuplane.engines.base import (
    EngineLoad,
    GpuEngineAdapter,
    LaunchTemplate,
    load_from_samples,
    prometheus_samples,
    register,
)

_MAX_NUM_SEQS = re.compile(r"max_num_seqs=(\d+)")


def parse_vllm_load(metrics_text: str) -> EngineLoad:
    """Running/waiting/KV usage from vLLM's `/metrics` (summed over engines and models)."""
    return load_from_samples(
        prometheus_samples(metrics_text),
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    )


@register
class VllmAdapter(GpuEngineAdapter):
    """vLLM's OpenAI server. Capacity is `--max-num-seqs`, which gpuplane sets when it launches."""

    name = "vllm"
    health_path = "/health"
    default_capacity = 256  # vLLM's default max_num_seqs
    info_path = "/server_info"  # only with VLLM_SERVER_DEV_MODE=1; otherwise 404

    template = LaunchTemplate(
        command=("vllm", "serve"),
        capacity_flag="--max-num-seqs",
        memory_flag="--gpu-memory-utilization",
        memory_full=0.9,
        tensor_parallel_flag="--tensor-parallel-size",
    )

    def parse_load(self, metrics_text: str) -> EngineLoad:
        return parse_vllm_load(metrics_text)

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        """`max_num_seqs` from a config dict, or from the `vllm_config` text `/server_info` has."""
        direct = info.get("max_num_seqs")
        if isinstance(direct, int) and direct > 0:
            return direct
        sched = info.get("scheduler_config")
        if isinstance(sched, dict):
            nested = sched.get("max_num_seqs")
            if isinstance(nested, int) and nested > 0:
                return nested
        for value in info.values():
            if isinstance(value, str):
                m = _MAX_NUM_SEQS.search(value)
                if m:
                    return int(m.group(1))
        return None
