"""The web console at `/ui`: server-rendered pages (Jinja2, no script) over the same queries and
the same policy table as the JSON API: the overview, jobs, quotas, GPUs and events (`fleet.py`:
deployments and batch runs; `login.py`: logging in and out).

The control API's edge takes a console route's caller from the session cookie
(`auth.Rule.console`, through `mount.Console.caller`) and every other route's from the bearer
token only, so a cookie never authorises the JSON API. Every console form that changes something
carries the session's CSRF token, checked before anything is done.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from gpuplane.audit import history
from gpuplane.audit.usage_report import Holdings
from gpuplane.console.deps import holdings_of
from gpuplane.console.render import check_csrf, form, render
from gpuplane.console.shapes import SliceView, by_model, card_map, quota_rows
from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.identity.auth import Principal, Role
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import queries
from gpuplane.control.store.models import ACTIVE_STATES, JOB_STATES, Allocation, Device, Job, Node
from gpuplane.errors import ResourceError, unknown_name

ENDED = ("succeeded", "failed", "cancelled")
# the overview's history: how far back it looks (seconds), in this many steps
WINDOWS = {"1h": 3600.0, "6h": 6 * 3600.0, "24h": 24 * 3600.0, "7d": 7 * 24 * 3600.0}
STEPS = 48

router = APIRouter(include_in_schema=False)


def _held(service: ControlService) -> list[tuple[str, str, int, SliceView, str]]:
    """Every card share held by an admitted or running job."""
    query = (
        select(Node.cluster_name, Node.name, Device.index, Allocation, Job.name, Job.team_name)
        .join(Device, Allocation.device_id == Device.id)
        .join(Node, Device.node_id == Node.id)
        .join(Job, Allocation.job_id == Job.id)
        .where(Job.state.in_(ACTIVE_STATES))
    )
    with service.store.session() as session:
        return [
            (c, n, i, SliceView(a.job_id, f"{name} ({team})", a.gpu_milli, a.mem_mib), team)
            for c, n, i, a, name, team in session.execute(query)
        ]


@router.get("/ui")
def overview(
    request: Request,
    window: str = "24h",
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
    holdings: Holdings = Depends(holdings_of),
) -> Response:
    if window not in WINDOWS:
        raise ResourceError(unknown_name("history window", window, WINDOWS))
    clusters = queries.list_clusters(service)
    models = by_model(queries.list_nodes(service))
    past = history.read(
        holdings, service.config.samples_dir, service.clock(), WINDOWS[window], STEPS
    )
    return render(
        request,
        "overview.html",
        who,
        clusters=clusters,
        models=models,
        history=past,
        windows=list(WINDOWS),
        window=window,
    )


@router.get("/ui/jobs")
def jobs(
    request: Request,
    team: str = "",
    state: str = "",
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    listed = queries.list_jobs(service, team or None, state or None, 500, who.teams())
    teams = [t.name for t in queries.list_teams(service, who.teams())]
    return render(
        request,
        "jobs.html",
        who,
        jobs=listed,
        teams=teams,
        states=JOB_STATES,
        team=team,
        state=state,
    )


@router.get("/ui/jobs/{ref}")
def job(
    request: Request,
    ref: str,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    view = queries.get_job(service, ref, who.teams())
    can_cancel = view.state not in ENDED and who.role.covers(Role.member)
    return render(request, "job.html", who, job=view, can_cancel=can_cancel)


@router.post("/ui/jobs/{ref}/cancel")
async def cancel(
    request: Request,
    ref: str,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    check_csrf(request, await form(request))
    job_id = await run_in_threadpool(service.cancel, ref, who.teams())
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.get("/ui/quotas")
def quotas(
    request: Request,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    shown = who.teams()
    teams = queries.list_teams(service)
    rows = quota_rows(teams, shown)
    mine = [t for t in teams if shown is None or t.name in shown]
    return render(request, "quotas.html", who, rows=rows, teams=mine)


@router.get("/ui/gpus")
def gpus(
    request: Request,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    nodes = card_map(queries.list_nodes(service), _held(service), who.teams())
    return render(request, "gpus.html", who, nodes=nodes)


@router.get("/ui/events")
def events(
    request: Request,
    team: str = "",
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    listed = queries.list_events(service, team or None, None, 300, who.teams())
    return render(request, "events.html", who, events=list(reversed(listed)), team=team)
