"""The pool's clusters and nodes: anyone with a token reads them, admins add, remove, cordon and
drain clusters."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from gpuplane.control.api.deps import service_of
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from gpuplane.control.store.views import ClusterAdd, ClusterDetail, ClusterView, Drain, NodeView

router = APIRouter()


@router.get("/clusters", response_model=list[ClusterView])
def clusters(service: ControlService = Depends(service_of)) -> list[ClusterView]:
    return queries.list_clusters(service)


@router.get("/clusters/{name}", response_model=ClusterDetail)
def cluster(name: str, service: ControlService = Depends(service_of)) -> ClusterDetail:
    return queries.get_cluster(service, name)


@router.post("/clusters", response_model=ClusterDetail, status_code=201)
def add_cluster(body: ClusterAdd, service: ControlService = Depends(service_of)) -> ClusterDetail:
    service.add_cluster(body)
    return queries.get_cluster(service, body.name)


@router.delete("/clusters/{name}", status_code=204)
def remove_cluster(name: str, service: ControlService = Depends(service_of)) -> Response:
    service.remove_cluster(name)
    return Response(status_code=204)


@router.post("/clusters/{name}/cordon", response_model=ClusterDetail)
def cordon(name: str, service: ControlService = Depends(service_of)) -> ClusterDetail:
    service.cordon(name)
    return queries.get_cluster(service, name)


@router.post("/clusters/{name}/uncordon", response_model=ClusterDetail)
def uncordon(name: str, service: ControlService = Depends(service_of)) -> ClusterDetail:
    service.cordon(name, cordoned=False)
    return queries.get_cluster(service, name)


@router.post("/clusters/{name}/drain", response_model=Drain)
def drain(
    name: str,
    requeue: bool = Query(False, description="stop and requeue its running jobs too"),
    service: ControlService = Depends(service_of),
) -> Drain:
    done = service.drain(name, requeue=requeue)
    return Drain(
        cluster=queries.get_cluster(service, name),
        requeued=done.requeued,
        running=done.running,
    )


@router.get("/nodes", response_model=list[NodeView])
def nodes(service: ControlService = Depends(service_of)) -> list[NodeView]:
    return queries.list_nodes(service)
