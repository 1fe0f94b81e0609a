"""Node reservations: a job that waited too long holds a node that drains for it (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplane.control.admission import PassResult, PendingJob, ReservePolicy, run_pass
from gpuplane.control.estate import Estate
from gpuplane.control.quota import FlavorQuota, QuotaBook, TeamQuota
from gpuplane.control.scheduler import Nomination, ReasonCode, Request, Snapshot, make_policy
from gpuplane.resources import Selector

from .sched_helpers import node

RESERVE = ReservePolicy(after_s=10.0, limit=1)


def estate(*nodes: Any, teams: tuple[TeamQuota, ...] = ()) -> Estate:
    return Estate.build(
        Snapshot(nodes or (node("a", cards=4), node("b", cards=4))), QuotaBook(teams), []
    )


def job(job_id: str, t: float, team: str = "t", **req: Any) -> PendingJob:
    return PendingJob(job_id, team, 0, t, Request(job_id, **req))


def run(
    e: Estate,
    jobs: dict[str, PendingJob],
    now: float,
    reserve: ReservePolicy | None,
    longest_first: bool = True,
) -> PassResult:
    """One pass over `jobs`; the admitted leave `jobs`."""
    rng = np.random.default_rng(0)
    result = run_pass(
        e, list(jobs.values()), make_policy(), rng, now, reserve, longest_first=longest_first
    )
    for a in result.admitted:
        del jobs[a.job_id]
    return result


def codes(result: PassResult, job_id: str) -> list[str]:
    return [r["code"] for r in result.reasons.get(job_id, [])]


def churn(
    reserve: ReservePolicy | None,
) -> tuple[Estate, list[PassResult], dict[str, str], list[dict[str, str]]]:
    """Two 4-card nodes full of 1-card jobs, a 4-card job behind them, and a stream of 1-card
    jobs: each step one running job ends (alternating between the nodes) and a new one
    arrives. Returns the estate, every pass's result, where each job went and the held nodes
    after each pass."""
    e = estate()
    pending = {f"s{i}": job(f"s{i}", 0.0, gpus=1) for i in range(8)}
    where = {a.job_id: a.placement.node for a in run(e, pending, 0.0, reserve).admitted}
    on_a = [j for j, n in where.items() if n == "a"]
    on_b = [j for j, n in where.items() if n == "b"]
    running = [j for pair in zip(on_a, on_b, strict=True) for j in pair]
    pending["big"] = job("big", 1.0, gpus=4)
    results, held = [], []
    for step in range(12):
        now = 20.0 + step
        e.release(running.pop(0))
        pending[f"n{step}"] = job(f"n{step}", now, gpus=1)
        result = run(e, pending, now, reserve)
        results.append(result)
        held.append({j: h.node for j, h in e.reserved.items()})
        for a in result.admitted:
            where[a.job_id] = a.placement.node
            running.append(a.job_id)
    return e, results, where, held


def test_without_reservations_a_whole_node_job_starves_behind_small_ones() -> None:
    _, results, where, _ = churn(None)
    assert "big" not in where
    assert all(codes(r, "big") for r in results)


def test_a_reservation_drains_a_node_for_the_starving_job_while_small_jobs_backfill_elsewhere() -> (
    None
):
    e, results, where, holds = churn(RESERVE)
    assert holds[0] == {"big": "a"}  # the node the first ended job left a card free on
    assert where["big"] == "a"
    held = "a"
    placed_at = next(i for i, r in enumerate(results) if any(a.job_id == "big" for a in r.admitted))
    assert all(
        codes(r, "big") and codes(r, "big")[0] == ReasonCode.RESERVED for r in results[:placed_at]
    )
    # while the node drained, newcomers only went to the other node
    for r in results[:placed_at]:
        assert all(a.placement.node != held for a in r.admitted)
    assert any(r.admitted for r in results[:placed_at]), "small jobs kept backfilling"
    assert e.reserved == {}  # placed: the reservation ended


def test_the_reasons_say_who_holds_a_reservation_and_who_is_kept_off_it() -> None:
    e = estate(node("a", cards=2))
    pending = {"x": job("x", 0.0, gpus=1)}
    run(e, pending, 0.0, RESERVE)
    pending["big"] = job("big", 1.0, gpus=2)
    pending["small"] = job("small", 2.0, gpus=1)
    result = run(e, pending, 20.0, RESERVE)
    (held,) = result.reasons["big"]
    assert held["code"] == "Reserved"
    assert "holds a reservation on node a" in held["message"]
    assert held["numbers"]["waited_s"] == 19
    (kept,) = result.reasons["small"]
    assert kept["code"] == "BlockedByNomination"
    assert "a (job big)" in kept["message"]


def test_a_reservation_ends_when_its_job_leaves_the_queue() -> None:
    e = estate(node("a", cards=2))
    pending = {"x": job("x", 0.0, gpus=1)}
    run(e, pending, 0.0, RESERVE)
    pending["big"] = job("big", 1.0, gpus=2)
    run(e, pending, 20.0, RESERVE)
    assert set(e.reserved) == {"big"}
    del pending["big"]  # cancelled: no longer pending
    pending["small"] = job("small", 21.0, gpus=1)
    result = run(e, pending, 21.0, RESERVE)
    assert e.reserved == {}
    assert [a.job_id for a in result.admitted] == ["small"]
    # the service's cancel releases the job, which ends its reservation too
    pending["big"] = job("big", 1.0, gpus=2)
    run(e, pending, 22.0, RESERVE)
    assert set(e.reserved) == {"big"}
    e.release("big")
    e.release("big")  # idempotent
    assert e.reserved == {}


def test_a_reservation_respects_selectors_and_quota_and_the_limit() -> None:
    gpu_model = Selector(gpu_models=frozenset({"L4"}))
    e = estate(
        node("a", cards=2),
        node("l", cards=2, model="L4", card_gib=24),
        teams=(TeamQuota("q", flavors={"A100": FlavorQuota(0)}),),
    )
    pending = {
        "x": job("x", 0.0, gpus=1, selector=Selector(gpu_models=frozenset({"A100"}))),
        "y": job("y", 0.0, gpus=1, selector=gpu_model),
    }
    run(e, pending, 0.0, RESERVE)
    pending["over"] = job("over", 0.5, team="q", gpus=1)  # its quota allows nothing
    pending["l4"] = job("l4", 1.0, gpus=2, selector=gpu_model)
    pending["any"] = job("any", 2.0, gpus=2)
    result = run(e, pending, 20.0, ReservePolicy(after_s=10.0, limit=1))
    assert {j: h.node for j, h in e.reserved.items()} == {"l4": "l"}
    assert set(codes(result, "over")) == {"Quota"}
    run(e, pending, 21.0, ReservePolicy(after_s=10.0, limit=2))
    assert {j: h.node for j, h in e.reserved.items()} == {"l4": "l", "any": "a"}


def test_a_rebuilt_estate_keeps_reservations_on_nodes_it_still_has() -> None:
    old = estate()
    old.reserved = {
        "j": Nomination("a", Request("j", gpus=4)),
        "k": Nomination("gone", Request("k", gpus=4)),
    }
    new = estate()
    new.adopt(old)
    assert set(new.reserved) == {"j"}
    assert set(old.copy().reserved) == {"j", "k"}
