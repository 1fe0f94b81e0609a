"""Submit: validate a spec, refuse what can never run (with reasons), queue it, or dry-run it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from gpuplane.control.admission import Estate, PendingJob, decide
from gpuplane.control.inventory import split_qualified
from gpuplane.control.models import Job, Team
from gpuplane.control.scheduler.core import feasible
from gpuplane.control.scheduler.snapshot import Request
from gpuplane.control.spec import JobSpec, parse_spec

if TYPE_CHECKING:
    from gpuplane.control.service import ControlService


def submit(svc: ControlService, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Queue the job and run an admission pass; returns {"id": ...} or the dry-run answer."""
    from gpuplane.control.service import InfeasibleJobError

    spec = parse_spec(data)
    job_id = svc.new_id(spec.name)
    request = spec.to_request(job_id)
    with svc._mutex:
        estate, _ = svc.estate()
        decision = feasible(estate.snapshot, request)
        if not decision.ok:
            reasons = [
                {
                    "cluster": r.cluster,
                    "code": r.code.value,
                    "message": r.message,
                    "numbers": dict(r.numbers),
                }
                for r in decision.reasons
            ]
            detail = "; ".join(f"{r['cluster']}: {r['message']}" for r in reasons)
            raise InfeasibleJobError(
                f"job {spec.name} can never run here: {detail or 'no cluster is registered'}",
                reasons,
            )
        if dry_run:
            return _dry_run(svc, estate, spec, request)
    now = svc.clock()
    with svc._locked() as (session, _):  # serialised: a new team is created exactly once
        if session.get(Team, spec.team) is None:
            session.add(Team(name=spec.team))
            session.flush()
        session.add(
            Job(
                id=job_id,
                name=spec.name,
                team_name=spec.team,
                state="pending",
                priority=spec.priority,
                spec=spec.model_dump(mode="json"),
                reasons={"list": []},
                created_at=now,
                cpu_millis=request.cpu_millis,
                memory_mib=request.memory_mib,
            )
        )
        svc._event(session, "submitted", f"team {spec.team}", job_id=job_id)
    svc.schedule_pass()
    svc.bind_admitted()
    return {"id": job_id}


def _dry_run(
    svc: ControlService, estate: Estate, spec: JobSpec, request: Request
) -> dict[str, Any]:
    """Where the job would go now, on a copy of the estate; nothing is written."""
    job = PendingJob(request.job_id, spec.team, spec.priority, svc.clock(), request)
    outcome = decide(estate.copy(), job, svc.policy, svc.rng, svc.clock(), commit=False)
    with svc.store.session() as session:
        ahead = (
            session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.state == "pending", Job.priority >= spec.priority)
            )
            or 0
        )
    out: dict[str, Any] = {
        "fits": outcome.admitted is not None,
        "reasons": outcome.reasons,
        "queued_ahead": ahead,
    }
    if outcome.admitted is not None:
        p = outcome.admitted.placement
        out.update(
            cluster=p.cluster,
            node=split_qualified(p.node)[1],
            flavor=outcome.admitted.flavor,
            devices=list(p.device_indices),
            preempts=list(outcome.admitted.preempted),
        )
    return out
