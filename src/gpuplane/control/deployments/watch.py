"""What the gateway watches (`GET /deployments/watch`): every deployment's serving instances.

A read of the store, nothing else: per deployment, its instances whose job runs, whose address
and slots are known and which do not drain, with a resource version that changes exactly when
that list does, so a watcher polls cheaply and acts only on a change.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import select

from gpuplane.control.deployments.spec import DeploymentSpec
from gpuplane.control.store.models import Deployment, DeploymentInstance, Job
from gpuplane.control.store.store import Store


def endpoints(store: Store) -> dict[str, Any]:
    """What the gateway watches: every deployment's instances that serve (job running,
    slots known, not draining) with their version, its versions' weights during a rollout,
    whether the gateway holds its requests while none is ready (`hold`: the control plane
    starts or replaces them; not once it is being deleted) and for how long (`hold_s`, None:
    the gateway's queue timeout), and `resource_version`, a digest of all that."""
    with store.session() as session:
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
