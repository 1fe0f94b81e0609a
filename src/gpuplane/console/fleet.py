"""The console's pages over workloads beyond jobs: deployments (versions, weights, instances and
the slots the gateways report in use) and batch runs (their run.json summaries), under the same
policy table as the rest of `/ui`: a member sees its own team's, another team's answers 404.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from gpuplane.console import runs
from gpuplane.control.auth import Principal
from gpuplane.control.deployments.routes import describe, describe_all, rollout_of
from gpuplane.control.service import ControlService


def slots(d: dict[str, Any]) -> tuple[int | None, int]:
    """Slots the reporting gateways hold over a deployment's instances (None: no gateway
    reports), and the capacity of its running instances whose slots are known (an engine
    that reports its own is counted once it answered)."""
    reported = [i["in_use"] for i in d["instances"] if i["in_use"] is not None]
    capacity = sum(
        i["capacity"] for i in d["instances"] if i["state"] == "running" and i["capacity"]
    )
    return (sum(reported) if reported else None), capacity


def add_pages(
    app: FastAPI,
    service: ControlService,
    caller: Callable[..., Principal],
    render: Callable[..., Response],
) -> None:
    """The pages on `app`; `render(request, template, who, **context)` draws one."""
    runs_dirs = service.config.runs_dirs

    @app.get("/ui/deployments", include_in_schema=False)
    def deployments(request: Request, who: Principal = Depends(caller)) -> Response:
        shown = [(d, rollout_of(service, d), slots(d)) for d in describe_all(service, who.teams())]
        return render(request, "deployments.html", who, deployments=shown)

    @app.get("/ui/deployments/{name}", include_in_schema=False)
    def deployment(request: Request, name: str, who: Principal = Depends(caller)) -> Response:
        d = describe(service, name, who.teams())
        return render(
            request, "deployment.html", who, d=d, rollout=rollout_of(service, d), slots=slots(d)
        )

    @app.get("/ui/runs", include_in_schema=False)
    def batch_runs(request: Request, who: Principal = Depends(caller)) -> Response:
        listed = runs.list_runs(runs_dirs, who.teams())
        return render(request, "runs.html", who, runs=listed, configured=bool(runs_dirs))

    @app.get("/ui/runs/{team}/{name}", include_in_schema=False)
    def batch_run(
        request: Request, team: str, name: str, who: Principal = Depends(caller)
    ) -> Response:
        run = runs.get_run(runs_dirs, team, name, who.teams())
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
