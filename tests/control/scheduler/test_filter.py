"""The filter phase: selectors, cards that do not split, cordoned nodes."""

from __future__ import annotations

from gpuplane.control.scheduler import ReasonCode, Request, Snapshot
from gpuplane.resources import LABEL_CLUSTER, LABEL_REGION, Selector
from tests.control.scheduler.sched_helpers import codes, node, place


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
