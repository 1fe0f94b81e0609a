"""One admission pass over the queue, pure: quota reservation, placement, reclaim. No SQL.

For each pending job, in `FairQueue` order: reserve quota on the GPU models (flavors) the team may
use, ask the scheduler core for a place on those models, and commit both to the in-memory snapshot
and quota book. When the team is within its nominal quota but the cards are held by cohort members
that borrow, their jobs are preempted (lowest priority, newest first) if, and only if, that makes
the job fit. The service wraps a pass in one locked store transaction and writes what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpuplane.control.quota import (
    Amount,
    FairQueue,
    Queued,
    QuotaBook,
    QuotaDecision,
    Running,
    charge,
    dominant_share,
    reclaim_candidates,
)
from gpuplane.control.scheduler.base import Policy
from gpuplane.control.scheduler.core import schedule
from gpuplane.control.scheduler.snapshot import (
    ClusterReason,
    Decision,
    Placement,
    ReasonCode,
    Request,
    Snapshot,
)
from gpuplane.resources import Selector


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    team: str
    priority: int
    created_at: float
    request: Request


@dataclass(frozen=True, slots=True)
class Admitted:
    job_id: str
    placement: Placement
    flavor: str | None
    amount: Amount
    preempted: tuple[str, ...] = ()


@dataclass(slots=True)
class Outcome:
    """One job's answer: admitted, or the reasons per cluster (as JSON-able dicts)."""

    admitted: Admitted | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class PassResult:
    admitted: list[Admitted] = field(default_factory=list)
    reasons: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # admitted earlier in this pass, then preempted by a later job: pending, not re-evaluated
    requeued: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Estate:
    """What a pass works on: the snapshot, the quota book and the admitted jobs, kept in step."""

    snapshot: Snapshot
    book: QuotaBook
    running: dict[str, Running]
    flavors: dict[str, int] = field(default_factory=dict)  # GPU model -> card memory (MiB)
    clusters_of: dict[str, set[str]] = field(default_factory=dict)  # GPU model -> clusters
    capacity: Amount = field(default_factory=Amount)
    # what did not fit, by request shape: valid until something is released (free capacity only
    # shrinks between releases, so a shape that did not fit still does not)
    releases: int = 0
    shares: dict[str, float] = field(default_factory=dict)  # dominant share per team, cached
    no_fit: dict[tuple[object, ...], tuple[int, tuple[ClusterReason, ...]]] = field(
        default_factory=dict
    )

    @classmethod
    def build(cls, snapshot: Snapshot, book: QuotaBook, running: Iterable[Running]) -> Estate:
        estate = cls(snapshot, book, {r.job_id: r for r in running})
        milli = mem = 0
        for node in snapshot.nodes:
            if node.devices:
                model = node.gpu_model
                estate.flavors[model] = max(
                    estate.flavors.get(model, 0), max(d.mem_mib for d in node.devices)
                )
                estate.clusters_of.setdefault(model, set()).add(node.cluster)
                milli += 1000 * len(node.devices)
                mem += sum(d.mem_mib for d in node.devices)
        estate.capacity = Amount(milli, mem)
        return estate

    def copy(self) -> Estate:
        other = Estate(self.snapshot.copy(), self.book.copy(), dict(self.running))
        other.flavors, other.clusters_of, other.capacity = (
            self.flavors,
            self.clusters_of,
            self.capacity,
        )
        return other

    def release(self, job_id: str) -> None:
        """Give back a job's devices and quota. Idempotent."""
        held = self.book.reservation(job_id)
        if held is not None:
            self.shares.pop(held[0], None)
        self.snapshot.release(job_id)
        self.book.release(job_id)
        self.running.pop(job_id, None)
        self.releases += 1

    def share(self, team: str) -> float:
        """The team's dominant-resource share (over its weight), cached until it changes."""
        value = self.shares.get(team)
        if value is None:
            value = dominant_share(
                self.book.team_total(team), self.capacity, self.book.team(team).weight
            )
            self.shares[team] = value
        return value


def run_pass(
    estate: Estate,
    pending: Iterable[PendingJob],
    policy: Policy,
    rng: np.random.Generator,
    now: float,
) -> PassResult:
    """Admit what fits, in queue order; mutates `estate` for every admission."""
    jobs = {j.job_id: j for j in pending}
    queue = FairQueue(
        (Queued(j.job_id, j.team, j.priority, j.created_at) for j in jobs.values()), estate.share
    )
    requeued: list[str] = []
    admitted: dict[str, Admitted] = {}
    reasons: dict[str, list[dict[str, Any]]] = {}
    for queued in queue:
        job = jobs[queued.job_id]
        outcome = decide(estate, job, policy, rng, now, commit=True)
        if outcome.admitted is None:
            reasons[job.job_id] = outcome.reasons
            continue
        a = outcome.admitted
        # a victim admitted earlier in this same pass was never written: it just stays pending
        fresh = [v for v in a.preempted if v in admitted]
        requeued += fresh
        for v in fresh:
            del admitted[v]
            reasons[v] = [_preempted_reason(a.placement.cluster)]
        if fresh:
            a = replace(a, preempted=tuple(v for v in a.preempted if v not in fresh))
        admitted[job.job_id] = a
    return PassResult(list(admitted.values()), reasons, requeued)


def decide(
    estate: Estate,
    job: PendingJob,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
    *,
    commit: bool,
) -> Outcome:
    """Where `job` goes now (committed to `estate` when `commit`), or why not per cluster."""
    request = job.request
    if not request.is_gpu:
        decision = _schedule(estate, request, policy, rng)
        return _finish(estate, job, decision, None, Amount(), (), now, commit)
    wanted = request.selector.gpu_models
    models = sorted(m for m in estate.flavors if not wanted or m in wanted)
    checks: dict[str, QuotaDecision] = {}
    amounts: dict[str, Amount] = {}
    for model in models:
        amounts[model] = charge(request, estate.flavors[model])
        checks[model] = estate.book.check(job.team, model, amounts[model])
    allowed = [m for m in models if checks[m].ok]
    if not allowed:
        return Outcome(reasons=_quota_reasons(estate, checks, models))
    narrowed = _on_models(request, allowed)
    decision = _schedule(estate, narrowed, policy, rng)
    if decision.ok:
        assert decision.placement is not None
        model = _model_of(estate.snapshot, decision.placement)
        return _finish(estate, job, decision, model, amounts[model], (), now, commit)
    for model in allowed:
        if checks[model].borrowing or not _someone_borrows(estate, job.team, model):
            continue
        narrowed = _on_models(request, [model])
        outcome = _reclaim(estate, job, narrowed, model, amounts[model], policy, rng, now, commit)
        if outcome is not None:
            return outcome
    reasons = [_reason_dict(r) for r in decision.reasons]
    covered = {r["cluster"] for r in reasons}
    refused = {m: c for m, c in checks.items() if not c.ok}
    reasons += [
        r for r in _quota_reasons(estate, refused, list(refused)) if r["cluster"] not in covered
    ]
    return Outcome(reasons=reasons)


def _someone_borrows(estate: Estate, team: str, model: str) -> bool:
    """Does another member of `team`'s cohort use more than its nominal quota of `model`?"""
    cohort = estate.book.team(team).cohort
    if cohort is None:
        return False
    return any(
        m.name != team and estate.book.borrowing(m.name, model)
        for m in estate.book.cohort_members(cohort)
    )


def _reclaim(
    estate: Estate,
    job: PendingJob,
    request: Request,
    model: str,
    amount: Amount,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
    commit: bool,
) -> Outcome | None:
    """Preempt borrowers of `model` in the team's cohort until `request` fits; None if it cannot."""
    candidates = reclaim_candidates(estate.book, job.team, model, list(estate.running.values()))
    if not candidates:
        return None
    trial = estate.copy()
    victims: list[str] = []
    for victim in candidates:
        if not trial.book.borrowing(victim.team, model):
            continue
        trial.release(victim.job_id)
        victims.append(victim.job_id)
        decision = schedule(trial.snapshot, request, policy, rng)
        if decision.ok:
            if commit:
                for v in victims:
                    estate.release(v)
            return _finish(estate, job, decision, model, amount, tuple(victims), now, commit)
    return None


def _finish(
    estate: Estate,
    job: PendingJob,
    decision: Decision,
    model: str | None,
    amount: Amount,
    preempted: tuple[str, ...],
    now: float,
    commit: bool,
) -> Outcome:
    if decision.placement is None:
        return Outcome(reasons=[_reason_dict(r) for r in decision.reasons])
    placement = decision.placement
    if commit:
        estate.snapshot.commit(placement)
        if model is not None:
            estate.book.reserve(job.job_id, job.team, model, amount)
            estate.shares.pop(job.team, None)
            estate.running[job.job_id] = Running(job.job_id, job.team, model, job.priority, now)
    return Outcome(admitted=Admitted(job.job_id, placement, model, amount, preempted))


def _schedule(
    estate: Estate, request: Request, policy: Policy, rng: np.random.Generator
) -> Decision:
    """`schedule`, skipped when the same shape already failed since the last release."""
    sel = request.selector
    key = (
        request.gpus,
        request.gpu_milli,
        request.gpu_mem_mib,
        request.cpu_millis,
        request.memory_mib,
        tuple(sorted(sel.match_labels.items())),
        sel.gpu_models,
    )
    known = estate.no_fit.get(key)
    if known is not None and known[0] == estate.releases:
        return Decision(request.job_id, None, known[1], policy.name)
    decision = schedule(estate.snapshot, request, policy, rng)
    if not decision.ok:
        estate.no_fit[key] = (estate.releases, decision.reasons)
    return decision


def _on_models(request: Request, models: list[str]) -> Request:
    selector = Selector(request.selector.match_labels, frozenset(models))
    return replace(request, selector=selector)


def _model_of(snapshot: Snapshot, placement: Placement) -> str:
    return snapshot.nodes[snapshot.index[placement.node]].gpu_model


def _quota_reasons(
    estate: Estate, checks: Mapping[str, QuotaDecision], models: list[str]
) -> list[dict[str, Any]]:
    """One Quota reason per cluster, joining the refusals of its GPU models."""
    if not models:
        return [
            {
                "cluster": c,
                "code": ReasonCode.NO_MATCHING_NODE.value,
                "message": "no GPU of the requested models in this cluster",
                "numbers": {},
            }
            for c in estate.snapshot.clusters
        ]
    by_cluster: dict[str, list[str]] = {}
    for model in models:
        for cluster in sorted(estate.clusters_of.get(model, ())):
            by_cluster.setdefault(cluster, []).append(checks[model].reason)
    return [
        {
            "cluster": c,
            "code": ReasonCode.QUOTA.value,
            "message": "; ".join(msgs),
            "numbers": dict(checks[models[0]].numbers),
        }
        for c, msgs in by_cluster.items()
    ]


def _preempted_reason(cluster: str) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "code": ReasonCode.QUOTA.value,
        "message": "preempted: its team's borrowed quota was reclaimed by the lending team",
        "numbers": {},
    }


def _reason_dict(reason: ClusterReason) -> dict[str, Any]:
    return {
        "cluster": reason.cluster,
        "code": reason.code.value,
        "message": reason.message,
        "numbers": {k: int(v) for k, v in reason.numbers.items()},
    }
