"""API tokens: admins list, make and revoke them; a token is shown once, when made."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends

from gpuplane.control.api.deps import service_of
from gpuplane.control.identity.auth import Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from gpuplane.control.store.views import TokenCreate, TokenCreated, TokenView
from gpuplane.errors import ResourceError

router = APIRouter()


@router.get("/tokens", response_model=list[TokenView])
def tokens(service: ControlService = Depends(service_of)) -> list[TokenView]:
    return [TokenView(**asdict(t)) for t in service.tokens.list()]


@router.post("/tokens", response_model=TokenCreated, status_code=201)
def create_token(body: TokenCreate, service: ControlService = Depends(service_of)) -> TokenCreated:
    if body.team is not None:
        queries.get_team(service, body.team)
    elif body.role is not Role.admin:
        raise ResourceError(
            f"a {body.role} token is for one team: give --team (only admins act on all)"
        )
    info, token = service.tokens.create(body.name, body.role, body.team, body.expires_in_s)
    return TokenCreated(**asdict(info), token=token)


@router.delete("/tokens/{token_id}", response_model=TokenView)
def revoke_token(token_id: str, service: ControlService = Depends(service_of)) -> TokenView:
    return TokenView(**asdict(service.tokens.revoke(token_id)))
