"""The deployment controller: the shell around the reconciler (`reconcile.py`) in the service.

It stores deployments, and on every service tick (and right after an apply, scale or delete)
plans each one and carries the plan out through the service's own job paths and three pieces
it is handed, each with its own state and none knowing the controller: `Instances` starts an
instance by submitting its job, learns its address and slots and paces crashed ones'
replacements; `Loads` holds the gateways' load reports and the autoscaler's state; `Spread`
answers where one instance should move back once a lost or full cluster has room again (ask),
and the controller starts it there (commit), make before break. An instance is stopped by
cancelling its job; one lost with its cluster (which stopped answering) is recorded ended
without asking it (`abandon`: its quota is freed), drains, and is replaced elsewhere at once.
What the gateway watches of them is `watch.py`'s.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpuplane.control.adapters.local import ENGINE_HOST
from gpuplane.control.deployments.instances import (
    Instances,
    JobService,
    event,
    observed,
    slots_per_instance,
)
from gpuplane.control.deployments.loads import Loads
from gpuplane.control.deployments.reconcile import Plan, Want, plan
from gpuplane.control.deployments.spec import DeploymentSpec, parse_deployment
from gpuplane.control.deployments.spread import Spread
from gpuplane.control.errors import ConflictError, NotFoundError
from gpuplane.control.oplog import log
from gpuplane.control.spec import SpecError
from gpuplane.control.store.models import Deployment, DeploymentInstance
from gpuplane.errors import ConfigError, unknown_name


@dataclass(frozen=True, slots=True)
class Applied:
    """What an apply did (or, dry, would do): created, changed or unchanged, and where one more
    instance would be placed now (the scheduler's dry run)."""

    name: str
    action: str  # created | configured | unchanged
    placement: dict[str, Any]


class Deployments:
    """Deployments of one control plane. Thread-safe: one reconcile at a time."""

    def __init__(
        self, service: JobService, instances: Instances, loads: Loads, spread: Spread
    ) -> None:
        self.service = service
        self.instances = instances
        self.loads = loads
        self.spread = spread
        self._lock = threading.RLock()

    # -- commands ----------------------------------------------------------------------------

    def apply(
        self, data: Any, *, dry_run: bool = False, teams: Collection[str] | None = None
    ) -> Applied:
        """Create or change a deployment; refuse a spec that can never be served here. `teams`:
        the teams whose deployments the caller may change (None: all)."""
        spec = parse_deployment(data, self.service.config.default_team)
        self.instances.require_servable(spec)
        with self.service.store.session() as session:
            row = session.get(Deployment, spec.name)
            if row is not None and not _shown(row, teams):
                # names are one namespace: say it is taken, not whose it is
                raise ConflictError(
                    f"the deployment name {spec.name} is taken: choose another name"
                )
            if row is not None and row.deleting:
                raise ConflictError(
                    f"deployment {spec.name} is being deleted; apply it again once "
                    "`gpuplane deploy list` no longer shows it"
                )
        action = (
            "created"
            if row is None
            else "unchanged"
            if row.spec == _stored(spec)
            else ("configured")
        )
        placement = self.service.submit(spec.to_job(ENGINE_HOST, 1), dry_run=True)
        placement["reasons"] = [r.to_json() for r in placement["reasons"]]
        if dry_run or action == "unchanged":
            return Applied(spec.name, action, placement)
        now = self.service.clock()
        with self.service.store.session() as session, session.begin():
            if row is None:
                session.add(
                    Deployment(name=spec.name, spec=_stored(spec), created_at=now, updated_at=now)
                )
            else:
                row = session.get(Deployment, spec.name)
                assert row is not None
                row.spec, row.updated_at = _stored(spec), now
                session.add(row)
            wanted = spec.replicas_by_version(spec.desired)
            canary = "".join(
                f", canary {c.version} ({c.weight:g} %, {wanted[c.version]} replica(s))"
                for c in spec.canary
            )
            event(
                session,
                now,
                spec.name,
                f"{action}: version {spec.version}, "
                f"{spec.desired} replica(s) of {spec.engine} {spec.model}{canary}",
            )
        self.reconcile(spec.name)
        return Applied(spec.name, action, placement)

    def scale(
        self, name: str, replicas: int, teams: Collection[str] | None = None
    ) -> DeploymentSpec:
        if replicas < 0:
            raise SpecError(f"replicas must be >= 0, got {replicas}")
        with self.service.store.session() as session:
            spec = self.spec(session, name, teams)
        if spec.scaling is not None:
            raise ConflictError(
                f"deployment {name} is autoscaled (scaling: min {spec.scaling.min}, max "
                f"{spec.scaling.max}); change `scaling` in its spec and apply it, or replace "
                "`scaling` with `replicas` to scale by hand"
            )
        data = {**_stored(spec), "replicas": replicas}
        self.apply(data)
        return parse_deployment(data)

    def promote(
        self, name: str, version: str | None = None, teams: Collection[str] | None = None
    ) -> DeploymentSpec:
        """The canary `version` (the only one, when None) becomes the deployment's version:
        its instances stay, more start up to the main version's replicas, and the old
        version's drain once those serve."""
        return self._roll(name, lambda spec: spec.promoted(version), "promoted", teams)

    def rollback(self, name: str, teams: Collection[str] | None = None) -> DeploymentSpec:
        """Drop every canary: their instances drain; the main version serves everything."""
        return self._roll(name, DeploymentSpec.rolled_back, "rolled back", teams)

    def _roll(
        self,
        name: str,
        change: Callable[[DeploymentSpec], DeploymentSpec],
        verb: str,
        teams: Collection[str] | None,
    ) -> DeploymentSpec:
        with self.service.store.session() as session:
            spec = self.spec(session, name, teams)
        try:
            new = change(spec)
        except ConfigError as exc:
            raise ConflictError(f"{exc}; see `gpuplane deploy rollout status {name}`") from None
        with self.service.store.session() as session, session.begin():
            weights = ", ".join(f"{v} {w:g} %" for v, w in spec.weights().items())
            event(session, self.service.clock(), name, f"{verb} (was {weights})")
        self.apply(_stored(new))
        return new

    def delete(self, name: str, teams: Collection[str] | None = None) -> None:
        """Drain every instance, stop each after its requests (or the drain timeout), then
        forget the deployment."""
        now = self.service.clock()
        with self.service.store.session() as session, session.begin():
            row = self.row(session, name, teams)
            if not row.deleting:
                row.deleting = True
                session.add(row)
                event(session, now, name, "deleting: draining its instances")
        self.reconcile(name)

    # -- the loop ----------------------------------------------------------------------------

    def reconcile(self, only: str | None = None) -> None:
        """Plan every deployment (or `only` one) and carry the plans out."""
        with self._lock:
            with self.service.store.session() as session:
                names = [only] if only else list(session.scalars(select(Deployment.name)))
            for name in names:
                try:
                    self._reconcile_one(name)
                except Exception:
                    log.exception("reconciling deployment %s failed; retrying next tick", name)

    def _reconcile_one(self, name: str) -> None:
        now = self.service.clock()
        with self.service.store.session() as session:
            row = session.get(Deployment, name)
            if row is None:
                return
            spec = parse_deployment(row.spec)
            self.instances.discover(session, spec, now)
            seen = observed(session, name)
            scaled = self.loads.autoscale(spec, seen, slots_per_instance(session, spec), now)
            if scaled.note is not None:
                event(session, now, name, scaled.note)
                session.commit()
            versions = {} if row.deleting else spec.replicas_by_version(scaled.replicas)
            ready = self.loads.ready(name)
            # one more while a move's instance starts; none once deleting (every one drains)
            if not row.deleting and self.spread.moved(name, seen, ready):
                versions = {**versions, spec.version: versions[spec.version] + 1}
            want = Want(versions, spec.drain_timeout_s, spec.surge)
        held = self.loads.held(name, now)
        released = self.loads.released(name, seen)
        todo = plan(want, seen, now, self.instances.next_start(name), released, ready, held)
        self._carry_out(spec, todo, now)
        if not todo.changes and not row.deleting and not self.spread.moving(name):
            move = self.spread.ask(spec, seen, versions, ready)
            if move is not None:
                job_id = self.instances.start(spec, now, cluster=move.cluster, why=move.why)
                if job_id is not None:
                    self.spread.started(name, job_id)
        if row.deleting and not [i for i in seen if i.job_id not in todo.forget]:
            with self.service.store.session() as session, session.begin():
                session.execute(delete(Deployment).where(Deployment.name == name))
                event(session, now, name, "deleted: every instance has stopped")
            self.instances.forget(name)
            self.loads.forget(name)
            self.spread.forget(name)

    def _carry_out(self, spec: DeploymentSpec, todo: Plan, now: float) -> None:
        name = spec.name
        with self.service.store.session() as session, session.begin():
            for inst in todo.crashed:
                self.instances.crashed(session, spec, inst, now)
            for inst in todo.lost:
                row = session.get(DeploymentInstance, inst.job_id)
                if row is not None and row.draining_since is None:
                    row.draining_since = now  # it ended on purpose: not a crash next round
                event(
                    session,
                    now,
                    name,
                    f"instance {inst.job_id} ({inst.version}) lost: {inst.lost}; a replacement "
                    "starts elsewhere now",
                )
        for inst in todo.lost:
            self.service.abandon(inst.job_id, f"lost: {inst.lost}")
        with self.service.store.session() as session, session.begin():
            if todo.forget:
                session.execute(
                    delete(DeploymentInstance).where(DeploymentInstance.job_id.in_(todo.forget))
                )
            for job_id in todo.drain:
                row = session.get(DeploymentInstance, job_id)
                if row is not None and row.draining_since is None:
                    row.draining_since = now
                    event(session, now, name, f"draining {job_id} ({row.version})")
        for job_id in todo.stop:
            with contextlib.suppress(ConflictError):  # it ended meanwhile: forgotten next round
                self.service.cancel(job_id)
        if todo.start:
            with self.service.store.session() as session, session.begin():
                if self.instances.cannot_start(session, spec, now):
                    return
        for version, n in todo.start.items():
            for _ in range(n):
                self.instances.start(spec.of_version(version), now)

    def spec(
        self, session: Session, name: str, teams: Collection[str] | None = None
    ) -> DeploymentSpec:
        return parse_deployment(self.row(session, name, teams).spec)

    def row(self, session: Session, name: str, teams: Collection[str] | None = None) -> Deployment:
        """The deployment `name` of one of `teams` (None: any); another team's answers exactly
        as an unknown one, so names do not leak."""
        row = session.get(Deployment, name)
        if row is None or not _shown(row, teams):
            names = self.names(session, teams)
            raise NotFoundError(unknown_name("deployment", name, names))
        return row

    @staticmethod
    def names(session: Session, teams: Collection[str] | None = None) -> list[str]:
        """The deployments of `teams` (None: all), by name."""
        rows = session.scalars(select(Deployment).order_by(Deployment.name))
        return [d.name for d in rows if _shown(d, teams)]


def _shown(row: Deployment, teams: Collection[str] | None) -> bool:
    return teams is None or row.spec.get("team") in teams


def _stored(spec: DeploymentSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_none=True)
