"""The cycle writer: one admission pass against the store, in one locked transaction.

Reads the pending jobs, runs the pure cycle (`admission.run_pass`) on the mirror's `Estate`, and
writes what it decided: preempted jobs back to pending (their workloads queued for the binder to
stop), admitted jobs with their allocations, and each pending job's reasons where they changed.
Job events are logged once the transaction committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from gpuplane.control.admission import (
    Estate,
    NominationPolicy,
    PassResult,
    PendingJob,
    PendingReason,
    run_pass,
)
from gpuplane.control.metrics import ControlMetrics
from gpuplane.control.oplog import job_event
from gpuplane.control.scheduler import Policy
from gpuplane.control.spec import SpecError, parse_spec
from gpuplane.control.store.mirror import Mirror
from gpuplane.control.store.models import Allocation, Event, Job
from gpuplane.control.store.records import Records

_Event = tuple[str, str, str, str | None, str]  # kind, job id, team, cluster, reason


@dataclass(frozen=True, slots=True)
class PassRules:
    """How the passes decide (from `ControlConfig`): node nominations, delay scheduling for
    faster GPUs, longest limits first."""

    nomination: NominationPolicy
    wait_for_faster: bool
    longest_first: bool


@dataclass(slots=True)
class CycleWriter:
    """Runs admission passes for the service and writes them; `waiting` is what the last pass
    left pending, per (cluster, reason code)."""

    mirror: Mirror
    records: Records
    policy: Policy
    rng: np.random.Generator
    clock: Callable[[], float]
    rules: PassRules
    metrics: ControlMetrics
    stop_later: Callable[[Iterable[tuple[str, str]]], None]  # the binder stops preempted jobs
    # (cluster, reason code) -> pending jobs, as of the last pass
    waiting: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    # parsed specs of pending jobs, by id
    _pending: dict[str, PendingJob] = field(default_factory=dict, init=False)

    def schedule_pass(self, before: Callable[[Session], None] | None = None) -> int:
        """Admit what fits now, in queue order, in one locked transaction; returns how many.
        `before(session)` runs first in the same transaction (submit queues its jobs there)."""
        if before is None and self.mirror.settled():
            return 0  # nothing was committed since the last pass: it would decide the same
        started = time.perf_counter()
        admitted, preempted, waiting = self._admission_pass(before)
        self.metrics.pass_seconds.observe(time.perf_counter() - started)
        self.metrics.admitted.inc(admitted)
        self.metrics.preempted.inc(preempted)
        self.waiting = waiting
        return admitted

    def forget(self, job_id: str) -> None:
        """Drop a job's parsed spec (it left the queue). Idempotent."""
        self._pending.pop(job_id, None)

    def _admission_pass(
        self, before: Callable[[Session], None] | None
    ) -> tuple[int, int, dict[tuple[str, str], int]]:
        now = self.clock()
        with self.mirror.locked(settles_queue=True) as (session, estate):
            if before is not None:
                before(session)
            pending, old = self._read_pending(session, estate, now)
            if not pending:
                return 0, 0, {}
            result = run_pass(
                estate,
                pending,
                self.policy,
                self.rng,
                now,
                self.rules.nomination,
                wait_for_faster=self.rules.wait_for_faster,
                longest_first=self.rules.longest_first,
            )
            preempted = sum(len(a.preempted) for a in result.admitted)
            events = self._write_preempted(session, result)
            events += self._write_admitted(session, result, pending)
            changed = [
                {"id": j, "reasons": stored}
                for j, r in result.reasons.items()
                if old.get(j) != (stored := _stored(r))
            ]
            if changed:
                session.execute(update(Job), changed)
            waiting: dict[tuple[str, str], int] = {}
            for reasons in result.reasons.values():
                for reason in reasons:
                    key = (reason.cluster, reason.code.value)
                    waiting[key] = waiting.get(key, 0) + 1
            requeued = bool(preempted or result.requeued)
        if requeued:  # requeued jobs were not evaluated in this pass: the next one must run
            self.mirror.unsettle()
        for event, job_id, team, cluster, why in events:
            job_event(event, job_id, team=team, cluster=cluster, reason=why)
        return len(result.admitted), preempted, waiting

    def _read_pending(
        self, session: Session, estate: Estate, now: float
    ) -> tuple[list[PendingJob], dict[str, object]]:
        """The pending jobs (their parsed specs cached), and their stored reasons. A spec that
        no longer parses fails its job here."""
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
                    self.records.finish(session, estate, row.id, "failed", None, why, now)
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
        return pending, old

    def _write_preempted(self, session: Session, result: PassResult) -> list[_Event]:
        """Requeue the jobs the pass preempted; their workloads go to the binder to stop."""
        preempted = [v for a in result.admitted for v in a.preempted]
        if not preempted:
            return []
        victims = self.records.requeue(
            session,
            preempted,
            "preempted: its team's borrowed quota was reclaimed",
            "preempted",
            "borrowed quota reclaimed; requeued",
        )
        self.stop_later([(cluster, job_id) for job_id, cluster, _ in victims if cluster])
        reason = "its team's borrowed quota was reclaimed; requeued"
        return [("preempted", job_id, team, cluster, reason) for job_id, cluster, team in victims]

    def _write_admitted(
        self, session: Session, result: PassResult, pending: list[PendingJob]
    ) -> list[_Event]:
        """Record the admitted jobs and the devices they hold."""
        if not result.admitted:
            return []
        ids = self.mirror.ids
        session.execute(
            update(Job),
            [
                {
                    "id": a.job_id,
                    "state": "admitted",
                    "cluster_name": a.placement.cluster,
                    "node_id": ids.nodes[a.placement.node],
                    "devices": list(a.placement.device_indices),
                    "flavor": a.flavor,
                    "gpu_milli": a.amount.gpu_milli,
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
        reasons = {
            a.job_id: f"placed on {a.placement.node}" + (f" ({a.flavor})" if a.flavor else "")
            for a in result.admitted
        }
        now = self.records.clock()
        session.execute(  # the jobs' timelines: one row each, in one statement
            insert(Event),
            [
                {
                    "at": now,
                    "kind": "admitted",
                    "job_id": a.job_id,
                    "cluster_name": a.placement.cluster,
                    "message": reasons[a.job_id],
                }
                for a in result.admitted
            ],
        )
        events: list[_Event] = []
        for a in result.admitted:
            self._pending.pop(a.job_id, None)
            events.append(
                ("admitted", a.job_id, teams[a.job_id], a.placement.cluster, reasons[a.job_id])
            )
        return events


def _stored(reasons: tuple[PendingReason, ...]) -> dict[str, list[dict[str, object]]]:
    """A job's reasons as `jobs.reasons` keeps them."""
    return {"list": [r.to_json() for r in reasons]}
