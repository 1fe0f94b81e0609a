"""The control API over real HTTP on 127.0.0.1, in a thread of the test process, for CLI tests
that need no `gpuplane control serve` subprocess; and the CLI groups invoked against it, as the
service's local admin (the token it wrote to its state dir) unless told otherwise."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer
import uvicorn
from typer.testing import CliRunner

from gpuplane.audit.settings import AuditSettings
from gpuplane.cli import cluster as cluster_cli
from gpuplane.cli import events
from gpuplane.cli import job as job_cli
from gpuplane.cli import quota as quota_cli
from gpuplane.cli import secret as secret_cli
from gpuplane.cli import token as token_cli
from gpuplane.cli import usage as usage_cli
from gpuplane.control.service.service import ControlService
from gpuplane.plane import control_app
from tests.control.svc_helpers import admin_token

cli_app = typer.Typer()
cli_app.add_typer(job_cli.app, name="job")
cli_app.add_typer(quota_cli.app, name="quota")
cli_app.add_typer(cluster_cli.app, name="cluster")
cli_app.add_typer(token_cli.app, name="token")
cli_app.add_typer(secret_cli.app, name="secret")
events.register(cli_app)
cli_app.command()(usage_cli.usage)
_runner = CliRunner()
_admins: dict[str, str] = {}  # URL -> the admin token of the service served there


@contextmanager
def serving(service: ControlService, audit: AuditSettings | None = None) -> Iterator[str]:
    """The API over `service` (no background loop; `audit`: its config's `audit:` section) while
    the block runs; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    app = control_app(service, background=False, audit=audit)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="control-api-test", daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the API server did not start"
            time.sleep(0.01)
        url = f"http://127.0.0.1:{port}"
        _admins[url] = admin_token(service)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the API server did not stop"


@contextmanager
def serving_with_loop(service: ControlService) -> Iterator[str]:
    """`serving`, with the service's background loop as `control serve` runs it: a tick every
    0.2 s in a thread, stopped before the block's end returns."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.2):
            service.tick()

    ticker = threading.Thread(target=tick, name="control-tick-test", daemon=True)
    ticker.start()
    try:
        with serving(service) as url:
            yield url
    finally:
        stop.set()
        ticker.join(timeout=30)


def admin_of(url: str) -> str:
    """The admin token of the service `serving` serves at `url` ("" for any other URL)."""
    return _admins.get(url, "")


def cli(
    url: str, *args: str, token: str | None = None, input: str | None = None
) -> tuple[int, str]:
    """`gpuplane job|quota|cluster|token|secret|events|usage ...` against `url` as `token`
    (default: the served service's admin): its exit code and what it printed."""
    env = {"GPUPLANE_SERVER": url, "GPUPLANE_TOKEN": admin_of(url) if token is None else token}
    result = _runner.invoke(cli_app, list(args), env=env, input=input)
    return result.exit_code, result.output
