"""The event log: what happened to jobs, clusters and the API, a caller's own team's only."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.identity.auth import Principal
from gpuplane.control.service.service import ControlService
from gpuplane.control.spec import parse_duration
from gpuplane.control.store import queries
from gpuplane.control.store.views import EventView
from gpuplane.errors import ResourceError

router = APIRouter()


@router.get("/events", response_model=list[EventView])
def events(
    team: str | None = None,
    since: str | None = Query(None, description="only the last 1h, 30m, 7d, ..."),
    kind: list[str] = Query(
        [], description="only these kinds (repeat it): api, submitted, started, cluster, ..."
    ),
    limit: int = Query(500, ge=1, le=10000),
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> list[EventView]:
    try:
        since_s = None if since is None else parse_duration(since)
    except ValueError as exc:
        raise ResourceError(f"since: {exc}") from None
    return queries.list_events(service, team, since_s, limit, who.teams(), kind)
