"""Prometheus metrics of the control plane, named `gpuplane_control_<thing>_<unit>`.

Pass durations and admission counts are recorded by the service; gauges (jobs per state, why
jobs wait, how full each cluster is, team shares, what admission learned from completed jobs) are
read at scrape time, so admission pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PASS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _ServiceStateCollector(Collector):
    def __init__(self, state: Callable[[], dict[str, Any]]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        s = self._state()
        jobs = GaugeMetricFamily("gpuplane_control_jobs", "Jobs by state", labels=["state"])
        for state, n in sorted(s["jobs"].items()):
            jobs.add_metric([state], n)
        waiting = GaugeMetricFamily(
            "gpuplane_control_pending_reasons_jobs",
            "Pending jobs by cluster and reason code, as of the last admission pass",
            labels=["cluster", "reason"],
        )
        for (cluster, code), n in sorted(s["reasons"].items()):
            waiting.add_metric([cluster, code], n)
        gpus = GaugeMetricFamily("gpuplane_control_gpus", "GPU cards", labels=["cluster"])
        used = GaugeMetricFamily(
            "gpuplane_control_gpu_allocated_ratio",
            "Allocated share of GPU compute (milli-GPUs) per cluster",
            labels=["cluster"],
        )
        for cluster, (cards, ratio) in sorted(s["clusters"].items()):
            gpus.add_metric([cluster], cards)
            used.add_metric([cluster], ratio)
        allocated = GaugeMetricFamily(
            "gpuplane_control_gpus_allocated",
            "GPUs held by placed jobs (a slice counts its share of a card), per cluster and "
            "GPU model",
            labels=["cluster", "gpu_model"],
        )
        for (cluster, model), n in sorted(s["allocated"].items()):
            allocated.add_metric([cluster, model], n)
        share = GaugeMetricFamily(
            "gpuplane_control_team_dominant_share_ratio",
            "Dominant-resource share of each team (over its weight)",
            labels=["team"],
        )
        for team, value in sorted(s["shares"].items()):
            share.add_metric([team], value)
        mean_work, limit_fill = s["work"]
        work = GaugeMetricFamily(
            "gpuplane_control_completed_job_work_seconds",
            "Mean work of completed jobs (run seconds x their cards' speed), as delay "
            "scheduling learns it",
            value=mean_work,
        )
        fill = GaugeMetricFamily(
            "gpuplane_control_time_limit_used_ratio",
            "Share of their time limits that completed jobs used, as the queue order learns it "
            "(1 until 8 jobs with a limit completed)",
            value=limit_fill,
        )
        yield from (jobs, waiting, gpus, used, allocated, share, work, fill)


class ControlMetrics:
    """The registry and the instruments the service updates."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._watching = False
        self.pass_seconds = Histogram(
            "gpuplane_control_admission_pass_seconds",
            "Duration of one admission pass (quota, placement, commit)",
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.admitted = Counter(
            "gpuplane_control_admitted_jobs", "Jobs admitted (placed)", registry=self.registry
        )
        self.preempted = Counter(
            "gpuplane_control_preempted_jobs",
            "Jobs preempted to reclaim borrowed quota",
            registry=self.registry,
        )
        self.unidentified = Counter(
            "gpuplane_control_unidentified_calls",
            "Calls that may change something from no identified caller (mostly 401s), by "
            "status: counted here instead of filling the trail",
            ["status"],
            registry=self.registry,
        )

    def watch(self, state: Callable[[], dict[str, Any]]) -> None:
        """Read gauges from `state()` at scrape time (the first source given wins)."""
        if not self._watching:
            self.registry.register(_ServiceStateCollector(state))
            self._watching = True

    def render(self) -> bytes:
        return generate_latest(self.registry)
