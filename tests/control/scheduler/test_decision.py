"""Requests, placements and decisions: the shared vocabulary mapped to scheduler units, shape
keys, the closest cluster's reason."""

from __future__ import annotations

import pytest

from gpuplane.control.scheduler import ReasonCode, Request, Snapshot
from gpuplane.errors import ResourceError
from gpuplane.resources import Resources, Selector, Slice
from tests.control.scheduler.sched_helpers import codes, node, place


def test_request_from_resources_maps_the_shared_vocabulary() -> None:
    frac = Request.from_resources("j", Resources(Slice(gpu_mem_mib=10240, gpu_cores_pct=25)))
    assert (frac.gpus, frac.gpu_milli, frac.gpu_mem_mib) == (0, 250, 10240)
    assert frac.is_fractional
    whole = Request.from_resources("k", Resources(Slice(gpus=4), cpu_millis=8000))
    assert (whole.gpus, whole.gpu_milli, whole.cpu_millis) == (4, 0, 8000)
    assert whole.gpu_demand_milli == 4000
    cpu_only = Request.from_resources("c", Resources(cpu_millis=100))
    assert not cpu_only.is_gpu
    with pytest.raises(ResourceError):
        Request("bad", gpus=2, gpu_milli=500)


def test_requests_of_one_shape_share_a_shape_key() -> None:
    a = Request("a", gpus=1, cpu_millis=1000, selector=Selector({"x": "1"}, frozenset({"A10"})))
    b = Request("b", gpus=1, cpu_millis=1000, selector=Selector({"x": "1"}, frozenset({"A10"})))
    c = Request("c", gpus=1, cpu_millis=1000, selector=Selector({"x": "2"}, frozenset({"A10"})))
    assert a.shape == b.shape
    assert hash(a.shape) == hash(b.shape)
    assert a.shape != c.shape
    assert Request("d", gpu_milli=250).shape != Request("e", gpu_mem_mib=250).shape


def test_primary_reason_is_the_cluster_closest_to_fitting() -> None:
    snap = Snapshot(
        [node("a1", cluster="east", model="A100"), node("h1", cluster="west", model="H100")]
    )
    place(snap, Request("fill", gpus=8, selector=Selector(gpu_models=frozenset({"H100"}))))
    decision = place(snap, Request("j", gpus=1, selector=Selector(gpu_models=frozenset({"H100"}))))
    assert codes(decision) == {
        "east": ReasonCode.NO_MATCHING_NODE,
        "west": ReasonCode.INSUFFICIENT_GPUS,
    }
    assert decision.primary_reason is not None
    assert decision.primary_reason.cluster == "west"
