"""Jobs: members submit and cancel their team's, viewers read them and their logs, admins move
one to other cards. Another team's job answers as an unknown one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.identity.auth import Principal, of_own_team
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from gpuplane.control.store.views import DryRunView, JobMove, JobView
from gpuplane.errors import ResourceError

router = APIRouter()


@router.post("/jobs", response_model=JobView | DryRunView, status_code=201)
def submit(
    spec: dict[str, Any] = Body(..., description="a job spec, as in the YAML file"),
    dry_run: bool = Query(False, description="answer where it would go; change nothing"),
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> JobView | DryRunView | JSONResponse:
    out = service.submit(of_own_team(who, spec, "jobs"), dry_run=dry_run)
    if dry_run:
        view = DryRunView(**{**out, "reasons": [r.to_json() for r in out["reasons"]]})
        return JSONResponse(view.model_dump(mode="json"), status_code=200)
    return queries.get_job(service, out["id"])


@router.post("/jobs/batch", status_code=201)
def submit_batch(
    specs: list[dict[str, Any]] = Body(..., description="job specs; all queued or none"),
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> dict[str, list[str]]:
    return {"ids": service.submit_many([of_own_team(who, s, "jobs") for s in specs])}


@router.get("/jobs", response_model=list[JobView])
def jobs(
    team: str | None = None,
    state: str | None = None,
    limit: int = Query(500, ge=1, le=10000),
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> list[JobView]:
    return queries.list_jobs(service, team, state, limit, who.teams())


@router.get("/jobs/{ref}", response_model=JobView)
def job(
    ref: str, who: Principal = Depends(caller), service: ControlService = Depends(service_of)
) -> JobView:
    return queries.get_job(service, ref, who.teams())


@router.post("/jobs/{ref}/cancel", response_model=JobView)
def cancel(
    ref: str, who: Principal = Depends(caller), service: ControlService = Depends(service_of)
) -> JobView:
    return queries.get_job(service, service.cancel(ref, who.teams()))


@router.post("/jobs/{ref}/move", response_model=JobView)
def move(ref: str, body: JobMove, service: ControlService = Depends(service_of)) -> JobView:
    slice_ = body.model_dump(include={"gpu_mem_mib", "gpu_cores_pct"}, exclude_none=True)
    service.move(ref, body.cluster, body.node, slice_, body.reason)
    return queries.get_job(service, ref)


@router.get("/jobs/{ref}/logs", response_class=PlainTextResponse)
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
    service: ControlService = Depends(service_of),
) -> StreamingResponse:
    if tail is not None and since:
        raise ResourceError("give tail or since, not both: since counts bytes from the start")
    # streamed a block at a time: a log is never held whole, however large
    return StreamingResponse(
        queries.job_logs(service, ref, tail, since, who.teams()),
        media_type="text/plain; charset=utf-8",
    )
