"""Prometheus metrics of the gateway, named `gpuplane_<thing>_<unit>`.

Counters and histograms are updated on the request path, through per-model children looked up
once (`ModelSeries`); gauges of slot and queue state are read from the routers at scrape time, so
the hot path pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.serve.placement import Choice
from gpuplane.serve.router import ModelRouter, Rejection, RouterEvents
from gpuplane.serve.slots import Lease

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _StateCollector(Collector):
    def __init__(self, routers: Callable[[], Iterable[ModelRouter]]) -> None:
        self._routers = routers

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "instance"]
        capacity = GaugeMetricFamily(
            "gpuplane_instance_capacity_slots", "Concurrency slots of an instance", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "gpuplane_instance_in_flight_requests",
            "Requests holding a slot on an instance",
            labels=labels,
        )
        healthy = GaugeMetricFamily(
            "gpuplane_instance_healthy", "1 when the instance gets new requests", labels=labels
        )
        queued = GaugeMetricFamily(
            "gpuplane_queue_depth_requests",
            "Requests waiting for a slot, per model and tenant",
            labels=["model", "tenant"],
        )
        for router in self._routers():
            for inst in router.instances:
                capacity.add_metric([router.name, inst.id], inst.capacity)
                in_flight.add_metric([router.name, inst.id], inst.in_flight)
                healthy.add_metric([router.name, inst.id], 1.0 if inst.healthy else 0.0)
            for tenant, depth in router.queue.depth_by_tenant().items():
                queued.add_metric([router.name, tenant], depth)
        yield from (capacity, in_flight, healthy, queued)


@dataclass(slots=True)
class ModelSeries:
    """One model's children of the request-path metrics: `.labels(...)` costs a lock and a
    label tuple per call, so each child is looked up once per model (and status)."""

    model: str
    metrics: GatewayMetrics
    ttft: Histogram
    latency: Histogram
    queue_wait: Histogram
    retries: Counter
    prefix_hits: Counter
    by_status: dict[int, Counter] = field(default_factory=dict)
    by_reason: dict[str, Counter] = field(default_factory=dict)

    def answered(self, status: int) -> Counter:
        child = self.by_status.get(status)
        if child is None:
            child = self.metrics.requests.labels(self.model, str(status))
            self.by_status[status] = child
        return child

    def placed(self, reason: str) -> Counter:
        child = self.by_reason.get(reason)
        if child is None:
            child = self.by_reason[reason] = self.metrics.placements.labels(self.model, reason)
        return child


class GatewayMetrics:
    def __init__(self, routers: Callable[[], Iterable[ModelRouter]]) -> None:
        # `_created` series double the page and nobody reads them
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_StateCollector(routers))
        r = self.registry
        self.requests = Counter(
            "gpuplane_requests_total",
            "Requests answered, by model and HTTP status",
            ["model", "status"],
            registry=r,
        )
        self.rejections = Counter(
            "gpuplane_rejections_total",
            "Requests refused before reaching an engine, by reason",
            ["model", "reason"],
            registry=r,
        )
        self.placements = Counter(
            "gpuplane_placements_total",
            "Slot grants by the placement decision that made them (prefix = affinity hit)",
            ["model", "reason"],
            registry=r,
        )
        self.prefix_hits = Counter(
            "gpuplane_prefix_affinity_hits_total",
            "Requests placed on an instance that recently served their prompt prefix",
            ["model"],
            registry=r,
        )
        self.reaped = Counter(
            "gpuplane_leases_reaped_total",
            "Leases freed by the reaper after their TTL: each one is a leak",
            ["model"],
            registry=r,
        )
        self.upstream_failures = Counter(
            "gpuplane_upstream_failures_total",
            "Failed attempts at an engine, by kind",
            ["model", "instance", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "gpuplane_retries_total", "Requests retried on another instance", ["model"], registry=r
        )
        self.ttft = Histogram(
            "gpuplane_time_to_first_token_seconds",
            "Arrival to the first byte of the engine's answer, queueing included",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "gpuplane_request_duration_seconds",
            "Arrival to the last byte of the answer",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "gpuplane_queue_wait_seconds",
            "Time a request waited for a slot",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        self._series: dict[str, ModelSeries] = {}

    def model(self, name: str) -> ModelSeries:
        """The request-path series of one model (made on first use, then reused)."""
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = ModelSeries(
                model=name,
                metrics=self,
                ttft=self.ttft.labels(name),
                latency=self.latency.labels(name),
                queue_wait=self.queue_wait.labels(name),
                retries=self.retries.labels(name),
                prefix_hits=self.prefix_hits.labels(name),
            )
        return series

    def router_events(self) -> RouterEvents:
        return RouterEvents(
            placed=self._placed,
            rejected=lambda model, reason: self.reject(model, reason.value),
            reaped=self._reaped,
        )

    def reject(self, model: str, reason: str) -> None:
        self.rejections.labels(model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _placed(self, model: str, choice: Choice) -> None:
        series = self.model(model)
        series.placed(choice.reason).inc()
        if choice.reason == "prefix":
            series.prefix_hits.inc()

    def _reaped(self, model: str, lease: Lease) -> None:
        self.reaped.labels(model).inc()


__all__ = ["GatewayMetrics", "ModelSeries", "Rejection"]
