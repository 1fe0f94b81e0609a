"""The control plane's HTTP API (FastAPI; OpenAPI at /docs): clusters, nodes, jobs, teams, quotas.

Handlers are thin: they call `ControlService` / `queries` and map the project's errors to HTTP
once (422 for a spec or request that can never run, or a cluster that cannot be added; 404
unknown, 409 wrong state). A background
thread runs the service's tick (observe, admit, bind) every `schedule_interval_s`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gpuplane import __version__
from gpuplane.control import queries
from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.deployments import routes as deployment_routes
from gpuplane.control.errors import ConflictError, InfeasibleJobError, NotFoundError
from gpuplane.control.service import ControlService
from gpuplane.control.views import (
    ClusterAdd,
    ClusterDetail,
    ClusterView,
    Drain,
    DryRunView,
    JobMove,
    JobView,
    NodeView,
    QuotaSet,
    TeamSet,
    TeamView,
)
from gpuplane.errors import ConfigError, GpuplaneError, ResourceError

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


def create_app(service: ControlService, *, background: bool = True) -> FastAPI:
    """The API over a started `service`; `background` runs the admission loop while serving."""

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

    app = FastAPI(
        title="gpuplane control plane",
        version=__version__,
        description="One pool over many GPU clusters: inventory, team quotas, one queue.",
        lifespan=lifespan,
    )

    @app.exception_handler(GpuplaneError)
    async def _errors(_: Request, exc: GpuplaneError) -> JSONResponse:
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
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, and an inf or NaN there cannot be JSON: a 500
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
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
    ) -> JobView | DryRunView | JSONResponse:
        out = service.submit(spec, dry_run=dry_run)
        if dry_run:
            view = DryRunView(**{**out, "reasons": [r.to_json() for r in out["reasons"]]})
            return JSONResponse(view.model_dump(mode="json"), status_code=200)
        return queries.get_job(service, out["id"])

    @app.post("/jobs/batch", status_code=201)
    def submit_batch(
        specs: list[dict[str, Any]] = Body(..., description="job specs; all queued or none"),
    ) -> dict[str, list[str]]:
        return {"ids": service.submit_many(specs)}

    @app.get("/jobs", response_model=list[JobView])
    def jobs(
        team: str | None = None, state: str | None = None, limit: int = Query(500, ge=1, le=10000)
    ) -> list[JobView]:
        return queries.list_jobs(service, team, state, limit)

    @app.get("/jobs/{ref}", response_model=JobView)
    def job(ref: str) -> JobView:
        return queries.get_job(service, ref)

    @app.post("/jobs/{ref}/cancel", response_model=JobView)
    def cancel(ref: str) -> JobView:
        return queries.get_job(service, service.cancel(ref))

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
    ) -> StreamingResponse:
        if tail is not None and since:
            raise ResourceError("give tail or since, not both: since counts bytes from the start")
        # streamed a block at a time: a log is never held whole, however large
        return StreamingResponse(
            queries.job_logs(service, ref, tail, since), media_type="text/plain; charset=utf-8"
        )

    @app.get("/teams", response_model=list[TeamView])
    def teams() -> list[TeamView]:
        return queries.list_teams(service)

    @app.get("/quotas", response_model=list[TeamView])
    def quotas() -> list[TeamView]:
        return queries.list_teams(service)

    @app.get("/teams/{name}", response_model=TeamView)
    def team(name: str) -> TeamView:
        return queries.get_team(service, name)

    @app.put("/teams/{name}", response_model=TeamView)
    def put_team(name: str, body: TeamSet) -> TeamView:
        return queries.set_team(service, name, body)

    @app.put("/teams/{name}/quotas/{flavor}", response_model=TeamView)
    def put_quota(name: str, flavor: str, body: QuotaSet) -> TeamView:
        return queries.set_quota(service, name, flavor, body)

    app.include_router(deployment_routes.router(service))
    return app
