"""The control plane's HTTP API (FastAPI; OpenAPI at /docs): clusters, nodes, jobs, teams, quotas,
tokens, secrets, events and (`deployments/routes.py`) deployments, one router module per group
of `auth.POLICY`.

Handlers are thin: they call `ControlService` / `queries` and the project's errors are mapped to
HTTP once, here (422 for a spec or request that can never run, or a cluster that cannot be
added; 404 unknown, 409 wrong state, 401/403 from `auth`). Every route is a row of
`auth.POLICY`, checked by one dependency (`deps.allow`) before the handler runs (the app refuses
to build with a route missing from it); a team-scoped handler passes the caller's teams to its
query, so another team's objects answer as unknown ones. Only a bearer token authenticates the
JSON API (no cookie), so a cross-site form cannot act; a Host header not in
`control.auth.allowed_hosts` (default: the loopback names) gets 400. The composition root may
add more routers under the same table (the audit's usage report) and `deps.Pages` (the web
console at `/ui`, its caller from its session cookie). Every call that may change something is
recorded in the store's trail, and every caller is identified and authorised before its body is
read, which is bounded (`edge.py`). A background thread runs the service's tick (`serving.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import BaseRoute

from gpuplane import __version__
from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.api import clusters, events, jobs, system, team_secrets, teams, tokens
from gpuplane.control.api.deps import Pages, allow, bearer
from gpuplane.control.api.edge import Gatekeeper, Trail, served
from gpuplane.control.api.openapi import document_errors
from gpuplane.control.api.serving import lifespan
from gpuplane.control.deployments import routes as deployments
from gpuplane.control.errors import ConflictError, InfeasibleJobError, NotFoundError
from gpuplane.control.identity.auth import POLICY, AuthError, Principal, Rule
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from gpuplane.errors import ConfigError, GpuplaneError, ResourceError, user_message


def create_app(
    service: ControlService,
    *,
    background: bool = True,
    routers: Sequence[APIRouter] = (),
    pages: Pages | None = None,
) -> FastAPI:
    """The API over a started `service`; `background` runs the admission loop while serving;
    `routers`: more routes (each a row of `auth.POLICY`); `pages`: a UI on the same app."""

    def refusal(request: Request, status: int, message: str) -> Response:
        """A refused call's answer: a page of `pages` when it is theirs, else a JSON error."""
        if pages is not None and pages.owns(request):
            return pages.refusal(request, status, message)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse({"detail": message}, status_code=status, headers=headers)

    async def identify(request: Request, rule: Rule) -> Principal | None:
        """The caller of a route with `rule` (`edge.Gatekeeper` asks, before reading the body): a
        page's from its session, any other route's from its bearer token only."""
        if rule.console:
            return None if pages is None else await run_in_threadpool(pages.caller, request)
        credentials = await bearer(request)
        if credentials is None:
            return None
        return await run_in_threadpool(service.authenticate, credentials.credentials)

    app = FastAPI(
        title="gpuplane control plane",
        version=__version__,
        description="One pool over many GPU clusters: inventory, team quotas, one queue. "
        "Every route but /healthz needs `Authorization: Bearer <token>`.",
        lifespan=lifespan(service, background),
        dependencies=[Depends(allow)],
    )
    app.state.service = service
    # outermost last: the host check, then the trail, then the edge's identify-then-read
    app.add_middleware(
        Gatekeeper, router=app.router, identify=identify, refuse=refusal, http=service.config.http
    )
    app.add_middleware(Trail, service=service)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=service.config.served_hosts())

    @app.exception_handler(GpuplaneError)
    async def _errors(request: Request, exc: GpuplaneError) -> Response:
        status, body = error_answer(exc)
        if isinstance(exc, AuthError) or (pages is not None and pages.owns(request)):
            return refusal(request, status, str(exc))
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, and an inf or NaN there cannot be JSON: a 500
        errors = [
            {"loc": list(e["loc"]), "msg": user_message(e), "type": e["type"]} for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    service.metrics.watch(lambda: queries.metrics_state(service))
    for router in (
        system.router,
        clusters.router,
        jobs.router,
        teams.router,
        deployments.router,
        team_secrets.router,
        events.router,
        *routers,
        tokens.router,
    ):
        app.include_router(router)
    if pages is not None:
        pages.add_to(app)
    document_errors(app)

    unlisted = [r for r in _endpoints(app.routes) if r not in POLICY]
    if unlisted:
        raise RuntimeError(f"routes missing from auth.POLICY: {unlisted}")
    return app


def error_answer(exc: GpuplaneError) -> tuple[int, dict[str, Any]]:
    """The one mapping of the project's errors to HTTP: the status and the JSON body."""
    body: dict[str, Any] = {"detail": str(exc)}
    if isinstance(exc, AuthError):
        return exc.status, body
    if isinstance(exc, InfeasibleJobError):
        return 422, body | {"reasons": [r.to_json() for r in exc.reasons]}
    if isinstance(exc, ResourceError | ConfigError | AdapterError):
        return 422, body
    if isinstance(exc, NotFoundError):
        return 404, body
    if isinstance(exc, ConflictError):
        return 409, body
    return 500, body


def _endpoints(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves (HEAD is GET's)."""
    out = []
    for route in served(routes):
        methods = getattr(route, "methods", None) or set()
        out += [(m, getattr(route, "path", "")) for m in sorted(methods) if m != "HEAD"]
    return out
