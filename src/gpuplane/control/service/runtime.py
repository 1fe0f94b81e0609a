"""The binder: bind admitted jobs through their cluster's adapter, and observe them until they end.

Adapters are called outside the store's transaction: bind after the placement was committed,
release after the end was recorded. A job is only moved on if it is still in the state this
round saw (a cancel or a preemption in between wins). Whatever binding one job raises fails that
job with the reason, never the round: one bad spec does not hold up the others. A cluster marked
unreachable (`down`, kept by `clusters.py`) is neither bound to nor observed: its jobs wait
there, shown `unknown`, until it answers again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from sqlalchemy import or_, select, update

from gpuplane.control.adapters import kserve
from gpuplane.control.adapters.base import (
    AdapterError,
    ClusterAdapter,
    Workload,
    WorkloadState,
    WorkloadStatus,
)
from gpuplane.control.admission import Estate
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.oplog import job_event, log
from gpuplane.control.scheduler import Placement, wall_seconds
from gpuplane.control.service.inventory import split_qualified
from gpuplane.control.spec import EnvValue, SpecError, parse_spec
from gpuplane.control.store.mirror import Mirror
from gpuplane.control.store.models import Job
from gpuplane.control.store.records import Records

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Observed:
    """What one reconcile saw of the jobs this service process runs: still running, ended with an
    exit code, lost by the backend, stopped at their time limit."""

    running: int = 0
    exited: int = 0
    lost: int = 0
    timed_out: int = 0


@dataclass(slots=True)
class Binder:
    """Binds, observes and stops the workloads of the jobs this service process runs, through
    `adapters` (cluster name -> adapter; the service fills it at start). One binder or
    reconciler runs at a time in the process (`lock`)."""

    adapters: dict[str, ClusterAdapter]
    mirror: Mirror
    records: Records
    clock: Callable[[], float]
    service_id: str  # this control-plane process (`control.service_id`)
    # a job's env with its references resolved (team, spec env); called only to bind
    env_of: Callable[[str, Mapping[str, EnvValue]], dict[str, str]]
    down: dict[str, str] = field(default_factory=dict)  # unreachable clusters, and why
    # bind and reconcile: one at a time per process
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _stops: list[tuple[str, str]] = field(default_factory=list, init=False)  # preempted

    def stop_later(self, stops: Iterable[tuple[str, str]]) -> None:
        """Queue the workloads (cluster, job id) of jobs just preempted: the next bind stops
        them. The admission pass calls it inside its transaction, under the mirror's mutex,
        which `drain_stops` takes too: nothing is stopped before the preemption is committed."""
        with self.mirror.mutex:
            self._stops += stops

    def bind_admitted(self) -> None:
        """Stop preempted workloads, then start admitted ones; a refusal fails the job."""
        with self.lock:  # one binder or reconciler at a time in this process
            self._bind_admitted()

    def _bind_admitted(self) -> None:
        self.drain_stops()
        with self.mirror.store.session() as session:
            jobs = list(session.scalars(select(Job).where(Job.state == "admitted")))
        estate, _ = self.mirror.estate()
        bound: list[tuple[str, Workload]] = []
        failed: dict[str, str] = {}
        teams, clusters = {}, {}
        for job in jobs:
            placement = estate.snapshot.allocations.get(job.id)
            cluster = str(job.cluster_name)
            if placement is None or cluster not in self.adapters or cluster in self.down:
                continue
            teams[job.id], clusters[job.id] = job.team_name, cluster
            adapter = self.adapters[cluster]
            try:
                workload = _workload(job, placement, estate, self.env_of)
                adapter.bind(workload)
            except Exception as exc:  # whatever it is, it fails this job, not the round
                if isinstance(exc, AdapterError) and not adapter.reachable()[0]:
                    continue  # the cluster went away: the health check re-places the job
                failed[job.id] = _why_not(exc, job.id, cluster)
            else:
                bound.append((clusters[job.id], workload))
        if not (bound or failed):
            return
        now = self.clock()
        lost_race, started, gave_up = [], [], []
        with self.mirror.locked(neutral=not failed) as (session, estate):
            for _, workload in bound:
                moved = session.execute(
                    update(Job)
                    .where(Job.id == workload.job_id, Job.state == "admitted")
                    .values(state="running", started_at=now, bound_by=self.service_id)
                )
                if moved.rowcount == 1:  # type: ignore[attr-defined]
                    self.records.event(
                        session, "started", f"bound by {self.service_id}", job_id=workload.job_id
                    )
                    started.append(workload)
                else:  # cancelled meanwhile, or another service process bound it first
                    lost_race.append(workload.job_id)
            for job_id, msg in failed.items():
                if self.records.finish(
                    session, estate, job_id, "failed", None, msg, now, expect="admitted"
                ):
                    gave_up.append(job_id)
        for job_id in lost_race:
            self.adapters[clusters[job_id]].release(job_id)
        for workload in started:
            job_id = workload.job_id
            reason = f"bound by {self.service_id} on {workload.node}"
            job_event(
                "started", job_id, team=teams[job_id], cluster=clusters[job_id], reason=reason
            )
        for job_id in gave_up:
            job_event(
                "finished",
                job_id,
                team=teams[job_id],
                cluster=clusters[job_id],
                reason=failed[job_id],
                state="failed",
                level=logging.WARNING,
            )

    def reconcile(self) -> Observed:
        """Record the end of jobs this service process bound (exit code, or lost by the backend),
        freeing their devices; stop workloads whose job was cancelled or preempted elsewhere.
        Run first by `ControlService.start`, where it takes back the jobs of an earlier process."""
        with self.lock:
            return self._reconcile()

    def _reconcile(self) -> Observed:
        mine = (Job.state == "running") & (Job.bound_by == self.service_id)
        # an unreachable cluster is not asked; one that fails to answer now is skipped this round
        answering = {c: a for c, a in self.adapters.items() if c not in self.down}
        with self.mirror.store.session() as session:
            rows = session.execute(
                select(Job.id, Job.cluster_name, Job.team_name).where(mine)
            ).all()
            held = {c: ids for c, a in answering.items() if (ids := _ask(c, a.workloads))}
            wanted = {i for ids in held.values() for i in ids}
            # a workload is live only on the cluster its job is placed on now: a copy left on
            # another (a bind re-placed off a cluster that stopped answering) is stopped. An
            # admitted job's workload is kept: binding it takes it back (a crash before the store
            # recorded the bind)
            live = {
                (r.cluster_name, r.id)
                for r in session.execute(
                    select(Job.cluster_name, Job.id).where(
                        Job.id.in_(wanted), or_(mine, Job.state == "admitted")
                    )
                )
            }
        for cluster, ids in held.items():
            for job_id in ids:
                if (cluster, job_id) not in live:
                    self.adapters[cluster].release(job_id)
        by_cluster: dict[str, list[str]] = {}
        for row in rows:
            by_cluster.setdefault(str(row.cluster_name), []).append(row.id)
        ended: list[tuple[str, str, WorkloadStatus]] = []
        for cluster, ids in by_cluster.items():
            adapter = answering.get(cluster)
            if adapter is None:
                continue
            for job_id, status in (_ask(cluster, partial(adapter.status, ids)) or {}).items():
                if status.state != WorkloadState.RUNNING:
                    ended.append((cluster, job_id, status))
        if not ended:
            return Observed(running=len(rows))
        now = self.clock()
        done = []
        with self.mirror.locked() as (session, estate):
            for cluster, job_id, status in ended:
                state = "succeeded" if status.state == WorkloadState.SUCCEEDED else "failed"
                message = status.message or None
                if self.records.finish(
                    session, estate, job_id, state, status.exit_code, message, now, expect="running"
                ):
                    done.append((cluster, job_id, state, status))
        teams = {row.id: row.team_name for row in rows}
        for cluster, job_id, state, status in done:
            self.adapters[cluster].release(job_id)
            job_event(
                "finished",
                job_id,
                team=teams[job_id],
                cluster=cluster,
                reason=status.message or "exited with code 0",
                state=state,
                exit_code=status.exit_code,
                level=logging.WARNING if status.state == WorkloadState.LOST else logging.INFO,
            )
        kinds = [status.state for _, _, _, status in done]
        return Observed(
            running=len(rows) - len(ended),
            exited=sum(k in (WorkloadState.SUCCEEDED, WorkloadState.FAILED) for k in kinds),
            lost=kinds.count(WorkloadState.LOST),
            timed_out=kinds.count(WorkloadState.TIMED_OUT),
        )

    def stop_all(self) -> int:
        """Record the running jobs of this service process cancelled (stopped at shutdown, on
        purpose: not a failure), then stop every workload its adapters hold; returns how many
        jobs were stopped. Idempotent."""
        reason = (
            "stopped when its control plane shut down with its jobs (`gpuplane up`, or "
            "`control serve --stop-jobs`); "
            "submit it again to run it"
        )
        with self.lock:
            try:
                with self.mirror.store.session() as session:
                    rows = session.execute(
                        select(Job.id, Job.cluster_name, Job.team_name).where(
                            Job.state == "running", Job.bound_by == self.service_id
                        )
                    ).all()
                stopped = []
                if rows:
                    now = self.clock()
                    with self.mirror.locked() as (session, estate):
                        stopped = [
                            row
                            for row in rows
                            if self.records.finish(
                                session,
                                estate,
                                row.id,
                                "cancelled",
                                None,
                                reason,
                                now,
                                expect="running",
                            )
                        ]
            finally:  # the processes are stopped even if the store could not record it
                for adapter in self.adapters.values():
                    adapter.close()
        for row in stopped:
            team, cluster = row.team_name, row.cluster_name
            job_event(
                "cancelled", row.id, team=team, cluster=cluster, reason=reason, state="cancelled"
            )
        return len(stopped)

    def drain_stops(self) -> None:
        """Stop the workloads of jobs preempted since the last call. Idempotent."""
        with self.mirror.mutex:  # the admission pass appends under the same lock
            stops, self._stops = self._stops, []
        for cluster, job_id in stops:
            if cluster in self.adapters:
                self.adapters[cluster].release(job_id)


def _ask(cluster: str, call: Callable[[], T]) -> T | None:
    """`call()` to one cluster's adapter, or None (logged) when it could not answer: the round
    goes on with the others, and the health check marks it unreachable if it stays so."""
    try:
        return call()
    except AdapterError as exc:
        log.warning("cluster %s did not answer the reconcile: %s", cluster, exc)
        return None


def _workload(
    job: Job,
    placement: Placement,
    estate: Estate,
    env_of: Callable[[str, Mapping[str, EnvValue]], dict[str, str]],
) -> Workload:
    """What the adapter starts for `job`; raises SpecError if its stored spec is no longer valid
    (one queued before a check that refuses it now) or its env refers to a secret since gone."""
    spec = parse_spec(job.spec)
    limit = None
    if spec.time_limit is not None:  # stated for a card of speed 1.0: scaled to this node's
        limit = wall_seconds(spec.time_limit, estate.snapshot.speed_of(placement.node))
    return Workload(
        job_id=job.id,
        name=job.name,
        command=tuple(spec.command),
        node=split_qualified(placement.node)[1],
        devices=placement.devices,
        env=env_of(job.team_name, spec.env),
        workdir=spec.workdir,
        cpu_millis=job.cpu_millis,
        memory_mib=job.memory_mib,
        fractional=spec.to_request(job.id).is_fractional,
        time_limit_s=limit,
        team=job.team_name,
        # a deployment instance: how a cluster that serves it itself (KServe) runs it
        serve=None
        if spec.serve is None
        else parse_deployment(spec.serve.deployment).serving(kserve.PORT),
    )


def _why_not(exc: Exception, job_id: str, cluster: str) -> str:
    """The failed job's message: what was wrong and what to do."""
    if isinstance(exc, AdapterError):
        return str(exc)
    if isinstance(exc, SpecError):
        return f"{exc}; submit a corrected spec"
    log.exception("binding job %s on cluster %s raised", job_id, cluster)
    return (
        f"the {cluster} adapter could not start it ({type(exc).__name__}: {exc}); "
        "check the job spec, and the control plane's log for the cause"
    )
