"""The simulator's `/metrics` text (`engines/sim/metrics.py`), rendered from a model alone."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

from gpuplane.engines import get_adapter
from gpuplane.engines.sim.metrics import render_metrics
from gpuplane.engines.sim.model import InstanceCore, SimParams


def test_metrics_use_vllms_names_old_and_new_and_read_back_as_its_load() -> None:
    core = InstanceCore(SimParams(max_num_seqs=2, block_tokens=1), random.Random(0))
    first = core.arrive("shared prompt", 4, now=0.0)
    core.prefilled(first)
    core.release(first, now=1.0, completed=True)
    for prompt in ("shared prompt", "second", "third"):  # two run, the third waits
        core.arrive(prompt, 4, now=1.0)

    text = render_metrics(core, "m").decode()
    samples = {
        (s.name, s.labels.get("model_name")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for name in ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"):
        assert samples[(name, "m")] == core.stats.prefix_hit_tokens > 0
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        assert samples[(name, "m")] == core.kv_usage() > 0
    assert samples[("vllm:request_success_total", "m")] == 1
    assert samples[("vllm:prompt_tokens_total", "m")] == core.stats.prompt_tokens
    load = get_adapter("sim").parse_load(text)
    assert (load.running, load.waiting) == (2, 1)


def test_metrics_also_use_sglangs_names_and_its_cache_hit_rate_reads_back_as_its_load() -> None:
    core = InstanceCore(SimParams(max_num_seqs=2, block_tokens=1), random.Random(0))
    first = core.arrive("shared prompt", 4, now=0.0)
    core.prefilled(first)
    core.release(first, now=1.0, completed=True)
    for prompt in ("shared prompt", "second", "third"):
        core.arrive(prompt, 4, now=1.0)

    text = render_metrics(core, "m").decode()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model_name") == "m"
    }
    st = core.stats
    assert samples["sglang:cache_hit_rate"] == st.prefix_hit_tokens / st.prefix_queries > 0
    assert samples["sglang:prompt_tokens_total"] == st.prompt_tokens
    assert (samples["sglang:num_running_reqs"], samples["sglang:num_queue_reqs"]) == (2, 1)
    load = get_adapter("sglang").parse_load(text)
    assert (load.running, load.waiting) == (2, 1)
