"""One admission pass over the queue, pure: the cycle that reads top to bottom. No SQL.

Nominations first (`nominate.py`: refreshed, then granted to jobs that waited too long), then
per pending job in queue order (`order.py`): ask (`can_admit`: the quota check, `flavors.py` →
filter and score by the scheduler core, `placement.py` → wait for a faster GPU, `delay.py` →
reclaim borrowed quota, `reclaim.py`), then commit what it answers (`commit.py`: reserve devices
and quota together), or keep its reasons (`reasons.py`). The service wraps a pass in one locked
store transaction and writes what it returns (`control/service/cycle_writer.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import partial

import numpy as np

from gpuplane.control.admission.commit import admit
from gpuplane.control.admission.decision import (
    AdmissionDecision,
    Admitted,
    NominationPolicy,
    PassResult,
    PendingJob,
)
from gpuplane.control.admission.delay import FasterGpuWait
from gpuplane.control.admission.estate import Estate
from gpuplane.control.admission.flavors import (
    assign_flavors,
    charge_on,
    quota_reasons,
    with_refusals,
)
from gpuplane.control.admission.nominate import (
    grant_nominations,
    refresh_nominations,
    with_nomination,
)
from gpuplane.control.admission.order import queue_order
from gpuplane.control.admission.placement import on_models, place
from gpuplane.control.admission.quota import Amount
from gpuplane.control.admission.reasons import PendingReason, preempted
from gpuplane.control.admission.reclaim import reclaim
from gpuplane.control.scheduler import Policy


def run_pass(
    estate: Estate,
    pending: Iterable[PendingJob],
    policy: Policy,
    rng: np.random.Generator,
    now: float,
    nomination: NominationPolicy | None = None,
    wait_for_faster: bool = False,
    longest_first: bool = True,
) -> PassResult:
    """Admit what fits, in queue order; mutates `estate` for every admission. With
    `nomination`, jobs that waited too long are nominated nodes (ended here once they leave the
    queue). With `wait_for_faster`, a job may wait for a faster GPU model (`delay.py`). With
    `longest_first`, jobs whose time limit reaches past the backlog go first (`order.py`)."""
    jobs = {j.job_id: j for j in pending}
    refresh_nominations(estate, jobs, now)
    for job_id in [j for j in estate.delayed if j not in jobs]:
        del estate.delayed[job_id]
    if nomination is not None:
        ask = partial(can_admit, estate, policy=policy, rng=rng, now=now)
        grant_nominations(estate, jobs.values(), nomination, ask, now)
    faster = None
    if wait_for_faster:
        longest = max((j.request.time_limit_s or 0.0 for j in jobs.values()), default=0.0)
        faster = FasterGpuWait(estate.snapshot, estate.work, longest, estate.expected_ends(), now)
    admitted: dict[str, Admitted] = {}
    reasons: dict[str, tuple[PendingReason, ...]] = {}
    requeued: list[str] = []
    for job_id in queue_order(estate, jobs, longest_first):
        job = jobs[job_id]
        answer = can_admit(estate, job, policy, rng, now, faster)
        if answer.admitted is None:
            if answer.waits:
                estate.delayed.setdefault(job.job_id, now)
            if faster is not None and answer.eligible is not None:
                faster.queued(answer.eligible)
            held = estate.nominated.get(job.job_id)
            reasons[job.job_id] = (
                answer.reasons
                if held is None
                else with_nomination(estate, job, held, answer.reasons, now)
            )
            continue
        a = answer.admitted
        admit(estate, job, a, now)
        # a victim admitted earlier in this same pass was never written: it just stays pending
        fresh = [v for v in a.preempted if v in admitted]
        requeued += fresh
        for v in fresh:
            del admitted[v]
            reasons[v] = (preempted(a.placement.cluster),)
        if fresh:
            a = replace(a, preempted=tuple(v for v in a.preempted if v not in fresh))
        admitted[job.job_id] = a
    return PassResult(list(admitted.values()), reasons, requeued)


def can_admit(
    estate: Estate,
    job: PendingJob,
    policy: Policy,
    rng: np.random.Generator,
    now: float,
    faster: FasterGpuWait | None = None,
) -> AdmissionDecision:
    """Where `job` goes now, or why not per cluster; asks only (`admit` commits the answer).
    With `faster`, a job the policy places on a slower model takes or waits for a faster one
    expected to free in time (`delay.py`); a nominated node's holder never waits."""
    request = job.request
    if not request.is_gpu:
        decision, why = place(estate, request, policy, rng, now)
        if decision.placement is None:
            return AdmissionDecision(reasons=why, eligible=request)
        return AdmissionDecision(Admitted(job.job_id, decision.placement, None, Amount()))
    quota = assign_flavors(estate, job)
    if not quota.allowed:
        return AdmissionDecision(reasons=quota_reasons(estate, quota.checks, quota.models))
    # all the models the request matches: its own selector says as much (and is cheaper)
    if len(quota.allowed) == len(quota.models):
        narrowed = request
    else:
        narrowed = on_models(request, quota.allowed)
    decision, why = place(estate, narrowed, policy, rng, now)
    placement = decision.placement
    if placement is not None and faster is not None and job.job_id not in estate.nominated:
        wait = faster.check(narrowed, estate.snapshot.model_of(placement.node))
        # patience: a job waits at most as long as the slow card would lose on a long job
        if wait is not None and now - estate.delayed.get(job.job_id, now) <= wait.loss_s:
            faster_only = on_models(request, wait.models)
            placement = place(estate, faster_only, policy, rng, now)[0].placement
            if placement is None:  # no faster card fits now: wait for one
                reason = wait.reason(estate.clusters_of)
                return AdmissionDecision(reasons=(reason,), eligible=narrowed, waits=True)
    if placement is not None:
        model = estate.snapshot.model_of(placement.node)
        amount = charge_on(estate, request, model)
        return AdmissionDecision(Admitted(job.job_id, placement, model, amount))
    reclaimed = reclaim(estate, job, quota, policy, rng, now)
    if reclaimed is not None:
        return AdmissionDecision(reclaimed)
    return AdmissionDecision(reasons=with_refusals(estate, quota, why), eligible=narrowed)
