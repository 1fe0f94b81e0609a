"""`gpuplane up`: the whole plane on this machine in one process, until Ctrl-C.

A control plane on loopback with the config's `control` section (embedded defaults: SQLite in
the state dir, the `local` cluster, the local admin token it writes there), a default
deployment of the embedded engine applied through it (`default_deployment`: the `engine`
section as a deployment spec), and the gateway in front, which finds that deployment (and any
applied later) by watching the control plane, beside the config's own `models`.

In process, not as a child process: one process to start and to stop, the imports paid once, no
control plane left behind when `up` dies, and one signal handler that orders shutdown: the
gateway stops admitting and drains, the control API stops, then the service stops every job it
runs (the engines, recorded cancelled: a clean stop is no failure), the default deployment is
deleted and the store closed. The control API shares the gateway's event loop for
its async glue only; its handlers and its tick run on threads. `gpuplane control serve` and
`gpuplane gateway serve --control URL` run the same two parts as separate processes, as on a
cluster.

`control_app` is the control plane's composition root, here and in `gpuplane control serve`:
the control API with the audit's usage route and the web console mounted on it, each handed
what it reads of the service, so that neither the API nor the audit imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from sqlalchemy import select

from gpuplane.audit.routes import usage_router
from gpuplane.audit.settings import AuditSettings
from gpuplane.config import Settings
from gpuplane.console.mount import Console, login_url
from gpuplane.control.adapters.local import LocalAdapter
from gpuplane.control.api.app import create_app
from gpuplane.control.api.deps import caller
from gpuplane.control.api.serving import server_config
from gpuplane.control.errors import NotFoundError
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig, TeamConfig
from gpuplane.control.statedir import exclusive
from gpuplane.control.store import queries
from gpuplane.control.store.models import Job
from gpuplane.engines.config import EngineConfig
from gpuplane.engines.diagnose import TAIL_LINES, classify_exit, tail_of
from gpuplane.engines.llamacpp import LlamaCpp, check_installed
from gpuplane.errors import ConfigError, EngineError
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.server import check_free, serving, stop_on_signal, uvicorn_serving

if TYPE_CHECKING:
    from gpuplane.audit.collect.store import Card, Holding

UP_TEAM = "default"  # the default deployment's team when the config declares none
READY_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Plane:
    """What `up` serves, for the summary it prints."""

    gateway_url: str
    control_url: str
    token_file: Path
    model: str
    replicas: int
    console_url: str = ""  # a one-time login link, made when the plane is ready


@dataclass(frozen=True, slots=True)
class _Usage:
    """What the audit's usage route reads of `service` (`audit.routes.UsageSource`)."""

    service: ControlService

    @property
    def samples_dir(self) -> str | None:
        return self.service.config.samples_dir

    def holdings(self, since: float, until: float) -> tuple[list[Card], list[Holding]]:
        """The store's cards and holdings (pyarrow is imported when a report is read)."""
        from gpuplane.audit.collect.store import read_holdings

        return read_holdings(self.service.store, since, until)

    def clock(self) -> float:
        return self.service.clock()

    def teams(self, request: Request, team: str | None) -> Collection[str] | None:
        teams = caller(request.state.principal).teams()
        if team is not None:
            queries.get_team(self.service, team, teams)  # another team's: 404 as an unknown one
            teams = {team}
        return teams


def control_app(
    service: ControlService, *, background: bool = True, audit: AuditSettings | None = None
) -> FastAPI:
    """The control API over a started `service` with the audit's `/usage` route (`audit`: the
    config's `audit:` section, its prices) and the web console mounted; `background` runs the
    admission loop while serving."""
    usage = _Usage(service)
    return create_app(
        service,
        background=background,
        routers=[usage_router(usage, audit or AuditSettings())],
        pages=Console(service, usage.holdings),
    )


def embedded_control(control: ControlConfig, euid: int) -> tuple[ControlConfig, str, str | None]:
    """The control plane `up` runs, the default deployment's team (`control.default_team`, else
    the first declared team, else a team `default` added to the config), and a note to print
    when `up` chose something for the user: run as root (`euid` 0) with neither
    `control.job_user` nor `control.allow_root_jobs` set, its jobs run as root, as `up` ran its
    engines before it deployed them (an unprivileged job user often cannot reach a virtualenv
    under /root)."""
    team = control.default_team or (control.teams[0].name if control.teams else UP_TEAM)
    if all(t.name != team for t in control.teams):
        control = control.model_copy(update={"teams": [*control.teams, TeamConfig(name=team)]})
    note = None
    if euid == 0 and not {"job_user", "allow_root_jobs"} & control.model_fields_set:
        # one user's plane: its teams share that user knowingly (the note says so)
        shared = (
            {"allow_shared_job_user": True}
            if "allow_shared_job_user" not in control.model_fields_set
            else {}
        )
        control = control.model_copy(update={"allow_root_jobs": True, **shared})
        note = (
            "running as root: the plane's jobs (its engines too) run as root, every team's "
            "alike; set control.job_user to run them as an unprivileged user who can run this "
            "Python"
        )
    return control, team, note


def default_deployment(engine: EngineConfig, team: str) -> dict[str, Any]:
    """The deployment `up` applies: `engine.instances` replicas of the embedded llama.cpp serving
    `engine.model_path` (default: the bundled SmolLM2) as `engine.model_name`, with the engine
    section's context window, threads and RAM prompt cache."""
    tuning = LlamaCpp.tuning(
        n_ctx=engine.n_ctx, threads=engine.threads, cache_bytes=engine.cache_bytes
    )
    return {
        "name": engine.model_name,
        "model": engine.model_path or "smollm2",
        "version": "v1",
        "engine": LlamaCpp.name,
        "replicas": engine.instances,
        "team": team,
        "engine_args": tuning,
    }


async def run_up(
    settings: Settings, control: ControlConfig, team: str, on_ready: Callable[[Plane], None]
) -> None:
    """Serve the plane (`control`, `team`: from `embedded_control`) until SIGINT or SIGTERM.
    Refused before anything starts when another process holds the state dir (`exclusive`) or
    a port is taken. Fails, with the engine's diagnosis, when an instance of the default
    deployment ends while starting, or when not every one serves within
    `engine.start_timeout_s`. However it ends, short of SIGKILL, the engines are stopped
    (recorded cancelled) and the default deployment is deleted: it is `up`'s, not a stored
    deployment for the next control plane in this state dir to start again."""
    check_installed()
    name = settings.engine.model_name
    if any(m.name == name for m in settings.models):
        raise ConfigError(
            f"model '{name}' is both in `models` and the embedded engine (engine.model_name); "
            "rename one"
        )
    gw = settings.gateway
    with exclusive(control.state_dir):
        check_free(control.host, control.port, "control plane", "control.port, --control-port")
        check_free(gw.host, gw.port, "gateway", "gateway.port, --port")
        service = ControlService(control)
        try:
            service.start()
            await _serve(settings, service, default_deployment(settings.engine, team), on_ready)
        finally:
            _shut_down(service, name)


async def _serve(
    settings: Settings,
    service: ControlService,
    spec: dict[str, Any],
    on_ready: Callable[[Plane], None],
) -> None:
    """The control API, the default deployment `spec` applied through it and the gateway,
    until a signal (or a failed start, raised)."""
    control = service.config
    token_file = service.tokens.local_admin(Path(control.state_dir)).resolve()
    with stop_on_signal() as stop:
        app = control_app(service, audit=settings.audit)
        config = server_config(app, control)
        async with uvicorn_serving(config, "control plane", "control.port, --control-port") as port:
            control_url = f"http://{control.host}:{port}"
            started = service.clock()
            await asyncio.to_thread(service.deployments.apply, spec)
            gateway = Gateway(
                settings, control=control_url, control_token=token_file.read_text().strip()
            )
            async with serving(settings, gateway) as gateway_url:
                plane = Plane(gateway_url, control_url, token_file, spec["name"], spec["replicas"])
                wait = settings.engine.start_timeout_s
                if await _until_ready(service, gateway, plane, started, wait, stop):
                    admin = token_file.read_text().strip()
                    on_ready(replace(plane, console_url=login_url(app, control_url, admin)))
                    await stop.wait()


def _shut_down(service: ControlService, deployment: str) -> None:
    """Delete `deployment` (its instances drain), stop the jobs (its instances among them,
    recorded cancelled), let the deployment forget its ended instances, which deletes it, and
    close the service. Idempotent steps; the service is closed even when one fails."""
    try:
        with contextlib.suppress(NotFoundError):  # never applied: `up` failed before
            service.deployments.delete(deployment)
        service.binder.stop_all()
        service.deployments.reconcile(deployment)
    finally:
        service.close(stop_jobs=True)


async def _until_ready(
    service: ControlService,
    gateway: Gateway,
    plane: Plane,
    since: float,
    timeout_s: float,
    stop: asyncio.Event,
) -> bool:
    """Wait until the gateway admits to every replica of the default deployment; False when
    stopped first (Ctrl-C while starting)."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        await gateway.probe_once()  # not only every health.probe_interval_s: it serves sooner
        router = gateway.routers.get(plane.model)
        if router is not None and router.slots.healthy_count >= plane.replicas:
            return True
        failed = await asyncio.to_thread(_failed_start, service, plane.model, since)
        if failed is not None:
            raise EngineError(failed)
        if time.monotonic() > deadline:
            raise EngineError(
                f"deployment {plane.model} did not serve {plane.replicas} instance(s) within "
                f"{timeout_s:g} s (engine.start_timeout_s); its events say why: run `gpuplane "
                f"up` again and `gpuplane deploy describe {plane.model}`, or raise the timeout"
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), READY_POLL_S)
    return False


def _failed_start(service: ControlService, deployment: str, since: float) -> str | None:
    """The diagnosis of an instance of `deployment` (its version v1, as `default_deployment`
    makes it) that failed since `since`, if any: what its exit means and the end of its log."""
    with service.store.session() as session:
        job = session.scalars(
            select(Job)
            .where(Job.name == f"{deployment}-v1", Job.state == "failed")
            .where(Job.created_at >= since)
            .order_by(Job.finished_at)
        ).first()
        if job is None:
            return None
        job_id, cluster, code, message = job.id, job.cluster_name, job.exit_code, job.message
    adapter = service.adapters.get(str(cluster))
    if code is None or not isinstance(adapter, LocalAdapter):  # it never ran: why not
        return f"instance {job_id} of deployment {deployment} could not start: {message}"
    tail = tail_of(b"".join(adapter.logs(job_id, tail=TAIL_LINES)).decode("utf-8", "replace"))
    diagnosis = classify_exit(code, tail)
    return (
        f"instance {job_id} of deployment {deployment} {diagnosis.cause} while starting: "
        f"{diagnosis.hint} (log: {Path(adapter.log_path(job_id)).resolve()})"
    )
