"""A deployment's instances as jobs of the service: started, found, read and paced.

An instance is started by submitting its job (quotas, packing and pending reasons are the
scheduler's). A crashed instance's version waits out a doubling back-off (the supervisor's
`Backoff`) before its replacement starts; one that ended before this process started (stopped
with the previous one: `up`, `control serve --stop-jobs`) is replaced at once. An instance's
address is its cluster's to give (`instance_url`): on a `local` cluster the loopback port its
engine was started on; on Kubernetes the URL KServe reports once its InferenceService is Ready;
so it is learnt once the job runs (`discover`). An instance of a spec without
`max_concurrency` has its slots read from its engine once it answers (`read_capacity`). A spec
that could be placed on a cluster that cannot run instances (its adapter's `serving_refusal`)
is refused. `Instances` holds the back-offs and what each deployment waits for; it knows no
controller.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuplane.control.adapters.base import AdapterError, ClusterAdapter
from gpuplane.control.adapters.local import ENGINE_HOST
from gpuplane.control.deployments.reconcile import Instance
from gpuplane.control.deployments.spec import DeploymentSpec
from gpuplane.control.errors import InfeasibleJobError, NotFoundError
from gpuplane.control.oplog import log
from gpuplane.control.settings import ControlConfig
from gpuplane.control.spec import SpecError
from gpuplane.control.store.models import Cluster, DeploymentEvent, DeploymentInstance, Job
from gpuplane.control.store.store import Store
from gpuplane.engines.backoff import Backoff
from gpuplane.engines.base import adapter_class
from gpuplane.errors import unknown_name

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
    """What the deployments use of the service (`ControlService`): its config, store, clock
    and cluster adapters, and its job paths."""

    config: ControlConfig
    store: Store
    clock: Callable[[], float]

    @property
    def adapters(self) -> Mapping[str, ClusterAdapter]: ...

    def submit(self, data: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]: ...

    def cancel(self, ref: str) -> str: ...

    def abandon(self, job_id: str, why: str) -> bool: ...


def event(session: Session, now: float, name: str, message: str) -> None:
    """Record one of deployment `name`'s events (`deploy describe`), and log it."""
    session.add(DeploymentEvent(at=now, deployment=name, message=message))
    log.info("deployment %s: %s", name, message, extra={"event": "deployment", "deployment": name})


def observed(session: Session, name: str) -> list[Instance]:
    """Deployment `name`'s instances as the reconciler sees them, oldest first: their jobs'
    states, and whether the cluster each runs on stopped answering (lost)."""
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


def slots_per_instance(session: Session, spec: DeploymentSpec) -> int:
    """The slots of one instance of the main version: the fewest its instances report, else
    the spec's `capacity()`."""
    known = session.scalars(
        select(DeploymentInstance.capacity).where(
            DeploymentInstance.deployment == spec.name,
            DeploymentInstance.version == spec.version,
            DeploymentInstance.capacity.is_not(None),
            DeploymentInstance.draining_since.is_(None),
        )
    ).all()
    return min((c for c in known if c is not None), default=spec.capacity())


class Instances:
    """Starts instances and learns where they answer; paces the replacement of crashed ones;
    says once why none can start. Called by the controller under its lock."""

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
        self._backoff: dict[tuple[str, str], Backoff] = {}
        self._next_start: dict[tuple[str, str], float] = {}
        self._waiting: dict[str, str] = {}  # deployment -> why none of its instances can start
        self._since = service.clock()  # an instance that ended before this did no crash here

    def next_start(self, name: str) -> dict[str, float]:
        """Per version of `name`, the earliest its next instance may start (its back-off)."""
        return {v: t for (d, v), t in self._next_start.items() if d == name}

    def forget(self, name: str) -> None:
        """Drop what is held of a deleted deployment. Idempotent."""
        for key in [k for k in self._backoff if k[0] == name]:
            self._backoff.pop(key)
            self._next_start.pop(key, None)
        self._waiting.pop(name, None)

    def discover(self, session: Session, spec: DeploymentSpec, now: float) -> None:
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
                event(session, now, spec.name, f"{row.job_id} answers at {row.url}")
                session.commit()
            if row.capacity is not None:
                continue
            found = self._capacity(row.url, spec.engine)
            if found is None:
                continue
            row.capacity, how = found
            session.add(row)
            event(session, now, spec.name, f"{row.job_id} runs {row.capacity} slot(s): {how}")
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

    def crashed(self, session: Session, spec: DeploymentSpec, inst: Instance, now: float) -> None:
        """Record that `inst` ended unasked, and when its version's replacement may start: now
        when it ended before this process started, else after its back-off."""
        job = session.get(Job, inst.job_id)
        why = job.message if job is not None and job.message else inst.job_state
        if job is not None and job.finished_at is not None and job.finished_at < self._since:
            # stopped with an earlier control plane process (`control serve --stop-jobs`, `up`):
            # no crash loop to slow down, so its replacement starts now
            event(
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
        event(
            session,
            now,
            spec.name,
            f"instance {inst.job_id} ({inst.version}) ended unasked ({why}); a replacement "
            f"starts in {pause:g} s",
        )

    def start(
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
                event(session, now, spec.name, f"cannot start an instance: {exc}")
            return None
        with self.service.store.session() as session, session.begin():
            session.add(
                DeploymentInstance(
                    job_id=job_id,
                    deployment=spec.name,
                    version=spec.version,
                    url=None,  # known once it runs, from its cluster (`discover`)
                    capacity=None if spec.discovers_capacity else spec.capacity(),
                    created_at=now,
                )
            )
            where = f" on cluster {cluster}" if cluster is not None else ""
            because = f" {why}" if why else ""
            event(session, now, spec.name, f"started {job_id} ({spec.version}){where}{because}")
        return job_id

    def require_servable(self, spec: DeploymentSpec) -> None:
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

    def cannot_start(self, session: Session, spec: DeploymentSpec, now: float) -> bool:
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
            event(session, now, spec.name, f"waiting: no instance can start: {why}")
        return True
