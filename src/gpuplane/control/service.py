"""The control-plane service: submit → queue → admit (quota + placement) → bind → observe.

Holds the store, one adapter per cluster and an in-memory `Estate` (snapshot + quota book) that
mirrors the store. Every change to allocations runs in `Store.locked()`: the lock row's version
says whether the mirror is current (it is rebuilt from the store when another process moved it),
so commits never double-book a device, across threads or processes. Adapters are called outside
the transaction, after the commit (bind) or after the release was recorded (stop).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from gpuplane.control import intake, runtime
from gpuplane.control.adapters.base import (
    ClusterAdapter,
    create_adapter,
)
from gpuplane.control.admission import PendingJob, ReservePolicy, run_pass
from gpuplane.control.estate import Estate
from gpuplane.control.inventory import (
    RowIds,
    load_estate,
    remove_clusters_except,
    sync_cluster,
)
from gpuplane.control.metrics import ControlMetrics
from gpuplane.control.models import Allocation, Event, Job, Quota, Team
from gpuplane.control.oplog import job_event
from gpuplane.control.scheduler import DEFAULT_POLICY, make_policy
from gpuplane.control.settings import ControlConfig, QuotaConfig
from gpuplane.control.spec import SpecError, parse_spec
from gpuplane.control.store import Store
from gpuplane.control.views import QuotaSet
from gpuplane.errors import GpuplaneError

log = logging.getLogger("gpuplane.control")


class NotFoundError(GpuplaneError):
    """No job, cluster or team by that name."""


class ConflictError(GpuplaneError):
    """The object is not in a state that allows the operation."""


class InfeasibleJobError(GpuplaneError):
    """The job can never run on this estate (e.g. 200 GiB on 80 GiB cards, unknown GPU model)."""

    def __init__(self, message: str, reasons: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.reasons = reasons


class ControlService:
    """One control plane over the configured clusters. Thread-safe."""

    def __init__(
        self,
        config: ControlConfig,
        *,
        store: Store | None = None,
        clock: Callable[[], float] = time.time,
        rng: np.random.Generator | None = None,
        new_id: Callable[[str], str] | None = None,
        bind_on_submit: bool = True,
    ) -> None:
        self.config = config
        self.bind_on_submit = bind_on_submit  # False: admitted jobs wait for tick() to bind
        self.instance = config.instance or f"{socket.gethostname()}:{config.port}"
        self.store = store or Store.open(config.resolved_database_url())
        self.clock = clock
        self.rng = rng or np.random.default_rng(0)
        self.new_id = new_id or (lambda name: f"{name}-{uuid.uuid4().hex[:8]}")
        self.policy = make_policy(config.policy or DEFAULT_POLICY)
        self.reserve = ReservePolicy(config.reserve_after_s, config.max_reservations)
        self.adapters: dict[str, ClusterAdapter] = {}
        self.inventory_sources: dict[str, str] = {}
        self.mutex = threading.RLock()
        self.adapter_lock = threading.Lock()  # bind and reconcile: one at a time per process
        self._estate: Estate | None = None
        self._ids = RowIds()
        self._version: int | None = None
        self._pending: dict[str, PendingJob] = {}
        self._stop_later: list[tuple[str, str]] = []
        self._settled: int | None = None  # store version at which the queue was last evaluated
        self.metrics = ControlMetrics()
        self.waiting: dict[tuple[str, str], int] = {}  # (cluster, reason) -> pending jobs

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Register the configured clusters and teams, then take back the jobs an earlier process
        of this instance left running (`runtime.reconcile`: still running, ended while it was
        down, or lost; logged), before any pass can place a job on their cards. Returns what
        each inventory came from."""
        now = self.clock()
        messages = []
        # the adapters tell this instance's workloads from other instances' by its name
        control = self.config.model_copy(update={"instance": self.instance})
        for cluster in self.config.clusters:
            adapter = create_adapter(cluster, control)
            inventory = adapter.inventory()
            self.adapters[cluster.name] = adapter
            self.inventory_sources[cluster.name] = inventory.source
            messages.append(f"cluster {cluster.name} ({cluster.adapter}): {inventory.source}")
            with self.locked() as (session, _):
                sync_cluster(
                    session,
                    cluster.name,
                    cluster.adapter,
                    dict(cluster.labels),
                    cluster.region,
                    inventory,
                    now,
                )
                self.record_event(
                    session, "cluster", f"registered: {inventory.source}", cluster=cluster.name
                )
                self.invalidate()  # the inventory changed: rebuild the mirror next time
        with self.locked() as (session, _):
            for gone in remove_clusters_except(session, self.adapters):
                messages.append(f"cluster {gone} is no longer configured: removed")
            for team in self.config.teams:
                self._apply_team_config(session, team)
            self.invalidate()
        seen = self.reconcile()
        summary = (
            f"reconciled on start: adopted {seen.running} running jobs, recorded {seen.exited} "
            f"exits while down, {seen.lost} lost"
        )
        if seen.timed_out:
            summary += f", {seen.timed_out} stopped past their time limit"
        log.info(
            summary,
            extra={
                "event": "reconciled",
                "adopted": seen.running,
                "exited": seen.exited,
                "lost": seen.lost,
                "timed_out": seen.timed_out,
            },
        )
        return messages

    def close(self, *, stop_jobs: bool = True) -> None:
        """Shut down. `stop_jobs`: stop the jobs this process runs, recorded failed; False leaves
        them running for a restart of this instance to take back (`control serve` on SIGTERM)."""
        if stop_jobs:
            runtime.stop_all(self)
        else:
            with self.store.session() as session:
                left = session.scalar(
                    select(func.count())
                    .select_from(Job)
                    .where(Job.state == "running", Job.bound_by == self.instance)
                )
            log.info(
                "control plane stopped; %d running jobs left running for its restart to take back",
                left,
                extra={"event": "stopped", "left_running": left},
            )
        self.store.close()

    def tick(self) -> None:
        """One round of the background loop: observe, admit, bind."""
        self.reconcile()
        self.schedule_pass()
        self.bind_admitted()

    # -- the mirror ----------------------------------------------------------------------------

    @contextmanager
    def locked(
        self, *, settles_queue: bool = False, neutral: bool = False
    ) -> Iterator[tuple[Session, Estate]]:
        """A locked store transaction and the estate, current as of this transaction.

        After the commit, `settles_queue` (the admission pass) records that the queue has been
        evaluated at this version, and `neutral` (a change that cannot make a pending job fit,
        e.g. admitted -> running) keeps that record; any other commit, here or in another
        process, means the next pass has to run."""
        with self.mutex:
            try:
                with self.store.locked() as (session, version):
                    estate = self._estate
                    if estate is None or self._version != version - 1:
                        estate = self._reload(session)
                    self._version = version
                    yield session, estate
            except BaseException:
                self.invalidate()
                raise
            if settles_queue or (neutral and self._settled == version - 1):
                self._settled = version

    def invalidate(self) -> None:
        """Forget the in-memory estate; the next transaction rebuilds it from the store."""
        with self.mutex:
            self._estate, self._version = None, None

    def estate(self) -> tuple[Estate, RowIds]:
        """The current estate for reads (rebuilt if the store moved); do not mutate it."""
        with self.mutex:
            version = self.store.version()
            estate = self._estate
            if estate is None or self._version != version:
                with self.store.session() as session:
                    estate = self._reload(session)
                self._version = version
            return estate, self._ids

    def _reload(self, session: Session) -> Estate:
        """Rebuild the mirror from the store, keeping what only memory holds (`Estate.adopt`)."""
        estate, self._ids = load_estate(session)
        if self._estate is not None:
            estate.adopt(self._estate)
        self._estate = estate
        return estate

    # -- submit ----------------------------------------------------------------------------------

    def submit(self, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Validate, refuse the impossible, then queue and try to admit (or only answer)."""
        return intake.submit(self, data, dry_run=dry_run)

    def submit_many(self, items: list[dict[str, Any]], *, admit: bool = True) -> list[str]:
        """Queue many specs in one transaction (all or none), then run one admission pass."""
        return intake.submit_many(self, items, admit=admit)

    def bind_admitted(self) -> None:
        """Hand admitted jobs to their cluster's adapter; a refusal fails the job."""
        runtime.bind_admitted(self)

    def reconcile(self) -> runtime.Observed:
        """Record jobs that ended (or that the backend lost), releasing their devices."""
        return runtime.reconcile(self)

    # -- admission -------------------------------------------------------------------------------

    def schedule_pass(self, before: Callable[[Session], None] | None = None) -> int:
        """Admit what fits now, in queue order, in one locked transaction; returns how many.
        `before(session)` runs first in the same transaction (submit queues its jobs there)."""
        settled = self._settled
        if before is None and settled is not None and self.store.version() == settled:
            return 0  # nothing was committed since the last pass: it would decide the same
        started = time.perf_counter()
        admitted, preempted, waiting = self._admission_pass(before)
        self.metrics.pass_seconds.observe(time.perf_counter() - started)
        self.metrics.admitted.inc(admitted)
        self.metrics.preempted.inc(preempted)
        self.waiting = waiting
        return admitted

    def _admission_pass(
        self, before: Callable[[Session], None] | None
    ) -> tuple[int, int, dict[tuple[str, str], int]]:
        now = self.clock()
        with self.locked(settles_queue=True) as (session, estate):
            if before is not None:
                before(session)
            rows = session.execute(
                select(
                    Job.id, Job.team_name, Job.priority, Job.created_at, Job.spec, Job.reasons
                ).where(Job.state == "pending")
            ).all()
            pending, old, invalid = [], {}, []
            for row in rows:
                job = self._pending.get(row.id)
                if job is None or job.priority != row.priority:
                    try:
                        request = parse_spec(row.spec).to_request(row.id)
                    except SpecError as exc:  # queued before a check that refuses it now
                        why = f"{exc}; submit a corrected spec"
                        self.finish(session, estate, row.id, "failed", None, why, now)
                        invalid.append((row.id, row.team_name, why))
                        continue
                    job = PendingJob(row.id, row.team_name, row.priority, row.created_at, request)
                    self._pending[row.id] = job
                pending.append(job)
                old[row.id] = row.reasons
            for job_id, team, why in invalid:  # here: the pass may end just below
                job_event(
                    "finished",
                    job_id,
                    team=team,
                    cluster=None,
                    reason=why,
                    state="failed",
                    level=logging.WARNING,
                )
            if not pending:
                return 0, 0, {}
            result = run_pass(
                estate,
                pending,
                self.policy,
                self.rng,
                now,
                self.reserve,
                wait_for_faster=self.config.wait_for_faster_gpu,
                longest_first=self.config.longest_first,
            )
            preempted = [v for a in result.admitted for v in a.preempted]
            events: list[tuple[str, str, str, str | None, str]] = []  # logged once committed
            if preempted:
                session.execute(delete(Allocation).where(Allocation.job_id.in_(preempted)))
                victims = session.execute(
                    select(Job.id, Job.cluster_name, Job.attempts, Job.team_name).where(
                        Job.id.in_(preempted)
                    )
                ).all()
                session.execute(
                    update(Job),
                    [
                        {
                            "id": v.id,
                            "state": "pending",
                            "cluster_name": None,
                            "node_id": None,
                            "flavor": None,
                            "milli_gpus": 0,
                            "gpu_mem_mib": 0,
                            "attempts": v.attempts + 1,
                            "started_at": None,
                            "message": "preempted: its team's borrowed quota was reclaimed",
                        }
                        for v in victims
                    ],
                )
                self._stop_later += [(v.cluster_name, v.id) for v in victims if v.cluster_name]
                for v in victims:
                    self.record_event(
                        session, "preempted", "borrowed quota reclaimed; requeued", job_id=v.id
                    )
                    reason = "its team's borrowed quota was reclaimed; requeued"
                    events.append(("preempted", v.id, v.team_name, v.cluster_name, reason))
            if result.admitted:
                ids = self._ids
                session.execute(
                    update(Job),
                    [
                        {
                            "id": a.job_id,
                            "state": "admitted",
                            "cluster_name": a.placement.cluster,
                            "node_id": ids.nodes[a.placement.node],
                            "flavor": a.flavor,
                            "milli_gpus": a.amount.milli_gpus,
                            "gpu_mem_mib": a.amount.mem_mib,
                            "reasons": {"list": []},
                            "message": None,
                        }
                        for a in result.admitted
                    ],
                )
                allocs = [
                    {
                        "job_id": a.job_id,
                        "mem_mib": g.mem_mib,
                        "gpu_milli": g.gpu_milli,
                        "device_id": ids.devices[(ids.nodes[a.placement.node], g.index)],
                    }
                    for a in result.admitted
                    for g in a.placement.devices
                ]
                if allocs:
                    session.execute(insert(Allocation), allocs)
                teams = {job.job_id: job.team for job in pending}
                for a in result.admitted:
                    self._pending.pop(a.job_id, None)
                    reason = f"placed on {a.placement.node} ({a.flavor})"
                    events.append(
                        ("admitted", a.job_id, teams[a.job_id], a.placement.cluster, reason)
                    )
            changed = [
                {"id": j, "reasons": {"list": r}}
                for j, r in result.reasons.items()
                if old.get(j) != {"list": r}
            ]
            if changed:
                session.execute(update(Job), changed)
            waiting: dict[tuple[str, str], int] = {}
            for reasons in result.reasons.values():
                for r in reasons:
                    key = (r["cluster"], r["code"])
                    waiting[key] = waiting.get(key, 0) + 1
            out = len(result.admitted), len(preempted), waiting
            requeued = bool(preempted or result.requeued)
        if requeued:  # requeued jobs were not evaluated in this pass: the next one must run
            self._settled = None
        for event, job_id, team, cluster, reason in events:
            job_event(event, job_id, team=team, cluster=cluster, reason=reason)
        return out

    def cancel(self, ref: str) -> str:
        """Cancel a pending or active job (its process is stopped); returns its id."""
        now = self.clock()
        with self.locked() as (session, estate):
            job = self.job_row(session, ref)
            if job.state in ("succeeded", "failed", "cancelled"):
                raise ConflictError(f"job {job.id} already ended ({job.state}); nothing to cancel")
            cluster, team = job.cluster_name, job.team_name
            self.finish(session, estate, job.id, "cancelled", None, "cancelled by a user", now)
            job_id = job.id
        reason = "cancelled by a user"
        job_event("cancelled", job_id, team=team, cluster=cluster, reason=reason, state="cancelled")
        self._pending.pop(job_id, None)
        if cluster in self.adapters:
            self.adapters[str(cluster)].release(job_id)
        return job_id

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
        """Record the end of a job and free its devices; with `expect`, only from that state."""
        if expect is not None:
            current = session.scalar(select(Job.state).where(Job.id == job_id))
            if current != expect:
                return False
        session.execute(delete(Allocation).where(Allocation.job_id == job_id))
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(state=state, exit_code=exit_code, message=message, finished_at=now)
        )
        estate.release(job_id, ended_at=now if state == "succeeded" else None)
        self.record_event(session, state, message or state, job_id=job_id)
        return True

    # -- helpers ---------------------------------------------------------------------------------

    def job_row(self, session: Session, ref: str) -> Job:
        """A job by id, or by name (the newest of that name); NotFoundError says how to list."""
        job = session.get(Job, ref)
        if job is None:
            job = session.scalars(
                select(Job).where(Job.name == ref).order_by(Job.created_at.desc()).limit(1)
            ).first()
        if job is None:
            raise NotFoundError(f"no job '{ref}'; list jobs with `gpuplane job list`")
        return job

    def record_event(
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

    def _apply_team_config(self, session: Session, team: Any) -> None:
        row = session.get(Team, team.name) or Team(name=team.name)
        row.cohort, row.weight = team.cohort, team.weight
        session.add(row)
        session.flush()
        session.execute(delete(Quota).where(Quota.team_name == team.name))
        for q in team.quotas:
            session.add(quota_row(team.name, q.flavor, q))


def quota_row(team: str, flavor: str, q: QuotaConfig | QuotaSet) -> Quota:
    """The store row of a quota given in GPUs (config file or API body)."""
    return Quota(
        team_name=team,
        flavor=flavor,
        nominal_milli_gpus=round(q.gpus * 1000),
        nominal_mem_mib=q.gpu_mem_mib,
        borrowing_limit_milli_gpus=_milli(q.borrowing_limit_gpus),
        borrowing_limit_mem_mib=q.borrowing_limit_mem_mib,
        lending_limit_milli_gpus=_milli(q.lending_limit_gpus),
        lending_limit_mem_mib=q.lending_limit_mem_mib,
    )


def _milli(gpus: float | None) -> int | None:
    return None if gpus is None else round(gpus * 1000)
