"""Reclaim: a team within its nominal quota takes back the cards that cohort members borrow.

Kueue's preemption within a cohort: when the job cannot be placed and another member of its
team's cohort uses more than its nominal quota of a GPU model, that member's jobs on the model
are preempted (lowest priority, newest first) if, and only if, that makes the job fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuplane.control.admission.decision import Admitted, PendingJob
from gpuplane.control.admission.estate import Estate, Running
from gpuplane.control.admission.flavors import Flavors, charge_on
from gpuplane.control.admission.placement import on_models
from gpuplane.control.admission.quota import QuotaBook
from gpuplane.control.scheduler import Policy, schedule


def reclaim(
    estate: Estate,
    job: PendingJob,
    flavors: Flavors,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
) -> Admitted | None:
    """Where `job` goes once borrowers of one of its allowed models are preempted (the first
    model where that works, `preempted` naming them), or None. Asks only: `admit` preempts."""
    if flavors.cohort is None:
        return None
    for model in flavors.allowed:
        if flavors.borrows(model) or not _someone_borrows(estate, job.team, model):
            continue
        found = _on_model(estate, job, model, policy, rng, now)
        if found is not None:
            return found
    return None


def _someone_borrows(estate: Estate, team: str, model: str) -> bool:
    """Does another member of `team`'s cohort use more than its nominal quota of `model`?"""
    cohort = estate.book.team(team).cohort
    if cohort is None:
        return False
    return any(
        m.name != team and estate.book.borrowing(m.name, model)
        for m in estate.book.cohort_members(cohort)
    )


def _on_model(
    estate: Estate,
    job: PendingJob,
    model: str,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
) -> Admitted | None:
    """Preempt borrowers of `model` in the team's cohort, on a copy of the estate, until the
    job fits there; None if it cannot."""
    amount = charge_on(estate, job.request, model)
    request = on_models(job.request, [model])
    candidates = reclaim_candidates(estate.book, job.team, model, list(estate.running.values()))
    if not candidates:
        return None
    trial = estate.copy()
    others = estate.nominations_against(request, now)
    victims: list[str] = []
    for victim in candidates:
        if not trial.book.borrowing(victim.team, model):
            continue
        trial.release(victim.job_id)
        victims.append(victim.job_id)
        decision = schedule(trial.snapshot, request, policy, rng, others)
        if decision.placement is not None:
            return Admitted(job.job_id, decision.placement, model, amount, tuple(victims))
    return None


def reclaim_candidates(
    book: QuotaBook, team: str, flavor: str, running: Sequence[Running]
) -> list[Running]:
    """Jobs of other cohort members that borrow on `flavor`, in preemption order (lowest
    priority, then newest first). Empty when `team` has no cohort."""
    cohort = book.team(team).cohort
    if cohort is None:
        return []
    lenders = {t.name for t in book.cohort_members(cohort) if t.name != team}
    victims = [
        r
        for r in running
        if r.flavor == flavor and r.team in lenders and book.borrowing(r.team, flavor)
    ]
    return sorted(victims, key=lambda r: (r.priority, -r.started_at, r.job_id))
