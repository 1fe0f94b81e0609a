"""Re-place a job on another node without dropping it: the way preemption requeues a job.

The job keeps its id, attempts (one more) and history; its process is stopped and it goes back
to the queue pinned to the target node through the selector vocabulary (`gpuplane.io/cluster`
and `gpuplane.io/node`, which the estate sets on every node), optionally with a new slice (the
audit plan's right-sized one). The next admission pass places it there like any pending job.
Ask-then-commit: the pinned spec is validated and checked feasible on the target before anything
is written. A job already where it is asked to go (running there, or pending pinned there) is
left alone: moving is idempotent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete
from sqlalchemy.orm import Session

from gpuplane.control.admission import Estate, from_scheduler
from gpuplane.control.errors import ConflictError, InfeasibleJobError, NotFoundError
from gpuplane.control.scheduler import feasible
from gpuplane.control.service.inventory import RowIds, qualified, split_qualified
from gpuplane.control.spec import JobSpec, parse_spec
from gpuplane.control.store.models import Allocation
from gpuplane.control.store.records import Records, job_row
from gpuplane.errors import unknown_name
from gpuplane.resources import LABEL_NODE

MOVABLE = ("pending", "admitted", "running")


@dataclass(frozen=True, slots=True)
class MoveResult:
    """`moved` False: the job already ran (or waited) on the target; nothing was changed.
    `stop`: the (cluster, job id) workload to stop, when the job was placed."""

    job_id: str
    team: str
    moved: bool
    stop: tuple[str, str] | None = None


def pinned(spec: JobSpec, cluster: str, node: str, resources: dict[str, Any]) -> JobSpec:
    """`spec` constrained to `node` of `cluster`, with `resources` (fields of the spec's
    resources) replacing its own."""
    data = spec.model_dump(mode="json")
    data["selector"]["cluster"] = cluster
    data["selector"]["match_labels"][LABEL_NODE] = node
    data["resources"].update(resources)
    return parse_spec(data)


def is_pinned_to(spec: JobSpec, cluster: str, node: str) -> bool:
    return spec.selector.cluster == cluster and spec.selector.match_labels.get(LABEL_NODE) == node


def move_job(
    session: Session,
    estate: Estate,
    records: Records,
    ref: str,
    cluster: str,
    node: str,
    resources: dict[str, Any],
    reason: str,
    ids: RowIds,
) -> MoveResult:
    """Requeue job `ref` pinned to `node` of `cluster` (under the store lock, `ids` the rows
    behind the estate's names)."""
    job = job_row(session, ref)
    if job.state not in MOVABLE:
        raise ConflictError(
            f"job {job.id} is {job.state}; only a pending, admitted or running job can be moved"
        )
    _require_node(estate, cluster, node)
    spec = parse_spec(job.spec)
    if job.node_id is not None and job.node_id == ids.nodes[qualified(cluster, node)]:
        return MoveResult(job.id, job.team_name, moved=False)
    if job.state == "pending" and is_pinned_to(spec, cluster, node):
        return MoveResult(job.id, job.team_name, moved=False)
    target = pinned(spec, cluster, node, resources)
    decision = feasible(estate.snapshot, target.to_request(job.id))
    if not decision.ok:
        reasons = from_scheduler(decision.reasons)
        why = "; ".join(r.message for r in reasons) or "it does not fit"
        raise InfeasibleJobError(
            f"job {job.id} can never run on {cluster}/{node}: {why}; pick another node", reasons
        )
    stop = (job.cluster_name, job.id) if job.cluster_name is not None else None
    session.execute(delete(Allocation).where(Allocation.job_id == job.id))
    estate.release(job.id)
    job.spec = target.model_dump(mode="json")
    if job.state != "pending":
        job.attempts += 1
    job.state, job.cluster_name, job.node_id, job.flavor = "pending", None, None, None
    job.gpu_milli, job.gpu_mem_mib, job.started_at = 0, 0, None
    job.message = reason
    records.event(session, "moved", f"{reason}; requeued for {cluster}/{node}", job_id=job.id)
    return MoveResult(job.id, job.team_name, moved=True, stop=stop)


def _require_node(estate: Estate, cluster: str, node: str) -> None:
    names = {n.name for n in estate.snapshot.nodes}
    if qualified(cluster, node) in names:
        return
    clusters = {split_qualified(n)[0] for n in names}
    if cluster not in clusters:
        raise NotFoundError(unknown_name("cluster", cluster, clusters))
    raise NotFoundError(unknown_name(f"node of cluster {cluster}", node, _nodes(names, cluster)))


def _nodes(names: Iterable[str], cluster: str) -> list[str]:
    return [n for c, n in map(split_qualified, names) if c == cluster]
