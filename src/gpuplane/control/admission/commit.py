"""Reserve and commit: an admitted job's devices, quota and bookkeeping applied to the estate.

The second step of ask-then-commit: `can_admit` answered without changing the estate; `admit`
preempts the victims it named, commits the placement on the snapshot (which checks every card
again and applies all or nothing) and reserves the quota, together.
"""

from __future__ import annotations

from gpuplane.control.admission.decision import Admitted, PendingJob
from gpuplane.control.admission.estate import Estate, Running


def admit(estate: Estate, job: PendingJob, admitted: Admitted, now: float) -> None:
    """Commit `admitted` (the answer of `can_admit` for `job`) to `estate`."""
    for victim in admitted.preempted:
        estate.release(victim)
    placement, flavor = admitted.placement, admitted.flavor
    estate.snapshot.commit(placement)
    estate.admitted(placement, job.request.time_limit_s, now)
    estate.end_nomination(job.job_id)
    estate.delayed.pop(job.job_id, None)
    if flavor is not None:
        estate.book.reserve(job.job_id, job.team, flavor, admitted.amount)
        estate.shares.pop(job.team, None)
        estate.running[job.job_id] = Running(job.job_id, job.team, flavor, job.priority, now)
