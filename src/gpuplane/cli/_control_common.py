"""What the control-plane CLI groups share: --server, -o table|json|yaml, and error exits."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from gpuplane.control.client import DEFAULT_SERVER, SERVER_ENV, ClientError, ControlClient
from gpuplane.errors import GpuplaneError


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


SERVER_OPTION = typer.Option(
    None, "--server", envvar=SERVER_ENV, help=f"control plane URL (default {DEFAULT_SERVER})"
)
OUTPUT_OPTION = typer.Option(Output.table, "--output", "-o", help="table, json or yaml")

console = Console(soft_wrap=True)
if not console.is_terminal:  # piped: do not squeeze tables into 80 columns
    console.width = 200
err_console = Console(stderr=True, soft_wrap=True)


@contextmanager
def client(server: str | None) -> Iterator[ControlClient]:
    """A client; any gpuplane error inside exits non-zero with its message."""
    try:
        with ControlClient(server) as c:
            yield c
    except ClientError as exc:
        where = f" (HTTP {exc.status})" if exc.status else ""
        err_console.print(f"[red]error{where}:[/red] {exc}", highlight=False)
        body = exc.body if isinstance(exc.body, dict) else {}
        for reason in body.get("reasons", []):
            err_console.print(
                f"  {reason['cluster']}: {reason['code']}: {reason['message']}", highlight=False
            )
        raise typer.Exit(1) from None
    except GpuplaneError as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None


def fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(1)


def emit(data: Any, output: Output, table: Callable[[Any], None]) -> None:
    """Print `data` as JSON, YAML, or with the command's own table renderer."""
    if output == Output.json:
        typer.echo(json.dumps(data, indent=2, sort_keys=False))
    elif output == Output.yaml:
        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())
    else:
        table(data)


def print_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None
) -> None:
    t = Table(*columns, title=title, box=None, header_style="bold", pad_edge=False)
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)


def print_reasons(reasons: Sequence[dict[str, Any]]) -> None:
    for r in reasons:
        nums = ", ".join(f"{k}={v}" for k, v in r.get("numbers", {}).items())
        console.print(
            f"  {r['cluster']}: {r['code']}: {r['message']}" + (f" ({nums})" if nums else ""),
            highlight=False,
        )


def mib(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f}GiB" if value >= 1024 else f"{value}MiB"
