"""The control API over real HTTP on 127.0.0.1, in a thread of the test process, for CLI tests
that need no `gpuplane control serve` subprocess; and the CLI groups invoked against it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer
import uvicorn
from typer.testing import CliRunner

from gpuplane.cli import cluster as cluster_cli
from gpuplane.cli import job as job_cli
from gpuplane.cli import quota as quota_cli
from gpuplane.control.api import create_app
from gpuplane.control.service import ControlService

cli_app = typer.Typer()
cli_app.add_typer(job_cli.app, name="job")
cli_app.add_typer(quota_cli.app, name="quota")
cli_app.add_typer(cluster_cli.app, name="cluster")
_runner = CliRunner()


@contextmanager
def serving(service: ControlService) -> Iterator[str]:
    """The API over `service` (no background loop) while the block runs; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    app = create_app(service, background=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="control-api-test", daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the API server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the API server did not stop"


def cli(url: str, *args: str) -> tuple[int, str]:
    """`gpuplane job|quota|cluster ...` against `url`: its exit code and what it printed."""
    result = _runner.invoke(cli_app, list(args), env={"GPUPLANE_SERVER": url})
    return result.exit_code, result.output
