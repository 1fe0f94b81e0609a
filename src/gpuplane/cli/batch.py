"""`gpuplane batch`: run a pipeline over clips, print its packing plan, manage the stage cache
(`batch_cache.py`), compare two runs. Thin: parse, call `gpuplane.batch`, print. A flag left
unset takes its value from the `batch:` section of --config (`batch/settings.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from gpuplane.batch.clips import ClipRef, list_clips
from gpuplane.batch.driver import PROBE_CLIPS, Driver, RunOptions
from gpuplane.batch.errors import BatchError
from gpuplane.batch.packing import BatchDevice, PackingPlan, declared_devices
from gpuplane.batch.pipeline import Pipeline, load_pipeline
from gpuplane.batch.report import STAGE_HEAD, compare_runs, stage_rows, write_report
from gpuplane.batch.runners.base import WorkerSpec, make_runner
from gpuplane.batch.runners.local import detect_gpus
from gpuplane.cli import batch_cache
from gpuplane.cli._batch_common import (
    CACHE_OPTION,
    CONFIG_OPTION,
    OUTPUT_OPTION,
    BatchOutput,
    batch_settings,
    emit,
    err,
    guard,
    key_help,
    stdout,
)
from gpuplane.cli.batch_drive import observed, run_options, runner_options

app = typer.Typer(help="Offline batch evaluation: prefetch, stage cache, packing.")
app.add_typer(batch_cache.app, name="cache")


PIPELINE_ARG = typer.Argument(..., help="directory with pipeline.py, a .py, or module:attr")
GPUS_OPTION = typer.Option(None, help=key_help("gpus"))
GPU_MEM_OPTION = typer.Option(None, help=key_help("gpu_mem_mib"))
STORAGE_OPTION = typer.Option(
    [], help="KEY=VALUE for the clips' filesystem, repeatable; over batch.storage_options"
)
VERIFY_OPTION = typer.Option(None, help=key_help("verify_clips"))


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BatchError(f"{what} {item!r}: write it as KEY=VALUE")
        out[key] = value
    return out


def _plan_table(plan: PackingPlan) -> Table:
    t = Table(title=f"packing plan (bottleneck: {plan.bottleneck})")
    for col in ("module", "replicas", "devices", "share", "clips/s"):
        t.add_column(col)
    for name, n in plan.replica_counts.items():
        devices = ", ".join(r.device for r in plan.replicas_of(name))
        t.add_row(name, str(n), devices, f"{plan.share_of(name):.2f}", f"{plan.rates[name]:.2f}")
    return t


def _devices(gpus: int | None, mem_mib: int) -> tuple[tuple[BatchDevice, ...], bool]:
    """(devices, whether they are real cards): --gpus declares; else detect; else 2 declared."""
    if gpus is None:
        real = detect_gpus()
        if real:
            return real, True
        gpus = 2
    return declared_devices(gpus, mem_mib), False


def _default_out(runs_dir: str, pipe: Pipeline, clips: str) -> Path:
    tag = hashlib.sha256(f"{pipe.fingerprint()}|{clips}".encode()).hexdigest()[:10]
    return Path(runs_dir) / f"{pipe.name}-{tag}"


@app.command()
def run(
    pipeline: str = PIPELINE_ARG,
    clips: str = typer.Option(..., "--clips", help="fsspec URL of the clips (a local dir works)"),
    pattern: str | None = typer.Option(None, help=key_help("pattern")),
    cache: str | None = CACHE_OPTION,
    out: Path | None = typer.Option(
        None, help="run directory; default: one under batch.runs_dir named after the inputs"
    ),
    gpus: int | None = GPUS_OPTION,
    gpu_mem_mib: int | None = GPU_MEM_OPTION,
    runner: str | None = typer.Option(None, help=key_help("runner")),
    ray_address: str | None = typer.Option(None, help=key_help("ray_address")),
    ray_token_file: str | None = typer.Option(None, help=key_help("ray_token_file")),
    threads: bool | None = typer.Option(None, help=key_help("threads")),
    cpu_slots: int | None = typer.Option(None, help=key_help("cpu_slots")),
    stage_version: list[str] = typer.Option([], help="STAGE=VERSION, repeatable (a release)"),
    storage_option: list[str] = STORAGE_OPTION,
    prefetch_items: int | None = typer.Option(None, help=key_help("prefetch_items")),
    prefetch_bytes: str | None = typer.Option(None, help=key_help("prefetch_bytes")),
    io_workers: int | None = typer.Option(None, help=key_help("io_workers")),
    limit: int | None = typer.Option(None, help="only the first N clips"),
    calibrate: bool | None = typer.Option(None, help=key_help("calibrate")),
    verify_clips: bool | None = VERIFY_OPTION,
    report: bool | None = typer.Option(None, help=key_help("report")),
    progress: bool | None = typer.Option(None, help=key_help("progress")),
    metrics_port: int | None = typer.Option(
        None, help="serve the run's Prometheus metrics at 127.0.0.1:PORT/metrics while it runs"
    ),
    config: Path | None = CONFIG_OPTION,
    output: BatchOutput = OUTPUT_OPTION,
) -> None:
    """Run PIPELINE over the clips. A re-run of the same command resumes where it stopped, and the
    run directory's run.json and report cover every clip of the run."""

    def go() -> dict[str, Any]:
        cfg = batch_settings(
            config, pattern=pattern, cache_url=cache, gpus=gpus, gpu_mem_mib=gpu_mem_mib,
            runner=runner, ray_address=ray_address, ray_token_file=ray_token_file,
            threads=threads, cpu_slots=cpu_slots,
            prefetch_items=prefetch_items, prefetch_bytes=prefetch_bytes, io_workers=io_workers,
            calibrate=calibrate, verify_clips=verify_clips, report=report, progress=progress,
        )  # fmt: skip
        versions = _pairs(stage_version, "--stage-version")
        pipe = load_pipeline(pipeline, versions)
        opts_fs = cfg.storage_options | _pairs(storage_option, "--storage-option")
        refs: list[ClipRef] = list(list_clips(clips, cfg.pattern, opts_fs))[:limit]
        if not refs:
            raise BatchError(f"no clips matching {cfg.pattern!r} under {clips}")
        out_dir = out or _default_out(cfg.runs_dir, pipe, clips)
        devices, real = _devices(cfg.gpus, cfg.gpu_mem_mib)
        spec = WorkerSpec(
            str(Path(pipeline).resolve()) if Path(pipeline.split(":")[0]).exists() else pipeline,
            versions,
            cfg.cache_url or None,
        )
        run_opts = run_options(cfg, out_dir, devices, opts_fs)
        summary = observed(
            lambda obs: Driver(
                pipe, spec, make_runner(cfg.runner, **runner_options(cfg, real)), run_opts, obs
            ),
            pipe.name,
            refs,
            cfg.progress and output is BatchOutput.table,
            metrics_port,
        )
        if cfg.report:
            summary["report"] = str(write_report(summary, out_dir))
        summary["out_dir"] = str(out_dir)
        return summary

    _show_run(guard(go), output)


def _show_run(summary: dict[str, Any], output: BatchOutput) -> None:
    """Print a run's summary; exit non-zero when clips failed, saying how to retry them."""
    if output is not BatchOutput.table:
        emit(summary, output)
    else:
        _print_run(summary)
    if summary["clips"]["errors"]:
        err.print(
            f"[red]{summary['clips']['errors']} clips failed[/red]: see "
            f"{summary['out_dir']}/errors.jsonl; fix the cause and run the same command again "
            "to retry them (finished clips are skipped)"
        )
        raise typer.Exit(1)


def _print_run(summary: Mapping[str, Any]) -> None:
    t = Table(title=f"{summary['pipeline']}: {summary['status']}")
    for col in STAGE_HEAD:
        t.add_column(col)
    for row in stage_rows(summary):
        t.add_row(*map(str, row))
    stdout().print(t)
    c, inv = summary["clips"], summary["invocation"]
    if inv["status"] == "nothing_to_do":
        typer.echo(f"nothing to do, {inv['skipped_already_done']} clips already done")
    else:
        typer.echo(
            f"clips: {inv['done']} done, {inv['skipped_already_done']} already done, "
            f"{inv['errors']} errors in this invocation ({inv['wall_s']:.1f} s)"
        )
    typer.echo(
        f"run: {c['done']} clips done over {c['invocations']} invocations, "
        f"wall {summary['wall_s']:.1f} s, {summary['throughput_clips_per_s']:.2f} clips/s, "
        f"device-seconds {summary['device_seconds']:.1f}"
    )
    if summary.get("aggregate"):
        agg: Mapping[str, Any] = summary["aggregate"]  # None: see run.json's nulls
        shown = {k: "-" if v is None else f"{v:.4g}" if isinstance(v, float) else v
                 for k, v in agg.items()}  # fmt: skip
        typer.echo("aggregate: " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    typer.echo(f"run directory: {summary['out_dir']}")
    if "report" in summary:
        typer.echo(f"report: {summary['report']}")


@app.command()
def plan(
    pipeline: str = PIPELINE_ARG,
    clips: str = typer.Option(..., "--clips", help="the clips `batch run` would take"),
    pattern: str | None = typer.Option(None, help=key_help("pattern")),
    calibrate: bool | None = typer.Option(None, help=key_help("calibrate")),
    gpus: int | None = GPUS_OPTION,
    gpu_mem_mib: int | None = GPU_MEM_OPTION,
    cache: str | None = CACHE_OPTION,
    stage_version: list[str] = typer.Option([], help="STAGE=VERSION, repeatable"),
    storage_option: list[str] = STORAGE_OPTION,
    verify_clips: bool | None = VERIFY_OPTION,
    config: Path | None = CONFIG_OPTION,
    output: BatchOutput = OUTPUT_OPTION,
) -> None:
    """Plan which modules share which device, as `batch run` will. The same options and config
    give the same plan: the stages' seconds per clip come from an earlier run's measurements, else
    from timing one clip with --calibrate (batch.calibrate), else from their declared slices;
    expected cache hits (on the first clips) lighten a stage. It says which it used."""

    def go() -> tuple[PackingPlan, dict[str, Any]]:
        cfg = batch_settings(
            config, pattern=pattern, gpus=gpus, gpu_mem_mib=gpu_mem_mib, cache_url=cache,
            calibrate=calibrate, verify_clips=verify_clips,
        )  # fmt: skip
        pipe = load_pipeline(pipeline, _pairs(stage_version, "--stage-version"))
        opts_fs = cfg.storage_options | _pairs(storage_option, "--storage-option")
        head = list(itertools.islice(list_clips(clips, cfg.pattern, opts_fs), PROBE_CLIPS))
        if not head:
            raise BatchError(f"no clips matching {cfg.pattern!r} under {clips} to plan for")
        devices, _ = _devices(cfg.gpus, cfg.gpu_mem_mib)
        run_opts = RunOptions(
            Path("."), devices, storage_options=opts_fs, calibrate=cfg.calibrate,
            verify_clips=cfg.verify_clips,
        )  # fmt: skip
        spec = WorkerSpec(None, cache_url=cfg.cache_url or None)
        driver = Driver(pipe, spec, make_runner("local"), run_opts)
        plan, profile = driver.plan(head[0], head)
        basis = {
            "profile_s": profile,
            "profile_source": driver.profile_source,
            "expected_hits": driver.hit_estimate,
        }
        return plan, basis

    p, basis = guard(go)
    if output is not BatchOutput.table:
        emit(p.to_dict() | basis, output)
        return
    stdout().print(_plan_table(p))
    typer.echo("device load: " + ", ".join(f"{d} {v:.2f}" for d, v in p.device_load.items()))
    hits = ", ".join(f"{k} {v:.0%}" for k, v in basis["expected_hits"].items() if v) or "none"
    typer.echo(f"seconds per clip: {basis['profile_source']}; expected cache hits: {hits}")
    for note in p.notes:
        typer.echo(note)


@app.command()
def compare(
    run_a: Path = typer.Argument(..., help="run directory (the baseline)"),
    run_b: Path = typer.Argument(..., help="run directory (the candidate)"),
    output: BatchOutput = OUTPUT_OPTION,
) -> None:
    """Compare two runs. Totals, per-stage compute and cache hits, clips whose results changed."""
    doc = guard(lambda: compare_runs(run_a, run_b))
    if output is not BatchOutput.table:
        emit(doc, output)
        return
    t = Table(title=f"{run_a} → {run_b}")
    for col in ("", "A", "B", "B/A"):
        t.add_column(col)
    for k, v in doc["totals"].items():
        r = v["b_over_a"]
        t.add_row(k, f"{v['a']:.3f}", f"{v['b']:.3f}", "-" if r is None else f"{r:.2f}")
    stdout().print(t)
    s = Table(title="stages")
    for col in ("stage", "version A→B", "computed A→B", "hit rate A→B", "results changed"):
        s.add_column(col)
    for name, st in doc["stages"].items():
        hr = [f"{x:.0%}" if x is not None else "-" for x in st["hit_rate"]]
        s.add_row(
            name,
            f"{st['version'][0]} → {st['version'][1]}",
            f"{st['computed'][0]} → {st['computed'][1]}",
            f"{hr[0]} → {hr[1]}",
            str(doc["changed_results"].get(name, 0)),
        )
    stdout().print(s)
    c = doc["clips"]
    typer.echo(f"clips in both: {c['common']}, only in A: {c['only_a']}, only in B: {c['only_b']}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
