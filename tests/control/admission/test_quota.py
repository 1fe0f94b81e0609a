"""Quota arithmetic (pure): nominal quota, cohort borrowing, lending limits, dominant shares."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplane.control.admission.quota import (
    Amount,
    FlavorQuota,
    QuotaBook,
    TeamQuota,
    charge,
    dominant_share,
)
from gpuplane.control.scheduler import Request

A100 = "A100-80GB"
CARD = 80 * 1024


def gpus(n: float) -> Amount:
    return Amount(int(n * 1000), int(n * CARD))


def book(*teams: TeamQuota) -> QuotaBook:
    return QuotaBook(teams)


def test_charge_counts_the_larger_of_compute_and_memory_share() -> None:
    assert charge(Request("a", gpus=2), CARD) == Amount(2000, 2 * CARD)
    assert charge(Request("b", gpu_milli=250, gpu_mem_mib=10240), CARD) == Amount(250, 10240)
    assert charge(Request("c", gpu_milli=100, gpu_mem_mib=40960), CARD) == Amount(500, 40960)
    assert charge(Request("d", gpu_mem_mib=8192), CARD) == Amount(100, 8192)
    assert charge(Request("e", cpu_millis=1000), CARD) == Amount()


def test_a_team_without_quota_is_not_limited() -> None:
    assert book().check("anyone", A100, gpus(100)).ok


def test_nominal_quota_admits_up_to_it_and_refuses_beyond_without_a_cohort() -> None:
    b = book(TeamQuota("a", flavors={A100: FlavorQuota(2000, 2 * CARD)}))
    assert b.check("a", A100, gpus(2)).ok
    b.reserve("j1", "a", A100, gpus(1.5))
    decision = b.check("a", A100, gpus(1))
    assert not decision.ok
    assert "no cohort" in decision.reason
    assert decision.numbers["nominal"] == 2000
    b.release("j1")
    b.release("j1")  # idempotent
    assert b.usage("a", A100) == Amount()


def test_a_flavor_without_quota_is_refused_with_the_flavors_the_team_has() -> None:
    b = book(TeamQuota("a", flavors={A100: FlavorQuota(1000)}))
    decision = b.check("a", "H100-80GB", gpus(1))
    assert not decision.ok
    assert "no quota for GPU model H100-80GB" in decision.reason
    assert A100 in decision.reason


def test_borrowing_from_the_cohort_up_to_the_borrowing_limit() -> None:
    b = book(
        TeamQuota("a", "ml", flavors={A100: FlavorQuota(1000, borrowing_limit_gpu_milli=1000)}),
        TeamQuota("b", "ml", flavors={A100: FlavorQuota(4000)}),
    )
    decision = b.check("a", A100, gpus(2))
    assert decision.ok
    assert decision.borrowing
    over = b.check("a", A100, gpus(3))
    assert not over.ok
    assert "borrowing limit" in over.reason
    b.reserve("b1", "b", A100, gpus(3.5))
    # the cohort has 5 GPUs nominal, 3.5 used: a may take 1.5
    assert b.check("a", A100, gpus(1.5)).ok
    short = b.check("a", A100, gpus(2))
    assert not short.ok
    assert "cohort ml has 1.5 GPUs of unused quota" in short.reason


def test_a_lending_limit_keeps_the_rest_of_the_nominal_quota_for_its_team() -> None:
    b = book(
        TeamQuota("lender", "ml", flavors={A100: FlavorQuota(4000, lending_limit_gpu_milli=1000)}),
        TeamQuota("borrower", "ml", flavors={A100: FlavorQuota(0)}),
    )
    assert b.check("borrower", A100, gpus(1)).ok
    refused = b.check("borrower", A100, gpus(1.5))
    assert not refused.ok
    assert "cohort ml has 1 GPU of unused quota" in refused.reason
    b.reserve("l1", "lender", A100, gpus(3))  # within the guaranteed 3 GPUs: lends nothing away
    assert b.check("borrower", A100, gpus(1)).ok
    b.reserve("l2", "lender", A100, gpus(0.5))  # now it eats into its lendable part
    assert not b.check("borrower", A100, gpus(1)).ok
    assert b.check("borrower", A100, gpus(0.5)).ok


def test_within_nominal_is_admitted_even_when_the_cohort_is_borrowed_out() -> None:
    b = book(
        TeamQuota("a", "ml", flavors={A100: FlavorQuota(2000)}),
        TeamQuota("b", "ml", flavors={A100: FlavorQuota(2000)}),
    )
    b.reserve("b1", "b", A100, gpus(4))
    assert b.borrowing("b", A100)
    decision = b.check("a", A100, gpus(2))
    assert decision.ok
    assert not decision.borrowing


def test_unlimited_memory_nominal_only_limits_gpus() -> None:
    b = book(TeamQuota("a", flavors={A100: FlavorQuota(1000, None)}))
    assert b.check("a", A100, Amount(1000, 10**9)).ok


def test_dominant_share_and_weight() -> None:
    cap = Amount(10_000, 10 * CARD)
    assert dominant_share(Amount(1000, 5 * CARD), cap) == 0.5
    assert dominant_share(Amount(2000, 0), cap, weight=2.0) == 0.1
    assert dominant_share(Amount(), Amount()) == 0.0


@settings(max_examples=200, deadline=None)
@given(
    nominal=st.lists(st.integers(0, 4000), min_size=3, max_size=3),
    limits=st.lists(st.one_of(st.none(), st.integers(0, 3000)), min_size=3, max_size=3),
    lending=st.lists(st.one_of(st.none(), st.integers(0, 3000)), min_size=3, max_size=3),
    asks=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2000)), max_size=40),
)
def test_admitted_usage_never_exceeds_quota(
    nominal: list[int],
    limits: list[int | None],
    lending: list[int | None],
    asks: list[tuple[int, int]],
) -> None:
    """Reserving only what `check` allows keeps every team under nominal + borrowing limit, and
    a borrowing admission never takes the cohort past its total nominal or lendable quota."""
    teams = [
        TeamQuota(
            f"t{i}",
            "c",
            flavors={
                A100: FlavorQuota(
                    nominal[i],
                    borrowing_limit_gpu_milli=limits[i],
                    lending_limit_gpu_milli=lending[i],
                )
            },
        )
        for i in range(3)
    ]
    b = QuotaBook(teams)
    for k, (team, milli) in enumerate(asks):
        decision = b.check(f"t{team}", A100, Amount(milli, 0))
        if not decision.ok:
            continue
        b.reserve(f"j{k}", f"t{team}", A100, Amount(milli, 0))
        used = [b.usage(f"t{i}", A100).gpu_milli for i in range(3)]
        limit = limits[team]
        assert used[team] <= nominal[team] + (limit if limit is not None else sum(nominal))
        if decision.borrowing:
            assert sum(used) <= sum(nominal)
            # lending limits: beyond its guaranteed part, the cohort only uses what is lendable
            lendable = [
                min(n, x) if x is not None else n for n, x in zip(nominal, lending, strict=True)
            ]
            guaranteed = [n - x for n, x in zip(nominal, lendable, strict=True)]
            assert sum(max(0, u - g) for u, g in zip(used, guaranteed, strict=True)) <= sum(
                lendable
            )
        else:
            assert used[team] <= nominal[team]
