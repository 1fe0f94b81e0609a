"""What the `gpuplane batch` commands share: the `batch:` section under their flags, the options
several of them take, -o table|json|yaml, and error exits."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from gpuplane.batch.settings import BatchConfig
from gpuplane.config import load_settings
from gpuplane.errors import GpuplaneError

err = Console(stderr=True, soft_wrap=True)  # an error names paths: print them whole, never cut
T = TypeVar("T")


class BatchOutput(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


OUTPUT_OPTION = typer.Option(BatchOutput.table, "-o", "--output")
CONFIG_OPTION = typer.Option(
    None, "--config", "-c", help="gpuplane.yaml: its batch: section sets what a flag leaves unset"
)


def key_help(key: str) -> str:
    """A flag's help: what it sets, and the `batch:` key (with its default) it overrides."""
    field = BatchConfig.model_fields[key]
    default = field.get_default(call_default_factory=True)
    shown = "" if default is None else f" ({default!r})"
    return f"{field.description}; default batch.{key}{shown}"


CACHE_OPTION = typer.Option(None, "--cache", help=key_help("cache_url"))


def batch_settings(config: Path | None, **flags: Any) -> BatchConfig:
    """The `batch:` section of `config` (embedded defaults without a file), each flag that was
    given (not None) overriding its key."""
    section = load_settings(config).batch
    return section.model_copy(update={k: v for k, v in flags.items() if v is not None})


def stdout() -> Console:
    """Tables on stdout; wide when piped, so columns are not truncated."""
    return Console(width=None if sys.stdout.isatty() else 160)


def guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except GpuplaneError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def emit(doc: Any, fmt: BatchOutput) -> None:
    if fmt is BatchOutput.yaml:
        import yaml

        typer.echo(yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False))
    else:
        typer.echo(json.dumps(doc, indent=2, default=str))
