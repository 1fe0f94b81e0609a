"""Submit: validate a spec, refuse what can never run (with reasons), queue it, or dry-run it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from gpuplane.control.admission import PendingJob, decide
from gpuplane.control.estate import Estate
from gpuplane.control.inventory import split_qualified
from gpuplane.control.models import Event, Job, Team
from gpuplane.control.scheduler import Request, feasible
from gpuplane.control.spec import JobSpec, SpecError, parse_spec
from gpuplane.errors import unknown_name

if TYPE_CHECKING:
    from gpuplane.control.service import ControlService


def submit(svc: ControlService, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    """Queue the job and run an admission pass; returns {"id": ...} or the dry-run answer."""
    spec = _parse(svc, data)
    request = spec.to_request(svc.new_id(spec.name))
    with svc.mutex:
        estate, _ = svc.estate()
        _refuse_impossible(estate, spec, request)
        if dry_run:
            return _dry_run(svc, estate, spec, request)
    _queue_and_admit(svc, [(spec, request)])
    return {"id": request.job_id}


def submit_many(
    svc: ControlService, items: list[dict[str, Any]], *, admit: bool = True
) -> list[str]:
    """Validate every spec first (an error names the item), then queue them all at once."""
    jobs = []
    for k, data in enumerate(items):
        try:
            spec = _parse(svc, data)
        except SpecError as exc:
            raise SpecError(f"item {k}: {exc}") from None
        jobs.append((spec, spec.to_request(svc.new_id(spec.name))))
    with svc.mutex:
        estate, _ = svc.estate()
        for spec, request in jobs:
            _refuse_impossible(estate, spec, request)
    if admit:
        _queue_and_admit(svc, jobs)
    else:
        with svc.locked() as (session, _):
            _insert(session, jobs, svc.clock())
    return [r.job_id for _, r in jobs]


def _parse(svc: ControlService, data: Any) -> JobSpec:
    """A spec that names no team is `control.default_team`'s, when the config sets one."""
    default = svc.config.default_team
    if default is not None and isinstance(data, dict) and data.get("team") is None:
        data = {**data, "team": default}
    return parse_spec(data)


def _require_declared(session: Session, teams: set[str]) -> None:
    """Refuse jobs of a team nobody declared (in the config or with `gpuplane quota set`):
    created on the fly, it would have no quota and could take every GPU."""
    from gpuplane.control.service import NotFoundError

    declared = set(session.scalars(select(Team.name)))
    missing = sorted(teams - declared)
    if missing:
        raise NotFoundError(
            unknown_name("team", missing[0], declared) + "; declare it under control.teams in "
            f"gpuplane.yaml or with `gpuplane quota set {missing[0]} --weight 1`"
        )


def _refuse_impossible(estate: Estate, spec: JobSpec, request: Request) -> None:
    from gpuplane.control.service import InfeasibleJobError

    decision = feasible(estate.snapshot, request)
    if decision.ok:
        return
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
        f"job {spec.name} can never run here: {detail or 'no cluster is registered'}", reasons
    )


def _queue_and_admit(svc: ControlService, jobs: list[tuple[JobSpec, Request]]) -> None:
    """Insert the jobs and run the admission pass in the same locked transaction."""
    now = svc.clock()
    svc.schedule_pass(before=lambda session: _insert(session, jobs, now))
    if svc.bind_on_submit:
        svc.bind_admitted()


def _insert(session: Session, jobs: list[tuple[JobSpec, Request]], now: float) -> None:
    """Queue `jobs`, all or none; runs under the store lock."""
    _require_declared(session, {spec.team for spec, _ in jobs})
    session.execute(
        insert(Job),
        [
            {
                "id": r.job_id,
                "name": spec.name,
                "team_name": spec.team,
                "state": "pending",
                "priority": spec.priority,
                "spec": spec.model_dump(mode="json"),
                "reasons": {"list": []},
                "created_at": now,
                "cpu_millis": r.cpu_millis,
                "memory_mib": r.memory_mib,
                "milli_gpus": 0,
                "gpu_mem_mib": 0,
                "attempts": 0,
                "time_limit_s": spec.time_limit,
            }
            for spec, r in jobs
        ],
    )
    session.execute(
        insert(Event),
        [
            {
                "at": now,
                "kind": "submitted",
                "job_id": r.job_id,
                "message": f"team {spec.team}",
            }
            for spec, r in jobs
        ],
    )


def _dry_run(
    svc: ControlService, estate: Estate, spec: JobSpec, request: Request
) -> dict[str, Any]:
    """Where the job would go now, on a copy of the estate; nothing is written."""
    job = PendingJob(request.job_id, spec.team, spec.priority, svc.clock(), request)
    outcome = decide(estate.copy(), job, svc.policy, svc.rng, svc.clock(), commit=False)
    with svc.store.session() as session:
        _require_declared(session, {spec.team})
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
