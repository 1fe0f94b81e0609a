"""The service's own routes: its liveness (`/healthz`, open) and its Prometheus metrics
(`/metrics`, admins: it counts every team's jobs)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from gpuplane.control.api.deps import service_of
from gpuplane.control.service.service import ControlService

router = APIRouter()


@router.get("/metrics", response_class=Response)
def metrics(service: ControlService = Depends(service_of)) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
def healthz(service: ControlService = Depends(service_of)) -> dict[str, str]:
    return {"status": "ok", "store": service.store.backend}
