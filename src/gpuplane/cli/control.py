"""`gpuplane control serve`: the control-plane API with its admission loop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuplane import logs
from gpuplane.config import Settings, load_settings, parse_settings

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

app = typer.Typer(help="The multi-cluster control plane service.", no_args_is_help=True)


@app.command()
def serve(
    port: int | None = typer.Option(None, "--port", "-p", help="default: control.port (8080)"),
    host: str | None = typer.Option(None, "--host", help="default: control.host (127.0.0.1)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="gpuplane.yaml"),
    database_url: str | None = typer.Option(
        None, "--db", help="SQLAlchemy URL; default: sqlite:///.gpuplane/control.db"
    ),
    stop_jobs: bool = typer.Option(
        False,
        "--stop-jobs",
        help="on shutdown, stop the jobs this service runs (recorded cancelled) instead of "
        "leaving them to its restart",
    ),
) -> None:
    """Serve the control plane. OpenAPI at /docs; on embedded defaults or a config file.

    Every request but /healthz needs a bearer token. At start the service writes an admin token
    to its state dir (0600) and prints where; the CLI on this machine reads it by itself.
    Listening beyond loopback needs control.auth.allowed_hosts (refused at start otherwise).

    One control plane per state dir: a second one started on the same dir is refused, naming
    the process that holds it, before it reads or changes anything.

    SIGTERM and SIGINT (Ctrl-C) stop the service, not its jobs: they keep running, and the
    service started again with the same control.service_id (default host:port) takes them back,
    recording the exit code of any that ended meanwhile. With --stop-jobs, shutting down stops
    them too.
    """
    from gpuplane.control.statedir import exclusive
    from gpuplane.errors import GpuplaneError
    from gpuplane.serve.server import check_free

    logs.configure()
    try:
        data = load_settings(config).model_dump(exclude_unset=True)
        data.setdefault("control", {}).update(
            (k, v)
            for k, v in (("port", port), ("host", host), ("database_url", database_url))
            if v is not None
        )
        settings = parse_settings(data, source=str(config or "defaults"))
        control = settings.control
        # one control plane per state dir, on a free port, before its jobs are taken back
        with exclusive(control.state_dir):
            check_free(control.host, control.port, "control plane", "control.port, --port")
            _run(settings, stop_jobs)
    except GpuplaneError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _run(settings: Settings, stop_jobs: bool) -> None:
    """Start the service, serve its API until a signal, then close it (`stop_jobs`: with its
    jobs)."""
    from gpuplane.control.api.serving import server_config
    from gpuplane.control.service.service import ControlService
    from gpuplane.plane import control_app

    control = settings.control
    service = ControlService(control)
    messages = service.start()
    typer.echo(f"store: {service.store.safe_url} (policy {service.policy.name})")
    for line in messages:
        typer.echo(line)
    api = control_app(service, audit=settings.audit)
    admin = service.tokens.local_admin(Path(control.state_dir)).read_text().strip()
    try:
        asyncio.run(_serve_until_signal(server_config(api, control), api, admin))
    finally:
        service.close(stop_jobs=stop_jobs)


async def _serve_until_signal(config: uvicorn.Config, api: FastAPI, admin: str) -> None:
    """Serve the control API until SIGTERM or SIGINT; the service's own shutdown runs after.
    Once listening it prints a one-time console login URL for the local `admin` token."""
    from gpuplane.console.mount import login_url
    from gpuplane.serve.server import stop_on_signal, uvicorn_serving

    with stop_on_signal() as stop:
        async with uvicorn_serving(config, "control plane", "control.port, --port") as port:
            base = f"http://{config.host}:{port}"
            typer.echo(f"control plane on {base} (API docs at /docs)")
            typer.echo(f"web console (one-time login link): {login_url(api, base, admin)}")
            await stop.wait()
