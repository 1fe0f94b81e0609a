"""The console's pages over workloads beyond jobs: deployments (versions, weights, instances and
the slots the gateways report in use) and batch runs (their run.json summaries), under the same
policy table as the rest of `/ui`: a member sees its own team's, another team's answers 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from gpuplane.console import runs
from gpuplane.console.render import render
from gpuplane.control.api.deps import caller, service_of
from gpuplane.control.deployments.routes import describe, describe_all, rollout_of
from gpuplane.control.identity.auth import Principal
from gpuplane.control.service.service import ControlService

router = APIRouter(include_in_schema=False)


def slots(d: dict[str, Any]) -> tuple[int | None, int]:
    """Slots the reporting gateways hold over a deployment's instances (None: no gateway
    reports), and the capacity of its running instances whose slots are known (an engine
    that reports its own is counted once it answered)."""
    reported = [i["in_use"] for i in d["instances"] if i["in_use"] is not None]
    capacity = sum(
        i["capacity"] for i in d["instances"] if i["state"] == "running" and i["capacity"]
    )
    return (sum(reported) if reported else None), capacity


@router.get("/ui/deployments")
def deployments(
    request: Request,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    shown = [(d, rollout_of(service, d), slots(d)) for d in describe_all(service, who.teams())]
    return render(request, "deployments.html", who, deployments=shown)


@router.get("/ui/deployments/{name}")
def deployment(
    request: Request,
    name: str,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    d = describe(service, name, who.teams())
    return render(
        request, "deployment.html", who, d=d, rollout=rollout_of(service, d), slots=slots(d)
    )


@router.get("/ui/runs")
def batch_runs(
    request: Request,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    runs_dirs = service.config.runs_dirs
    listed = runs.list_runs(runs_dirs, who.teams())
    return render(request, "runs.html", who, runs=listed, configured=bool(runs_dirs))


@router.get("/ui/runs/{team}/{name}")
def batch_run(
    request: Request,
    team: str,
    name: str,
    who: Principal = Depends(caller),
    service: ControlService = Depends(service_of),
) -> Response:
    run = runs.get_run(service.config.runs_dirs, team, name, who.teams())
    tables: dict[str, Any] = {}
    if run.summary is not None:
        # the batch tier's report shapers; imported here, so the API needs no batch extra
        from gpuplane.batch import report

        s = run.summary
        tables = {
            "runner": report.runner_words(s),
            "stages": (report.STAGE_HEAD, report.stage_rows(s)),
            "invocations": (report.INVOCATION_HEAD, report.invocation_rows(s)),
            "clips": report.clip_rows(s, run.path),
        }
    return render(request, "run.html", who, run=run, tables=tables)
