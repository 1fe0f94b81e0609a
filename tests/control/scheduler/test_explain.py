"""Post-filter: the reason per cluster when nothing fits, with the numbers behind it."""

from __future__ import annotations

from gpuplane.control.scheduler import ReasonCode, Request, Snapshot
from gpuplane.resources import Selector
from tests.control.scheduler.sched_helpers import GIB, codes, node, place


def test_no_matching_label_is_said_per_cluster() -> None:
    snap = Snapshot([node("a1", cluster="east"), node("b1", cluster="west")])
    decision = place(snap, Request("j", gpus=1, selector=Selector(gpu_models=frozenset({"B200"}))))
    assert not decision.ok
    assert codes(decision) == {
        "east": ReasonCode.NO_MATCHING_NODE,
        "west": ReasonCode.NO_MATCHING_NODE,
    }
    assert "B200" in decision.reasons[0].message


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
