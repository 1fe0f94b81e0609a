"""One admission pass, pure (no store): ask, then commit; a borrower admitted and reclaimed in
the same pass stays pending."""

from __future__ import annotations

import numpy as np

from gpuplane.control.admission import admit, can_admit
from gpuplane.control.admission.quota import FlavorQuota, TeamQuota
from gpuplane.control.scheduler import make_policy

from .helpers import A100, one_pass, pending, two_clusters


def test_can_admit_only_asks_and_admit_commits_devices_and_quota_together() -> None:
    e = two_clusters([TeamQuota("t", flavors={A100: FlavorQuota(2000)})])
    job = pending("j", "t", 1.0, gpus=1)
    answer = can_admit(e, job, make_policy(), np.random.default_rng(0), 10.0)
    assert answer.admitted is not None
    assert answer.reasons == ()
    assert e.snapshot.allocations == {}  # asked, nothing taken
    assert e.book.reservation("j") is None
    admit(e, job, answer.admitted, 10.0)
    assert e.snapshot.allocations["j"] == answer.admitted.placement
    assert e.book.reservation("j") == ("t", A100, answer.admitted.amount)
    assert set(e.running) == {"j"}


def test_a_refusal_carries_its_reasons_typed() -> None:
    e = two_clusters([TeamQuota("t", flavors={A100: FlavorQuota(1000)})])
    answer = can_admit(
        e, pending("j", "t", 1.0, gpus=2), make_policy(), np.random.default_rng(0), 10.0
    )
    assert answer.admitted is None
    (reason,) = answer.reasons
    assert (reason.cluster, reason.code) == ("c1", "Quota")
    assert reason.numbers == {"requested": 2000, "used": 0, "nominal": 1000}


def test_a_borrower_admitted_and_reclaimed_in_the_same_pass_is_simply_left_pending() -> None:
    teams = [
        TeamQuota("owner", "ml", flavors={A100: FlavorQuota(2000)}),
        TeamQuota("guest", "ml", flavors={A100: FlavorQuota(0)}),
    ]
    e = two_clusters(teams)
    result = one_pass(e, [pending("g1", "guest", 1.0, gpus=2), pending("o1", "owner", 2.0, gpus=1)])
    assert [a.job_id for a in result.admitted] == ["o1"]
    assert result.admitted[0].preempted == ()  # g1 was never written as admitted
    assert "preempted" in result.reasons["g1"][0].message
    assert result.requeued == ["g1"]
    assert set(e.snapshot.allocations) == {"o1"}  # the mirror agrees with what is written
    assert e.book.reservation("g1") is None
