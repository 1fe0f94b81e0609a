"""Reclaim (pure): a team within its nominal quota preempts the cohort's borrowers, lowest
priority and newest first, only as far as that makes its job fit."""

from __future__ import annotations

from gpuplane.control.admission import Running, reclaim_candidates
from gpuplane.control.admission.quota import Amount, FlavorQuota, QuotaBook, TeamQuota

from .helpers import A100, one_pass, pending, two_clusters


def test_reclaim_takes_borrowers_lowest_priority_newest_first() -> None:
    b = QuotaBook(
        [
            TeamQuota("owner", "ml", flavors={A100: FlavorQuota(2000)}),
            TeamQuota("borrower", "ml", flavors={A100: FlavorQuota(0)}),
            TeamQuota("outsider", None, flavors={A100: FlavorQuota(0)}),
        ]
    )
    running = [
        Running("old-low", "borrower", A100, 0, 1.0),
        Running("new-low", "borrower", A100, 0, 2.0),
        Running("high", "borrower", A100, 9, 3.0),
        Running("other", "outsider", A100, 0, 1.0),
        Running("mine", "owner", A100, 0, 1.0),
    ]
    for r in running:
        b.reserve(r.job_id, r.team, A100, Amount(500, 40 * 1024))
    victims = reclaim_candidates(b, "owner", A100, running)
    assert [v.job_id for v in victims] == ["new-low", "old-low", "high"]
    assert reclaim_candidates(b, "outsider", A100, running) == []


def test_reclaim_preempts_only_what_makes_the_job_fit() -> None:
    teams = [
        TeamQuota("owner", "ml", flavors={A100: FlavorQuota(2000)}),
        TeamQuota("guest", "ml", flavors={A100: FlavorQuota(0)}),
    ]
    e = two_clusters(teams)
    assert len(one_pass(e, [pending("g1", "guest", 1.0, gpus=1)], now=10.0).admitted) == 1
    assert len(one_pass(e, [pending("g2", "guest", 2.0, gpus=1)], now=20.0).admitted) == 1
    second = one_pass(e, [pending("o1", "owner", 3.0, gpus=1)], now=30.0)  # newest borrower goes
    assert [(a.job_id, a.preempted) for a in second.admitted] == [("o1", ("g2",))]
    assert set(e.snapshot.allocations) == {"g1", "o1"}
