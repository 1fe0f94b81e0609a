"""Bind admitted jobs through their cluster's adapter, and observe them until they end.

Adapters are called outside the store's transaction: bind after the placement was committed,
release after the end was recorded. A job is only moved on if it is still in the state this
round saw (a cancel or a preemption in between wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select, update

from gpuplane.control.adapters.base import AdapterError, Workload, WorkloadState, WorkloadStatus
from gpuplane.control.inventory import split_qualified
from gpuplane.control.models import Job
from gpuplane.control.scheduler.speed import wall_seconds
from gpuplane.control.spec import JobSpec

if TYPE_CHECKING:
    from gpuplane.control.service import ControlService


def bind_admitted(svc: ControlService) -> None:
    """Stop preempted workloads, then start admitted ones; a refusal fails the job."""
    with svc.adapter_lock:  # one binder or reconciler at a time in this process
        _bind_admitted(svc)


def _bind_admitted(svc: ControlService) -> None:
    drain_stops(svc)
    with svc.store.session() as session:
        jobs = list(session.scalars(select(Job).where(Job.state == "admitted")))
    estate, _ = svc.estate()
    binds: list[tuple[str, Workload]] = []
    for job in jobs:
        placement = estate.snapshot.allocations.get(job.id)
        if placement is None or job.cluster_name not in svc.adapters:
            continue
        spec = JobSpec.model_validate(job.spec)
        limit = None
        if spec.time_limit is not None:  # stated for a card of speed 1.0: scaled to this node's
            limit = wall_seconds(spec.time_limit, estate.snapshot.speed_of(placement.node))
        binds.append(
            (
                str(job.cluster_name),
                Workload(
                    job_id=job.id,
                    name=job.name,
                    command=tuple(spec.command),
                    node=split_qualified(placement.node)[1],
                    devices=placement.devices,
                    env=spec.env,
                    workdir=spec.workdir,
                    cpu_millis=job.cpu_millis,
                    memory_mib=job.memory_mib,
                    fractional=spec.to_request(job.id).is_fractional,
                    time_limit_s=limit,
                ),
            )
        )
    started, failed = [], {}
    for cluster, workload in binds:
        try:
            svc.adapters[cluster].bind(workload)
            started.append(workload.job_id)
        except AdapterError as exc:
            failed[workload.job_id] = str(exc)
    if not (started or failed):
        return
    now = svc.clock()
    lost_race = []
    with svc.locked(neutral=not failed) as (session, estate):
        for job_id in started:
            moved = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == "admitted")
                .values(state="running", started_at=now, bound_by=svc.instance)
            )
            if moved.rowcount == 1:  # type: ignore[attr-defined]
                svc.record_event(session, "started", f"bound by {svc.instance}", job_id=job_id)
            else:  # cancelled meanwhile, or another service process bound it first
                lost_race.append(job_id)
        for job_id, msg in failed.items():
            svc.finish(session, estate, job_id, "failed", None, msg, now, expect="admitted")
    for cluster, workload in binds:
        if workload.job_id in lost_race:
            svc.adapters[cluster].release(workload.job_id)


def reconcile(svc: ControlService) -> None:
    """Record the end of jobs this service process bound (exit code, or lost by the backend),
    freeing their devices; stop workloads whose job was cancelled or preempted elsewhere."""
    with svc.adapter_lock:
        _reconcile(svc)


def _reconcile(svc: ControlService) -> None:
    with svc.store.session() as session:
        rows = session.execute(
            select(Job.id, Job.cluster_name).where(
                Job.state == "running", Job.bound_by == svc.instance
            )
        ).all()
        held = {c: a.workloads() for c, a in svc.adapters.items()}
        wanted = {i for ids in held.values() for i in ids}
        live = set(
            session.scalars(
                select(Job.id).where(
                    Job.id.in_(wanted), Job.state == "running", Job.bound_by == svc.instance
                )
            )
        )
    for cluster, ids in held.items():
        for job_id in ids:
            if job_id not in live:
                svc.adapters[cluster].release(job_id)
    by_cluster: dict[str, list[str]] = {}
    for row in rows:
        by_cluster.setdefault(str(row.cluster_name), []).append(row.id)
    ended: list[tuple[str, str, WorkloadStatus]] = []
    for cluster, ids in by_cluster.items():
        adapter = svc.adapters.get(cluster)
        if adapter is None:
            continue
        for job_id, status in adapter.status(ids).items():
            if status.state != WorkloadState.RUNNING:
                ended.append((cluster, job_id, status))
    if not ended:
        return
    now = svc.clock()
    done = []
    with svc.locked() as (session, estate):
        for cluster, job_id, status in ended:
            state = "succeeded" if status.state == WorkloadState.SUCCEEDED else "failed"
            message = status.message or None
            if svc.finish(
                session, estate, job_id, state, status.exit_code, message, now, expect="running"
            ):
                done.append((cluster, job_id))
    for cluster, job_id in done:
        svc.adapters[cluster].release(job_id)


def drain_stops(svc: ControlService) -> None:
    """Stop the workloads of jobs preempted since the last call. Idempotent."""
    with svc.mutex:  # the admission pass appends under the same lock
        stops, svc._stop_later = svc._stop_later, []
    for cluster, job_id in stops:
        if cluster in svc.adapters:
            svc.adapters[cluster].release(job_id)
