"""How `gpuplane batch run` drives a run: the runner's and the driver's options from the
`batch:` settings, and the progress bars (`RichObserver`) and metrics endpoint kept up while
the driver runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from gpuplane.batch.cache import parse_size
from gpuplane.batch.clips import ClipRef
from gpuplane.batch.driver import Driver, Observer, RunOptions
from gpuplane.batch.errors import BatchError
from gpuplane.batch.exporter import BatchExporter
from gpuplane.batch.metrics import StageMetrics
from gpuplane.batch.packing import BatchDevice, PackingPlan
from gpuplane.batch.settings import BatchConfig


class RateColumn(ProgressColumn):
    """Clips per second over Rich's recent window; '-' until there are two samples."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("- clips/s" if speed is None else f"{speed:.1f} clips/s")


class RichObserver:
    """Progress per stage (computed + served from cache) and overall clips: rate and ETA."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<20}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            RateColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
        )
        self.tasks: dict[str, Any] = {}

    def on_start(self, stages: list[str], total: int | None, plan: PackingPlan) -> None:
        self.progress.start()
        self.tasks["clips"] = self.progress.add_task("clips", total=total, detail="")
        for s in stages:
            self.tasks[s] = self.progress.add_task(s, total=total, detail="")

    def on_update(self, metrics: Mapping[str, StageMetrics], done: int) -> None:
        self.progress.update(self.tasks["clips"], completed=done)
        for name, m in metrics.items():
            detail = f"cached {m.cached}" + (f" errors {m.errors}" if m.errors else "")
            self.progress.update(self.tasks[name], completed=m.done, detail=detail)

    def stop(self) -> None:
        self.progress.stop()


def run_options(
    cfg: BatchConfig, out_dir: Path, devices: tuple[BatchDevice, ...], storage: dict[str, str]
) -> RunOptions:
    """The driver's options for a run into `out_dir` on `devices`."""
    return RunOptions(
        out_dir=out_dir,
        devices=devices,
        storage_options=storage,
        prefetch_items=cfg.prefetch_items,
        prefetch_bytes=parse_size(cfg.prefetch_bytes),
        io_workers=cfg.io_workers,
        calibrate=cfg.calibrate,
        verify_clips=cfg.verify_clips,
    )


def runner_options(cfg: BatchConfig, real: bool) -> dict[str, Any]:
    """The keyword arguments of `make_runner` for the configured runner."""
    if cfg.runner == "local":
        return {"cpu_slots": cfg.cpu_slots, "threads": cfg.threads, "pin_devices": real}
    if cfg.runner == "ray":
        return {"address": cfg.ray_address, "token_file": cfg.ray_token_file}
    return {}


def observed(
    driver: Callable[[Observer], Driver],
    pipeline: str,
    refs: list[ClipRef],
    progress: bool,
    metrics_port: int | None,
) -> dict[str, Any]:
    """Run `driver(observer)` over `refs` with progress bars (`progress` on a terminal) and,
    with `metrics_port`, its Prometheus metrics served while it runs; both stop after it."""
    console = Console(stderr=True)
    bars = RichObserver(console, progress and console.is_terminal)
    obs: Observer = bars
    if metrics_port is not None:
        exporter = BatchExporter(pipeline, bars)
        try:
            server, thread = exporter.serve(metrics_port)
        except OSError as exc:
            raise BatchError(
                f"--metrics-port {metrics_port}: cannot listen on 127.0.0.1 ({exc}); "
                "pick a free port"
            ) from None
        obs = exporter
    try:
        return driver(obs).run(refs, total=len(refs))
    finally:
        bars.stop()
        if metrics_port is not None:
            server.shutdown()
            server.server_close()
            thread.join()
