"""Nominated nodes: a job that waited too long holds a node that drains for it (pure); with time
limits, jobs whose limit ends before the nominated job's expected start backfill onto it."""

from __future__ import annotations

import pytest

from gpuplane.control.admission import Estate, NominationPolicy, PassResult, PendingJob
from gpuplane.control.admission.quota import FlavorQuota, TeamQuota
from gpuplane.control.scheduler import ReasonCode
from gpuplane.resources import Selector
from tests.control.scheduler.sched_helpers import node

from .helpers import NOMINATE, codes, estate, job, run

SPEEDS = {"A100": 1.0, "A10": 0.5}


def churn(
    nomination: NominationPolicy | None,
) -> tuple[Estate, list[PassResult], dict[str, str], list[dict[str, str]]]:
    """Two 4-card nodes full of 1-card jobs, a 4-card job behind them, and a stream of 1-card
    jobs: each step one running job ends (alternating between the nodes) and a new one
    arrives. Returns the estate, every pass's result, where each job went and the nominated
    nodes after each pass."""
    e = estate()
    pending = {f"s{i}": job(f"s{i}", 0.0, gpus=1) for i in range(8)}
    where = {a.job_id: a.placement.node for a in run(e, pending, 0.0, nomination).admitted}
    on_a = [j for j, n in where.items() if n == "a"]
    on_b = [j for j, n in where.items() if n == "b"]
    running = [j for pair in zip(on_a, on_b, strict=True) for j in pair]
    pending["big"] = job("big", 1.0, gpus=4)
    results, held = [], []
    for step in range(12):
        now = 20.0 + step
        e.release(running.pop(0))
        pending[f"n{step}"] = job(f"n{step}", now, gpus=1)
        result = run(e, pending, now, nomination)
        results.append(result)
        held.append({j: n.node for j, n in e.nominated.items()})
        for a in result.admitted:
            where[a.job_id] = a.placement.node
            running.append(a.job_id)
    return e, results, where, held


def nominate_big(
    cards: int, running: PendingJob, model: str = "A100"
) -> tuple[Estate, dict[str, PendingJob]]:
    """One node `a` of `cards` cards (of `model`) where `running` (job x) runs from t=0, and a
    job `big` of all its cards that waited since t=1, nominated the node at t=20."""
    e = estate(node("a", cards=cards, model=model), speeds=SPEEDS)
    jobs = {"x": running}
    assert [a.job_id for a in run(e, jobs, 0.0, NOMINATE).admitted] == ["x"]
    jobs["big"] = job("big", 1.0, gpus=cards)
    run(e, jobs, 20.0, NOMINATE)
    assert set(e.nominated) == {"big"}
    return e, jobs


def test_without_nominations_a_whole_node_job_starves_behind_small_ones() -> None:
    _, results, where, _ = churn(None)
    assert "big" not in where
    assert all(codes(r, "big") for r in results)


def test_a_nomination_drains_a_node_for_the_starving_job_while_small_jobs_backfill_elsewhere() -> (
    None
):
    e, results, where, nominated = churn(NOMINATE)
    assert nominated[0] == {"big": "a"}  # the node the first ended job left a card free on
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
    assert e.nominated == {}  # placed: the nomination ended


def test_the_reasons_say_who_holds_a_nomination_and_who_is_kept_off_it() -> None:
    e = estate(node("a", cards=2))
    pending = {"x": job("x", 0.0, gpus=1)}
    run(e, pending, 0.0, NOMINATE)
    pending["big"] = job("big", 1.0, gpus=2)
    pending["small"] = job("small", 2.0, gpus=1)
    result = run(e, pending, 20.0, NOMINATE)
    (held,) = result.reasons["big"]
    assert held.code == "Reserved"
    assert "holds a nomination on node a" in held.message
    assert held.numbers["waited_s"] == 19
    (kept,) = result.reasons["small"]
    assert kept.code == "BlockedByNomination"
    assert "a (job big)" in kept.message


def test_a_nomination_ends_when_its_job_leaves_the_queue() -> None:
    e, pending = nominate_big(2, job("x", 0.0, gpus=1))
    del pending["big"]  # cancelled: no longer pending
    pending["small"] = job("small", 21.0, gpus=1)
    result = run(e, pending, 21.0, NOMINATE)
    assert e.nominated == {}
    assert [a.job_id for a in result.admitted] == ["small"]
    # the service's cancel releases the job, which ends its nomination too
    pending["big"] = job("big", 1.0, gpus=2)
    run(e, pending, 22.0, NOMINATE)
    assert set(e.nominated) == {"big"}
    e.release("big")
    e.release("big")  # idempotent
    assert e.nominated == {}


def test_a_nomination_respects_selectors_and_quota_and_the_limit() -> None:
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
    run(e, pending, 0.0, NOMINATE)
    pending["over"] = job("over", 0.5, team="q", gpus=1)  # its quota allows nothing
    pending["l4"] = job("l4", 1.0, gpus=2, selector=gpu_model)
    pending["any"] = job("any", 2.0, gpus=2)
    result = run(e, pending, 20.0, NominationPolicy(after_s=10.0, limit=1))
    assert {j: n.node for j, n in e.nominated.items()} == {"l4": "l"}
    assert set(codes(result, "over")) == {"Quota"}
    run(e, pending, 21.0, NominationPolicy(after_s=10.0, limit=2))
    assert {j: n.node for j, n in e.nominated.items()} == {"l4": "l", "any": "a"}


# -- backfilling onto a nominated node, with time limits ---------------------------------------


def nominated_node(speed_model: str = "A100") -> tuple[Estate, dict[str, PendingJob]]:
    """One 4-card node (of `speed_model`): two cards run a job whose limit ends it at t=1000,
    and a 4-card job that waited since t=1 holds the node from t=20 on."""
    x = job("x", 0.0, limit=1000.0 * SPEEDS[speed_model], gpus=2)
    e, jobs = nominate_big(4, x, speed_model)
    assert e.nominated["big"].start_s == 1000.0
    return e, jobs


def test_a_job_whose_limit_ends_before_the_nominated_start_backfills_onto_its_node() -> None:
    e, jobs = nominated_node()
    jobs["short"] = job("short", 21.0, limit=900.0, gpus=1)
    result = run(e, jobs, 30.0, NOMINATE)  # ends at 930, before 1000
    assert {a.job_id: a.placement.node for a in result.admitted} == {"short": "a"}
    (held,) = result.reasons["big"]
    assert held.code == "Reserved"
    assert held.numbers["starts_in_s"] == 970
    assert "jobs whose limits end by then may use the node" in held.message
    assert e.nominated["big"].start_s == 1000.0  # the backfilled job does not delay it


@pytest.mark.parametrize("limit", [1000.0, None])
def test_a_job_whose_limit_ends_later_or_that_has_none_is_kept_off_the_nominated_node(
    limit: float | None,
) -> None:
    e, jobs = nominated_node()
    jobs["long"] = job("long", 21.0, limit=limit, gpus=1)
    result = run(e, jobs, 30.0, NOMINATE)  # 30 + 1000 > 1000
    assert result.admitted == []
    (kept,) = result.reasons["long"]
    assert kept.code == "BlockedByNomination"
    assert "a (job big)" in kept.message
    assert "only jobs whose time limits end before the held jobs' expected starts" in kept.message


def test_backfilling_counts_the_limit_at_the_nominated_nodes_speed() -> None:
    # on an A10 (speed 0.5) a limit of 600 s on an A100 is 1200 s of wall clock: past 1000
    e, jobs = nominated_node("A10")
    jobs["short"] = job("short", 21.0, limit=600.0, gpus=1)
    assert run(e, jobs, 30.0, NOMINATE).admitted == []
    jobs["shorter"] = job("shorter", 22.0, limit=400.0, gpus=1)
    assert [a.job_id for a in run(e, jobs, 31.0, NOMINATE).admitted] == ["shorter"]


def test_without_limits_on_the_node_there_is_no_expected_start_and_no_backfill() -> None:
    e, jobs = nominate_big(4, job("x", 0.0, gpus=2))
    assert e.nominated["big"].start_s is None
    jobs["short"] = job("short", 21.0, limit=1.0, gpus=1)
    assert run(e, jobs, 30.0, NOMINATE).admitted == []


def test_the_expected_start_comes_closer_as_the_nodes_jobs_end() -> None:
    e = estate(node("a", cards=4))
    jobs = {"x": job("x", 0.0, limit=1000.0, gpus=2), "y": job("y", 0.0, limit=500.0, gpus=1)}
    run(e, jobs, 0.0, NOMINATE)
    jobs["big"] = job("big", 1.0, gpus=4)
    run(e, jobs, 20.0, NOMINATE)
    assert e.nominated["big"].start_s == 1000.0
    e.release("x")  # ended early: now only y's limit stands between big and the node
    run(e, jobs, 100.0, NOMINATE)
    assert e.nominated["big"].start_s == 500.0
