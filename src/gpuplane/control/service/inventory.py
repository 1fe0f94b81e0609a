"""Inventory: clusters, nodes and devices between adapters, the store and the scheduler snapshot.

`sync_cluster` writes what an adapter reports into the store (upsert by name; a node or card that
disappeared is removed unless a job still holds it); `sync_nodes` writes only the nodes a watch
changed since (what `ClusterAdapter.changes()` answers), so one event costs one node's rows.
`load_estate` reads the store back into the scheduler's `Snapshot` (node names qualified as
`cluster/node`), the quota book and the admitted jobs, which is what an admission pass works on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.orm import Session, selectinload

from gpuplane.control.adapters.base import DiscoveredNode, Inventory, InventoryChange
from gpuplane.control.admission import Estate, Running
from gpuplane.control.admission.quota import Amount, FlavorQuota, QuotaBook, TeamQuota
from gpuplane.control.scheduler import (
    DeviceGrant,
    DeviceInfo,
    NodeInfo,
    Placement,
    Snapshot,
)
from gpuplane.control.spec import spread_group
from gpuplane.control.store.models import (
    ACTIVE_STATES,
    Allocation,
    Cluster,
    Device,
    Job,
    Node,
    Team,
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
    """Upsert the cluster and its whole inventory; called inside a locked transaction."""
    check_cluster_name(name)
    cluster = session.get(Cluster, name)
    merged = {**labels, LABEL_CLUSTER: name, LABEL_REGION: labels.get(LABEL_REGION, region)}
    if cluster is None:
        cluster = Cluster(name=name, adapter=adapter, labels=merged, created_at=now)
        session.add(cluster)
    else:
        cluster.adapter, cluster.labels = adapter, merged
    session.flush()
    existing = _nodes(session, select(Node).where(Node.cluster_name == name))
    _write_nodes(session, name, merged, existing, inventory.nodes)


def sync_nodes(session: Session, name: str, change: InventoryChange) -> None:
    """Write what a watch changed in cluster `name` since its last sync: the rows of the
    changed nodes and their cards, and of the nodes gone, and no other; called inside a locked
    transaction. The cluster must have had a full `sync_cluster` first (its labels are kept
    on its row)."""
    cluster = session.get(Cluster, name)
    if cluster is None:
        raise LookupError(f"cluster {name} is not in the store yet: sync it in full first")
    names = [n.name for n in change.nodes] + list(change.gone)
    existing = _nodes(session, select(Node).where(Node.cluster_name == name, Node.name.in_(names)))
    _write_nodes(session, name, cluster.labels, existing, change.nodes)


def _nodes(session: Session, query: Select[Node]) -> dict[str, Node]:
    """The nodes `query` selects, by name, with their cards."""
    return {n.name: n for n in session.scalars(query.options(selectinload(Node.devices)))}


def _write_nodes(
    session: Session,
    cluster: str,
    labels: dict[str, Any],
    existing: dict[str, Node],
    found: Iterable[DiscoveredNode],
) -> None:
    """Upsert each of `found`; remove the rest of `existing` (nodes gone), and the cards a node
    no longer has, unless a job still holds them."""
    existing = dict(existing)
    cards_gone: list[Device] = []
    for seen in found:
        node = existing.pop(seen.name, None)
        node_labels = {**labels, **seen.labels}
        if node is None:
            node = Node(
                cluster_name=cluster,
                name=seen.name,
                labels=node_labels,
                cpu_millis=seen.cpu_millis,
                memory_mib=seen.memory_mib,
            )
            session.add(node)  # its cards join it through `node.devices`: one flush at commit
        else:
            node.labels, node.cpu_millis = node_labels, seen.cpu_millis
            node.memory_mib = seen.memory_mib
        devices = {d.index: d for d in node.devices}
        for dev in seen.devices:
            row = devices.pop(dev.index, None)
            if row is None:
                node.devices.append(
                    Device(index=dev.index, model=dev.model, mem_mib=dev.mem_mib, uuid=dev.uuid)
                )
            else:
                row.model, row.mem_mib, row.uuid = dev.model, dev.mem_mib, dev.uuid
        cards_gone.extend(devices.values())
    ids = [d.id for d in cards_gone] + [d.id for n in existing.values() for d in n.devices]
    held: set[int] = set()
    if ids:  # only the allocations of what would go: an event that removes nothing asks none
        held = set(
            session.scalars(select(Allocation.device_id).where(Allocation.device_id.in_(ids)))
        )
    for card in cards_gone:
        if card.id not in held:
            session.delete(card)
    for node in existing.values():
        if not any(d.id in held for d in node.devices):
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


def _node_infos(
    session: Session,
) -> tuple[list[NodeInfo], dict[tuple[int, int], int], dict[int, str]]:
    """The stored nodes as the scheduler sees them, with the device row ids by (node row id,
    card index) and each node row id's qualified name."""
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
    return infos, device_ids, node_names


def load_estate(session: Session) -> tuple[Estate, RowIds]:
    """The store as the scheduler sees it, plus the row ids behind its names."""
    infos, device_ids, node_names = _node_infos(session)
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
            job.id,
            split_qualified(node_name)[0],
            node_name,
            grants,
            job.cpu_millis,
            job.memory_mib,
            spread_group(job.team_name, job.spec.get("spread")),
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
