"""Drill faults, injected into a running deployment by the control plane (`POST
/deployments/{name}/faults`): the server's half of `gpuplane drill` (`drills.py` measures).

- `crash`: one instance's engine is killed (SIGKILL): the gateway takes it out of rotation, the
  controller starts a replacement after its back-off;
- `node`: the node of one instance stops answering; `cluster`: the cluster of one instance
  does. Either way every job there is killed and the cluster's adapter answers nothing for
  `lost_for_s`: the service marks it unreachable, the controller replaces its instances
  elsewhere (`reconcile.py`: lost), and once it answers again what was left there is stopped.

Only the `local` adapter can inject them (`LocalAdapter.kill` / `lose`): a fake for what cannot
happen to this machine on purpose. A local cluster is one machine, so losing an instance's node
loses its local cluster; `node` and `cluster` differ in what the drill measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from sqlalchemy import select

from gpuplane.control.adapters.local import LocalAdapter
from gpuplane.control.errors import ConflictError, NotFoundError
from gpuplane.control.service.service import ControlService
from gpuplane.control.spec import SpecError
from gpuplane.control.store.models import DeploymentInstance, Job, Node
from gpuplane.errors import unknown_name

Fault = Literal["crash", "node", "cluster"]
FAULTS: tuple[Fault, ...] = ("crash", "node", "cluster")


@dataclass(frozen=True, slots=True)
class Injected:
    """What a fault hit: its instance (the victim), where it ran, the jobs killed, and when
    (the service's clock)."""

    fault: str
    deployment: str
    instance: str
    cluster: str
    node: str | None
    killed: list[str]
    at: float
    dry_run: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def inject(
    service: ControlService,
    deployment: str,
    fault: str,
    instance: str | None = None,
    *,
    lost_for_s: float = 60.0,
    dry_run: bool = False,
) -> Injected:
    """Inject `fault` at `instance` of `deployment` (None: its oldest running instance);
    `dry_run`: only say what it would hit."""
    if fault not in FAULTS:
        raise SpecError(unknown_name("fault", fault, FAULTS))
    with service.store.session() as session:
        service.deployments.row(session, deployment)  # an unknown name says so
        rows = session.execute(
            select(DeploymentInstance.job_id, Job.cluster_name, Job.node_id)
            .join(Job, Job.id == DeploymentInstance.job_id)
            .where(
                DeploymentInstance.deployment == deployment,
                DeploymentInstance.draining_since.is_(None),
                Job.state == "running",
            )
            .order_by(DeploymentInstance.created_at)
        ).all()
    running = {r.job_id: r for r in rows}
    if instance is None:
        if not running:
            raise ConflictError(
                f"deployment {deployment} has no running instance to inject a {fault} into; "
                f"see `gpuplane deploy describe {deployment}`"
            )
        instance = next(iter(running))
    elif instance not in running:
        raise NotFoundError(unknown_name(f"running instance of {deployment}", instance, running))
    cluster = str(running[instance].cluster_name)
    adapter = service.adapters.get(cluster)
    if not isinstance(adapter, LocalAdapter):
        raise ConflictError(
            f"instance {instance} runs on cluster {cluster}, whose adapter cannot inject drill "
            "faults (only `local` clusters, which cannot fail on their own here, can)"
        )
    node = _node_name(service, running[instance].node_id)
    killed: list[str] = []
    if not dry_run:
        if fault == "crash":
            adapter.kill(instance)
            killed = [instance]
        else:
            killed = adapter.lose(lost_for_s)
    return Injected(fault, deployment, instance, cluster, node, killed, service.clock(), dry_run)


def _node_name(service: ControlService, node_id: int | None) -> str | None:
    if node_id is None:
        return None
    with service.store.session() as session:
        node = session.get(Node, node_id)
        return None if node is None else node.name
