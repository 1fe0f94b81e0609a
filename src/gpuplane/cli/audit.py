"""`gpuplane audit collect`: usage samples from NVML, Prometheus, the gateway, the control plane
or recorded files into a sample store (a directory of Parquet files by day)."""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

import pyarrow as pa
import typer

from gpuplane.audit.collect import CollectError
from gpuplane.audit.sample_store import SampleStore
from gpuplane.audit.samples import TRAFFIC_SCHEMA, SampleError
from gpuplane.cli._loop import run as run_loop
from gpuplane.cli._secrets import secret_option
from gpuplane.control.spec import parse_duration
from gpuplane.errors import GpuplaneError

app = typer.Typer(
    help="GPU audit: usage samples, findings, right-sized slices.", no_args_is_help=True
)


class Source(enum.StrEnum):
    nvml = "nvml"
    prometheus = "prometheus"
    gateway = "gateway"
    control = "control"
    file = "file"


# One pass of a collector: the samples of the window [since, until).
Pass = Callable[[datetime, datetime], pa.Table]


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _duration(value: str, option: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        _fail(f"{option}: {exc}")


@app.command()
def collect(
    source: Source = typer.Option(..., "--source", "-s", help="where the samples come from"),
    out: Path = typer.Option(..., "--out", help="the sample store (a directory; made if absent)"),
    files: list[Path] = typer.Argument(None, help="--source file: the CSV/Parquet files"),
    once: bool = typer.Option(False, "--once", help="collect one pass, then exit (the default)"),
    interval: float | None = typer.Option(
        None, "--interval", min=1.0, help="collect every this many seconds until interrupted"
    ),
    url: str | None = typer.Option(
        None,
        "--url",
        help="--source prometheus|gateway: the server, e.g. http://prom:9090, http://gw:8000",
    ),
    db: str | None = typer.Option(
        None, "--db", help="--source control: the store's database URL (control.database_url)"
    ),
    since: str = typer.Option(
        "1h",
        "--since",
        help="--source control|prometheus: the first pass covers this much history",
    ),
    step: str = typer.Option(
        "60s",
        "--step",
        help="--source control|prometheus: one sample per this; "
        "--source gateway --once: observe the gateway this long",
    ),
    traffic: bool = typer.Option(
        False, "--traffic", help="--source file: the files hold gateway traffic, not samples"
    ),
    cluster: str = typer.Option(
        "local", "--cluster", help="--source nvml|prometheus: the cluster the cards are in"
    ),
    node: str | None = typer.Option(
        None, "--node", help="--source nvml: this node's name (default $NODE_NAME, or hostname)"
    ),
    run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        help="--source nvml: the local adapter's job records "
        "(<control.state_dir>/clusters/<cluster>/run), to name each process's job",
    ),
    record: Path | None = typer.Option(
        None, "--record", help="--source nvml: also write NVML's answer of each pass here (JSON)"
    ),
    admin_key: str | None = secret_option(
        "--admin-key", "GPUPLANE_ADMIN_KEY", "--source gateway: its admin key, once it has keys"
    ),
) -> None:
    """Collect usage samples into the store at --out. Each pass is written as it completes, so an
    interrupted collector loses at most the pass in flight."""
    if once and interval is not None:
        _fail("--once and --interval exclude each other; give one (--once is the default)")
    if source is Source.file:
        if interval is not None:
            _fail("--source file imports once; drop --interval")
        _import(files or [], out, traffic)
        return
    if files:
        _fail(f"--source {source.value} takes no file arguments (got {files[0]})")
    if source is Source.nvml:
        _nvml(SampleStore(out), cluster, node, run_dir, record, interval)
        return
    if source is Source.prometheus:
        _collect_prometheus(out, url, cluster, since, step, interval)
    elif source is Source.gateway:
        _collect_gateway(out, url, step, interval, admin_key)
    elif source is Source.control:
        _collect_control(out, db, since, step, interval)


def _collect_prometheus(
    out: Path, url: str | None, cluster: str, since: str, step: str, interval: float | None
) -> None:
    """`collect --source prometheus`: a pass over each window, from the Prometheus server."""
    if url is None:
        _fail("--source prometheus needs --url, the Prometheus server (http://host:9090)")
    from gpuplane.audit.collect import prometheus

    client, step_s = prometheus.PromClient(url), _duration(step, "--step")

    def window(lo: datetime, hi: datetime) -> pa.Table:
        return prometheus.collect(client, cluster, lo, hi, step_s)

    try:
        _loop(window, SampleStore(out), _duration(since, "--since"), interval)
    finally:
        client.close()


def _collect_gateway(
    out: Path, url: str | None, step: str, interval: float | None, admin_key: str | None
) -> None:
    """`collect --source gateway`: the gateway's traffic, observed a window at a time."""
    if url is None:
        _fail("--source gateway needs --url, the gateway (http://host:8000)")
    window_s = interval if interval is not None else _duration(step, "--step")
    try:
        store = SampleStore(out, TRAFFIC_SCHEMA)
        run_loop(_gateway(url, store, window_s, interval is None, admin_key))
    except GpuplaneError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("interrupted; every finished pass is stored")


def _collect_control(
    out: Path, db: str | None, since: str, step: str, interval: float | None
) -> None:
    """`collect --source control`: the allocations the control plane's store recorded."""
    if db is None:
        _fail("--source control needs --db, the control plane's database URL")
    from gpuplane.audit.collect import store as control_store

    url, step_s = str(db), _duration(step, "--step")

    def one(lo: datetime, hi: datetime) -> pa.Table:
        return control_store.collect(url, lo, hi, step_s)

    _loop(one, SampleStore(out), _duration(since, "--since"), interval)


def _nvml(
    store: SampleStore,
    cluster: str,
    node: str | None,
    run_dir: Path | None,
    record: Path | None,
    interval: float | None,
) -> None:
    from gpuplane.audit.collect import nvml

    def nobody(pid: int) -> nvml.Owner | None:
        return None

    try:
        reader = nvml.Reader()
    except CollectError as exc:
        _fail(str(exc))
    name = node or nvml.default_node()

    def one(lo: datetime, hi: datetime) -> pa.Table:
        answer = reader.answer()
        if record is not None:
            record.write_text(json.dumps(answer, indent=2) + "\n")
        resolve = nvml.run_dir_resolver(run_dir) if run_dir else nobody  # jobs come and go
        return nvml.samples(answer, hi, cluster, name, resolve)

    try:
        _loop(one, store, 0.0, interval)
    finally:
        reader.close()


async def _gateway(
    url: str, store: SampleStore, window_s: float, once: bool, admin_key: str | None
) -> None:
    """Sample the gateway's slots every second; every `window_s`, store one traffic row per
    instance for the window."""
    from gpuplane.audit.collect.gateway import GatewayReader, traffic

    reader = GatewayReader(url, admin_key=admin_key)
    try:
        await reader.sample(time.monotonic())
        before = await reader.read()
        while True:
            end = time.monotonic() + window_s
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(1.0, left))
                await reader.sample(time.monotonic())
            after = await reader.read()
            table = traffic(datetime.now(UTC), before, after, reader.take_slot_seconds())
            store.append(table)
            typer.echo(f"{datetime.now(UTC).isoformat(timespec='seconds')}: {table.num_rows} rows")
            before = after
            if once:
                return
    finally:
        await reader.aclose()


def _loop(one: Pass, store: SampleStore, history_s: float, interval: float | None) -> None:
    """Run `one` over `[now - history, now)`, then (with an interval) every `interval` seconds
    over the time since the last pass; each pass's samples are appended as soon as it ends."""
    until = datetime.now(UTC)
    since = until - timedelta(seconds=history_s)
    try:
        while True:
            try:
                table = one(since, until)
                store.append(table)
            except (GpuplaneError, OSError) as exc:
                _fail(str(exc))
            typer.echo(f"{until.isoformat(timespec='seconds')}: {table.num_rows} samples")
            if interval is None:
                return
            time.sleep(
                max(0.0, (until + timedelta(seconds=interval) - datetime.now(UTC)).total_seconds())
            )
            since, until = until, datetime.now(UTC)
    except KeyboardInterrupt:
        typer.echo("interrupted; every finished pass is stored")


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
