"""The workload mix (task-class distribution): the popular classes kept, each job counted once."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import OnlineWorkloadMix, Request, WorkloadMix


def test_a_mix_from_requests_keeps_the_popular_classes() -> None:
    reqs = [Request(f"a{i}", gpu_milli=500) for i in range(90)]
    reqs += [Request(f"b{i}", gpus=2) for i in range(9)] + [Request("c", gpu_milli=130)]
    w = WorkloadMix.from_requests(reqs, popularity=0.95)
    assert {(c.gpus, c.milli) for c in w.classes} == {(0, 500), (2, 1000)}
    assert w.total_weight == pytest.approx(0.99)
    assert len(WorkloadMix.from_requests(reqs)) == 3


def test_an_online_mix_counts_each_job_once() -> None:
    online = OnlineWorkloadMix(popularity=1.0)
    for _ in range(50):  # a pending job retried every pass
        online.observe(Request("stuck", gpus=8))
    for i in range(30):
        online.observe(Request(f"s{i}", gpu_milli=250))
    weights = {(c.gpus, c.milli): c.weight for c in online.mix.classes}
    assert weights == {(8, 1000): pytest.approx(1 / 31), (0, 250): pytest.approx(30 / 31)}
