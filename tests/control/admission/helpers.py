"""Helpers for the pure admission tests: an estate over declared nodes, pending jobs, one pass."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplane.control.admission import Estate, NominationPolicy, PassResult, PendingJob, run_pass
from gpuplane.control.admission.quota import QuotaBook, TeamQuota
from gpuplane.control.scheduler import NodeInfo, Request, Snapshot, make_policy
from tests.control.scheduler.sched_helpers import node

NOMINATE = NominationPolicy(after_s=10.0, limit=1)
A100, L4 = "A100-80GB", "L4"


def estate(
    *nodes: NodeInfo, teams: tuple[TeamQuota, ...] = (), speeds: dict[str, float] | None = None
) -> Estate:
    """An estate over `nodes` (default: two 4-card A100 nodes, a and b) and `teams`' quotas."""
    snapshot = Snapshot(nodes or (node("a", cards=4), node("b", cards=4)), gpu_speeds=speeds)
    return Estate.build(snapshot, QuotaBook(teams), [])


def job(
    job_id: str, t: float, team: str = "t", limit: float | None = None, **req: Any
) -> PendingJob:
    """A pending job submitted at `t` (with a time limit of `limit` seconds)."""
    return PendingJob(job_id, team, 0, t, Request(job_id, time_limit_s=limit, **req))


def run(
    e: Estate,
    jobs: dict[str, PendingJob],
    now: float,
    nomination: NominationPolicy | None,
    longest_first: bool = True,
) -> PassResult:
    """One pass over `jobs`; the admitted leave `jobs`."""
    rng = np.random.default_rng(0)
    result = run_pass(
        e, list(jobs.values()), make_policy(), rng, now, nomination, longest_first=longest_first
    )
    for a in result.admitted:
        del jobs[a.job_id]
    return result


def codes(result: PassResult, job_id: str) -> list[str]:
    return [r.code for r in result.reasons.get(job_id, ())]


def two_clusters(teams: list[TeamQuota], *, a100: int = 2, l4: int = 0) -> Estate:
    """Cluster c1: one node of `a100` A100-80GB cards; cluster c2: one node of `l4` L4 cards."""
    nodes = [node("c1/n1", cards=a100, cluster="c1", model=A100)]
    if l4:
        nodes.append(node("c2/n1", cards=l4, card_gib=24, cluster="c2", model=L4))
    return estate(*nodes, teams=tuple(teams))


def pending(job_id: str, team: str, t: float, priority: int = 0, **req: Any) -> PendingJob:
    return PendingJob(job_id, team, priority, t, Request(job_id, **req))


def one_pass(e: Estate, jobs: list[PendingJob], now: float = 100.0) -> PassResult:
    return run_pass(e, jobs, make_policy(), np.random.default_rng(0), now=now)
