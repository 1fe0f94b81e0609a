"""Prometheus metrics of the gateway, named `gpuplane_<thing>_<unit>`.

The gateway runs on one event loop, so the request path counts into plain in-memory tallies
(`Tally`, `Buckets`) instead of prometheus_client's metric objects, whose every `inc` and
`observe` takes a lock and whose histograms scan their buckets in Python: together they were
~7 % of the gateway's CPU per request. A collector turns the tallies into metric families at
scrape time, beside the gauges of slot and queue state read from the routers and the tenants'
usage read from their accounts (labelled by configured tenant only); prometheus_client renders
the page.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpuplane.serve.errors import Rejection
from gpuplane.serve.hooks import RouterEvents
from gpuplane.serve.limits import Account
from gpuplane.serve.placement import Choice
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.slots import Lease

# The model label of requests refused before they named a configured model: a label per name a
# client made up would grow the page and the gateway's memory without bound.
UNKNOWN_MODEL = "unknown"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Tally:
    """A counter family: a count per tuple of label values."""

    def __init__(self, name: str, doc: str, labels: list[str]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.counts: dict[tuple[object, ...], int] = {}

    def inc(self, *values: object) -> None:
        self.counts[values] = self.counts.get(values, 0) + 1

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, count in self.counts.items():
            family.add_metric([str(v) for v in values], count)
        return family


@dataclass(slots=True)
class Buckets:
    """One histogram series: how many observations fell in each bucket, and their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        # bucket i holds values in (LATENCY_BUCKETS[i-1], LATENCY_BUCKETS[i]]; the last is +Inf
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        bounds = [*map(floatToGoString, LATENCY_BUCKETS), "+Inf"]
        return list(zip(bounds, map(float, itertools.accumulate(self.counts)), strict=True))


class HistogramTally:
    """A histogram family with a model label: one `Buckets` per model."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.series: dict[str, Buckets] = {}

    def child(self, model: str) -> Buckets:
        return self.series.setdefault(model, Buckets())

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.doc, labels=["model"])
        for model, buckets in self.series.items():
            family.add_metric([model], buckets.cumulative(), buckets.total)
        return family


def tenant_families(accounts: Iterable[Account]) -> list[Metric]:
    """What each tenant used since start, and how many of its requests its limits refused."""
    tenant = ["tenant"]
    requests = CounterMetricFamily(
        "gpuplane_tenant_requests_total",
        "Requests admitted past the tenant's limits",
        labels=tenant,
    )
    prompt = CounterMetricFamily(
        "gpuplane_tenant_prompt_tokens_total",
        "Prompt tokens: as the engine reported them (source=engine), else estimated",
        labels=["tenant", "source"],
    )
    completion = CounterMetricFamily(
        "gpuplane_tenant_completion_tokens_total",
        "Completion tokens: as the engine reported them (source=engine), else estimated",
        labels=["tenant", "source"],
    )
    slot_seconds = CounterMetricFamily(
        "gpuplane_tenant_slot_seconds_total",
        "Seconds the tenant's requests held slots",
        labels=tenant,
    )
    limited = CounterMetricFamily(
        "gpuplane_tenant_limited_total",
        "Requests refused 429 by the tenant's limits, by limit (requests, tokens)",
        labels=["tenant", "limit"],
    )
    for account in accounts:
        name, usage = account.name, account.usage
        requests.add_metric([name], usage.requests)
        for family, total, estimated in (
            (prompt, usage.prompt_tokens, usage.estimated_prompt_tokens),
            (completion, usage.completion_tokens, usage.estimated_completion_tokens),
        ):
            family.add_metric([name, "engine"], total - estimated)
            family.add_metric([name, "estimate"], estimated)
        slot_seconds.add_metric([name], usage.slot_seconds)
        for kind in sorted({w.kind for w in account.windows}):
            limited.add_metric([name, kind], usage.limited.get(kind, 0))
    return [requests, prompt, completion, slot_seconds, limited]


class _StateCollector(Collector):
    def __init__(
        self,
        routers: Callable[[], Iterable[ModelRouter]],
        accounts: Iterable[Account],
        tallies: list[Tally | HistogramTally],
    ) -> None:
        self._routers = routers
        self._accounts = accounts
        self._tallies = tallies

    def collect(self) -> Iterator[Metric]:
        for tally in self._tallies:
            yield tally.family()
        yield from tenant_families(self._accounts)
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
    """One model's request-path series, looked up once per request."""

    model: str
    metrics: GatewayMetrics
    ttft: Buckets
    latency: Buckets
    queue_wait: Buckets

    def answered(self, status: int) -> None:
        self.metrics.requests.inc(self.model, status)

    def retried(self) -> None:
        self.metrics.retries.inc(self.model)

    def failed(self, instance_id: str, kind: str) -> None:
        self.metrics.upstream_failures.inc(self.model, instance_id, kind)


class GatewayMetrics:
    def __init__(
        self, routers: Callable[[], Iterable[ModelRouter]], accounts: Iterable[Account] = ()
    ) -> None:
        self.requests = Tally(
            "gpuplane_requests_total",
            "Requests answered, by model and HTTP status",
            ["model", "status"],
        )
        self.rejections = Tally(
            "gpuplane_rejections_total",
            "Requests refused before reaching an engine, by reason",
            ["model", "reason"],
        )
        self.placements = Tally(
            "gpuplane_placements_total",
            "Slot grants by the placement decision that made them (prefix = affinity hit)",
            ["model", "reason"],
        )
        self.instance_requests = Tally(
            "gpuplane_instance_requests_total",
            "Slot grants on an instance (request attempts placed there)",
            ["model", "instance"],
        )
        self.prefix_hits = Tally(
            "gpuplane_prefix_affinity_hits_total",
            "Requests placed on an instance that recently served their prompt prefix",
            ["model"],
        )
        self.reaped = Tally(
            "gpuplane_leases_reaped_total",
            "Leases freed by the reaper after their TTL: each one is a leak",
            ["model"],
        )
        self.upstream_failures = Tally(
            "gpuplane_upstream_failures_total",
            "Failed attempts at an engine, by kind",
            ["model", "instance", "kind"],
        )
        self.retries = Tally(
            "gpuplane_retries_total", "Requests retried on another instance", ["model"]
        )
        self.connections_refused = Tally(
            "gpuplane_connections_refused_total",
            "Client connections closed before a request was read in full, by reason",
            ["reason"],
        )
        self.ttft = HistogramTally(
            "gpuplane_time_to_first_token_seconds",
            "Arrival to the first byte of the engine's answer, queueing included",
        )
        self.latency = HistogramTally(
            "gpuplane_request_duration_seconds", "Arrival to the last byte of the answer"
        )
        self.queue_wait = HistogramTally(
            "gpuplane_queue_wait_seconds", "Time a request waited for a slot"
        )
        tallies: list[Tally | HistogramTally] = [
            self.requests,
            self.rejections,
            self.placements,
            self.instance_requests,
            self.prefix_hits,
            self.reaped,
            self.upstream_failures,
            self.retries,
            self.connections_refused,
            self.ttft,
            self.latency,
            self.queue_wait,
        ]
        self.registry = CollectorRegistry()
        self.registry.register(_StateCollector(routers, accounts, tallies))
        self._series: dict[str, ModelSeries] = {}

    def model(self, name: str) -> ModelSeries:
        """The request-path series of one model (made on first use, then reused)."""
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = ModelSeries(
                name,
                self,
                self.ttft.child(name),
                self.latency.child(name),
                self.queue_wait.child(name),
            )
        return series

    def router_events(self) -> RouterEvents:
        return RouterEvents(
            placed=self._placed,
            rejected=lambda model, reason: self.reject(model, reason.value),
            reaped=self._reaped,
        )

    def reject(self, model: str, reason: str) -> None:
        self.rejections.inc(model, reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _placed(self, model: str, choice: Choice) -> None:
        self.placements.inc(model, choice.reason)
        self.instance_requests.inc(model, choice.instance_id)
        if choice.reason == "prefix":
            self.prefix_hits.inc(model)

    def _reaped(self, model: str, lease: Lease) -> None:
        self.reaped.inc(model)


__all__ = ["UNKNOWN_MODEL", "GatewayMetrics", "ModelSeries", "Rejection"]
