"""The deployments API (`/deployments`): an APIRouter the control API's app includes
(`control/api/app.py`), each handler handed the service and the caller by `Depends`
(`control/api/deps.py`), like the other groups of `auth.POLICY`.

Deployments are team scoped like jobs: members apply, scale, roll and delete their own team's,
viewers read them, and another team's answer 404 exactly as unknown names (in lists too). The
gateway's watch and its load reports see every team's and need an admin token.

Errors are the project's own and are mapped to HTTP by the app's handler (422 a spec that can
never be served, 404 an unknown deployment, 409 one being deleted). `GET /deployments/watch` is
the gateway's discovery: a long poll that answers once the endpoints' `resource_version` differs
from the one the caller has (at once when it has none), or with the same version after
`timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy import select

from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.deployments.watch import endpoints
from gpuplane.control.identity.auth import Principal, of_own_team
from gpuplane.control.lab import faults
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from gpuplane.control.store.models import DeploymentEvent, DeploymentInstance, Job

WATCH_POLL_S = 0.2  # how often a waiting watch looks at the endpoints again


class ModelLoad(BaseModel):
    name: str
    in_flight: int = Field(ge=0, description="slots its requests hold on this gateway")
    queued: int = Field(ge=0, description="requests waiting in its fair queue")
    oldest_wait_s: float = Field(ge=0, description="how long the oldest of them has waited")
    idle_s: float = Field(
        0.0,
        ge=0,
        description="how long it has had no request in flight or queued (0 while it has one); "
        "a deployment scales to zero only after `cooldown_s` of it",
    )
    ready: int = Field(ge=0, description="instances that take requests")
    instances: dict[str, int] = Field(
        default_factory=dict,
        description="leases held per instance this gateway still has (draining ones too)",
    )
    ready_ids: list[str] = Field(default_factory=list, description="the instances it admits to")


class LoadReport(BaseModel):
    gateway: str = Field(min_length=1, max_length=255, description="the reporting gateway")
    models: list[ModelLoad]


class PromoteBody(BaseModel):
    version: str | None = Field(None, description="the canary to promote (needed with several)")


class FaultBody(BaseModel):
    fault: str = Field(description="crash | node | cluster")
    instance: str | None = Field(None, description="the victim; default: the oldest running")
    lost_for_s: float = Field(
        60.0, gt=0, le=3600, description="node, cluster: how long it answers nothing"
    )


class ScaleBody(BaseModel):
    replicas: int = Field(ge=0, le=1000, description="instances of the current version")


router = APIRouter(tags=["deployments"])
Service = Depends(service_of)
Caller = Depends(caller)


@router.post("/deployments", status_code=201)
def apply(
    spec: dict[str, Any] = Body(..., description="a deployment spec, as in the YAML file"),
    dry_run: bool = Query(False, description="validate and place one instance; change nothing"),
    who: Principal = Caller,
    service: ControlService = Service,
) -> JSONResponse:
    mine = of_own_team(who, spec, "deployments")
    out = service.deployments.apply(mine, dry_run=dry_run, teams=who.teams())
    body = {
        "name": out.name,
        "action": out.action,
        "dry_run": dry_run,
        "placement": out.placement,
    }
    return JSONResponse(body, status_code=201 if out.action == "created" and not dry_run else 200)


@router.get("/deployments")
def list_(who: Principal = Caller, service: ControlService = Service) -> list[dict[str, Any]]:
    return [summary(d) for d in describe_all(service, who.teams())]


@router.get("/deployments/watch")
async def watch(
    request: Request,
    resource_version: str | None = Query(None, description="the version the caller has"),
    timeout_s: float = Query(30.0, ge=0, le=300, description="longest wait for a change"),
    service: ControlService = Service,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        out: dict[str, Any] = await run_in_threadpool(endpoints, service.store)
        done = time.monotonic() >= deadline or await request.is_disconnected()
        if out["resource_version"] != resource_version or done:
            return out
        await asyncio.sleep(min(WATCH_POLL_S, max(0.0, deadline - time.monotonic())))


@router.post("/deployments/load", status_code=204)
def load(body: LoadReport, service: ControlService = Service) -> None:
    """A gateway's exact slot use per deployment, which the autoscaler acts on."""
    service.deployments.loads.report(body.gateway, [m.model_dump() for m in body.models])


@router.get("/deployments/{name}")
def describe_(
    name: str, who: Principal = Caller, service: ControlService = Service
) -> dict[str, Any]:
    return describe(service, name, who.teams())


@router.post("/deployments/{name}/scale")
def scale(
    name: str, body: ScaleBody, who: Principal = Caller, service: ControlService = Service
) -> dict[str, Any]:
    service.deployments.scale(name, body.replicas, who.teams())
    return describe(service, name)


@router.get("/deployments/{name}/rollout")
def rollout_(
    name: str, who: Principal = Caller, service: ControlService = Service
) -> dict[str, Any]:
    return rollout(service, name, who.teams())


@router.post("/deployments/{name}/promote")
def promote(
    name: str,
    body: PromoteBody | None = None,
    who: Principal = Caller,
    service: ControlService = Service,
) -> dict[str, Any]:
    service.deployments.promote(name, body.version if body else None, who.teams())
    return rollout(service, name)


@router.post("/deployments/{name}/rollback")
def rollback(
    name: str, who: Principal = Caller, service: ControlService = Service
) -> dict[str, Any]:
    service.deployments.rollback(name, who.teams())
    return rollout(service, name)


@router.post("/deployments/{name}/faults")
def fault(
    name: str,
    body: FaultBody,
    dry_run: bool = Query(False, description="only name the instance it would hit"),
    service: ControlService = Service,
) -> dict[str, Any]:
    """A drill's fault (`gpuplane drill`): kill an instance's engine, or lose its node or
    cluster for a while (`lab/faults.py`; local clusters only)."""
    return faults.inject(
        service, name, body.fault, body.instance, lost_for_s=body.lost_for_s, dry_run=dry_run
    ).to_json()


@router.delete("/deployments/{name}")
def delete(name: str, who: Principal = Caller, service: ControlService = Service) -> dict[str, Any]:
    service.deployments.delete(name, who.teams())
    return {"name": name, "deleting": True}


def describe_all(service: ControlService, teams: Collection[str] | None) -> list[dict[str, Any]]:
    """Every deployment of `teams` (None: all), described, by name."""
    with service.store.session() as session:
        names = service.deployments.names(session, teams)
    return [describe(service, n) for n in names]


def describe(
    service: ControlService, name: str, teams: Collection[str] | None = None
) -> dict[str, Any]:
    """A deployment's spec, state, instances (job state, cluster, node, cards, URL, slots the
    reporting gateways hold) and its last events; one of `teams` (None: any)."""
    with service.store.session() as session:
        row = service.deployments.row(session, name, teams)
        insts = list(
            session.scalars(
                select(DeploymentInstance)
                .where(DeploymentInstance.deployment == name)
                .order_by(DeploymentInstance.created_at)
            )
        )
        jobs = {
            j.id: j
            for j in session.scalars(select(Job).where(Job.id.in_([i.job_id for i in insts])))
        }
        events = list(
            session.scalars(
                select(DeploymentEvent)
                .where(DeploymentEvent.deployment == name)
                .order_by(DeploymentEvent.id.desc())
                .limit(50)
            )
        )
    instances = []
    for inst in insts:
        job = jobs.get(inst.job_id)
        view = queries.job_view(service, job) if job is not None else None
        instances.append(
            {
                "id": inst.job_id,
                "version": inst.version,
                "url": inst.url,
                "capacity": inst.capacity,
                "in_use": service.deployments.loads.in_use(name, inst.job_id),
                "state": "draining"
                if inst.draining_since is not None
                else view.state
                if view
                else "gone",
                "cluster": view.cluster if view else None,
                "node": view.node if view else None,
                "devices": view.devices if view else [],
                "reason": view.reason.message
                if view and view.reason
                else view.message
                if view
                else None,
            }
        )
    spec = row.spec
    return {
        "name": name,
        "model": spec["model"],
        "version": spec["version"],
        "engine": spec["engine"],
        "team": spec["team"],
        "replicas": service.deployments.loads.replicas(parse_deployment(spec)),
        "scaling": spec.get("scaling"),
        "deleting": row.deleting,
        "spec": spec,
        "instances": instances,
        "events": [{"at": e.at, "message": e.message} for e in reversed(events)],
    }


def rollout(
    service: ControlService, name: str, teams: Collection[str] | None = None
) -> dict[str, Any]:
    """Per version: its share of requests, the instances wanted, running, ready in every
    reporting gateway (None: no gateway reports) and draining; the main version first, then
    the canaries, then versions that drain."""
    return rollout_of(service, describe(service, name, teams))


def rollout_of(service: ControlService, d: dict[str, Any]) -> dict[str, Any]:
    """`rollout` of a deployment `describe` gave."""
    name = d["name"]
    spec = parse_deployment(d["spec"])
    wanted = spec.replicas_by_version(d["replicas"])
    weights = spec.weights() or {spec.version: 100.0}
    ready = service.deployments.loads.ready(name)
    order = list(wanted) + sorted({i["version"] for i in d["instances"]} - wanted.keys())
    versions = []
    for v in order:
        mine = [i for i in d["instances"] if i["version"] == v]
        running = [i for i in mine if i["state"] == "running"]
        versions.append(
            {
                "version": v,
                "weight": weights.get(v, 0.0),
                "replicas": wanted.get(v, 0),
                "running": len(running),
                "ready": None if ready is None else sum(i["id"] in ready for i in running),
                "draining": sum(i["state"] == "draining" for i in mine),
            }
        )
    return {"name": name, "version": spec.version, "versions": versions}


def summary(d: dict[str, Any]) -> dict[str, Any]:
    states = [i["state"] for i in d["instances"]]
    return {
        "name": d["name"],
        "model": d["model"],
        "version": d["version"],
        "engine": d["engine"],
        "team": d["team"],
        "replicas": d["replicas"],
        "running": states.count("running"),
        "pending": sum(s in ("pending", "admitted") for s in states),
        "draining": states.count("draining"),
        "deleting": d["deleting"],
    }
