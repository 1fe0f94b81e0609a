"""The simulator's `/metrics` page: an instance's state under vLLM's and SGLang's metric names.

Rendered with prometheus_client at scrape time from an `InstanceCore`, which stays free of it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.engines.sim.model import InstanceCore


def render_metrics(core: InstanceCore, model: str) -> bytes:
    """The instance's state as vLLM and SGLang name it on `/metrics` (Prometheus text format).

    Both vLLM's V1 names (`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_*`) and the older ones
    (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`) are exported, as vLLM did while it
    renamed them; prefix-cache counters are in tokens, as in vLLM. SGLang's (`sglang:*`, with
    `--enable-metrics`) follow: its running and queued requests, token usage, token counters and
    `sglang:cache_hit_rate`, the share of prompt tokens served from its prefix cache.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_VllmCollector(core, model))
    registry.register(_SglangCollector(core, model))
    return generate_latest(registry)


Rows = tuple[tuple[str, str, float], ...]  # name, help text, value


def _per_model(model: str, gauges: Rows, counters: Rows) -> Iterator[Metric]:
    """One family per row, with the instance's model as its only label (`model_name`)."""
    for kind, rows in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
        for name, doc, value in rows:
            family = kind(name, doc, labels=["model_name"])
            family.add_metric([model], float(value))
            yield family


class _VllmCollector(Collector):
    def __init__(self, core: InstanceCore, model: str) -> None:
        self.core = core
        self.model = model

    def collect(self) -> Iterator[Metric]:
        core, st = self.core, self.core.stats
        gauges = (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                len(core.running),
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                len(core.waiting),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                core.kv_usage(),
            ),
            (
                "vllm:gpu_cache_usage_perc",
                "GPU KV-cache usage. 1 means 100 percent usage.",
                core.kv_usage(),
            ),
        )
        counters = (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", st.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", st.prefix_hit_tokens),
            (
                "vllm:gpu_prefix_cache_queries",
                "GPU prefix cache queries, in tokens.",
                st.prefix_queries,
            ),
            (
                "vllm:gpu_prefix_cache_hits",
                "GPU prefix cache hits, in tokens.",
                st.prefix_hit_tokens,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                st.generation_tokens,
            ),
        )
        yield from _per_model(self.model, gauges, counters)
        done = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["finished_reason", "model_name"],
        )
        done.add_metric(["length", self.model], float(st.requests_completed))
        yield done


class _SglangCollector(Collector):
    def __init__(self, core: InstanceCore, model: str) -> None:
        self.core = core
        self.model = model

    def collect(self) -> Iterator[Metric]:
        core, st = self.core, self.core.stats
        hit_rate = st.prefix_hit_tokens / st.prefix_queries if st.prefix_queries else 0.0
        gauges = (
            ("sglang:num_running_reqs", "The number of running requests.", len(core.running)),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                len(core.waiting),
            ),
            ("sglang:token_usage", "The token usage.", core.kv_usage()),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", hit_rate),
        )
        counters = (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            (
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                st.generation_tokens,
            ),
        )
        yield from _per_model(self.model, gauges, counters)
