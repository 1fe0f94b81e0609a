"""Job and quota rows every writer shares: the audit trail, a job's end, a job by reference.

Called inside the caller's transaction; they never commit. `Records` carries the service's
injected clock, so an event is stamped when it is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpuplane.control.admission import Estate
from gpuplane.control.errors import NotFoundError
from gpuplane.control.settings import QuotaConfig
from gpuplane.control.store.models import Allocation, Event, Job, Quota, Team
from gpuplane.control.store.views import QuotaSet


@dataclass(frozen=True, slots=True)
class Records:
    """Writes of job events and job ends, stamped by `clock`."""

    clock: Callable[[], float]

    def event(
        self,
        session: Session,
        kind: str,
        message: str,
        *,
        job_id: str | None = None,
        cluster: str | None = None,
    ) -> None:
        """Append to the audit trail, in the caller's transaction."""
        session.add(
            Event(
                at=self.clock(),
                kind=kind,
                job_id=job_id,
                cluster_name=cluster,
                message=message[:2000],
            )
        )

    def finish(
        self,
        session: Session,
        estate: Estate,
        job_id: str,
        state: str,
        exit_code: int | None,
        message: str | None,
        now: float,
        *,
        expect: str | None = None,
    ) -> bool:
        """Record the end of a job and free its devices; with `expect`, only from that state.
        Its pending reasons go: an ended job waits for nothing, and `message` says why it
        ended (a cancelled job's REASON is its cancel, not the quota it waited for)."""
        if expect is not None:
            current = session.scalar(select(Job.state).where(Job.id == job_id))
            if current != expect:
                return False
        session.execute(delete(Allocation).where(Allocation.job_id == job_id))
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                state=state,
                exit_code=exit_code,
                message=message,
                finished_at=now,
                reasons={"list": []},
            )
        )
        estate.release(job_id, ended_at=now if state == "succeeded" else None)
        self.event(session, state, message or state, job_id=job_id)
        return True

    def requeue(
        self, session: Session, job_ids: list[str], message: str, kind: str, note: str
    ) -> list[tuple[str, str | None, str]]:
        """Put placed jobs back in the queue (preempted, or re-placed off a cluster): their
        devices freed, one more attempt, `message` on the job and a `kind` event saying `note`.
        Returns (id, cluster, team) of each, for the caller to stop its workload and to release
        it from the estate (an admission pass already has)."""
        if not job_ids:
            return []
        session.execute(delete(Allocation).where(Allocation.job_id.in_(job_ids)))
        rows = session.execute(
            select(Job.id, Job.cluster_name, Job.team_name, Job.attempts).where(Job.id.in_(job_ids))
        ).all()
        session.execute(
            update(Job),
            [
                {
                    "id": r.id,
                    "state": "pending",
                    "cluster_name": None,
                    "node_id": None,
                    "flavor": None,
                    "gpu_milli": 0,
                    "gpu_mem_mib": 0,
                    "attempts": r.attempts + 1,
                    "started_at": None,
                    "message": message,
                }
                for r in rows
            ],
        )
        for r in rows:
            self.event(session, kind, note, job_id=r.id)
        return [(r.id, r.cluster_name, r.team_name) for r in rows]


def job_row(session: Session, ref: str, teams: Collection[str] | None = None) -> Job:
    """A job by id, or by name (the newest of that name), among `teams`' (None: every team's);
    NotFoundError says how to list, the same for another team's job as for an unknown one."""
    job = session.get(Job, ref)
    if job is None or (teams is not None and job.team_name not in teams):
        query = select(Job).where(Job.name == ref)
        if teams is not None:
            query = query.where(Job.team_name.in_(teams))
        job = session.scalars(query.order_by(Job.created_at.desc()).limit(1)).first()
    if job is None:
        raise NotFoundError(f"no job '{ref}'; list jobs with `gpuplane job list`")
    return job


def team_row(session: Session, name: str, teams: Collection[str] | None = None) -> Team:
    """A team among `teams` (None: any); the same NotFoundError for another team as for an
    unknown one."""
    team = session.get(Team, name) if teams is None or name in teams else None
    if team is None:
        raise NotFoundError(
            f"no team '{name}'; declare teams under control.teams in gpuplane.yaml or "
            "with `gpuplane quota set`"
        )
    return team


def quota_row(team: str, flavor: str, q: QuotaConfig | QuotaSet) -> Quota:
    """The store row of a quota given in GPUs (config file or API body)."""
    return Quota(
        team_name=team,
        flavor=flavor,
        nominal_gpu_milli=round(q.gpus * 1000),
        nominal_mem_mib=q.gpu_mem_mib,
        borrowing_limit_gpu_milli=_milli(q.borrowing_limit_gpus),
        borrowing_limit_mem_mib=q.borrowing_limit_mem_mib,
        lending_limit_gpu_milli=_milli(q.lending_limit_gpus),
        lending_limit_mem_mib=q.lending_limit_mem_mib,
    )


def _milli(gpus: float | None) -> int | None:
    return None if gpus is None else round(gpus * 1000)
