"""Teams and their quotas: viewers read their own team, admins set teams and quotas."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.identity.auth import Principal
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries, team_edits
from gpuplane.control.store.views import QuotaSet, TeamSet, TeamView

router = APIRouter()


@router.get("/teams", response_model=list[TeamView])
def teams(
    who: Principal = Depends(caller), service: ControlService = Depends(service_of)
) -> list[TeamView]:
    return queries.list_teams(service, who.teams())


@router.get("/quotas", response_model=list[TeamView])
def quotas(
    who: Principal = Depends(caller), service: ControlService = Depends(service_of)
) -> list[TeamView]:
    return queries.list_teams(service, who.teams())


@router.get("/teams/{name}", response_model=TeamView)
def team(
    name: str, who: Principal = Depends(caller), service: ControlService = Depends(service_of)
) -> TeamView:
    return queries.get_team(service, name, who.teams())


@router.put("/teams/{name}", response_model=TeamView)
def put_team(name: str, body: TeamSet, service: ControlService = Depends(service_of)) -> TeamView:
    return team_edits.set_team(service, name, body)


@router.put("/teams/{name}/quotas/{flavor}", response_model=TeamView)
def put_quota(
    name: str, flavor: str, body: QuotaSet, service: ControlService = Depends(service_of)
) -> TeamView:
    return team_edits.set_quota(service, name, flavor, body)
