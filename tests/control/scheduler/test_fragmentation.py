"""The workload mix (task-class distribution): the popular classes kept, each job counted once."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import OnlineWorkloadMix, Request, WorkloadMix


def test_a_mix_from_requests_keeps_the_popular_classes() -> None:
    reqs = [Request(f"a{i}", gpu_milli=500) for i in range(90)]
    reqs += [Request(f"b{i}", gpus=2) for i in range(9)] + [Request("c", gpu_milli=130)]
    w = WorkloadMix.from_requests(reqs, popularity=0.95)
    assert {(c.gpus, c.milli) for c in w.classes} == {(0, 500), (2, 1000)}
    # the kept classes' weights are renormalised to sum to 1, as the published simulator does
    assert w.total_weight == pytest.approx(1.0)
    assert {c.milli: c.weight for c in w.classes} == {
        500: pytest.approx(90 / 99),
        1000: pytest.approx(9 / 99),
    }
    assert len(WorkloadMix.from_requests(reqs)) == 3


def test_host_memory_tells_classes_apart_only_where_it_counts() -> None:
    """The published FGD's typical pods are (CPU, GPU share, cards, model): two requests that
    differ only in host memory are one class for `fgd`, two for `frag` (memory counts). The
    popularity cut is over those shapes either way: split by memory, a popular shape keeps its
    place in the cut and shares its weight among its memory sizes."""
    reqs = [
        Request(f"a{i}", gpu_milli=500, cpu_millis=4000, memory_mib=1024 * (1 + i % 3))
        for i in range(30)
    ]
    reqs += [Request(f"b{i}", gpus=1, cpu_millis=8000) for i in range(20)]
    fgd = WorkloadMix.from_requests(reqs, popularity=0.5)
    assert [(c.milli, c.weight) for c in fgd.classes] == [(500, 1.0)]  # 60 % in one class
    frag = WorkloadMix.from_requests(reqs, popularity=0.5, use_memory=True)
    # a is 60 %, though 20 % at each memory size (b, 40 %, is larger than each of those)
    kept = sorted((c.milli, c.memory_mib, c.weight) for c in frag.classes)
    assert [(milli, mem) for milli, mem, _ in kept] == [(500, 1024), (500, 2048), (500, 3072)]
    assert [w for *_, w in kept] == pytest.approx([1 / 3] * 3)
    assert len(WorkloadMix.from_requests(reqs, popularity=1.0, use_memory=True)) == 4
    online = OnlineWorkloadMix(popularity=1.0)
    for r in reqs:
        online.observe(r)
    assert len(online.mix.classes) == 2


def test_an_online_mix_counts_each_job_once() -> None:
    online = OnlineWorkloadMix(popularity=1.0)
    for _ in range(50):  # a pending job retried every pass
        online.observe(Request("stuck", gpus=8))
    for i in range(30):
        online.observe(Request(f"s{i}", gpu_milli=250))
    weights = {(c.gpus, c.milli): c.weight for c in online.mix.classes}
    assert weights == {(8, 1000): pytest.approx(1 / 31), (0, 250): pytest.approx(30 / 31)}
