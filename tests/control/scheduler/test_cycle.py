"""One scheduling cycle (schedule) and submit-time feasibility: whole cards vs shares, the
node's cards, and that neither mutates the snapshot."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplane.control.scheduler import (
    ReasonCode,
    Request,
    Snapshot,
    feasible,
    make_policy,
    policy_names,
    schedule,
)
from gpuplane.resources import Resources, Slice
from tests.control.scheduler.sched_helpers import GIB, codes, node, place


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


def test_schedule_does_not_mutate_the_snapshot() -> None:
    snap = Snapshot([node("n1")])
    decision = schedule(snap, Request("j", gpus=2), make_policy("frag"), np.random.default_rng(1))
    assert decision.ok
    assert snap.full_free.tolist() == [8]
    assert not snap.allocations
