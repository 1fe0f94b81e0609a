"""What every route of the control API is handed by FastAPI's `Depends`: the service it serves,
and the caller the edge identified, checked again against the route's row of `auth.POLICY`.

Also the one thing the composition root may plug in: `Pages`, a server-rendered UI on the same
app (the web console), whose routes take their caller from a session and whose refusals are
pages. The API knows it only by this protocol, so it imports no console.
"""

from __future__ import annotations

from typing import Protocol, cast

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpuplane.control.api.edge import rule_of
from gpuplane.control.identity.auth import AuthError, Principal, decide
from gpuplane.control.service.service import ControlService

bearer = HTTPBearer(auto_error=False, description="an API token (gpl_...) or an OIDC JWT")


class Pages(Protocol):
    """A UI served by the same app under the same policy table (its routes are rows with
    `console=True`)."""

    def add_to(self, app: FastAPI) -> None:
        """Add the UI's routes to `app`."""

    def owns(self, request: Request) -> bool:
        """Whether `request` is one of the UI's (its refusals and errors are then pages)."""

    def caller(self, request: Request) -> Principal | None:
        """The caller of one of the UI's routes, from its session (None: not logged in)."""

    def refusal(self, request: Request, status: int, message: str) -> Response:
        """The UI's answer to a refused or failed request of its own."""


def service_of(request: Request) -> ControlService:
    """The service the app was built over (`app.create_app`)."""
    return cast(ControlService, request.app.state.service)


def allow(
    request: Request, _credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Principal | None:
    """The caller `edge.Gatekeeper` identified and let through (every route); the route's row is
    applied again, so a route reached without the edge fails closed."""
    who: Principal | None = request.state.principal
    rule = rule_of(request.method, request.scope["route"].path)
    if rule is None:
        raise RuntimeError(f"no policy row for {request.method} {request.scope['route'].path}")
    decide(rule, who)
    return who


def caller(who: Principal | None = Depends(allow)) -> Principal:
    """The authenticated caller of a route that needs one (`allow` refused anyone else)."""
    if who is None:
        raise AuthError("this route needs a bearer token", 401)
    return who
