"""One admission pass, pure (no store): queue order, quota per flavor, reclaim within a pass."""

from __future__ import annotations

import numpy as np

from gpuplane.control.admission import PendingJob, run_pass
from gpuplane.control.estate import Estate
from gpuplane.control.quota import FlavorQuota, QuotaBook, TeamQuota
from gpuplane.control.scheduler import DeviceInfo, NodeInfo, Request, Snapshot, make_policy
from gpuplane.resources import LABEL_GPU_MODEL, Selector

A100, L4 = "A100-80GB", "L4"


def estate(teams: list[TeamQuota], *, a100: int = 2, l4: int = 0) -> Estate:
    nodes = [
        NodeInfo(
            "c1/n1",
            "c1",
            64_000,
            256_000,
            tuple(DeviceInfo(i, 81920) for i in range(a100)),
            {LABEL_GPU_MODEL: A100},
        )
    ]
    if l4:
        nodes.append(
            NodeInfo(
                "c2/n1",
                "c2",
                64_000,
                256_000,
                tuple(DeviceInfo(i, 24576) for i in range(l4)),
                {LABEL_GPU_MODEL: L4},
            )
        )
    return Estate.build(Snapshot(nodes), QuotaBook(teams), [])


def pending(job_id: str, team: str, t: float, priority: int = 0, **req: object) -> PendingJob:
    return PendingJob(job_id, team, priority, t, Request(job_id, **req))  # type: ignore[arg-type]


def run(e: Estate, jobs: list[PendingJob], now: float = 100.0):  # type: ignore[no-untyped-def]
    return run_pass(e, jobs, make_policy(), np.random.default_rng(0), now=now)


def test_a_borrower_admitted_and_reclaimed_in_the_same_pass_is_simply_left_pending() -> None:
    teams = [
        TeamQuota("owner", "ml", flavors={A100: FlavorQuota(2000)}),
        TeamQuota("guest", "ml", flavors={A100: FlavorQuota(0)}),
    ]
    e = estate(teams)
    result = run(e, [pending("g1", "guest", 1.0, gpus=2), pending("o1", "owner", 2.0, gpus=1)])
    assert [a.job_id for a in result.admitted] == ["o1"]
    assert result.admitted[0].preempted == ()  # g1 was never written as admitted
    assert "preempted" in result.reasons["g1"][0]["message"]
    assert result.requeued == ["g1"]
    assert set(e.snapshot.allocations) == {"o1"}  # the mirror agrees with what is written
    assert e.book.reservation("g1") is None


def test_reclaim_preempts_only_what_makes_the_job_fit() -> None:
    teams = [
        TeamQuota("owner", "ml", flavors={A100: FlavorQuota(2000)}),
        TeamQuota("guest", "ml", flavors={A100: FlavorQuota(0)}),
    ]
    e = estate(teams)
    assert len(run(e, [pending("g1", "guest", 1.0, gpus=1)], now=10.0).admitted) == 1
    assert len(run(e, [pending("g2", "guest", 2.0, gpus=1)], now=20.0).admitted) == 1
    second = run(e, [pending("o1", "owner", 3.0, gpus=1)], now=30.0)  # newest borrower goes
    assert [(a.job_id, a.preempted) for a in second.admitted] == [("o1", ("g2",))]
    assert set(e.snapshot.allocations) == {"g1", "o1"}


def test_quota_narrows_the_gpu_models_a_job_may_land_on() -> None:
    teams = [TeamQuota("t", flavors={L4: FlavorQuota(1000)})]
    e = estate(teams, a100=2, l4=1)
    result = run(e, [pending("j1", "t", 1.0, gpus=1), pending("j2", "t", 2.0, gpus=1)])
    assert [(a.job_id, a.flavor) for a in result.admitted] == [("j1", L4)]
    reasons = {r["cluster"]: r["code"] for r in result.reasons["j2"]}
    assert reasons == {"c1": "Quota", "c2": "Quota"}


def test_fair_share_alternates_between_teams_with_equal_priority() -> None:
    e = estate([], a100=4)
    jobs = [pending(f"a{i}", "a", float(i), gpus=1) for i in range(4)]
    jobs += [pending(f"b{i}", "b", 10.0 + i, gpus=1) for i in range(4)]
    result = run(e, jobs)
    assert sorted(a.job_id for a in result.admitted) == ["a0", "a1", "b0", "b1"]


def test_a_selector_on_gpu_models_is_honoured() -> None:
    e = estate([], a100=1, l4=1)
    job = PendingJob(
        "j", "t", 0, 1.0, Request("j", gpus=1, selector=Selector(gpu_models=frozenset({L4})))
    )
    (admitted,) = run(e, [job]).admitted
    assert admitted.flavor == L4
    assert admitted.placement.cluster == "c2"
