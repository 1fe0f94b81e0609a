"""Inventory: clusters, nodes and devices between adapters, the store and the scheduler snapshot.

`sync_cluster` writes what an adapter reports into the store (upsert by name; a node or card that
disappeared is removed unless a job still holds it). `load_estate` reads the store back into the
scheduler's `Snapshot` (node names qualified as `cluster/node`), the quota book and the admitted
jobs, which is what an admission pass works on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, selectinload

from gpuplane.control.adapters.base import Inventory
from gpuplane.control.admission import Estate, Running
from gpuplane.control.models import ACTIVE_STATES, Allocation, Cluster, Device, Job, Node, Team
from gpuplane.control.quota import Amount, FlavorQuota, QuotaBook, TeamQuota
from gpuplane.control.scheduler import (
    DeviceGrant,
    DeviceInfo,
    NodeInfo,
    Placement,
    Snapshot,
)
from gpuplane.errors import ConfigError
from gpuplane.resources import LABEL_CLUSTER, LABEL_GPU_MODEL, LABEL_NODE, LABEL_REGION

_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def check_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.match(name):
        raise ConfigError(
            f"cluster name '{name}' must be 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit"
        )
    return name


def qualified(cluster: str, node: str) -> str:
    """The snapshot's name of a node: unique across clusters."""
    return f"{cluster}/{node}"


def split_qualified(name: str) -> tuple[str, str]:
    cluster, _, node = name.partition("/")
    return cluster, node


def sync_cluster(
    session: Session,
    name: str,
    adapter: str,
    labels: dict[str, str],
    region: str,
    inventory: Inventory,
    now: float,
) -> None:
    """Upsert the cluster and its inventory; called inside a locked transaction."""
    check_cluster_name(name)
    cluster = session.get(Cluster, name)
    merged = {**labels, LABEL_CLUSTER: name, LABEL_REGION: labels.get(LABEL_REGION, region)}
    if cluster is None:
        cluster = Cluster(name=name, adapter=adapter, labels=merged, created_at=now)
        session.add(cluster)
    else:
        cluster.adapter, cluster.labels = adapter, merged
    session.flush()
    existing = {
        n.name: n
        for n in session.scalars(
            select(Node).where(Node.cluster_name == name).options(selectinload(Node.devices))
        )
    }
    held = set(session.scalars(select(Allocation.device_id)))
    seen = set()
    for found in inventory.nodes:
        seen.add(found.name)
        node = existing.get(found.name)
        node_labels = {**merged, **found.labels}
        if node is None:
            node = Node(
                cluster_name=name,
                name=found.name,
                labels=node_labels,
                cpu_millis=found.cpu_millis,
                memory_mib=found.memory_mib,
            )
            session.add(node)
            session.flush()
        else:
            node.labels, node.cpu_millis = node_labels, found.cpu_millis
            node.memory_mib = found.memory_mib
        devices = {d.index: d for d in node.devices}
        for dev in found.devices:
            row = devices.pop(dev.index, None)
            if row is None:
                session.add(
                    Device(
                        node_id=node.id,
                        index=dev.index,
                        model=dev.model,
                        mem_mib=dev.mem_mib,
                        uuid=dev.uuid,
                    )
                )
            else:
                row.model, row.mem_mib, row.uuid = dev.model, dev.mem_mib, dev.uuid
        for gone in devices.values():
            if gone.id not in held:
                session.delete(gone)
    for node_name, node in existing.items():
        if node_name not in seen and not any(d.id in held for d in node.devices):
            session.delete(node)


def remove_clusters_except(session: Session, keep: Iterable[str]) -> list[str]:
    """Forget clusters no longer configured (their jobs' allocations go with them)."""
    gone = [c for c in session.scalars(select(Cluster.name)) if c not in set(keep)]
    if gone:
        session.execute(delete(Cluster).where(Cluster.name.in_(gone)))
    return gone


@dataclass(slots=True)
class RowIds:
    """Store row ids behind snapshot names: node name -> node id, (node id, index) -> device id."""

    nodes: dict[str, int] = field(default_factory=dict)
    devices: dict[tuple[int, int], int] = field(default_factory=dict)


def load_estate(session: Session) -> tuple[Estate, RowIds]:
    """The store as the scheduler sees it, plus the row ids behind its names."""
    nodes = list(
        session.scalars(
            select(Node).options(selectinload(Node.devices)).order_by(Node.cluster_name, Node.name)
        )
    )
    # cordoned, draining or unreachable: its nodes stay (with their jobs) but take nothing new
    closed = set(
        session.scalars(
            select(Cluster.name).where(
                Cluster.cordoned | Cluster.draining | Cluster.unreachable.is_not(None)
            )
        )
    )
    infos = []
    device_ids: dict[tuple[int, int], int] = {}
    node_names: dict[int, str] = {}
    for node in nodes:
        name = qualified(node.cluster_name, node.name)
        node_names[node.id] = name
        labels = {**node.labels, LABEL_NODE: node.name}
        if node.devices:
            labels.setdefault(LABEL_GPU_MODEL, node.devices[0].model)
        infos.append(
            NodeInfo(
                name=name,
                cluster=node.cluster_name,
                cpu_millis=node.cpu_millis,
                memory_mib=node.memory_mib,
                labels=labels,
                devices=tuple(DeviceInfo(d.index, d.mem_mib) for d in node.devices),
                schedulable=node.cluster_name not in closed,
            )
        )
        for d in node.devices:
            device_ids[(node.id, d.index)] = d.id
    index_of = {d_id: key for key, d_id in device_ids.items()}
    jobs = list(
        session.scalars(
            select(Job).where(Job.state.in_(ACTIVE_STATES)).options(selectinload(Job.allocations))
        )
    )
    placements = []
    limited: list[tuple[Placement, float, float]] = []  # placement, time limit, start
    running = []
    book = QuotaBook(load_teams(session))
    for job in jobs:
        if job.node_id is None or job.node_id not in node_names:
            continue
        grants = tuple(
            DeviceGrant(index_of[a.device_id][1], a.mem_mib, a.gpu_milli) for a in job.allocations
        )
        grants = tuple(sorted(grants, key=lambda g: g.index))
        node_name = node_names[job.node_id]
        placement = Placement(
            job.id, split_qualified(node_name)[0], node_name, grants, job.cpu_millis, job.memory_mib
        )
        placements.append(placement)
        if job.time_limit_s is not None:
            limited.append((placement, job.time_limit_s, job.started_at or job.created_at))
        if job.flavor is not None:
            book.reserve(job.id, job.team_name, job.flavor, Amount(job.gpu_milli, job.gpu_mem_mib))
            running.append(
                Running(
                    job.id,
                    job.team_name,
                    job.flavor,
                    job.priority,
                    job.started_at or job.created_at,
                )
            )
    snapshot = Snapshot(infos, placements)
    node_ids = {name: nid for nid, name in node_names.items()}
    estate = Estate.build(snapshot, book, running)
    for placement, limit, start in limited:
        estate.admitted(placement, limit, start)
    return estate, RowIds(node_ids, device_ids)


def load_teams(session: Session) -> list[TeamQuota]:
    teams = session.scalars(select(Team).options(selectinload(Team.quotas)))
    return [
        TeamQuota(
            t.name,
            t.cohort,
            t.weight,
            {
                q.flavor: FlavorQuota(
                    q.nominal_gpu_milli,
                    q.nominal_mem_mib,
                    q.borrowing_limit_gpu_milli,
                    q.borrowing_limit_mem_mib,
                    q.lending_limit_gpu_milli,
                    q.lending_limit_mem_mib,
                )
                for q in t.quotas
            },
        )
        for t in teams
    ]
