"""Quota check (pure): the GPU models a job's quota and selector let it land on."""

from __future__ import annotations

from gpuplane.control.admission import PendingJob
from gpuplane.control.admission.quota import FlavorQuota, TeamQuota
from gpuplane.control.scheduler import Request
from gpuplane.resources import Selector

from .helpers import L4, one_pass, pending, two_clusters


def test_quota_narrows_the_gpu_models_a_job_may_land_on() -> None:
    teams = [TeamQuota("t", flavors={L4: FlavorQuota(1000)})]
    e = two_clusters(teams, a100=2, l4=1)
    result = one_pass(e, [pending("j1", "t", 1.0, gpus=1), pending("j2", "t", 2.0, gpus=1)])
    assert [(a.job_id, a.flavor) for a in result.admitted] == [("j1", L4)]
    reasons = {r.cluster: r.code for r in result.reasons["j2"]}
    assert reasons == {"c1": "Quota", "c2": "Quota"}


def test_a_selector_on_gpu_models_is_honoured() -> None:
    e = two_clusters([], a100=1, l4=1)
    job = PendingJob(
        "j", "t", 0, 1.0, Request("j", gpus=1, selector=Selector(gpu_models=frozenset({L4})))
    )
    (admitted,) = one_pass(e, [job]).admitted
    assert admitted.flavor == L4
    assert admitted.placement.cluster == "c2"
