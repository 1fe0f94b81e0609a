"""Prometheus metrics of gateway high availability, named `gpuplane_ha_<thing>_<unit>`.

Read at scrape time from the lease loop (primary/standby) or the shared slot table (shared),
beside the gateway's own metrics on `/metrics`; Redis round trips are observed as they happen.
Every label takes a handful of values (a role, a state, a kind of change).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # redis is imported only in mode shared
    from gpuplane.serve.ha.leadership import Leadership
    from gpuplane.serve.ha.shared import RedisSlotTable

# A loopback Redis answers in a fraction of a millisecond; past `shared_timeout_s` it is out.
ROUND_TRIP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class HaCollector(Collector):
    def __init__(self, leadership: Leadership | None, shared: RedisSlotTable | None) -> None:
        self.leadership = leadership
        self.shared = shared

    def collect(self) -> Iterator[Metric]:
        epoch = GaugeMetricFamily(
            "gpuplane_ha_epoch",
            "The epoch this gateway leads in (primary/standby; 0: it does not) or writes its "
            "shared leases under (shared)",
        )
        fenced = CounterMetricFamily(
            "gpuplane_ha_fenced_writes",
            "Writes of this gateway to shared state refused for an older epoch",
        )
        if self.leadership is not None:
            state = self.leadership.state()
            leader = GaugeMetricFamily(
                "gpuplane_ha_leader", "1 while this gateway leads and admits, else 0"
            )
            leader.add_metric([], 1.0 if state["role"] == "leader" else 0.0)
            changes = CounterMetricFamily(
                "gpuplane_ha_leader_changes",
                "Times this gateway became leader (elected) or stopped leading (lost)",
                labels=["change"],
            )
            changes.add_metric(["elected"], self.leadership.stats.elected)
            changes.add_metric(["lost"], self.leadership.stats.lost)
            epoch.add_metric([], float(self.leadership.election.epoch or 0))
            fenced.add_metric([], self.leadership.stats.fenced_writes)
            yield from (leader, changes)
        if self.shared is not None:
            from gpuplane.serve.ha.shared_layout import Share

            mode = GaugeMetricFamily(
                "gpuplane_ha_shared_state",
                "1 for how this gateway admits now: shared (Redis decides), local (Redis is "
                "out: its local allowance), resync (Redis is back: both), fenced (nothing)",
                labels=["state"],
            )
            for s in Share:
                mode.add_metric([s.value], 1.0 if self.shared.state is s else 0.0)
            changes = CounterMetricFamily(
                "gpuplane_ha_shared_state_changes",
                "Times this gateway's shared slot table entered each state",
                labels=["state"],
            )
            for s in Share:
                changes.add_metric([s.value], self.shared.entered[s])
            epoch.add_metric([], float(self.shared.epoch))
            fenced.add_metric([], self.shared.fenced_writes)
            yield from (mode, changes)
        yield from (epoch, fenced)


def register(
    registry: CollectorRegistry, leadership: Leadership | None, shared: RedisSlotTable | None
) -> None:
    """Put the HA metrics on the gateway's registry (and time the shared table's Redis calls)."""
    registry.register(HaCollector(leadership, shared))
    if shared is not None:
        round_trip = Histogram(
            "gpuplane_ha_redis_round_trip_seconds",
            "Time of one call to the shared slot table in Redis (an acquire, a heartbeat)",
            buckets=ROUND_TRIP_BUCKETS,
            registry=registry,
        )
        shared.on_round_trip = round_trip.observe
