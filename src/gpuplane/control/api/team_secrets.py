"""A team's secrets (`/teams/{name}/secrets`): its members keep them; a value is written, never
read back."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.identity.auth import Principal
from gpuplane.control.service.service import ControlService
from gpuplane.control.spec import check_name
from gpuplane.control.store import queries
from gpuplane.control.store.views import SecretSet, SecretView

router = APIRouter()


@router.get("/teams/{name}/secrets", response_model=list[SecretView])
def secrets(
    name: str, who: Principal = Depends(caller), service: ControlService = Depends(service_of)
) -> list[SecretView]:
    queries.get_team(service, name, who.teams())
    return [SecretView(**asdict(s)) for s in service.vault.list(name)]


@router.put("/teams/{name}/secrets/{secret}", response_model=SecretView)
def put_secret(
    name: str,
    secret: str,
    body: SecretSet,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> SecretView:
    queries.get_team(service, name, who.teams())
    check_name("secret", secret)
    return SecretView(**asdict(service.vault.set(name, secret, body.value)))


@router.delete("/teams/{name}/secrets/{secret}", status_code=204)
def delete_secret(
    name: str,
    secret: str,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    queries.get_team(service, name, who.teams())
    service.vault.delete(name, secret)
    return Response(status_code=204)
