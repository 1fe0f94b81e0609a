"""schedule / feasible: filtering, whole cards vs shares, selectors and the reasons per cluster."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplane.control.scheduler import (
    Decision,
    ReasonCode,
    Request,
    Snapshot,
    UnknownPolicyError,
    feasible,
    make_policy,
    policy_names,
    schedule,
)
from gpuplane.errors import ResourceError
from gpuplane.resources import LABEL_CLUSTER, LABEL_REGION, Resources, Selector, Slice
from tests.control.sched_helpers import GIB, node


def place(snap: Snapshot, req: Request, policy: str = "frag") -> Decision:
    decision = schedule(snap, req, make_policy(policy), np.random.default_rng(0))
    if decision.placement is not None:
        snap.commit(decision.placement)
    return decision


def codes(decision: Decision) -> dict[str, ReasonCode]:
    return {r.cluster: r.code for r in decision.reasons}


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


@pytest.mark.parametrize("policy", policy_names())
def test_multi_gpu_requests_take_whole_free_cards_on_one_node(policy: str) -> None:
    snap = Snapshot([node("n1", cards=4), node("n2", cards=4)])
    place(snap, Request("share", gpu_milli=100, gpu_mem_mib=GIB), policy)
    decision = place(snap, Request("big", gpus=4), policy)
    assert decision.placement is not None
    grants = decision.placement.devices
    assert len({g.index for g in grants}) == 4
    assert all(g.gpu_milli == 1000 and g.mem_mib == 80 * GIB for g in grants)
    shared_node = snap.allocations["share"].node
    assert decision.placement.node != shared_node  # the partly used node has 3 free cards


@pytest.mark.parametrize("policy", ["frag", "fgd", "best-fit", "binpack", "packing"])
def test_fractional_requests_share_one_card(policy: str) -> None:
    snap = Snapshot([node("n1", cards=2)])
    spec = Resources(Slice(gpu_mem_mib=10240, gpu_cores_pct=25))
    placements = [
        place(snap, Request.from_resources(f"j{i}", spec), policy).placement for i in range(4)
    ]
    assert all(p is not None for p in placements)
    cards = {p.devices[0].index for p in placements if p is not None}
    assert len(cards) == 1  # four quarter cards fill one card, the other stays whole
    assert snap.full_free.tolist() == [1]
    assert snap.dev_milli_free[0].min() == 0


def test_proportional_memory_follows_the_card_size() -> None:
    snap = Snapshot([node("n1", cards=1, card_gib=16)])
    decision = place(snap, Request("j", gpu_milli=500))
    assert decision.placement is not None
    assert decision.placement.devices[0].mem_mib == 8 * GIB


def test_selectors_restrict_nodes_by_labels_and_gpu_models() -> None:
    snap = Snapshot(
        [
            node("a1", cluster="east", model="A100", region="us"),
            node("h1", cluster="west", model="H100", region="eu"),
        ]
    )
    h100 = place(snap, Request("j", gpus=1, selector=Selector(gpu_models=frozenset({"H100"}))))
    assert h100.placement is not None
    assert h100.placement.node == "h1"
    us = place(snap, Request("k", gpus=1, selector=Selector(match_labels={LABEL_REGION: "us"})))
    assert us.placement is not None
    assert us.placement.cluster == "east"
    by_cluster = Request("m", gpus=1, selector=Selector(match_labels={LABEL_CLUSTER: "west"}))
    placement = place(snap, by_cluster).placement
    assert placement is not None
    assert placement.node == "h1"


def test_no_matching_label_is_said_per_cluster() -> None:
    snap = Snapshot([node("a1", cluster="east"), node("b1", cluster="west")])
    decision = place(snap, Request("j", gpus=1, selector=Selector(gpu_models=frozenset({"B200"}))))
    assert not decision.ok
    assert codes(decision) == {
        "east": ReasonCode.NO_MATCHING_NODE,
        "west": ReasonCode.NO_MATCHING_NODE,
    }
    assert "B200" in decision.reasons[0].message


def test_impossible_requests_exceed_capacity_and_feasible_says_so() -> None:
    snap = Snapshot([node("n1", cards=8, card_gib=80)])
    too_big = Request("j", gpu_mem_mib=200 * GIB, gpu_milli=500)
    decision = feasible(snap, too_big)
    assert not decision.ok
    reason = decision.reasons[0]
    assert reason.code is ReasonCode.EXCEEDS_CAPACITY
    assert reason.numbers == {"requested": 200 * GIB, "max_card": 80 * GIB}
    assert codes(feasible(snap, Request("k", gpus=9))) == {"c1": ReasonCode.EXCEEDS_CAPACITY}
    assert codes(feasible(snap, Request("m", cpu_millis=10**6))) == {
        "c1": ReasonCode.EXCEEDS_CAPACITY
    }
    ok = feasible(snap, Request("fits", gpus=8))
    assert ok.ok
    assert ok.placement is not None
    # feasible never mutates, even though nothing is free any more
    place(snap, Request("all", gpus=8))
    assert feasible(snap, Request("fits-later", gpus=8)).ok
    assert not place(snap, Request("now", gpus=1)).ok


def test_not_enough_free_gpu_memory_on_any_card() -> None:
    snap = Snapshot([node("n1", cards=2, card_gib=80)])
    for i in range(2):
        place(snap, Request(f"j{i}", gpu_mem_mib=60 * GIB, gpu_milli=100))
    decision = place(snap, Request("k", gpu_mem_mib=50 * GIB, gpu_milli=100))
    reason = decision.reasons[0]
    assert reason.code is ReasonCode.INSUFFICIENT_GPU_MEMORY
    assert reason.numbers["max_free_mem_mib"] == 20 * GIB
    assert reason.numbers["requested_mem_mib"] == 50 * GIB


def test_fragmented_when_enough_is_free_in_total_but_not_on_one_card() -> None:
    snap = Snapshot([node("n1", cards=2, card_gib=80)])
    for i in range(2):
        place(snap, Request(f"j{i}", gpu_mem_mib=50 * GIB, gpu_milli=100))
    decision = place(snap, Request("k", gpu_mem_mib=40 * GIB, gpu_milli=100))
    assert decision.reasons[0].code is ReasonCode.FRAGMENTED
    assert decision.reasons[0].numbers["free_mem_mib"] == 60 * GIB


def test_whole_cards_fragmented_across_nodes() -> None:
    snap = Snapshot([node("n1", cards=2), node("n2", cards=2)])
    place(snap, Request("a", gpus=1), "spread")
    place(snap, Request("b", gpus=1), "spread")
    assert snap.full_free.tolist() == [1, 1]
    decision = place(snap, Request("pair", gpus=2))
    reason = decision.reasons[0]
    assert reason.code is ReasonCode.FRAGMENTED
    assert reason.numbers["free_cards"] == 2
    assert reason.numbers["max_free_on_a_node"] == 1


def test_insufficient_gpus_when_the_cluster_is_simply_full() -> None:
    snap = Snapshot([node("n1", cards=2)])
    place(snap, Request("a", gpus=2))
    assert codes(place(snap, Request("b", gpus=1))) == {"c1": ReasonCode.INSUFFICIENT_GPUS}


def test_cpu_and_memory_are_checked_and_reported() -> None:
    snap = Snapshot([node("n1", cards=2, cpu=8000, mem_gib=64)])
    place(snap, Request("a", gpus=1, cpu_millis=6000))
    decision = place(snap, Request("b", gpus=1, cpu_millis=4000))
    assert decision.reasons[0].code is ReasonCode.INSUFFICIENT_CPU
    assert decision.reasons[0].numbers == {"requested": 4000, "max_free": 2000}
    decision = place(snap, Request("c", gpus=1, cpu_millis=1000, memory_mib=100 * GIB))
    assert decision.reasons[0].code is ReasonCode.EXCEEDS_CAPACITY
    place(snap, Request("d", memory_mib=60 * GIB))
    decision = place(snap, Request("e", gpus=1, memory_mib=8 * GIB))
    assert decision.reasons[0].code is ReasonCode.INSUFFICIENT_MEMORY


def test_fractional_requests_skip_nodes_that_do_not_split_cards() -> None:
    snap = Snapshot([node("n1", splittable=False)])
    decision = place(snap, Request("j", gpu_milli=250))
    assert codes(decision) == {"c1": ReasonCode.NOT_SPLITTABLE}
    assert place(snap, Request("k", gpus=1)).ok


def test_cordoned_nodes_are_skipped() -> None:
    snap = Snapshot([node("n1"), node("n2", cluster="c2")])
    snap.set_schedulable("n1", False)
    decision = place(snap, Request("j", gpus=8))
    assert decision.placement is not None
    assert decision.placement.node == "n2"
    assert codes(place(snap, Request("k", gpus=1))) == {
        "c1": ReasonCode.NO_NODES,
        "c2": ReasonCode.INSUFFICIENT_GPUS,
    }


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


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownPolicyError) as info:
        make_policy("first-fit")
    for name in ("frag", "fgd", "best-fit", "binpack", "spread", "packing", "random"):
        assert name in str(info.value)
    assert make_policy("best_fit").name == "best-fit"


def test_schedule_does_not_mutate_the_snapshot() -> None:
    snap = Snapshot([node("n1")])
    decision = schedule(snap, Request("j", gpus=2), make_policy("frag"), np.random.default_rng(1))
    assert decision.ok
    assert snap.full_free.tolist() == [8]
    assert not snap.allocations
