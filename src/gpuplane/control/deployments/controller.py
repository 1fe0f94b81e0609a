"""The deployment controller: the shell around the reconciler (`reconcile.py`) in the service.

It stores deployments, and on every service tick (and right after an apply, scale or delete)
plans each one and carries the plan out through the service's own job paths: an instance is
started by submitting its job (quotas, packing and pending reasons are the scheduler's), and
stopped by cancelling it. A crashed instance's version waits out a doubling back-off (the
supervisor's `Backoff`) before its replacement starts; one that ended before this process
started (stopped with the previous one: `up`, `control serve --stop-jobs`) is replaced at once.
An instance lost with its cluster (which stopped answering) is recorded ended without asking it
(`abandon`: its quota is freed), drains, and is replaced elsewhere at once; once a settled
deployment's instances could be spread better (the lost or full cluster has room again), one
moves back, make before break (`_respread`). An instance of a
spec without `max_concurrency` has its slots read from its engine once it answers
(`read_capacity`). An instance's address is its cluster's to give (`instance_url`): on a
`local` cluster the loopback port its engine was started on; on Kubernetes the URL KServe reports
once its InferenceService is Ready; so it is learnt once the job runs, and a spec that could be
placed on a cluster that cannot run instances (its adapter's `serving_refusal`) is refused at
apply. `endpoints()` is what the gateway watches: per deployment, its instances whose job runs,
whose address and slots are known and which do not drain, with a resource version that changes
exactly when that list does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpuplane.control.adapters.base import AdapterError, ClusterAdapter
from gpuplane.control.adapters.local import ENGINE_HOST
from gpuplane.control.deployments.autoscale import STALE_S, Load, Window, decide
from gpuplane.control.deployments.reconcile import Instance, Plan, Want, plan
from gpuplane.control.deployments.spec import DeploymentSpec, parse_deployment
from gpuplane.control.errors import ConflictError, InfeasibleJobError, NotFoundError
from gpuplane.control.models import (
    Cluster,
    Deployment,
    DeploymentEvent,
    DeploymentInstance,
    Job,
)
from gpuplane.control.oplog import log
from gpuplane.control.settings import ControlConfig
from gpuplane.control.spec import SpecError
from gpuplane.control.store import Store
from gpuplane.engines.backoff import Backoff
from gpuplane.engines.base import adapter_class
from gpuplane.errors import ConfigError, unknown_name

RESTART_BACKOFF_S = 1.0  # the first pause before a crashed instance's replacement; doubles
CAPACITY_TIMEOUT_S = 2.0  # an engine that does not answer its info route within this: next tick


def read_capacity(url: str, engine: str) -> tuple[int, str] | None:
    """The slots an engine at `url` runs at once, and how they were learnt: what it reports at
    its adapter's `info_path`, else the adapter's default when it answers without them. None
    while it does not answer (still starting): ask again next tick."""
    adapter = adapter_class(engine)()
    if adapter.info_path is None:
        return adapter.default_capacity, f"the {engine} default (it has no info route)"
    try:
        response = httpx.get(url + adapter.info_path, timeout=CAPACITY_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if response.status_code >= 500:
        return None
    try:
        info = response.json() if response.is_success else None
    except ValueError:
        info = None
    found = adapter.parse_capacity(info) if isinstance(info, dict) else None
    if found is not None:
        return found, f"reported by its engine at {adapter.info_path}"
    if response.status_code == 404:  # a server without the route (llama-cpp-python's)
        return adapter.default_capacity, f"the {engine} default (its server reports none)"
    return adapter.default_capacity, (
        f"the {engine} default ({adapter.info_path} answered {response.status_code} without "
        "them; set max_concurrency to be sure)"
    )


def free_port(host: str = ENGINE_HOST) -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class JobService(Protocol):
    """What the controller uses of the service (`ControlService`): its config, store, clock
    and cluster adapters, and its job paths."""

    config: ControlConfig
    store: Store
    clock: Callable[[], float]

    @property
    def adapters(self) -> Mapping[str, ClusterAdapter]: ...

    def submit(self, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]: ...

    def cancel(self, ref: str) -> str: ...

    def abandon(self, job_id: str, why: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Report:
    """One gateway's last load report for one model: the load, its ready instances, and the
    leases it holds per instance it still has (draining ones included)."""

    load: Load
    ready: int
    held: Mapping[str, int]
    ready_ids: tuple[str, ...] = ()


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
        self,
        service: JobService,
        *,
        port: Callable[[], int] = free_port,
        capacity: Callable[[str, str], tuple[int, str] | None] = read_capacity,
    ) -> None:
        """`port` picks an instance's port; `capacity(url, engine)` reads its engine's slots."""
        self.service = service
        self._port = port
        self._capacity = capacity
        self._lock = threading.RLock()
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._next_start: dict[tuple[str, str], float] = {}
        # autoscaled deployments: the gateways' last reports (by gateway), and the replicas
        # wanted now with when that last changed, and the reports of the last cooldown acted on
        self._loads: dict[str, dict[str, Report]] = {}
        self._loads_lock = threading.Lock()  # reports arrive on the API's threads
        self._scaled: dict[str, tuple[int, float | None]] = {}
        self._windows: dict[str, Window] = {}
        # deployment -> the instance started to restore its spread, until it serves
        self._moving: dict[str, str] = {}
        self._waiting: dict[str, str] = {}  # deployment -> why none of its instances can start
        self._since = service.clock()  # an instance that ended before this did no crash here

    # -- commands ----------------------------------------------------------------------------

    def apply(
        self, data: Any, *, dry_run: bool = False, teams: Collection[str] | None = None
    ) -> Applied:
        """Create or change a deployment; refuse a spec that can never be served here. `teams`:
        the teams whose deployments the caller may change (None: all)."""
        spec = parse_deployment(data, self.service.config.default_team)
        self._require_servable(spec)
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
            _event(
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
            _event(session, self.service.clock(), name, f"{verb} (was {weights})")
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
                _event(session, now, name, "deleting: draining its instances")
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
            self._discover(session, spec, now)
            seen = self._instances(session, name)
            replicas = self._autoscale(session, spec, seen, now)
            versions = {} if row.deleting else spec.replicas_by_version(replicas)
            ready = self.ready(name)
            if self._moved(name, seen, ready):  # one more while the move's instance starts
                versions = {**versions, spec.version: versions[spec.version] + 1}
            want = Want(versions, spec.drain_timeout_s, spec.surge)
        next_start = {v: t for (d, v), t in self._next_start.items() if d == name}
        held = self._held(name, now)
        todo = plan(want, seen, now, next_start, self._released(name, seen), ready, held)
        self._carry_out(spec, todo, now)
        if not todo.changes and not row.deleting and name not in self._moving:
            self._respread(spec, seen, versions, ready, now)
        if row.deleting and not [i for i in seen if i.job_id not in todo.forget]:
            with self.service.store.session() as session, session.begin():
                session.execute(delete(Deployment).where(Deployment.name == name))
                _event(session, now, name, "deleted: every instance has stopped")
            for key in [k for k in self._backoff if k[0] == name]:
                self._backoff.pop(key)
                self._next_start.pop(key, None)
            with self._loads_lock:
                self._loads.pop(name, None)
            self._scaled.pop(name, None)
            self._windows.pop(name, None)
            self._moving.pop(name, None)
            self._waiting.pop(name, None)

    def _discover(self, session: Session, spec: DeploymentSpec, now: float) -> None:
        """Learn where each running instance answers, once its cluster knows (at once on a
        local cluster; once KServe reports it Ready on Kubernetes), then read the slots of
        those whose engine has not reported them yet."""
        rows = session.execute(
            select(DeploymentInstance, Job)
            .join(Job, Job.id == DeploymentInstance.job_id)
            .where(
                DeploymentInstance.deployment == spec.name,
                DeploymentInstance.capacity.is_(None) | DeploymentInstance.url.is_(None),
                DeploymentInstance.draining_since.is_(None),
                Job.state == "running",
            )
        ).all()
        for row, job in rows:
            if row.url is None:
                row.url = self._address(job)
                if row.url is None:
                    continue
                session.add(row)
                _event(session, now, spec.name, f"{row.job_id} answers at {row.url}")
                session.commit()
            if row.capacity is not None:
                continue
            found = self._capacity(row.url, spec.engine)
            if found is None:
                continue
            row.capacity, how = found
            session.add(row)
            _event(session, now, spec.name, f"{row.job_id} runs {row.capacity} slot(s): {how}")
            session.commit()

    def _address(self, job: Job) -> str | None:
        """Where the instance of `job` answers, as its cluster's adapter knows it (None: not
        yet, or the cluster does not answer now: asked again next tick)."""
        adapter = self.service.adapters.get(job.cluster_name or "")
        serve = job.spec.get("serve")
        if adapter is None or serve is None:  # (an instance started before `serve` has its url)
            return None
        try:
            return adapter.instance_url(job.id, int(serve["port"]))
        except AdapterError as exc:
            log.warning("the address of instance %s: %s; asked again next tick", job.id, exc)
            return None

    def slots_per_instance(self, session: Session, spec: DeploymentSpec) -> int:
        """The slots of one instance of the main version: the fewest its instances report,
        else the spec's `capacity()`."""
        known = session.scalars(
            select(DeploymentInstance.capacity).where(
                DeploymentInstance.deployment == spec.name,
                DeploymentInstance.version == spec.version,
                DeploymentInstance.capacity.is_not(None),
                DeploymentInstance.draining_since.is_(None),
            )
        ).all()
        return min((c for c in known if c is not None), default=spec.capacity())

    # -- autoscaling -------------------------------------------------------------------------

    def report(self, gateway: str, models: Iterable[Mapping[str, Any]]) -> None:
        """A gateway's slot use per model (`POST /deployments/load`): in flight, queued, the
        oldest queued request's wait, how long it has been idle, and its ready instances."""
        now = self.service.clock()
        for m in models:
            load = Load(
                int(m["in_flight"]),
                int(m["queued"]),
                float(m["oldest_wait_s"]),
                now,
                float(m["idle_s"]),
            )
            held = {str(k): int(v) for k, v in m["instances"].items()}
            with self._loads_lock:
                self._loads.setdefault(str(m["name"]), {})[gateway] = Report(
                    load, int(m["ready"]), held, tuple(str(i) for i in m["ready_ids"])
                )

    def _fresh(self, name: str, now: float) -> list[Report]:
        with self._loads_lock:
            reports = list(self._loads.get(name, {}).values())
        return [r for r in reports if now - r.load.at <= STALE_S]

    def in_use(self, name: str, job_id: str) -> int | None:
        """Slots the reporting gateways hold on the instance (None: no gateway reports)."""
        held = self._held(name, self.service.clock())
        return None if held is None else held.get(job_id, 0)

    def _held(self, name: str, now: float) -> dict[str, int] | None:
        """Slots the reporting gateways hold on each of `name`'s instances (None: no gateway
        reports)."""
        fresh = self._fresh(name, now)
        if not fresh:
            return None
        out: dict[str, int] = {}
        for r in fresh:
            for job_id, slots in r.held.items():
                out[job_id] = out.get(job_id, 0) + slots
        return out

    def ready(self, name: str) -> set[str] | None:
        """The instances every reporting gateway admits to (None: no gateway reports)."""
        fresh = self._fresh(name, self.service.clock())
        if not fresh:
            return None
        return set.intersection(*(set(r.ready_ids) for r in fresh))

    def _released(self, name: str, seen: list[Instance]) -> set[str]:
        """Draining instances that every gateway reporting since the drain began no longer
        holds: each removed it at its last lease's release (or never had it)."""
        out = set()
        now = self.service.clock()
        for inst in seen:
            if inst.draining_since is None:
                continue
            since = [r for r in self._fresh(name, now) if r.load.at > inst.draining_since]
            if since and all(inst.job_id not in r.held for r in since):
                out.add(inst.job_id)
        return out

    def replicas(self, spec: DeploymentSpec) -> int:
        """The replicas wanted now: the autoscaler's for a `scaling` spec, else `replicas`."""
        scaled = self._scaled.get(spec.name)
        return spec.desired if scaled is None or spec.scaling is None else scaled[0]

    def _autoscale(
        self, session: Session, spec: DeploymentSpec, seen: list[Instance], now: float
    ) -> int:
        rules = spec.rules(self.slots_per_instance(session, spec))
        if rules is None:
            return spec.desired
        versions = {spec.version} | {c.version for c in spec.canary}  # sized together
        live = [
            i for i in seen if i.version in versions and not i.ended and i.draining_since is None
        ]
        wanted, changed = self._scaled.get(spec.name, (max(len(live), rules.min), None))
        fresh = self._fresh(spec.name, now)
        load = None
        serving = sum(i.running for i in live)
        window = self._windows.get(spec.name)
        if window is None or window.span_s != rules.cooldown_s:
            window = self._windows[spec.name] = Window(rules.cooldown_s)
        if fresh:  # every gateway sees the same instances: sum their requests
            load = Load(
                sum(r.load.in_flight for r in fresh),
                sum(r.load.queued for r in fresh),
                max(r.load.oldest_wait_s for r in fresh),
                min(r.load.at for r in fresh),
                min(r.load.idle_s for r in fresh),
            )
            serving = min(serving, *(r.ready for r in fresh))
            window.add(load)
        new = decide(rules, wanted, serving, window, now, changed)
        if new != wanted:
            busy = (
                ""
                if load is None
                else f": no request for {load.idle_s:.0f} s"
                if new == 0
                else (
                    f": {load.in_flight} slot(s) held of {serving * rules.slots_per_instance}, "
                    f"{load.queued} queued (oldest {load.oldest_wait_s:.1f} s)"
                )
            )
            _event(session, now, spec.name, f"autoscaled from {wanted} to {new} replica(s){busy}")
            session.commit()
            changed = now
        self._scaled[spec.name] = (new, changed)
        return new

    def _moved(self, name: str, seen: list[Instance], ready: set[str] | None) -> bool:
        """Whether a move of `name`'s (`_respread`) is under way: its instance was placed and
        does not serve yet. Once it serves, or when it could not be placed at once (pending),
        ended or was lost, the move is over: the reconciler's surplus rule then drains one
        instance from the most crowded cluster (or the move's own, when it never ran)."""
        job_id = self._moving.get(name)
        inst = next((i for i in seen if i.job_id == job_id), None)
        under_way = (
            inst is not None
            and inst.job_state in ("admitted", "running")
            and inst.lost is None
            and inst.draining_since is None
            and not (inst.running and (ready is None or inst.job_id in ready))
        )
        if not under_way:
            self._moving.pop(name, None)
        return under_way

    def _respread(
        self,
        spec: DeploymentSpec,
        seen: list[Instance],
        versions: Mapping[str, int],
        ready: set[str] | None,
        now: float,
    ) -> None:
        """Move one instance back where the spread was lost (a cluster that was lost, or full,
        has room again): when the deployment is settled (one version, all its instances
        serving, none draining) and the scheduler would place one more instance now, without
        preempting, on a cluster holding at least two fewer of them than the most crowded one,
        start it there (make before break: the one it replaces drains once it serves). Ask
        (a dry run, nothing written), then commit."""
        live = [i for i in seen if not i.ended]
        settled = list(versions) == [spec.version] and len(live) == versions[spec.version]
        if not settled or len(live) < 2:
            return
        if any(
            i.draining_since is not None
            or i.version != spec.version
            or not i.running
            or (ready is not None and i.job_id not in ready)
            for i in live
        ):
            return
        crowd = Counter(i.cluster for i in live)
        if max(crowd.values()) < 2:
            return  # one at most per cluster: already spread (no query each tick)
        with self.service.store.session() as session:
            open_clusters = session.scalars(
                select(Cluster.name).where(Cluster.unreachable.is_(None), ~Cluster.cordoned)
            ).all()
        if all(crowd[c] + 2 > max(crowd.values()) for c in open_clusters):
            return  # no cluster could improve it: no dry run
        # a dry run: where one more would go (its port does not matter)
        answer = self.service.submit(spec.to_job(ENGINE_HOST, 1), dry_run=True)
        target = answer.get("cluster")
        if not answer["fits"] or answer.get("preempts") or target is None:
            return
        if crowd[target] + 2 > max(crowd.values()):
            return  # no better spread there
        fullest, holds = crowd.most_common(1)[0]
        job_id = self._start(
            spec,
            now,
            cluster=target,
            why=f"to restore the spread: cluster {fullest} holds {holds} of {len(live)}",
        )
        if job_id is not None:
            self._moving[spec.name] = job_id

    def _carry_out(self, spec: DeploymentSpec, todo: Plan, now: float) -> None:
        name = spec.name
        with self.service.store.session() as session, session.begin():
            for inst in todo.crashed:
                self._crashed(session, spec, inst, now)
            for inst in todo.lost:
                row = session.get(DeploymentInstance, inst.job_id)
                if row is not None and row.draining_since is None:
                    row.draining_since = now  # it ended on purpose: not a crash next round
                _event(
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
                    _event(session, now, name, f"draining {job_id} ({row.version})")
        for job_id in todo.stop:
            with contextlib.suppress(ConflictError):  # it ended meanwhile: forgotten next round
                self.service.cancel(job_id)
        if todo.start:
            with self.service.store.session() as session, session.begin():
                if self._cannot_start(session, spec, now):
                    return
        for version, n in todo.start.items():
            for _ in range(n):
                self._start(spec.of_version(version), now)

    def _crashed(self, session: Session, spec: DeploymentSpec, inst: Instance, now: float) -> None:
        job = session.get(Job, inst.job_id)
        why = job.message if job is not None and job.message else inst.job_state
        if job is not None and job.finished_at is not None and job.finished_at < self._since:
            # stopped with an earlier control plane process (`control serve --stop-jobs`, `up`):
            # no crash loop to slow down, so its replacement starts now
            _event(
                session,
                now,
                spec.name,
                f"instance {inst.job_id} ({inst.version}) ended before this control plane "
                f"started ({why}); a replacement starts now",
            )
            return
        up = 0.0
        if job is not None and job.started_at is not None:
            up = (job.finished_at or now) - job.started_at
        key = (spec.name, inst.version)
        backoff = self._backoff.setdefault(key, Backoff(RESTART_BACKOFF_S))
        pause = backoff.after_exit(up)
        self._next_start[key] = now + pause
        _event(
            session,
            now,
            spec.name,
            f"instance {inst.job_id} ({inst.version}) ended unasked ({why}); a replacement "
            f"starts in {pause:g} s",
        )

    def _start(
        self, spec: DeploymentSpec, now: float, cluster: str | None = None, why: str = ""
    ) -> str | None:
        """Start one instance of `spec`'s version (on `cluster` when given); its job id, or
        None when it cannot start (an event says why)."""
        port = self._port()
        job = spec.to_job(ENGINE_HOST, port)
        if cluster is not None:
            job["selector"] = {**job["selector"], "cluster": cluster}
        try:
            job_id = str(self.service.submit(job)["id"])
        except (InfeasibleJobError, NotFoundError, SpecError) as exc:
            with self.service.store.session() as session, session.begin():
                _event(session, now, spec.name, f"cannot start an instance: {exc}")
            return None
        with self.service.store.session() as session, session.begin():
            session.add(
                DeploymentInstance(
                    job_id=job_id,
                    deployment=spec.name,
                    version=spec.version,
                    url=None,  # known once it runs, from its cluster (`_discover`)
                    capacity=None if spec.discovers_capacity else spec.capacity(),
                    created_at=now,
                )
            )
            where = f" on cluster {cluster}" if cluster is not None else ""
            because = f" {why}" if why else ""
            _event(session, now, spec.name, f"started {job_id} ({spec.version}){where}{because}")
        return job_id

    # -- reads -------------------------------------------------------------------------------

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

    @staticmethod
    def _instances(session: Session, name: str) -> list[Instance]:
        rows = session.execute(
            select(DeploymentInstance, Job.state, Job.cluster_name, Cluster.unreachable)
            .join(Job, Job.id == DeploymentInstance.job_id, isouter=True)
            .join(Cluster, Cluster.name == Job.cluster_name, isouter=True)
            .where(DeploymentInstance.deployment == name)
            .order_by(DeploymentInstance.created_at)
        ).all()
        return [
            Instance(
                r.job_id,
                r.version,
                state or "cancelled",
                r.created_at,
                r.draining_since,
                # a running job where the control plane no longer reaches: lost with its node
                f"cluster {cluster} stopped answering ({down})"
                if state == "running" and down
                else None,
                cluster,
            )
            for r, state, cluster, down in rows
        ]

    def endpoints(self) -> dict[str, Any]:
        """What the gateway watches: every deployment's instances that serve (job running,
        slots known, not draining) with their version, its versions' weights during a rollout,
        whether the gateway holds its requests while none is ready (`hold`: the control plane
        starts or replaces them; not once it is being deleted) and for how long (`hold_s`, None:
        the gateway's queue timeout), and `resource_version`, a digest of all that."""
        with self.service.store.session() as session:
            rows = session.execute(
                select(DeploymentInstance, Deployment.spec)
                .join(Deployment, Deployment.name == DeploymentInstance.deployment)
                .join(Job, Job.id == DeploymentInstance.job_id)
                .where(
                    Job.state == "running",
                    DeploymentInstance.capacity.is_not(None),
                    DeploymentInstance.url.is_not(None),
                    DeploymentInstance.draining_since.is_(None),
                )
                .order_by(DeploymentInstance.deployment, DeploymentInstance.job_id)
            ).all()
            names = session.execute(
                select(Deployment.spec, Deployment.deleting).order_by(Deployment.name)
            ).all()
        models: dict[str, dict[str, Any]] = {
            s["name"]: {
                "name": s["name"],
                "engine": s["engine"],
                "upstream_model": s["model"],
                "weights": spec.weights(),
                "hold": not deleting,
                "hold_s": spec.hold_s,
                "instances": [],
            }
            for s, deleting in names
            for spec in (DeploymentSpec.model_validate(s),)
        }
        for inst, spec in rows:
            models[spec["name"]]["instances"].append(
                {
                    "id": inst.job_id,
                    "url": inst.url,
                    "capacity": inst.capacity,
                    "version": inst.version,
                }
            )
        body = list(models.values())
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
        return {"resource_version": digest, "models": body}

    def _require_servable(self, spec: DeploymentSpec) -> None:
        """Refuse a placement that could land on a cluster that cannot run an instance the
        gateway reaches (its adapter's `serving_refusal`: e.g. a Kubernetes cluster without
        KServe, a Ray cluster), naming the clusters that can."""
        candidates, refusals = self._refusals(spec)
        if refusals:
            able = sorted(c for c in candidates if c not in refusals)
            raise SpecError(
                f"deployment {spec.name} could be placed on cluster(s) "
                f"{', '.join(sorted(refusals))}, which cannot run its instances: "
                + "; ".join(refusals.values())
                + "; set placement.cluster"
                + (f" to one of: {', '.join(able)}" if able else " to a cluster that can")
            )

    def _refusals(self, spec: DeploymentSpec) -> tuple[list[str], dict[str, str]]:
        """The clusters `spec`'s placement selects, and why each that cannot run its instances
        cannot (its adapter's `serving_refusal`)."""
        clusters = self.service.config.clusters
        sel = spec.placement
        candidates = [
            c.name
            for c in clusters
            if (sel.cluster is None or c.name == sel.cluster)
            and (sel.region is None or c.region == sel.region)
        ]
        if sel.cluster is not None and not candidates:
            raise SpecError(
                "invalid deployment spec: placement.cluster: "
                + unknown_name("cluster", sel.cluster, {c.name for c in clusters})
            )
        refusals: dict[str, str] = {}
        for name in candidates:
            adapter = self.service.adapters.get(name)
            try:
                why = "it is not connected" if adapter is None else adapter.serving_refusal()
            except AdapterError as exc:
                why = str(exc)
            if why is not None:
                refusals[name] = why
        return candidates, refusals

    def _cannot_start(self, session: Session, spec: DeploymentSpec, now: float) -> bool:
        """Whether no cluster `spec` could be placed on can run its instances now (a stored
        deployment whose job user cannot run this Python, say): starting one would only crash.
        Says why once, in its events (`deploy describe`), until the reason changes; it is asked
        again on each tick, so the deployment starts once the cause is fixed."""
        try:
            candidates, refusals = self._refusals(spec)
        except SpecError as exc:
            why = str(exc)
        else:
            why = "; ".join(refusals.values()) if len(refusals) == len(candidates) else ""
        if not why:
            self._waiting.pop(spec.name, None)
            return False
        if self._waiting.get(spec.name) != why:
            self._waiting[spec.name] = why
            _event(session, now, spec.name, f"waiting: no instance can start: {why}")
        return True


def _shown(row: Deployment, teams: Collection[str] | None) -> bool:
    return teams is None or row.spec.get("team") in teams


def _stored(spec: DeploymentSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_none=True)


def _event(session: Session, now: float, name: str, message: str) -> None:
    session.add(DeploymentEvent(at=now, deployment=name, message=message))
    log.info("deployment %s: %s", name, message, extra={"event": "deployment", "deployment": name})
