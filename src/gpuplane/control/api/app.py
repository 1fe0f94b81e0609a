"""The control plane's HTTP API (FastAPI; OpenAPI at /docs): clusters, nodes, jobs, teams, quotas,
tokens, secrets, events and (`deployments/routes.py`) deployments.

Handlers are thin: they call `ControlService` / `queries` and map the project's errors to HTTP
once (422 for a spec or request that can never run, or a cluster that cannot be added; 404
unknown, 409 wrong state, 401/403 from `auth`). Every route is a row of `auth.POLICY`, checked
by one dependency before the handler runs (the app refuses to build with a route missing from
it); a team-scoped handler passes the caller's teams to its query, so another team's objects
answer as unknown ones. Only a bearer token authenticates the JSON API (no cookie), so a
cross-site form cannot act; a Host header not in `control.auth.allowed_hosts` (default: the
loopback names) gets 400. The web console (`/ui`, `console.py`) is served by the same app under
the same table, its caller from its session cookie and its forms checked for a CSRF token. Every
call that may change something is recorded in the store's trail, and every caller is identified
and authorised before its body is read, which is bounded (`edge.py`). A background thread runs
the service's tick (observe, admit, bind) every `schedule_interval_s`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import BaseRoute

from gpuplane import __version__
from gpuplane.audit import usage_report as usage
from gpuplane.audit.settings import AuditSettings
from gpuplane.console import pages as console
from gpuplane.console.sessions import Sessions
from gpuplane.control import queries, team_edits
from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.api.edge import Edge, Trail, rule_of
from gpuplane.control.api.openapi import document_errors
from gpuplane.control.auth import POLICY, AuthError, Principal, Role, Rule, decide, of_own_team
from gpuplane.control.deployments import routes as deployment_routes
from gpuplane.control.errors import ConflictError, InfeasibleJobError, NotFoundError
from gpuplane.control.service import ControlService
from gpuplane.control.settings import ControlConfig
from gpuplane.control.spec import check_name, parse_duration
from gpuplane.control.views import (
    ClusterAdd,
    ClusterDetail,
    ClusterView,
    Drain,
    DryRunView,
    EventView,
    JobMove,
    JobView,
    NodeView,
    QuotaSet,
    SecretSet,
    SecretView,
    TeamSet,
    TeamView,
    TokenCreate,
    TokenCreated,
    TokenView,
)
from gpuplane.errors import ConfigError, GpuplaneError, ResourceError, user_message

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("gpuplane.control.api")


class _Ticker:
    """Runs `service.tick()` on a thread until stopped; an error is logged, never fatal."""

    def __init__(self, service: ControlService, interval_s: float) -> None:
        self.service = service
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuplane-control-tick", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.service.tick()
            except Exception:
                log.exception("control loop tick failed; retrying on the next tick")


def refusal(request: Request, status: int, message: str) -> Response:
    """A refused call's answer: a console page (401: to the login form), else a JSON error."""
    if console.is_console(request):
        return console.error_page(request, status, message)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


def server_config(app: FastAPI, control: ControlConfig) -> uvicorn.Config:
    """uvicorn's settings for the control API on control.host:port."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=control.host,
        port=control.port,
        log_level="warning",
        # X-Forwarded-For is believed from the configured proxies only: by default uvicorn
        # believes any caller on loopback, and every job on the host is one
        proxy_headers=bool(control.http.trusted_proxies),
        forwarded_allow_ips=control.http.trusted_proxies or None,
        # a gateway's deployment watch is a long poll: shut down without waiting it out
        timeout_graceful_shutdown=5,
    )


def create_app(
    service: ControlService, *, background: bool = True, audit: AuditSettings | None = None
) -> FastAPI:
    """The API over a started `service`; `background` runs the admission loop while serving;
    `audit`: the `audit:` section of the service's config (the usage report's prices)."""
    audit = audit or AuditSettings()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        ticker = _Ticker(service, service.config.schedule_interval_s) if background else None
        if ticker is not None:
            ticker.start()
        try:
            yield
        finally:
            if ticker is not None:
                ticker.stop()

    bearer = HTTPBearer(auto_error=False, description="an API token (gpl_...) or an OIDC JWT")
    sessions = Sessions(service.clock)

    async def identify(request: Request, rule: Rule) -> Principal | None:
        """The caller of a route with `rule` (`edge.Edge` asks, before reading the body): a
        console route's from its session, any other route's from its bearer token only."""
        if rule.console:
            return await run_in_threadpool(console.session_caller, service, sessions, request)
        credentials = await bearer(request)
        if credentials is None:
            return None
        return await run_in_threadpool(service.authenticate, credentials.credentials)

    def allow(
        request: Request, _credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
    ) -> Principal | None:
        """The caller `edge.Edge` identified and let through (every route); the route's row is
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

    app = FastAPI(
        title="gpuplane control plane",
        version=__version__,
        description="One pool over many GPU clusters: inventory, team quotas, one queue. "
        "Every route but /healthz needs `Authorization: Bearer <token>`.",
        lifespan=lifespan,
        dependencies=[Depends(allow)],
    )
    # outermost last: the host check, then the trail, then the edge's identify-then-read
    app.add_middleware(
        Edge, router=app.router, identify=identify, refuse=refusal, http=service.config.http
    )
    app.add_middleware(Trail, service=service)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=service.config.served_hosts())

    @app.exception_handler(AuthError)
    async def _refused(request: Request, exc: AuthError) -> Response:
        return refusal(request, exc.status, str(exc))

    @app.exception_handler(GpuplaneError)
    async def _errors(request: Request, exc: GpuplaneError) -> Response:
        status = 500
        body: dict[str, Any] = {"detail": str(exc)}
        if isinstance(exc, InfeasibleJobError):
            status, body["reasons"] = 422, [r.to_json() for r in exc.reasons]
        elif isinstance(exc, ResourceError | ConfigError | AdapterError):
            status = 422
        elif isinstance(exc, NotFoundError):
            status = 404
        elif isinstance(exc, ConflictError):
            status = 409
        if console.is_console(request):
            return console.error_page(request, status, str(exc))
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, and an inf or NaN there cannot be JSON: a 500
        errors = [
            {"loc": list(e["loc"]), "msg": user_message(e), "type": e["type"]} for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    service.metrics.watch(lambda: queries.metrics_state(service))

    @app.get("/metrics", response_class=Response)
    def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "store": service.store.backend}

    @app.get("/clusters", response_model=list[ClusterView])
    def clusters() -> list[ClusterView]:
        return queries.list_clusters(service)

    @app.get("/clusters/{name}", response_model=ClusterDetail)
    def cluster(name: str) -> ClusterDetail:
        return queries.get_cluster(service, name)

    @app.post("/clusters", response_model=ClusterDetail, status_code=201)
    def add_cluster(body: ClusterAdd) -> ClusterDetail:
        service.add_cluster(body)
        return queries.get_cluster(service, body.name)

    @app.delete("/clusters/{name}", status_code=204)
    def remove_cluster(name: str) -> Response:
        service.remove_cluster(name)
        return Response(status_code=204)

    @app.post("/clusters/{name}/cordon", response_model=ClusterDetail)
    def cordon(name: str) -> ClusterDetail:
        service.cordon(name)
        return queries.get_cluster(service, name)

    @app.post("/clusters/{name}/uncordon", response_model=ClusterDetail)
    def uncordon(name: str) -> ClusterDetail:
        service.cordon(name, cordoned=False)
        return queries.get_cluster(service, name)

    @app.post("/clusters/{name}/drain", response_model=Drain)
    def drain(
        name: str,
        requeue: bool = Query(False, description="stop and requeue its running jobs too"),
    ) -> Drain:
        done = service.drain(name, requeue=requeue)
        return Drain(
            cluster=queries.get_cluster(service, name),
            requeued=done.requeued,
            running=done.running,
        )

    @app.get("/nodes", response_model=list[NodeView])
    def nodes() -> list[NodeView]:
        return queries.list_nodes(service)

    @app.post("/jobs", response_model=JobView | DryRunView, status_code=201)
    def submit(
        spec: dict[str, Any] = Body(..., description="a job spec, as in the YAML file"),
        dry_run: bool = Query(False, description="answer where it would go; change nothing"),
        who: Principal = Depends(caller),
    ) -> JobView | DryRunView | JSONResponse:
        out = service.submit(of_own_team(who, spec, "jobs"), dry_run=dry_run)
        if dry_run:
            view = DryRunView(**{**out, "reasons": [r.to_json() for r in out["reasons"]]})
            return JSONResponse(view.model_dump(mode="json"), status_code=200)
        return queries.get_job(service, out["id"])

    @app.post("/jobs/batch", status_code=201)
    def submit_batch(
        specs: list[dict[str, Any]] = Body(..., description="job specs; all queued or none"),
        who: Principal = Depends(caller),
    ) -> dict[str, list[str]]:
        return {"ids": service.submit_many([of_own_team(who, s, "jobs") for s in specs])}

    @app.get("/jobs", response_model=list[JobView])
    def jobs(
        team: str | None = None,
        state: str | None = None,
        limit: int = Query(500, ge=1, le=10000),
        who: Principal = Depends(caller),
    ) -> list[JobView]:
        return queries.list_jobs(service, team, state, limit, who.teams())

    @app.get("/jobs/{ref}", response_model=JobView)
    def job(ref: str, who: Principal = Depends(caller)) -> JobView:
        return queries.get_job(service, ref, who.teams())

    @app.post("/jobs/{ref}/cancel", response_model=JobView)
    def cancel(ref: str, who: Principal = Depends(caller)) -> JobView:
        return queries.get_job(service, service.cancel(ref, who.teams()))

    @app.post("/jobs/{ref}/move", response_model=JobView)
    def move(ref: str, body: JobMove) -> JobView:
        slice_ = body.model_dump(include={"gpu_mem_mib", "gpu_cores_pct"}, exclude_none=True)
        service.move(ref, body.cluster, body.node, slice_, body.reason)
        return queries.get_job(service, ref)

    @app.get("/jobs/{ref}/logs", response_class=PlainTextResponse)
    def logs(
        ref: str,
        tail: int | None = Query(None, ge=0, description="only the last N lines"),
        since: int = Query(
            0,
            ge=0,
            le=2**62,
            description="from this byte on (a follower's count of bytes seen); not with tail",
        ),
        who: Principal = Depends(caller),
    ) -> StreamingResponse:
        if tail is not None and since:
            raise ResourceError("give tail or since, not both: since counts bytes from the start")
        # streamed a block at a time: a log is never held whole, however large
        return StreamingResponse(
            queries.job_logs(service, ref, tail, since, who.teams()),
            media_type="text/plain; charset=utf-8",
        )

    @app.get("/teams", response_model=list[TeamView])
    def teams(who: Principal = Depends(caller)) -> list[TeamView]:
        return queries.list_teams(service, who.teams())

    @app.get("/quotas", response_model=list[TeamView])
    def quotas(who: Principal = Depends(caller)) -> list[TeamView]:
        return queries.list_teams(service, who.teams())

    @app.get("/teams/{name}", response_model=TeamView)
    def team(name: str, who: Principal = Depends(caller)) -> TeamView:
        return queries.get_team(service, name, who.teams())

    @app.put("/teams/{name}", response_model=TeamView)
    def put_team(name: str, body: TeamSet) -> TeamView:
        return team_edits.set_team(service, name, body)

    @app.put("/teams/{name}/quotas/{flavor}", response_model=TeamView)
    def put_quota(name: str, flavor: str, body: QuotaSet) -> TeamView:
        return team_edits.set_quota(service, name, flavor, body)

    deployment_routes.add_routes(app, service, caller)

    @app.get("/teams/{name}/secrets", response_model=list[SecretView])
    def secrets(name: str, who: Principal = Depends(caller)) -> list[SecretView]:
        queries.get_team(service, name, who.teams())
        return [SecretView(**asdict(s)) for s in service.vault.list(name)]

    @app.put("/teams/{name}/secrets/{secret}", response_model=SecretView)
    def put_secret(
        name: str, secret: str, body: SecretSet, who: Principal = Depends(caller)
    ) -> SecretView:
        queries.get_team(service, name, who.teams())
        check_name("secret", secret)
        return SecretView(**asdict(service.vault.set(name, secret, body.value)))

    @app.delete("/teams/{name}/secrets/{secret}", status_code=204)
    def delete_secret(name: str, secret: str, who: Principal = Depends(caller)) -> Response:
        queries.get_team(service, name, who.teams())
        service.vault.delete(name, secret)
        return Response(status_code=204)

    @app.get("/events", response_model=list[EventView])
    def events(
        team: str | None = None,
        since: str | None = Query(None, description="only the last 1h, 30m, 7d, ..."),
        kind: list[str] = Query(
            [], description="only these kinds (repeat it): api, submitted, started, cluster, ..."
        ),
        limit: int = Query(500, ge=1, le=10000),
        who: Principal = Depends(caller),
    ) -> list[EventView]:
        try:
            since_s = None if since is None else parse_duration(since)
        except ValueError as exc:
            raise ResourceError(f"since: {exc}") from None
        return queries.list_events(service, team, since_s, limit, who.teams(), kind)

    @app.get("/usage")
    def usage_report(
        since: str = Query("7d", description="start: a duration ago (7d, 12h) or an ISO time"),
        until: str | None = Query(None, description="end, the same way; default: now"),
        step: str = Query("60s", description="allocations are counted once per this"),
        team: str | None = Query(None, description="this team only"),
        who: Principal = Depends(caller),
    ) -> dict[str, Any]:
        """GPU-hours, slice-hours and cost per team and GPU model (a slice counts its share of
        the card), used and idle apart where `control.samples_dir` measured them."""
        teams = who.teams()
        if team is not None:
            queries.get_team(service, team, teams)  # another team's: 404 as an unknown one
            teams = {team}
        window = usage.span(since, until, step, service.clock())
        return usage.report(service.store, window, audit, service.config.samples_dir, teams)

    @app.get("/tokens", response_model=list[TokenView])
    def tokens() -> list[TokenView]:
        return [TokenView(**asdict(t)) for t in service.tokens.list()]

    @app.post("/tokens", response_model=TokenCreated, status_code=201)
    def create_token(body: TokenCreate) -> TokenCreated:
        if body.team is not None:
            queries.get_team(service, body.team)
        elif body.role is not Role.admin:
            raise ResourceError(
                f"a {body.role} token is for one team: give --team (only admins act on all)"
            )
        info, token = service.tokens.create(body.name, body.role, body.team, body.expires_in_s)
        return TokenCreated(**asdict(info), token=token)

    @app.delete("/tokens/{token_id}", response_model=TokenView)
    def revoke_token(token_id: str) -> TokenView:
        return TokenView(**asdict(service.tokens.revoke(token_id)))

    console.add_console(app, service, sessions, caller)
    app.state.sessions = sessions  # for `console.login_url`, printed at start
    document_errors(app)

    unlisted = [r for r in _endpoints(app.routes) if r not in POLICY]
    if unlisted:
        raise RuntimeError(f"routes missing from auth.POLICY: {unlisted}")
    return app


def _endpoints(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves (HEAD is GET's)."""
    out = []
    for route in routes:
        methods = getattr(route, "methods", None) or set()
        out += [(m, getattr(route, "path", "")) for m in sorted(methods) if m != "HEAD"]
    return out
