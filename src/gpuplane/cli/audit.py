"""`gpuplane audit collect`: usage samples from NVML, Prometheus, the gateway, the control plane
or recorded files into a sample store (a directory of Parquet files by day)."""

from __future__ import annotations

import enum
from pathlib import Path

import typer

from gpuplane.audit.collect import CollectError
from gpuplane.audit.samples import TRAFFIC_SCHEMA, SampleError, SampleStore

app = typer.Typer(
    help="GPU audit: usage samples, findings, right-sized slices.", no_args_is_help=True
)


class Source(enum.StrEnum):
    file = "file"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@app.command()
def collect(
    source: Source = typer.Option(..., "--source", "-s", help="where the samples come from"),
    out: Path = typer.Option(..., "--out", help="the sample store (a directory; made if absent)"),
    files: list[Path] = typer.Argument(None, help="--source file: the CSV/Parquet files"),
    once: bool = typer.Option(False, "--once", help="collect one pass, then exit (the default)"),
    interval: float | None = typer.Option(
        None, "--interval", min=1.0, help="collect every this many seconds until interrupted"
    ),
    traffic: bool = typer.Option(
        False, "--traffic", help="--source file: the files hold gateway traffic, not samples"
    ),
) -> None:
    """Collect usage samples into the store at --out; each pass is written as it completes, so
    an interrupted collector loses at most the pass in flight."""
    if once and interval is not None:
        _fail("--once and --interval exclude each other; give one (--once is the default)")
    if interval is not None:
        _fail("--source file imports once; drop --interval")
    _import(files or [], out, traffic)


def _import(files: list[Path], out: Path, traffic: bool) -> None:
    from gpuplane.audit.collect.files import import_files

    if not files:
        _fail(
            "--source file needs the files to import, "
            "e.g. `gpuplane audit collect -s file --out DIR a.csv`"
        )
    store = SampleStore(out, TRAFFIC_SCHEMA) if traffic else SampleStore(out)
    try:
        rows = import_files(files, store)
    except (SampleError, CollectError) as exc:
        _fail(f"{exc}; nothing was imported, fix the file and run again")
    typer.echo(f"imported {rows} rows from {len(files)} file(s) into {out}")
