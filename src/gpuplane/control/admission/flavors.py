"""Quota check: Kueue's flavor assignment, the GPU models (flavors) a job's quota lets it use.

A team without any quota is not limited (no checks); a team with quotas may use the models its
quota can reserve the request on now (`QuotaBook.check`). The placement is then asked only on
those models; a model the quota refuses gives a `Quota` reason in each of its clusters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuplane.control.admission.decision import PendingJob
from gpuplane.control.admission.estate import Estate
from gpuplane.control.admission.quota import Amount, QuotaDecision, charge
from gpuplane.control.admission.reasons import PendingReason, no_gpu_model, quota
from gpuplane.control.scheduler import Request


@dataclass(slots=True)  # not frozen: one per job per pass, and frozen ones cost twice to build
class Flavors:
    """One job's flavor assignment: the GPU models its selector matches (`models`), the quota
    check on each (`checks`; none for a team without quota), those the quota allows, and the
    team's cohort (reclaim takes back from it)."""

    models: list[str]
    checks: dict[str, QuotaDecision]
    allowed: list[str]
    cohort: str | None

    def borrows(self, model: str) -> bool:
        """Would reserving the job's quota on `model` borrow from the cohort?"""
        return model in self.checks and self.checks[model].borrowing


def assign_flavors(estate: Estate, job: PendingJob) -> Flavors:
    """Check the job's quota on every GPU model it may use (a GPU request)."""
    request = job.request
    wanted = request.selector.gpu_models
    models = sorted(m for m in estate.flavors if not wanted or m in wanted)
    team = estate.book.team(job.team)
    checks: dict[str, QuotaDecision] = {}  # a team without quota is not limited: no checks
    if team.limited:
        for model in models:
            checks[model] = estate.book.check(job.team, model, charge_on(estate, request, model))
    allowed = [m for m in models if m not in checks or checks[m].ok]
    return Flavors(models, checks, allowed, team.cohort)


def charge_on(estate: Estate, request: Request, model: str) -> Amount:
    """What `request` counts against quota on GPU model `model`."""
    return charge(request, estate.flavors[model])


def quota_reasons(
    estate: Estate, checks: Mapping[str, QuotaDecision], models: Sequence[str]
) -> tuple[PendingReason, ...]:
    """One Quota reason per cluster, joining the refusals of its GPU models."""
    if not models:
        return tuple(no_gpu_model(c) for c in estate.snapshot.clusters)
    by_cluster: dict[str, list[str]] = {}
    for model in models:
        for cluster in sorted(estate.clusters_of.get(model, ())):
            by_cluster.setdefault(cluster, []).append(checks[model].reason)
    numbers = checks[models[0]].numbers
    return tuple(quota(c, msgs, numbers) for c, msgs in by_cluster.items())


def with_refusals(
    estate: Estate, flavors: Flavors, reasons: tuple[PendingReason, ...]
) -> tuple[PendingReason, ...]:
    """`reasons` (where the allowed models did not fit), plus a Quota reason for each cluster
    they do not cover where the quota refused a model."""
    refused = {m: c for m, c in flavors.checks.items() if not c.ok}
    if not refused:
        return reasons
    covered = {r.cluster for r in reasons}
    extra = quota_reasons(estate, refused, list(refused))
    return reasons + tuple(r for r in extra if r.cluster not in covered)
