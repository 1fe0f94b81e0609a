"""Nominations on hand-made snapshots: which node a waiting job is nominated, and what a
nominated node holds from every other request."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplane.control.scheduler import (
    Nomination,
    ReasonCode,
    Request,
    Snapshot,
    make_policy,
    nomination_node,
    schedule,
)
from gpuplane.resources import Selector
from tests.control.scheduler.sched_helpers import node


def test_the_nominated_node_is_the_one_expected_to_drain_first() -> None:
    nodes = [
        node("many", cards=4, pool="many"),
        node("one", cards=4, pool="one"),
        node("slow", cards=4, model="A10", pool="slow"),
    ]
    snap = Snapshot(nodes, gpu_speeds={"A100": 1.0, "A10": 0.5})
    rng = np.random.default_rng(0)
    policy = make_policy()

    def put(job_id: str, where: str, **req: Any) -> None:
        request = Request(job_id, selector=Selector({"pool": where}), **req)
        decision = schedule(snap, request, policy, rng)
        assert decision.placement is not None
        assert decision.placement.node == where
        snap.commit(decision.placement)

    put("m1", "many", gpus=1)
    put("m2", "many", gpus=1)  # two free cards, but two jobs to wait for
    put("o", "one", gpus=3)  # one free card, one job to wait for
    put("s", "slow", gpus=3)  # the same, on cards half as fast
    big = Request("big", gpus=4)
    assert nomination_node(snap, big, set()) == "one"
    assert nomination_node(snap, big, {"one"}) == "many"  # H(2) = 1.5 < 1 / 0.5
    assert nomination_node(snap, big, {"one", "many"}) == "slow"
    assert nomination_node(snap, big, {"one", "many", "slow"}) is None


def test_the_nominated_node_is_the_one_its_jobs_limits_drain_first() -> None:
    snap = Snapshot([node("one", cards=4, pool="one"), node("many", cards=4, pool="many")])
    rng = np.random.default_rng(0)
    ends = {}
    running = (("o", "one", 5000.0), ("m1", "many", 100.0), ("m2", "many", 200.0))
    for job_id, where, limit in running:
        request = Request(job_id, gpus=1, selector=Selector({"pool": where}))
        decision = schedule(snap, request, make_policy(), rng)
        assert decision.placement is not None
        snap.commit(decision.placement)
        ends[job_id] = limit
    big = Request("big", gpus=4)
    assert nomination_node(snap, big, set()) == "one"  # without limits: one job to wait for
    assert nomination_node(snap, big, set(), ends, 0.0) == "many"  # by limits: done at 200
    del ends["m2"]  # a job without a limit: that node's start is a guess, ranked after
    assert nomination_node(snap, big, set(), ends, 0.0) == "one"


def test_nominations_hold_only_what_the_nominated_job_needs() -> None:
    snap = Snapshot([node("a", cards=4)])
    rng = np.random.default_rng(0)
    policy = make_policy()
    held = [Nomination("a", Request("big", gpus=2))]
    assert schedule(snap, Request("two", gpus=2), policy, rng, held).ok  # 4 free, 2 spare
    assert not schedule(snap, Request("three", gpus=3), policy, rng, held).ok
    snap.commit(schedule(snap, Request("one", gpus=1), policy, rng).placement)  # type: ignore[arg-type]
    snap.commit(schedule(snap, Request("two", gpus=2), policy, rng).placement)  # type: ignore[arg-type]
    # one card free, the nominated job needs two: every card waits for it, even for a share
    blocked = schedule(snap, Request("share", gpu_milli=250), policy, rng, held)
    assert blocked.reasons[0].code == ReasonCode.BLOCKED_BY_NOMINATION
    assert schedule(snap, Request("share", gpu_milli=250), policy, rng).ok
    # a nominated share keeps its card (the freest) and leaves the others
    share = [Nomination("a", Request("s", gpu_milli=1000, gpu_mem_mib=80 * 1024))]
    decision = schedule(Snapshot([node("a", cards=2)]), Request("r", gpus=1), policy, rng, share)
    assert decision.placement is not None
    assert decision.placement.device_indices == (1,)
