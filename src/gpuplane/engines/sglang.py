"""SGLang: `sglang.launch_server` on a slice, `/health`, `sglang:*` metrics, `max_running_requests`.

SGLang exports metrics only with `--enable-metrics`, which the launch command sets. Capacity comes
from `/server_info` (`/get_server_info` before 0.4.7): `max_running_requests` at the top level or,
in newer versions, in `internal_states[0]`.
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


def parse_sglang_load(metrics_text: str) -> EngineLoad:
    return load_from_samples(
        prometheus_samples(metrics_text),
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
    )


@register
class SglangAdapter(GpuEngineAdapter):
    """SGLang's HTTP server."""

    name = "sglang"
    health_path = "/health"
    default_capacity = 128
    info_path = "/server_info"

    template = LaunchTemplate(
        command=("python", "-m", "sglang.launch_server"),
        model_flag="--model-path",
        fixed_flags=("--enable-metrics",),
        capacity_flag="--max-running-requests",
        memory_flag="--mem-fraction-static",
        memory_full=0.88,
        tensor_parallel_flag="--tp-size",
    )

    def parse_load(self, metrics_text: str) -> EngineLoad:
        return parse_sglang_load(metrics_text)

    def parse_capacity(self, info: dict[str, object]) -> int | None:
        value = info.get("max_running_requests")
        states = info.get("internal_states")
        if not isinstance(value, int) and isinstance(states, list) and states:
            first = states[0]
            if isinstance(first, dict):
                value = first.get("max_running_requests")
        return value if isinstance(value, int) and value > 0 else None
