"""One admission pass over the queue, pure: quota reservation, placement, reclaim. No SQL.

For each pending job, in `FairQueue` order (with time limits, the jobs whose limit reaches past
the backlog's horizon go first, longest first: `_queue`): reserve quota on the GPU models
(flavors) the team may use, ask the scheduler core for a place on those models, and commit both
to the in-memory snapshot and quota book. When the team is within its nominal quota but the
cards are held by cohort members that borrow, their jobs are preempted (lowest priority, newest
first) if, and only if, that makes the job fit. A job that has waited `ReservePolicy.after_s`
and still does not fit gets a node reservation: a node held for it (`scheduler/hold.py`) until
it is admitted or leaves the queue, so the jobs behind it cannot keep taking what it needs there
and the node drains for it; when the time limits of the node's jobs bound its start, a job whose
own limit ends by then may still use the node (EASY backfilling). The service wraps a pass in
one locked store transaction and writes what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpuplane.control.delay import FasterGpuWait
from gpuplane.control.estate import Estate
from gpuplane.control.quota import (
    Amount,
    FairQueue,
    Queued,
    QuotaDecision,
    Running,
    charge,
    reclaim_candidates,
)
from gpuplane.control.scheduler import (
    MILLI_PER_GPU,
    ClusterReason,
    Decision,
    Hold,
    Placement,
    Policy,
    ReasonCode,
    Request,
    reservation_node,
    schedule,
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
class ReservePolicy:
    """When a waiting job gets a node reservation: once it has waited `after_s` seconds (since
    submit) without fitting; at most `limit` at a time, in queue order (0: never)."""

    after_s: float
    limit: int


@dataclass(frozen=True, slots=True)
class Admitted:
    job_id: str
    placement: Placement
    flavor: str | None
    amount: Amount
    preempted: tuple[str, ...] = ()


@dataclass(slots=True)
class Outcome:
    """One job's answer: admitted, or the reasons per cluster (as JSON-able dicts) and the
    request as its quota allows it (None when quota allows no GPU model): what a reservation
    would hold."""

    admitted: Admitted | None = None
    reasons: list[dict[str, Any]] = field(default_factory=list)
    eligible: Request | None = None


@dataclass(slots=True)
class PassResult:
    admitted: list[Admitted] = field(default_factory=list)
    reasons: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # admitted earlier in this pass, then preempted by a later job: pending, not re-evaluated
    requeued: list[str] = field(default_factory=list)


def run_pass(
    estate: Estate,
    pending: Iterable[PendingJob],
    policy: Policy,
    rng: np.random.Generator,
    now: float,
    reserve: ReservePolicy | None = None,
    wait_for_faster: bool = False,
    longest_first: bool = True,
) -> PassResult:
    """Admit what fits, in queue order; mutates `estate` for every admission. With `reserve`,
    jobs that waited too long get node reservations (ended here once they leave the queue).
    With `wait_for_faster`, a job may wait for a faster GPU model (`delay.py`). With
    `longest_first`, jobs whose time limit reaches past the backlog go first (`_queue`)."""
    jobs = {j.job_id: j for j in pending}
    snap = estate.snapshot
    for job_id, held in list(estate.reserved.items()):
        if job_id not in jobs or not snap.schedulable[snap.index[held.node]]:
            estate.unreserve(job_id)
        else:  # its expected start moves as the node's jobs end
            estate.reserved[job_id] = estate.hold(held.node, held.request, now)
    for job_id in [j for j in estate.delayed if j not in jobs]:
        del estate.delayed[job_id]
    if reserve is not None:
        _grant(estate, jobs.values(), reserve, policy, rng, now)
    queue = _queue(estate, jobs, longest_first)
    requeued: list[str] = []
    admitted: dict[str, Admitted] = {}
    reasons: dict[str, list[dict[str, Any]]] = {}
    faster = None
    if wait_for_faster:
        longest = max((j.request.time_limit_s or 0.0 for j in jobs.values()), default=0.0)
        faster = FasterGpuWait(snap, estate.work, longest, estate.expected_ends(), now)
    for job_id in queue:
        job = jobs[job_id]
        outcome = decide(estate, job, policy, rng, now, commit=True, faster=faster)
        if outcome.admitted is None:
            if faster is not None and outcome.eligible is not None:
                faster.queued(outcome.eligible)
            hold = estate.reserved.get(job.job_id)
            reasons[job.job_id] = (
                outcome.reasons if hold is None else _reserved(estate, job, hold, outcome, now)
            )
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


def _queue(estate: Estate, jobs: Mapping[str, PendingJob], longest_first: bool) -> Iterator[str]:
    """The pass's order, per priority (highest first): with `longest_first`, the jobs whose
    time limit reaches past the backlog's horizon, longest first (LPT: each of them would end
    last if it started last; `_horizon`); then the rest in `FairQueue`'s order (fair share,
    oldest)."""
    horizon = _horizon(estate, jobs.values()) if longest_first else math.inf
    levels: dict[int, list[PendingJob]] = {}
    for j in jobs.values():
        levels.setdefault(j.priority, []).append(j)
    for _, level in sorted(levels.items(), key=lambda kv: -kv[0]):
        critical = [
            j
            for j in level
            if j.request.time_limit_s is not None and j.request.time_limit_s >= horizon
        ]
        critical.sort(key=lambda j: (-(j.request.time_limit_s or 0.0), j.created_at, j.job_id))
        yield from (j.job_id for j in critical)
        first = {j.job_id for j in critical}
        rest = (
            Queued(j.job_id, j.team, j.priority, j.created_at)
            for j in level
            if j.job_id not in first
        )
        yield from (q.job_id for q in FairQueue(rest, estate.share))


def _horizon(estate: Estate, jobs: Iterable[PendingJob]) -> float:
    """How long the estate is expected to need for the queued work, in seconds: each job's
    limit times the share of their limits that completed jobs used (`WorkHistory.limit_fill`;
    or the mean completed work, for a job without one), times its GPU demand, over the estate's
    speed-weighted cards. Against this a job's own limit is its longest possible run: taken
    at face value, limits would push the horizon out by as much as users overstate them, and
    a long job would be put first only once it is late."""
    snap = estate.snapshot
    rate = float((snap.n_devices * snap.gpu_speed)[snap.schedulable].sum()) * MILLI_PER_GPU
    mean, fill = estate.work.mean_s, estate.work.limit_fill()
    work = sum(
        j.request.gpu_demand_milli
        * (mean if j.request.time_limit_s is None else j.request.time_limit_s * fill)
        for j in jobs
    )
    return work / rate if rate else 0.0


def decide(
    estate: Estate,
    job: PendingJob,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
    *,
    commit: bool,
    faster: FasterGpuWait | None = None,
) -> Outcome:
    """Where `job` goes now (committed to `estate` when `commit`), or why not per cluster.
    With `faster`, a job the policy places on a slower model takes or waits for a faster one
    expected to free in time (`delay.py`); a node reservation's holder never waits."""
    request = job.request
    if not request.is_gpu:
        decision, why = _schedule(estate, request, policy, rng, now)
        if not decision.ok:
            return Outcome(reasons=list(why), eligible=request)
        assert decision.placement is not None
        return _finish(estate, job, decision.placement, None, Amount(), (), now, commit)
    wanted = request.selector.gpu_models
    models = sorted(m for m in estate.flavors if not wanted or m in wanted)
    team = estate.book.team(job.team)
    checks: dict[str, QuotaDecision] = {}  # a team without quota is not limited: no checks
    if team.limited:
        for model in models:
            checks[model] = estate.book.check(job.team, model, _charge(estate, request, model))
    allowed = [m for m in models if m not in checks or checks[m].ok]
    if not allowed:
        return Outcome(reasons=_quota_reasons(estate, checks, models))
    # all the models the request matches: its own selector says as much (and is cheaper)
    narrowed = request if len(allowed) == len(models) else _on_models(request, allowed)
    decision, why = _schedule(estate, narrowed, policy, rng, now)
    placement = decision.placement
    if placement is not None and faster is not None and job.job_id not in estate.reserved:
        wait = faster.check(narrowed, estate.snapshot.model_of(placement.node))
        # patience: a job waits at most as long as the slow card would lose on a long job
        if wait is not None and now - estate.delayed.get(job.job_id, now) <= wait.loss_s:
            faster_only = _on_models(request, list(wait.models))
            placement = _schedule(estate, faster_only, policy, rng, now)[0].placement
            if placement is None:  # no faster card fits now: wait for one
                if commit:
                    estate.delayed.setdefault(job.job_id, now)
                return Outcome(reasons=[wait.reason(estate.clusters_of)], eligible=narrowed)
    if placement is not None:
        model = estate.snapshot.model_of(placement.node)
        amount = _charge(estate, request, model)
        return _finish(estate, job, placement, model, amount, (), now, commit)
    for model in allowed if team.cohort is not None else ():
        if (model in checks and checks[model].borrowing) or not _someone_borrows(
            estate, job.team, model
        ):
            continue
        amount = _charge(estate, request, model)
        on_model = _on_models(request, [model])
        reclaimed = _reclaim(estate, job, on_model, model, amount, policy, rng, now, commit)
        if reclaimed is not None:
            return reclaimed
    reasons = list(why)
    refused = {m: c for m, c in checks.items() if not c.ok}
    if refused:
        covered = {r["cluster"] for r in reasons}
        reasons += [
            r for r in _quota_reasons(estate, refused, list(refused)) if r["cluster"] not in covered
        ]
    return Outcome(reasons=reasons, eligible=narrowed)


def _charge(estate: Estate, request: Request, model: str) -> Amount:
    return charge(request, estate.flavors[model])


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
    holds = estate.holds_against(request, now)
    victims: list[str] = []
    for victim in candidates:
        if not trial.book.borrowing(victim.team, model):
            continue
        trial.release(victim.job_id)
        victims.append(victim.job_id)
        decision = schedule(trial.snapshot, request, policy, rng, holds)
        if decision.placement is not None:
            if commit:
                for v in victims:
                    estate.release(v)
            placement = decision.placement
            return _finish(estate, job, placement, model, amount, tuple(victims), now, commit)
    return None


def _finish(
    estate: Estate,
    job: PendingJob,
    placement: Placement,
    model: str | None,
    amount: Amount,
    preempted: tuple[str, ...],
    now: float,
    commit: bool,
) -> Outcome:
    """Admit `job` at `placement` (committed to `estate` when `commit`)."""
    if commit:
        estate.snapshot.commit(placement)
        estate.admitted(placement, job.request.time_limit_s, now)
        estate.unreserve(job.job_id)
        estate.delayed.pop(job.job_id, None)
        if model is not None:
            estate.book.reserve(job.job_id, job.team, model, amount)
            estate.shares.pop(job.team, None)
            estate.running[job.job_id] = Running(job.job_id, job.team, model, job.priority, now)
    return Outcome(admitted=Admitted(job.job_id, placement, model, amount, preempted))


def _schedule(
    estate: Estate, request: Request, policy: Policy, rng: np.random.Generator, now: float
) -> tuple[Decision, tuple[dict[str, Any], ...]]:
    """`schedule` against the node reservations of other jobs (less those its time limit lets
    it backfill), and its reasons as dicts; skipped when the same shape, free of the same
    holds, already failed since capacity was last freed: until then free capacity only shrinks
    (a job's own reservation changes what it may use, so a holder is always scheduled). The
    reason dicts of a failed shape are shared by every job of that shape: read them, never
    mutate them."""
    holds = estate.holds_against(request, now)
    if request.job_id in estate.reserved:
        decision = schedule(estate.snapshot, request, policy, rng, holds)
        return decision, tuple(_reason_dict(r) for r in decision.reasons)
    sel = request.selector
    key = (
        request.gpus,
        request.gpu_milli,
        request.gpu_mem_mib,
        request.cpu_millis,
        request.memory_mib,
        tuple(sorted(sel.match_labels.items())),
        sel.gpu_models,
        # the held nodes its time limit lets it backfill (none for most jobs: one entry)
        tuple(sorted({h.node for h in estate.reserved.values()} - {h.node for h in holds})),
    )
    known = estate.no_fit.get(key)
    if known is not None and known[0] == estate.freed:
        return known[1], known[2]
    decision = schedule(estate.snapshot, request, policy, rng, holds)
    if decision.ok:
        return decision, ()
    why = tuple(_reason_dict(r) for r in decision.reasons)
    estate.no_fit[key] = (estate.freed, decision, why)
    return decision, why


def _grant(
    estate: Estate,
    pending: Iterable[PendingJob],
    reserve: ReservePolicy,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
) -> None:
    """Fill the free reservation slots, before the pass admits anything: the jobs that waited
    longest (highest priority first; a job's time limit counts as time already waited, so
    among equals the longest go first) and do not fit now, each on its `reservation_node`. By
    wait, not by queue order: fair share would otherwise keep giving the slots to the small
    teams' jobs while the big team's whole-node jobs wait on."""
    free = reserve.limit - len(estate.reserved)
    if free <= 0:
        return
    due = sorted(
        (
            j
            for j in pending
            if j.job_id not in estate.reserved and now - j.created_at >= reserve.after_s
        ),
        key=lambda j: (-j.priority, j.created_at - (j.request.time_limit_s or 0.0), j.job_id),
    )
    for job in due:
        outcome = decide(estate, job, policy, rng, now, commit=False)
        if outcome.admitted is not None or outcome.eligible is None:
            continue  # fits now (this pass admits it), or its quota allows no GPU model
        taken = {h.node for h in estate.reserved.values()}
        node = reservation_node(estate.snapshot, outcome.eligible, taken, estate.ends, now)
        if node is None:
            continue
        estate.reserved[job.job_id] = estate.hold(node, job.request, now)
        free -= 1
        if free == 0:
            return


def _reserved(
    estate: Estate, job: PendingJob, hold: Hold, outcome: Outcome, now: float
) -> list[dict[str, Any]]:
    """`outcome`'s reasons, with a `Reserved` one for the cluster of the node held for `job`."""
    cluster = estate.snapshot.nodes[estate.snapshot.index[hold.node]].cluster
    waited = now - job.created_at
    message = (
        f"holds a reservation on node {hold.node} after waiting {waited:.0f} s: "
        "jobs behind it may not take what it needs there, so the node drains for it"
    )
    numbers = {"waited_s": int(waited)}
    if hold.start_s is not None:
        numbers["starts_in_s"] = int(hold.start_s - now)
        message += (
            f"; expected to start within {hold.start_s - now:.0f} s (the time limits of the "
            "node's jobs), and jobs whose limits end by then may use the node meanwhile"
        )
    reason = {
        "cluster": cluster,
        "code": ReasonCode.RESERVED.value,
        "message": message,
        "numbers": numbers,
    }
    return [reason, *(r for r in outcome.reasons if r["cluster"] != cluster)]


def _on_models(request: Request, models: list[str]) -> Request:
    selector = Selector(request.selector.match_labels, frozenset(models))
    return replace(request, selector=selector)


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
