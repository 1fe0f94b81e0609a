"""Prometheus metrics of a running batch invocation, named `gpuplane_batch_<thing>_<unit>`.

A driver `Observer`: each update keeps a copy of the per-stage counters (the driver owns and
mutates the originals on its thread), and a collector turns the latest copy into metric families
when Prometheus scrapes `serve()`'s loopback endpoint. Labels are the pipeline and its stages,
both bounded by the pipeline's definition. Counters count this invocation's work: a resumed run
starts them again, and Prometheus' `increase()` and `rate()` read them across restarts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.batch.driver import Observer
from gpuplane.batch.metrics import StageMetrics
from gpuplane.batch.packing import PackingPlan


class BatchExporter(Collector):
    """Publishes the run's progress; passes every event on to `inner` (the progress bars)."""

    def __init__(self, pipeline: str, inner: Observer | None = None) -> None:
        self.pipeline = pipeline
        self.inner = inner
        self._lock = threading.Lock()
        self._total: int | None = None
        self._done = 0
        self._stages: dict[str, StageMetrics] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def on_start(self, stages: list[str], total: int | None, plan: PackingPlan) -> None:
        with self._lock:
            self._total = total
            self._stages = {s: StageMetrics() for s in stages}
        if self.inner:
            self.inner.on_start(stages, total, plan)

    def on_update(self, metrics: Mapping[str, StageMetrics], done: int) -> None:
        copies = {name: replace(m) for name, m in metrics.items()}
        with self._lock:
            self._stages, self._done = copies, done
        if self.inner:
            self.inner.on_update(metrics, done)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            total, done, stages = self._total, self._done, self._stages
        p = self.pipeline
        clips = GaugeMetricFamily(
            "gpuplane_batch_clips", "Clips this invocation has to do", labels=["pipeline"]
        )
        if total is not None:
            clips.add_metric([p], total)
        finished = CounterMetricFamily(
            "gpuplane_batch_clips_done", "Clips finished by this invocation", labels=["pipeline"]
        )
        finished.add_metric([p], done)
        tasks = CounterMetricFamily(
            "gpuplane_batch_stage_clips",
            "Clips through a stage, by outcome (computed, cached, error)",
            labels=["pipeline", "stage", "outcome"],
        )
        compute = CounterMetricFamily(
            "gpuplane_batch_stage_compute_seconds",
            "Wall seconds a stage computed",
            labels=["pipeline", "stage"],
        )
        device = CounterMetricFamily(
            "gpuplane_batch_stage_device_seconds",
            "Seconds of whole cards a stage held (its slice's share x compute seconds)",
            labels=["pipeline", "stage"],
        )
        for name, m in stages.items():
            for outcome, n in (("computed", m.computed), ("cached", m.cached), ("error", m.errors)):
                tasks.add_metric([p, name, outcome], n)
            compute.add_metric([p, name], m.compute_s)
            device.add_metric([p, name], m.device_s)
        yield from (clips, finished, tasks, compute, device)

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
        """Serve /metrics on `host:port` until `shutdown()`; returns the server and its thread."""
        return start_http_server(port, addr=host, registry=self.registry)


__all__ = ["BatchExporter"]
