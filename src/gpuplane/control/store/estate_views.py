"""The estate's views, one row at a time: a cluster with its nodes and cards, a team with its
quotas and use, each read from its store rows and the mirrored snapshot's free figures. The
queries that select the rows and check who may see them are `queries.py`'s."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from gpuplane.control.admission.quota import dominant_share
from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import ACTIVE_STATES, Allocation, Cluster, Job, Node, Team
from gpuplane.control.store.views import ClusterDetail, DeviceView, NodeView, QuotaView, TeamView


def node_views(service: ControlService, session: Session, cluster: str) -> list[NodeView]:
    estate, _ = service.estate()
    snap = estate.snapshot
    out = []
    nodes = session.scalars(
        select(Node)
        .where(Node.cluster_name == cluster)
        .options(selectinload(Node.devices))
        .order_by(Node.name)
    )
    for node in nodes:
        i = snap.index.get(f"{cluster}/{node.name}")
        if i is None:
            continue
        out.append(
            NodeView(
                cluster=cluster,
                name=node.name,
                labels=node.labels,
                cpu_millis=node.cpu_millis,
                cpu_free_millis=int(snap.cpu_free[i]),
                memory_mib=node.memory_mib,
                memory_free_mib=int(snap.mem_free[i]),
                devices=[
                    DeviceView(
                        index=d.index,
                        model=d.model,
                        mem_mib=d.mem_mib,
                        mem_free_mib=int(snap.dev_mem_free[i, d.index]),
                        gpu_milli_free=int(snap.dev_milli_free[i, d.index]),
                        uuid=d.uuid,
                    )
                    for d in node.devices
                ],
            )
        )
    return out


def cluster_view(service: ControlService, session: Session, c: Cluster) -> ClusterDetail:
    nodes = node_views(service, session, c.name)
    devices = [d for n in nodes for d in n.devices]
    slices = session.execute(
        select(func.count(Allocation.id), func.coalesce(func.sum(Allocation.gpu_milli), 0))
        .join(Job, Job.id == Allocation.job_id)
        .where(Job.cluster_name == c.name)
    ).one()
    running = (
        session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.cluster_name == c.name, Job.state.in_(ACTIVE_STATES))
        )
        or 0
    )
    return ClusterDetail(
        name=c.name,
        adapter=c.adapter,
        labels=c.labels,
        nodes=len(nodes),
        gpus=len(devices),
        gpus_free=sum(d.gpu_milli_free == 1000 and d.mem_free_mib == d.mem_mib for d in devices),
        gpu_milli_free=sum(d.gpu_milli_free for d in devices),
        gpu_milli_used=int(slices[1]),
        slices_used=int(slices[0]),
        inventory=c.inventory,
        running_jobs=running,
        source=c.source,
        version=c.version,
        health="ok" if c.unreachable is None else "unreachable",
        health_reason=c.unreachable,
        unreachable_at=c.unreachable_since,
        last_sync_at=c.last_sync_at,
        cordoned=c.cordoned,
        draining=c.draining,
        settings=c.settings,
        node_list=nodes,
    )


def team_view(service: ControlService, session: Session, team: Team) -> TeamView:
    estate, _ = service.estate()
    book = estate.book
    grouped = session.execute(
        select(Job.state, func.count()).where(Job.team_name == team.name).group_by(Job.state)
    ).all()
    counts: dict[str, int] = {str(state): int(n) for state, n in grouped}
    used = book.team_total(team.name)
    return TeamView(
        name=team.name,
        cohort=team.cohort,
        weight=team.weight,
        limited=bool(team.quotas),
        quotas=[
            QuotaView(
                flavor=q.flavor,
                gpus=q.nominal_gpu_milli / 1000,
                gpu_mem_mib=q.nominal_mem_mib,
                borrowing_limit_gpus=None
                if q.borrowing_limit_gpu_milli is None
                else q.borrowing_limit_gpu_milli / 1000,
                borrowing_limit_mem_mib=q.borrowing_limit_mem_mib,
                lending_limit_gpus=None
                if q.lending_limit_gpu_milli is None
                else q.lending_limit_gpu_milli / 1000,
                lending_limit_mem_mib=q.lending_limit_mem_mib,
                used_gpus=book.usage(team.name, q.flavor).gpu_milli / 1000,
                used_gpu_mem_mib=book.usage(team.name, q.flavor).mem_mib,
            )
            for q in team.quotas
        ],
        used_gpus=used.gpu_milli / 1000,
        used_gpu_mem_mib=used.mem_mib,
        dominant_share=dominant_share(used, estate.capacity, team.weight),
        pending_jobs=counts.get("pending", 0),
        running_jobs=counts.get("running", 0) + counts.get("admitted", 0),
    )
