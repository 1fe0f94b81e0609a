"""Nominated nodes: a job that has waited too long holds a node that drains for it.

Without them a whole-node job never runs while smaller jobs keep arriving: every card that frees
up is taken at once by a job behind it. A job that has waited `NominationPolicy.after_s` and
still does not fit is nominated a node (kube-scheduler's nominated node: the scheduler core keeps
what it needs there from every other job) until it is admitted or leaves the queue;
when the time limits of the node's jobs bound its start, a job whose own limit ends by then may
still use the node (EASY backfilling).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpuplane.control.admission.decision import AdmissionDecision, NominationPolicy, PendingJob
from gpuplane.control.admission.estate import Estate
from gpuplane.control.admission.reasons import PendingReason, nominated
from gpuplane.control.scheduler import Nomination, nomination_node


def refresh_nominations(estate: Estate, jobs: Mapping[str, PendingJob], now: float) -> None:
    """End the nominations of jobs that left the queue or whose node was cordoned; the others'
    expected starts move as their nodes' jobs end."""
    snap = estate.snapshot
    for job_id, held in list(estate.nominated.items()):
        if job_id not in jobs or not snap.schedulable[snap.index[held.node]]:
            estate.end_nomination(job_id)
        else:
            estate.nominated[job_id] = estate.nomination(held.node, held.request, now)


def grant_nominations(
    estate: Estate,
    pending: Iterable[PendingJob],
    policy: NominationPolicy,
    ask: Callable[[PendingJob], AdmissionDecision],
    now: float,
) -> None:
    """Fill the free nomination slots, before the pass admits anything: the jobs that waited
    longest (highest priority first; a job's time limit counts as time already waited, so
    among equals the longest go first) and do not fit now (`ask`: `can_admit`), each on its
    `nomination_node`. By wait, not by queue order: fair share would otherwise keep giving the
    slots to the small teams' jobs while the big team's whole-node jobs wait on."""
    free = policy.limit - len(estate.nominated)
    if free <= 0:
        return
    due = sorted(
        (
            j
            for j in pending
            if j.job_id not in estate.nominated and now - j.created_at >= policy.after_s
        ),
        key=lambda j: (-j.priority, j.created_at - (j.request.time_limit_s or 0.0), j.job_id),
    )
    for job in due:
        answer = ask(job)
        if answer.admitted is not None or answer.eligible is None:
            continue  # fits now (this pass admits it), or its quota allows no GPU model
        taken = {h.node for h in estate.nominated.values()}
        node = nomination_node(estate.snapshot, answer.eligible, taken, estate.ends, now)
        if node is None:
            continue
        estate.nominated[job.job_id] = estate.nomination(node, job.request, now)
        free -= 1
        if free == 0:
            return


def with_nomination(
    estate: Estate,
    job: PendingJob,
    nomination: Nomination,
    reasons: tuple[PendingReason, ...],
    now: float,
) -> tuple[PendingReason, ...]:
    """`reasons`, with a `Reserved` one for the cluster of the node nominated for `job`."""
    node = nomination.node
    cluster = estate.snapshot.nodes[estate.snapshot.index[node]].cluster
    starts_in = None if nomination.start_s is None else nomination.start_s - now
    held = nominated(node, cluster, now - job.created_at, starts_in)
    return (held, *(r for r in reasons if r.cluster != cluster))
