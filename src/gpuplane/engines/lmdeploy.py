"""LMDeploy: `lmdeploy serve api_server` on a slice, `/health`, `lmdeploy:*` metrics.

Capacity is `--max-batch-size`. LMDeploy has no info endpoint for it; it publishes its backend
config as the Prometheus info metric `lmdeploy:backend_config_info`, whose labels
`backend_config_labels` returns for `parse_capacity`.
"""

from __future__ import annotations

from gpuplane.engines.base import (
    EngineLoad,
    GpuEngineAdapter,
    LaunchTemplate,
    load_from_samples,
    prometheus_samples,
    register,
)


def parse_lmdeploy_load(metrics_text: str) -> EngineLoad:
    return load_from_samples(
        prometheus_samples(metrics_text),
        "lmdeploy:num_requests_running",
        "lmdeploy:num_requests_waiting",
        "lmdeploy:gpu_cache_usage_perc",
    )


def backend_config_labels(metrics_text: str) -> dict[str, object]:
    """The labels of `lmdeploy:backend_config_info`, e.g. `{"max_batch_size": "128", ...}`."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "lmdeploy:backend_config_info":
                return dict(sample.labels)
    return {}


@register
class LmdeployAdapter(GpuEngineAdapter):
    """LMDeploy's OpenAI server (TurboMind or PyTorch backend)."""

    name = "lmdeploy"
    health_path = "/health"
    default_capacity = 128  # LMDeploy's default max_batch_size on GPUs with lots of memory

    template = LaunchTemplate(
        command=("lmdeploy", "serve", "api_server"),
        host_flag="--server-name",
        port_flag="--server-port",
        capacity_flag="--max-batch-size",
        # the share of free memory (after the weights) for the KV cache
        memory_flag="--cache-max-entry-count",
        memory_full=0.8,
        tensor_parallel_flag="--tp",
    )

    def parse_load(self, metrics_text: str) -> EngineLoad:
        return parse_lmdeploy_load(metrics_text)

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        value = info.get("max_batch_size")
        try:
            n = int(value) if isinstance(value, int | str) else 0
        except ValueError:
            return None
        return n if n > 0 else None
