"""The `gpuplane` command: the root app and its groups."""

from __future__ import annotations

import typer

from gpuplane import __version__
from gpuplane.cli import audit as audit_cli
from gpuplane.cli import audit_review, engine, events, serve
from gpuplane.cli import batch as batch_cli
from gpuplane.cli import cluster as cluster_cli
from gpuplane.cli import config as config_cli
from gpuplane.cli import control as control_cli
from gpuplane.cli import deploy as deploy_cli
from gpuplane.cli import drill as drill_cli
from gpuplane.cli import job as job_cli
from gpuplane.cli import quota as quota_cli
from gpuplane.cli import secret as secret_cli
from gpuplane.cli import simulate as simulate_cli
from gpuplane.cli import token as token_cli
from gpuplane.cli import usage as usage_cli

app = typer.Typer(
    name="gpuplane",
    help="A control plane for an organisation's GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's plain help, for every command: Rich's option table cuts names at 80 columns
    rich_markup_mode=None,
)
serve.register(app)
app.add_typer(config_cli.app, name="config")
app.add_typer(batch_cli.app, name="batch")
app.add_typer(engine.app, name="engine")
app.add_typer(control_cli.app, name="control")
app.add_typer(job_cli.app, name="job")
app.add_typer(deploy_cli.app, name="deploy")
app.command("drill")(drill_cli.drill)
app.add_typer(cluster_cli.app, name="cluster")
app.add_typer(quota_cli.app, name="quota")
app.add_typer(simulate_cli.app, name="simulate")
app.add_typer(token_cli.app, name="token")
app.add_typer(secret_cli.app, name="secret")
events.register(app)
audit_review.register(audit_cli.app)
app.add_typer(audit_cli.app, name="audit")
app.command()(usage_cli.usage)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    _version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print gpuplane's version and exit.",
    ),
) -> None:
    """A control plane for an organisation's GPUs."""


@app.command()
def version() -> None:
    """Print gpuplane's version (as `gpuplane --version`)."""
    typer.echo(__version__)


if __name__ == "__main__":
    app()
