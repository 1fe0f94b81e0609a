"""Submit: validate a spec, refuse what can never run (with reasons), queue it, or dry-run it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from gpuplane.control.admission import Estate, PendingJob, can_admit, from_scheduler
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.errors import InfeasibleJobError, NotFoundError
from gpuplane.control.scheduler import Policy, Request, feasible
from gpuplane.control.service.cycle_writer import CycleWriter
from gpuplane.control.service.inventory import split_qualified
from gpuplane.control.service.runtime import Binder
from gpuplane.control.spec import JobSpec, SpecError, parse_spec
from gpuplane.control.store.mirror import Mirror
from gpuplane.control.store.models import Event, Job, Team
from gpuplane.errors import unknown_name


@dataclass(slots=True)
class Intake:
    """Submits jobs for the service: queued with an admission pass in the same transaction
    (`writer`), then bound at once when `bind_on_submit` (`binder`); a dry run asks `policy`
    on a copy of the estate. `new_id(name)` names a job; `default_team` takes a spec that names
    none; `check_refs` refuses a spec whose env refers to what its job could not be given."""

    mirror: Mirror
    writer: CycleWriter
    binder: Binder
    policy: Policy
    rng: np.random.Generator
    clock: Callable[[], float]
    new_id: Callable[[str], str]
    default_team: str | None
    bind_on_submit: bool
    check_refs: Callable[[JobSpec], None]  # refuses env references that cannot be resolved

    def submit(self, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Queue the job and run an admission pass; returns {"id": ...} or the dry-run answer
        (its `reasons` typed: the API writes them)."""
        spec = self._parse(data)
        request = spec.to_request(self.new_id(spec.name))
        with self.mirror.mutex:
            estate, _ = self.mirror.estate()
            _refuse_impossible(estate, spec, request)
            if dry_run:
                return self._dry_run(estate, spec, request)
        self._queue_and_admit([(spec, request)])
        return {"id": request.job_id}

    def submit_many(self, items: list[dict[str, Any]], *, admit: bool = True) -> list[str]:
        """Validate every spec first (an error names the item), then queue them all at once."""
        if not items:
            return []  # nothing to queue: no pass, no empty INSERT
        jobs = []
        for k, data in enumerate(items):
            try:
                spec = self._parse(data)
            except SpecError as exc:
                raise SpecError(f"item {k}: {exc}") from None
            jobs.append((spec, spec.to_request(self.new_id(spec.name))))
        with self.mirror.mutex:
            estate, _ = self.mirror.estate()
            for spec, request in jobs:
                _refuse_impossible(estate, spec, request)
        if admit:
            self._queue_and_admit(jobs)
        else:
            with self.mirror.locked() as (session, _):
                _insert(session, jobs, self.clock())
        return [r.job_id for _, r in jobs]

    def _parse(self, data: Any) -> JobSpec:
        """A spec that names no team is `control.default_team`'s, when the config sets one."""
        default = self.default_team
        if default is not None and isinstance(data, dict) and data.get("team") is None:
            data = {**data, "team": default}
        spec = parse_spec(data)
        if spec.serve is not None:  # a deployment instance: its version's spec must be one
            try:
                parse_deployment(spec.serve.deployment)
            except SpecError as exc:
                reason = str(exc).removeprefix("invalid deployment spec: ")
                raise SpecError(f"invalid job spec: serve.deployment: {reason}") from None
        self.check_refs(spec)
        return spec

    def _queue_and_admit(self, jobs: list[tuple[JobSpec, Request]]) -> None:
        """Insert the jobs and run the admission pass in the same locked transaction."""
        now = self.clock()
        self.writer.schedule_pass(before=lambda session: _insert(session, jobs, now))
        if self.bind_on_submit:
            self.binder.bind_admitted()

    def _dry_run(self, estate: Estate, spec: JobSpec, request: Request) -> dict[str, Any]:
        """Where the job would go now, on a copy of the estate; nothing is written."""
        job = PendingJob(request.job_id, spec.team, spec.priority, self.clock(), request)
        answer = can_admit(estate.copy(), job, self.policy, self.rng, self.clock())
        with self.mirror.store.session() as session:
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
            "fits": answer.admitted is not None,
            "reasons": answer.reasons,
            "queued_ahead": ahead,
        }
        if answer.admitted is not None:
            p = answer.admitted.placement
            out.update(
                cluster=p.cluster,
                node=split_qualified(p.node)[1],
                flavor=answer.admitted.flavor,
                devices=list(p.device_indices),
                preempts=list(answer.admitted.preempted),
            )
        return out


def _require_declared(session: Session, teams: set[str]) -> None:
    """Refuse jobs of a team nobody declared (in the config or with `gpuplane quota set`):
    created on the fly, it would have no quota and could take every GPU."""
    declared = set(session.scalars(select(Team.name)))
    missing = sorted(teams - declared)
    if missing:
        raise NotFoundError(
            unknown_name("team", missing[0], declared) + "; declare it under control.teams in "
            f"gpuplane.yaml or with `gpuplane quota set {missing[0]} --weight 1`"
        )


def _refuse_impossible(estate: Estate, spec: JobSpec, request: Request) -> None:
    decision = feasible(estate.snapshot, request)
    if decision.ok:
        return
    if not estate.snapshot.schedulable.all():
        # a cordoned, draining or unreachable cluster opens again: a job that fits there waits
        opened = estate.snapshot.copy()
        opened.schedulable[:] = True
        if feasible(opened, request).ok:
            return
    reasons = from_scheduler(decision.reasons)
    detail = "; ".join(f"{r.cluster}: {r.message}" for r in reasons)
    raise InfeasibleJobError(
        f"job {spec.name} can never run here: {detail or 'no cluster is registered'}", reasons
    )


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
                "gpu_milli": 0,
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
