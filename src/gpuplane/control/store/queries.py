"""The reads behind the API: jobs, events, logs, clusters, nodes, teams and the scrape-time
state; each selects its rows and keeps a team to its own (`estate_views.py` shapes the estate)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from gpuplane.control.errors import NotFoundError
from gpuplane.control.scheduler import MILLI_PER_GPU, ClusterReason, Decision, ReasonCode
from gpuplane.control.service.clusters import cluster_row
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import estate_views
from gpuplane.control.store.models import (
    JOB_STATES,
    Cluster,
    Event,
    Job,
    Node,
    Team,
)
from gpuplane.control.store.records import job_row, team_row
from gpuplane.control.store.views import (
    ClusterDetail,
    ClusterView,
    EventView,
    JobView,
    NodeView,
    ReasonView,
    TeamView,
)
from gpuplane.errors import ResourceError, unknown_name

UNKNOWN = "unknown"  # a running job on a cluster that does not answer: its state is not known
VIEW_STATES = (*JOB_STATES, UNKNOWN)


@dataclass(frozen=True, slots=True)
class Closed:
    """Clusters that take nothing new: the unreachable (and why), the cordoned or draining."""

    down: dict[str, str]
    held: dict[str, str]  # cluster -> "cordoned" | "draining"

    @classmethod
    def read(cls, session: Session) -> Closed:
        rows = session.execute(
            select(Cluster.name, Cluster.unreachable, Cluster.draining).where(
                Cluster.cordoned | Cluster.draining | Cluster.unreachable.is_not(None)
            )
        ).all()
        down = {r.name: str(r.unreachable) for r in rows if r.unreachable is not None}
        held = {r.name: "draining" if r.draining else "cordoned" for r in rows}
        return cls(down, held)

    def why(self, cluster: str) -> str:
        if cluster in self.down:
            return f"unreachable ({self.down[cluster]})"
        return self.held[cluster]


def job_view(service: ControlService, job: Job, closed: Closed | None = None) -> JobView:
    """`closed` (read here when not given): a running job on an unreachable cluster is shown
    `unknown`, with why, until the cluster answers and the job is reconciled; a waiting job's
    `NoNodes` on a closed cluster says why it is closed."""
    estate, _ = service.estate()
    placement = estate.snapshot.allocations.get(job.id)
    node = placement.node.partition("/")[2] if placement else None
    position = None
    with service.store.session() as session:
        if node is None and job.node_id is not None:
            node = session.scalar(select(Node.name).where(Node.id == job.node_id))
        if job.state == "pending":
            ahead = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(
                    Job.state == "pending",
                    (Job.priority > job.priority)
                    | ((Job.priority == job.priority) & (Job.created_at < job.created_at)),
                )
            )
            position = int(ahead or 0) + 1
        if closed is None:
            closed = Closed.read(session)
    state, message = job.state, job.message
    if state == "running" and job.cluster_name in closed.down:
        state = UNKNOWN
        message = (
            f"cluster {job.cluster_name} does not answer ({closed.down[job.cluster_name]}); "
            "the job is left as it was and reconciled when the cluster answers again"
        )
    spec = job.spec
    reasons = [ReasonView(**r) for r in (job.reasons or {}).get("list", [])]
    for r in reasons:
        if r.code == ReasonCode.NO_NODES and r.cluster in closed.held:
            r.message = f"the cluster is {closed.why(r.cluster)}: nothing new is placed there"
    return JobView(
        id=job.id,
        name=job.name,
        team=job.team_name,
        state=state,
        priority=job.priority,
        command=spec.get("command", []),
        env=spec.get("env", {}),
        resources=spec.get("resources", {}),
        selector=spec.get("selector", {}),
        cluster=job.cluster_name,
        node=node,
        flavor=job.flavor,
        devices=list(placement.device_indices if placement else job.devices or []),
        reasons=reasons,
        reason=closest_reason(reasons),
        queue_position=position,
        message=message,
        exit_code=job.exit_code,
        attempts=job.attempts,
        time_limit_s=job.time_limit_s,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def closest_reason(reasons: list[ReasonView]) -> ReasonView | None:
    """The reason of the cluster where the job came closest to fitting (the scheduler's
    `Decision.primary_reason`): the one reason `job list` and `job describe` show first."""
    each = tuple(ClusterReason(r.cluster, ReasonCode(r.code), r.message) for r in reasons)
    primary = Decision("", None, each).primary_reason
    return None if primary is None else reasons[each.index(primary)]


# `teams` below: the teams whose objects the caller sees (`Principal.teams`); None: all. Another
# team's object is answered as an unknown one.


def get_job(service: ControlService, ref: str, teams: Collection[str] | None = None) -> JobView:
    """One job, with its timeline."""
    with service.store.session() as session:
        job = job_row(session, ref, teams)
        events = session.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id))
        timeline = [_event_view(e, job.team_name) for e in events]
        return job_view(service, job).model_copy(update={"timeline": timeline})


def list_events(
    service: ControlService,
    team: str | None = None,
    since_s: float | None = None,
    limit: int = 500,
    teams: Collection[str] | None = None,
    kinds: Collection[str] = (),
) -> list[EventView]:
    """The newest events, oldest first: of one team if given (a job's events are its team's,
    a call's the caller's), of the last `since_s` seconds if given, of `kinds` if any."""
    event_team = func.coalesce(Event.team_name, Job.team_name)
    query = select(Event, event_team).outerjoin(Job, Job.id == Event.job_id)
    if kinds:
        query = query.where(Event.kind.in_(kinds))
    if team:
        query = query.where(event_team == team)
    if teams is not None:
        query = query.where(event_team.in_(teams))
    if since_s is not None:
        query = query.where(Event.at >= service.clock() - since_s)
    with service.store.session() as session:
        rows = session.execute(query.order_by(Event.id.desc()).limit(limit)).all()
        return [_event_view(e, t) for e, t in reversed(rows)]


def _event_view(e: Event, team: str | None) -> EventView:
    return EventView(
        at=e.at,
        kind=e.kind,
        message=e.message,
        job_id=e.job_id,
        cluster=e.cluster_name,
        team=team,
        actor=e.actor,
        source=e.source,
        status=e.status,
    )


def list_jobs(
    service: ControlService,
    team: str | None = None,
    state: str | None = None,
    limit: int = 500,
    teams: Collection[str] | None = None,
) -> list[JobView]:
    """The newest jobs, of one team and in one state if given (`unknown`: running on a cluster
    that does not answer); an unknown state or team is refused with the valid ones and the
    nearest."""
    if state and state not in VIEW_STATES:
        raise ResourceError(unknown_name("job state", state, VIEW_STATES))
    with service.store.session() as session:
        known = [t for t in session.scalars(select(Team.name)) if teams is None or t in teams]
        if team and team not in known:
            raise NotFoundError(unknown_name("team", team, known))
        query = select(Job).order_by(Job.created_at.desc()).limit(limit)
        if team:
            query = query.where(Job.team_name == team)
        elif teams is not None:
            query = query.where(Job.team_name.in_(teams))
        closed = Closed.read(session)
        if state == UNKNOWN:
            query = query.where(Job.state == "running", Job.cluster_name.in_(closed.down))
        elif state == "running":
            query = query.where(Job.state == state, Job.cluster_name.not_in(closed.down))
        elif state:
            query = query.where(Job.state == state)
        return [job_view(service, j, closed) for j in session.scalars(query)]


def job_logs(
    service: ControlService,
    ref: str,
    tail: int | None = None,
    since: int = 0,
    teams: Collection[str] | None = None,
) -> Iterator[bytes]:
    """The job's output in blocks from byte `since` (or only its last `tail` lines); an unknown
    job raises NotFoundError here, before anything is read."""
    with service.store.session() as session:
        job = job_row(session, ref, teams)
        cluster = job.cluster_name
        job_id = job.id
    adapter = service.adapters.get(cluster or "")
    if adapter is None:
        return iter(())
    return adapter.logs(job_id, tail, since)


def list_clusters(service: ControlService) -> list[ClusterView]:
    with service.store.session() as session:
        clusters = session.scalars(select(Cluster).order_by(Cluster.name))
        return [
            ClusterView(
                **estate_views.cluster_view(service, session, c).model_dump(
                    exclude={"node_list", "settings"}
                )
            )
            for c in clusters
        ]


def get_cluster(service: ControlService, name: str) -> ClusterDetail:
    with service.store.session() as session:
        return estate_views.cluster_view(service, session, cluster_row(session, name))


def list_nodes(service: ControlService) -> list[NodeView]:
    with service.store.session() as session:
        names = list(session.scalars(select(Cluster.name).order_by(Cluster.name)))
        return [n for c in names for n in estate_views.node_views(service, session, c)]


def list_teams(service: ControlService, teams: Collection[str] | None = None) -> list[TeamView]:
    with service.store.session() as session:
        query = select(Team).options(selectinload(Team.quotas)).order_by(Team.name)
        if teams is not None:
            query = query.where(Team.name.in_(teams))
        return [estate_views.team_view(service, session, t) for t in session.scalars(query)]


def get_team(service: ControlService, name: str, teams: Collection[str] | None = None) -> TeamView:
    with service.store.session() as session:
        return estate_views.team_view(service, session, team_row(session, name, teams))


def as_dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [i.model_dump(mode="json") for i in items]


def metrics_state(service: ControlService) -> dict[str, Any]:
    """What the scrape-time gauges read: jobs per state, why jobs wait, usage per cluster, team
    shares, and what admission learned from completed jobs."""
    estate, _ = service.estate()
    snap = estate.snapshot
    with service.store.session() as session:
        rows = session.execute(select(Job.state, func.count()).group_by(Job.state)).all()
    clusters: dict[str, tuple[int, float]] = {}
    for c, mask in zip(snap.clusters, snap.cluster_masks, strict=True):
        cap = int(snap.dev_milli_cap[mask].sum())
        free = int(snap.dev_milli_free[mask].sum())
        clusters[c] = (int(snap.n_devices[mask].sum()), (cap - free) / cap if cap else 0.0)
    held = (snap.dev_milli_cap - snap.dev_milli_free).sum(axis=1)  # milli-GPUs per node
    allocated: dict[tuple[str, str], float] = {}
    for node, milli in zip(snap.nodes, held.tolist(), strict=True):
        key = (node.cluster, node.gpu_model)
        allocated[key] = allocated.get(key, 0.0) + milli / MILLI_PER_GPU
    return {
        "jobs": {str(state): int(n) for state, n in rows},
        "reasons": dict(service.waiting),
        "clusters": clusters,
        "allocated": allocated,
        "shares": {t: estate.share(t) for t in estate.book.teams},
        "work": (estate.work.mean_s, estate.work.limit_fill()),
    }
