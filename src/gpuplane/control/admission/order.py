"""Queue sort: the order in which one admission pass considers the pending jobs.

Per priority (highest first): with time limits, the jobs whose limit reaches past the backlog's
horizon go first, longest first (LPT); then the rest in `AdmissionQueue` order: the team with
the smallest dominant-resource share first, then its oldest job.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping

from gpuplane.control.admission.decision import PendingJob
from gpuplane.control.admission.estate import Estate
from gpuplane.control.scheduler import MILLI_PER_GPU


class AdmissionQueue:
    """Pending jobs in admission order: priority first, then the team with the smallest
    dominant-resource share (recomputed on every pop, so admissions shift the order), then the
    oldest head job, then FIFO within the team.
    """

    def __init__(self, jobs: Iterable[PendingJob], share: Callable[[str], float]) -> None:
        self._share = share
        levels: dict[int, dict[str, list[PendingJob]]] = {}
        for job in jobs:
            levels.setdefault(job.priority, {}).setdefault(job.team, []).append(job)
        self._levels: list[dict[str, deque[PendingJob]]] = [
            {
                t: deque(sorted(js, key=lambda j: (j.created_at, j.job_id)))
                for t, js in teams.items()
            }
            for _, teams in sorted(levels.items(), key=lambda kv: -kv[0])
        ]

    def __iter__(self) -> AdmissionQueue:
        return self

    def __next__(self) -> PendingJob:
        while self._levels:
            teams = self._levels[0]
            if not teams:
                self._levels.pop(0)
                continue
            team = min(teams, key=lambda t: (self._share(t), teams[t][0].created_at, t))
            queue = teams[team]
            job = queue.popleft()
            if not queue:
                del teams[team]
            return job
        raise StopIteration


def queue_order(
    estate: Estate, jobs: Mapping[str, PendingJob], longest_first: bool
) -> Iterator[str]:
    """The pass's order, per priority (highest first): with `longest_first`, the jobs whose
    time limit reaches past the backlog's horizon, longest first (LPT: each of them would end
    last if it started last; `horizon`); then the rest in `AdmissionQueue`'s order (fair share,
    oldest)."""
    limit = horizon(estate, jobs.values()) if longest_first else math.inf
    levels: dict[int, list[PendingJob]] = {}
    for j in jobs.values():
        levels.setdefault(j.priority, []).append(j)
    for _, level in sorted(levels.items(), key=lambda kv: -kv[0]):
        critical = [
            j
            for j in level
            if j.request.time_limit_s is not None and j.request.time_limit_s >= limit
        ]
        critical.sort(key=lambda j: (-(j.request.time_limit_s or 0.0), j.created_at, j.job_id))
        yield from (j.job_id for j in critical)
        first = {j.job_id for j in critical}
        rest = (j for j in level if j.job_id not in first)
        yield from (q.job_id for q in AdmissionQueue(rest, estate.share))


def horizon(estate: Estate, jobs: Iterable[PendingJob]) -> float:
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
