"""The gateway's metrics page: request-path tallies rendered as Prometheus families."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpuplane.serve.metrics import LATENCY_BUCKETS, Buckets, GatewayMetrics
from gpuplane.serve.placement import Choice


def samples(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    page = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def test_an_observation_on_a_bound_counts_in_that_bucket_and_past_the_last_in_inf() -> None:
    buckets = Buckets()
    for value in (0.005, 0.0051, 0.3, 1000.0):
        buckets.observe(value)
    cumulative = dict(buckets.cumulative())
    assert cumulative["0.005"] == 1
    assert cumulative["0.01"] == 2
    assert cumulative["0.5"] == 3
    assert cumulative["300.0"] == 3
    assert cumulative["+Inf"] == 4
    assert len(cumulative) == len(LATENCY_BUCKETS) + 1
    assert buckets.total == 0.005 + 0.0051 + 0.3 + 1000.0


def test_the_page_has_every_family_with_its_labels_counts_and_sums() -> None:
    metrics = GatewayMetrics(lambda: [])
    series = metrics.model("m")
    series.answered(200)
    series.answered(200)
    series.answered(499)
    series.latency.observe(0.02)
    series.latency.observe(2.0)
    series.failed("i0", "connect")
    series.retried()
    metrics.reject("other", "unknown_model")
    events = metrics.router_events()
    events.placed("m", Choice("i0", "prefix", 3))
    events.placed("m", Choice("i1", "least_loaded"))

    got = samples(metrics)
    assert got[("gpuplane_requests_total", (("model", "m"), ("status", "200")))] == 2
    assert got[("gpuplane_requests_total", (("model", "m"), ("status", "499")))] == 1
    duration = "gpuplane_request_duration_seconds"
    assert got[(f"{duration}_count", (("model", "m"),))] == 2
    assert got[(f"{duration}_sum", (("model", "m"),))] == 2.02
    assert got[(f"{duration}_bucket", (("le", "0.025"), ("model", "m")))] == 1
    assert got[(f"{duration}_bucket", (("le", "+Inf"), ("model", "m")))] == 2
    assert got[("gpuplane_queue_wait_seconds_count", (("model", "m"),))] == 0
    failure = (("instance", "i0"), ("kind", "connect"), ("model", "m"))
    assert got[("gpuplane_upstream_failures_total", failure)] == 1
    assert got[("gpuplane_retries_total", (("model", "m"),))] == 1
    assert (
        got[("gpuplane_rejections_total", (("model", "other"), ("reason", "unknown_model")))] == 1
    )
    assert got[("gpuplane_placements_total", (("model", "m"), ("reason", "prefix")))] == 1
    assert got[("gpuplane_prefix_affinity_hits_total", (("model", "m"),))] == 1
