"""`gpuplane control serve`: the control-plane API with its admission loop."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuplane.config import load_settings

app = typer.Typer(help="The multi-cluster control plane service.", no_args_is_help=True)


@app.command()
def serve(
    port: int | None = typer.Option(None, "--port", "-p", help="default: control.port (8080)"),
    host: str | None = typer.Option(None, "--host", help="default: control.host (127.0.0.1)"),
    config: Path | None = typer.Option(None, "--config", "-c", help="gpuplane.yaml"),
    database_url: str | None = typer.Option(
        None, "--db", help="SQLAlchemy URL; default: sqlite:///.gpuplane/control.db"
    ),
) -> None:
    """Serve the control plane (OpenAPI at /docs) on embedded defaults or a config file."""
    import uvicorn

    from gpuplane.control.api import create_app
    from gpuplane.control.service import ControlService
    from gpuplane.errors import GpuplaneError

    try:
        control = load_settings(config).control
        updates = {
            k: v
            for k, v in (("port", port), ("host", host), ("database_url", database_url))
            if v is not None
        }
        control = control.model_copy(update=updates)
        service = ControlService(control)
        messages = service.start()
    except GpuplaneError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"store: {service.store.safe_url} (policy {service.policy.name})")
    for line in messages:
        typer.echo(line)
    typer.echo(f"control plane on http://{control.host}:{control.port} (API docs at /docs)")
    try:
        uvicorn.run(create_app(service), host=control.host, port=control.port, log_level="warning")
    finally:
        service.close()
