"""The pool's clusters: registration, lifecycle (add, cordon, drain, remove) and health.

Two sources: gpuplane.yaml's `control.clusters`, registered at every start, and clusters added at
run time (`cluster add`, `POST /clusters`), whose settings are stored in the database (references
only: a kubeconfig path and context, an address; never credentials) and registered again at the
next start. A name in both: gpuplane.yaml's entry wins and the stored one is dropped (logged);
`cluster add` refuses a name that exists, and `cluster remove` refuses a cluster from the file.

Nothing new is placed on a cluster that is cordoned, draining or unreachable: its nodes stay in
the estate, with their jobs, but unschedulable (`inventory.load_estate`). Health is checked on
every tick: `adapter.reachable()` (the Kubernetes watch heard nothing for a sync interval), and
once a sync interval `adapter.inventory()` (an AdapterError: unreachable; a changed answer is
written to the store); between those, the nodes a watching adapter (Kubernetes) saw change are
written at each tick, and only they (`adapter.changes()`, `inventory.sync_nodes`). A cluster
that stops answering is marked unreachable: its jobs admitted but not yet bound are re-placed
elsewhere, its running jobs are left alone (shown `unknown`) and the binder neither binds nor
observes there. When it answers again its inventory is synced and
the next reconcile records what its jobs did meanwhile, and stops any copy of a job that was
re-placed elsewhere; nothing is run twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpuplane.control.adapters.base import (
    AdapterError,
    ClusterAdapter,
    Inventory,
    create_adapter,
)
from gpuplane.control.errors import ConflictError, NotFoundError
from gpuplane.control.oplog import job_event
from gpuplane.control.service.inventory import (
    check_cluster_name,
    remove_clusters_except,
    sync_cluster,
    sync_nodes,
)
from gpuplane.control.service.runtime import Binder
from gpuplane.control.settings import ClusterConfig, ControlConfig
from gpuplane.control.store.mirror import Mirror
from gpuplane.control.store.models import ACTIVE_STATES, Cluster, Job
from gpuplane.control.store.records import Records
from gpuplane.errors import ConfigError, unknown_name, user_message

log = logging.getLogger("gpuplane.control.service.clusters")

Factory = Callable[[ClusterConfig, ControlConfig], ClusterAdapter]


@dataclass(frozen=True, slots=True)
class Drained:
    """What `drain` did: jobs re-placed off the cluster, and jobs left to finish there."""

    requeued: list[str]
    running: list[str]


@dataclass(slots=True)
class Clusters:
    """The registered clusters of one service process: their adapters (shared with the binder)
    and their health. `control` carries this process's `service_id`, which adapters use to tell
    its workloads from other instances'."""

    control: ControlConfig
    binder: Binder
    mirror: Mirror
    records: Records
    clock: Callable[[], float]
    factory: Factory = create_adapter
    _probed: dict[str, float] = field(default_factory=dict)  # last inventory() per cluster
    _seen: dict[str, Inventory] = field(default_factory=dict)  # last written per cluster
    _followed: float = float("-inf")  # when the store's clusters were last read

    @property
    def adapters(self) -> dict[str, ClusterAdapter]:
        return self.binder.adapters

    @property
    def down(self) -> dict[str, str]:
        """Unreachable clusters of this process, and why."""
        return self.binder.down

    # -- registration --------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Register gpuplane.yaml's clusters (an error in one stops the start, as a bad config
        does) and the stored ones (one that does not answer is registered unreachable); forget
        clusters that are neither. Returns what each inventory came from."""
        with self.mirror.store.session() as session:
            stored = session.execute(
                select(Cluster.name, Cluster.settings).where(Cluster.source == "api")
            ).all()
        configured = {c.name for c in self.control.clusters}
        messages = [self._register(cluster, "config") for cluster in self.control.clusters]
        for name, settings in stored:
            if name in configured:
                log.warning(
                    "cluster %s was added with `cluster add` and is declared in gpuplane.yaml "
                    "too: gpuplane.yaml's entry is used, the stored one dropped",
                    name,
                )
                continue
            messages.append(self._restore(name, settings))
        keep = configured | {name for name, _ in stored}
        with self.mirror.locked() as (session, _):
            gone = remove_clusters_except(session, keep)
            self.mirror.invalidate()
        messages += [f"cluster {name} is no longer configured: removed" for name in gone]
        return messages

    def _restore(self, name: str, settings: dict[str, object]) -> str:
        try:
            cluster = ClusterConfig.model_validate(settings)
        except ValidationError as exc:
            why = (
                f"its stored settings are no longer valid ({user_message(exc.errors()[0])}); "
                f"`gpuplane cluster remove {name}` and add it again"
            )
            self._mark_down(name, why)
            return f"cluster {name}: {why}"
        return self._register(cluster, "api")

    def _register(self, cluster: ClusterConfig, source: str) -> str:
        """Create the cluster's adapter, read its inventory and write the cluster. An AdapterError
        is raised for a gpuplane.yaml cluster; a stored one is registered unreachable."""
        adapter = self.factory(cluster, self.control)
        self.adapters[cluster.name] = adapter
        try:
            inventory = adapter.inventory()
        except AdapterError as exc:
            if source == "config":
                raise
            self._mark_down(cluster.name, str(exc))
            return f"cluster {cluster.name} ({cluster.adapter}): unreachable: {exc}"
        self._write(cluster, adapter, inventory, source)
        return f"cluster {cluster.name} ({cluster.adapter}): {inventory.source}"

    def _write(
        self,
        cluster: ClusterConfig,
        adapter: ClusterAdapter,
        inventory: Inventory,
        source: str,
        event: str = "registered",
    ) -> None:
        now = self.clock()
        with self.mirror.locked() as (session, _):
            sync_cluster(
                session,
                cluster.name,
                cluster.adapter,
                dict(cluster.labels),
                cluster.region,
                inventory,
                now,
            )
            row = cluster_row(session, cluster.name)
            row.source, row.inventory, row.version = source, inventory.source, adapter.version()
            row.settings = _stored(cluster) if source == "api" else {}
            row.last_sync_at, row.unreachable, row.unreachable_since = now, None, None
            self.records.event(session, "cluster", f"{event}: {inventory.source}", cluster=row.name)
            self.mirror.invalidate()  # the inventory changed: rebuild the mirror next time
        self._seen[cluster.name] = inventory
        self._probed[cluster.name] = now
        self.down.pop(cluster.name, None)

    # -- lifecycle -----------------------------------------------------------------------------

    def add(self, cluster: ClusterConfig) -> str:
        """Register a cluster at run time and store it; refuses a name in use, an address with
        credentials in it, and a backend that does not answer or is on an unsupported version
        (the adapter's AdapterError says which, and what was tried)."""
        check_cluster_name(cluster.name)
        if cluster.address and urlsplit(cluster.address).password is not None:
            raise ConfigError(
                f"cluster {cluster.name}: the address carries a password; give the address "
                "without credentials (they are never stored)"
            )
        with self.mirror.store.session() as session:
            existing = session.get(Cluster, cluster.name)
        if existing is not None or cluster.name in self.adapters:
            source = existing.source if existing is not None else "config"
            how = "declared in gpuplane.yaml" if source == "config" else "added before"
            raise ConflictError(
                f"cluster {cluster.name} already exists ({how}); pick another name, or "
                f"`gpuplane cluster remove {cluster.name}` first"
            )
        adapter = self.factory(cluster, self.control)
        try:
            inventory = adapter.inventory()
        except BaseException:
            try:  # what it started (a watch); it holds no job
                adapter.close()
            except AdapterError as exc:
                log.warning("cluster %s was not added; closing its adapter: %s", cluster.name, exc)
            raise
        self.adapters[cluster.name] = adapter
        self._write(cluster, adapter, inventory, "api", "added")
        return inventory.source

    def cordon(self, name: str, *, cordoned: bool) -> None:
        """Cordon (nothing new is placed there; what runs stays) or uncordon (also ends a
        drain)."""
        with self.mirror.locked() as (session, _):
            row = cluster_row(session, name)
            row.cordoned = cordoned
            if not cordoned:
                row.draining = False
            what = "cordoned" if cordoned else "uncordoned"
            self.records.event(session, "cluster", what, cluster=name)
            self.mirror.invalidate()

    def drain(self, name: str, *, requeue: bool) -> Drained:
        """Cordon and drain: jobs admitted there but not yet bound are re-placed elsewhere now;
        running jobs finish there, or with `requeue` are stopped and requeued."""
        states = ("admitted", "running") if requeue else ("admitted",)
        why = f"requeued: cluster {name} is being drained"
        with self.mirror.locked() as (session, estate):
            row = cluster_row(session, name)
            row.cordoned, row.draining = True, True
            self.records.event(session, "cluster", "draining", cluster=name)
            moved = self._requeue(session, name, states, why)
            for job_id, _, _ in moved:
                estate.release(job_id)
            running = list(
                session.scalars(
                    select(Job.id).where(Job.cluster_name == name, Job.state == "running")
                )
            )
            self.mirror.invalidate()
        self.binder.stop_later([(name, job_id) for job_id, _, _ in moved])
        _log_requeued(moved, name, why)
        return Drained([job_id for job_id, _, _ in moved], running)

    def remove(self, name: str) -> None:
        """Forget a cluster added at run time. Refused for one declared in gpuplane.yaml and
        while it holds jobs (drain it first)."""
        with self.mirror.locked() as (session, _):
            row = cluster_row(session, name)
            if row.source == "config":
                raise ConflictError(
                    f"cluster {name} is declared in gpuplane.yaml (control.clusters); delete "
                    "it there and restart the control plane"
                )
            held = list(
                session.scalars(
                    select(Job.id).where(Job.cluster_name == name, Job.state.in_(ACTIVE_STATES))
                )
            )
            if held:
                shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
                raise ConflictError(
                    f"cluster {name} holds {len(held)} job(s) ({shown}); drain it first: "
                    f"`gpuplane cluster drain {name}` lets them finish (`--requeue` moves them "
                    "elsewhere now), then remove it"
                )
            session.delete(row)
            self.records.event(session, "cluster", "removed", cluster=name)
            self.mirror.invalidate()
        self._forget(name)

    def _forget(self, name: str) -> None:
        adapter = self.adapters.pop(name, None)
        self.down.pop(name, None)
        self._seen.pop(name, None)
        self._probed.pop(name, None)
        if adapter is not None:
            adapter.close()  # its watches; it holds no job (strays are stopped)

    # -- health --------------------------------------------------------------------------------

    def check(self) -> None:
        """One health round (the service's tick): once a sync interval (the shortest of the
        clusters') follow clusters added or removed by another service process; then probe each
        cluster, marking it unreachable or back."""
        now = self.clock()
        interval = min((a.cluster.sync_interval_s for a in self.adapters.values()), default=30.0)
        if now - self._followed >= interval:
            self._followed = now
            self._follow_store()
        for name, adapter in list(self.adapters.items()):
            up, why = adapter.reachable()
            inventory = None
            due = now - self._probed.get(name, float("-inf")) >= adapter.cluster.sync_interval_s
            if up and due:  # a down one too: a call that hangs holds up the tick, so not often
                self._probed[name] = now
                try:
                    inventory = adapter.inventory()
                except AdapterError as exc:
                    up, why = False, str(exc)
            if not up:
                if name not in self.down:
                    self._mark_down(name, why or "it did not answer")
            elif inventory is not None and (name in self.down or inventory != self._seen.get(name)):
                event = "back" if name in self.down else "synced"
                self._write(adapter.cluster, adapter, inventory, _source(self, name), event)
                if event == "back":
                    log.info("cluster %s answers again: %s", name, inventory.source)
            elif inventory is not None:  # unchanged: only when it last answered
                with self.mirror.store.session() as session, session.begin():
                    session.execute(
                        update(Cluster).where(Cluster.name == name).values(last_sync_at=now)
                    )
            elif name not in self.down:
                self._apply_changes(name, adapter)

    def _apply_changes(self, name: str, adapter: ClusterAdapter) -> None:
        """Write the nodes a watching adapter saw change since the last tick (`changes()`),
        and only those; None (an adapter that does not watch, or one that relisted) leaves it to
        the whole-inventory probe once a sync interval."""
        try:
            change = adapter.changes()
        except AdapterError as exc:  # the next reachable() or probe says so
            log.debug("cluster %s: no changes read: %s", name, exc)
            return
        if change is None or not (change.nodes or change.gone):
            return
        with self.mirror.locked() as (session, _):
            sync_nodes(session, name, change)
            self.mirror.invalidate()

    def _follow_store(self) -> None:
        with self.mirror.store.session() as session:
            rows = session.execute(select(Cluster.name, Cluster.source, Cluster.settings)).all()
        for name in [n for n in self.adapters if n not in {r.name for r in rows}]:
            self._forget(name)  # removed by another service process
        for row in rows:
            if row.source == "api" and row.name not in self.adapters and row.name not in self.down:
                self._restore(row.name, row.settings)

    def _mark_down(self, name: str, why: str) -> None:
        """Record stored cluster `name` unreachable and re-place its jobs that wait to be bound
        there."""
        now = self.clock()
        message = f"re-placed: cluster {name} is unreachable ({why})"
        with self.mirror.locked() as (session, estate):
            row = cluster_row(session, name)
            row.unreachable, row.unreachable_since = why[:2000], now
            self.records.event(session, "cluster", f"unreachable: {why}", cluster=name)
            moved = self._requeue(session, name, ("admitted",), message)
            for job_id, _, _ in moved:
                estate.release(job_id)
            self.mirror.invalidate()
        self.down[name] = why
        log.warning("cluster %s is unreachable: %s", name, why)
        _log_requeued(moved, name, message)

    def _requeue(
        self, session: Session, name: str, states: tuple[str, ...], why: str
    ) -> list[tuple[str, str | None, str]]:
        ids = list(
            session.scalars(select(Job.id).where(Job.cluster_name == name, Job.state.in_(states)))
        )
        return self.records.requeue(session, ids, why, "requeued", why)


def cluster_row(session: Session, name: str) -> Cluster:
    """Cluster `name`, or NotFoundError naming the nearest and how to list them."""
    row = session.get(Cluster, name)
    if row is None:
        names = session.scalars(select(Cluster.name))
        raise NotFoundError(
            unknown_name("cluster", name, names) + "; list them with `gpuplane cluster list`"
        )
    return row


def _source(clusters: Clusters, name: str) -> str:
    configured = {c.name for c in clusters.control.clusters}
    return "config" if name in configured else "api"


def _stored(cluster: ClusterConfig) -> dict[str, object]:
    """What is stored of a cluster added at run time: its settings that differ from the
    defaults (references: a kubeconfig path and context, an address; no credentials)."""
    return cluster.model_dump(mode="json", exclude_defaults=True) | {"name": cluster.name}


def _log_requeued(moved: list[tuple[str, str | None, str]], cluster: str, why: str) -> None:
    for job_id, _, team in moved:
        job_event("requeued", job_id, team=team, cluster=cluster, reason=why, state="pending")
