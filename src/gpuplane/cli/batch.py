"""`gpuplane batch`: run a pipeline over clips, print its packing plan, manage the stage cache,
compare two runs. Thin: parse, call `gpuplane.batch`, print.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuplane.batch.cache import StageCache, parse_age, parse_size, plan_gc
from gpuplane.batch.clips import ClipRef, list_clips
from gpuplane.batch.driver import Driver, RunOptions
from gpuplane.batch.errors import BatchError
from gpuplane.batch.metrics import StageMetrics
from gpuplane.batch.packing import Device, Plan, declared_devices
from gpuplane.batch.pipeline import Pipeline, load_pipeline
from gpuplane.batch.report import STAGE_HEAD, compare_runs, stage_rows, write_report
from gpuplane.batch.runners.base import WorkerSpec, make_runner
from gpuplane.batch.runners.local import detect_gpus
from gpuplane.errors import GpuplaneError

app = typer.Typer(help="Offline batch evaluation: prefetch, stage cache, packing.")
cache_app = typer.Typer(help="Inspect and trim the stage cache.")
app.add_typer(cache_app, name="cache")
err = Console(stderr=True)
T = TypeVar("T")


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


DEFAULT_CACHE = ".gpuplane/cache"
VERIFY_CLIPS = (
    "key clips by a sha256 of their bytes, not the store's checksum or size and mtime "
    "(reads every clip, even when the cache has all its stages)"
)


def _out() -> Console:
    """Tables on stdout; wide when piped, so columns are not truncated."""
    return Console(width=None if sys.stdout.isatty() else 160)


def _guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except GpuplaneError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BatchError(f"{what} {item!r}: write it as KEY=VALUE")
        out[key] = value
    return out


def _emit(doc: Any, fmt: Output) -> None:
    if fmt is Output.yaml:
        import yaml

        typer.echo(yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False))
    else:
        typer.echo(json.dumps(doc, indent=2, default=str))


def _plan_table(plan: Plan) -> Table:
    t = Table(title=f"packing plan (bottleneck: {plan.bottleneck})")
    for col in ("module", "replicas", "devices", "share", "clips/s"):
        t.add_column(col)
    for name, n in plan.replica_counts.items():
        devices = ", ".join(r.device for r in plan.replicas_of(name))
        t.add_row(name, str(n), devices, f"{plan.share_of(name):.2f}", f"{plan.rates[name]:.2f}")
    return t


class RichObserver:
    """Progress per stage (computed + served from cache) and overall clips."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<20}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self.tasks: dict[str, Any] = {}

    def on_start(self, stages: list[str], total: int | None, plan: Plan) -> None:
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


def _devices(gpus: int | None, mem_mib: int) -> tuple[tuple[Device, ...], bool]:
    """(devices, whether they are real cards): --gpus declares; else detect; else 2 declared."""
    if gpus is None:
        real = detect_gpus()
        if real:
            return real, True
        gpus = 2
    return declared_devices(gpus, mem_mib), False


def _default_out(pipe: Pipeline, clips: str) -> Path:
    tag = hashlib.sha256(f"{pipe.fingerprint()}|{clips}".encode()).hexdigest()[:10]
    return Path(".gpuplane/runs") / f"{pipe.name}-{tag}"


@app.command()
def run(
    pipeline: str = typer.Argument(..., help="directory with pipeline.py, a .py, or module:attr"),
    clips: str = typer.Option(..., "--clips", help="fsspec URL of the clips (a local dir works)"),
    pattern: str = typer.Option("*", help="glob on clip file names"),
    cache: str = typer.Option(DEFAULT_CACHE, help="stage cache URL (fsspec)"),
    out: Path | None = typer.Option(None, help="run directory; default derives from the inputs"),
    gpus: int | None = typer.Option(
        None, help="declare N cards (default: the GPUs nvidia-smi lists, else 2 declared)"
    ),
    gpu_mem_mib: int = typer.Option(81920, help="memory of each declared card"),
    runner: str = typer.Option("local", help="local | ray"),
    ray_address: str | None = typer.Option(None, help="Ray cluster to join (ray runner)"),
    threads: bool = typer.Option(False, help="local runner: threads instead of processes"),
    cpu_slots: int | None = typer.Option(None, help="local runner: tasks at once (cores)"),
    stage_version: list[str] = typer.Option([], help="STAGE=VERSION, repeatable (a release)"),
    storage_option: list[str] = typer.Option([], help="KEY=VALUE for the clips' filesystem"),
    prefetch_items: int = typer.Option(8, help="clips held at once (downloading or computing)"),
    prefetch_bytes: str = typer.Option("1G", help="bytes of clips held at once"),
    io_workers: int = typer.Option(4, help="parallel downloads"),
    limit: int | None = typer.Option(None, help="only the first N clips"),
    calibrate: bool = typer.Option(
        False, help="time one clip before planning when no earlier run measured the stages"
    ),
    verify_clips: bool = typer.Option(False, help=VERIFY_CLIPS),
    report: bool = typer.Option(True, help="write report.html in the run directory"),
    progress: bool = typer.Option(True, help="show progress (off when not a terminal)"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """Run PIPELINE over the clips; a re-run of the same command resumes where it stopped, and
    the run directory's run.json and report cover every clip of the run."""

    def go() -> dict[str, Any]:
        versions = _pairs(stage_version, "--stage-version")
        pipe = load_pipeline(pipeline, versions)
        opts_fs = _pairs(storage_option, "--storage-option")
        refs: list[ClipRef] = list(list_clips(clips, pattern, opts_fs))[:limit]
        if not refs:
            raise BatchError(f"no clips matching {pattern!r} under {clips}")
        out_dir = out or _default_out(pipe, clips)
        devices, real = _devices(gpus, gpu_mem_mib)
        spec = WorkerSpec(
            str(Path(pipeline).resolve()) if Path(pipeline.split(":")[0]).exists() else pipeline,
            versions,
            cache or None,
        )
        options: dict[str, Any] = {}
        if runner == "local":
            options = {"cpu_slots": cpu_slots, "threads": threads, "pin_devices": real}
        elif runner == "ray":
            options = {"address": ray_address}
        run_opts = RunOptions(
            out_dir=out_dir,
            devices=devices,
            storage_options=opts_fs,
            prefetch_items=prefetch_items,
            prefetch_bytes=parse_size(prefetch_bytes),
            io_workers=io_workers,
            calibrate=calibrate,
            verify_clips=verify_clips,
        )
        console = Console(stderr=True)
        obs = RichObserver(console, progress and output is Output.table and console.is_terminal)
        try:
            summary = Driver(pipe, spec, make_runner(runner, **options), run_opts, obs).run(
                refs, total=len(refs)
            )
        finally:
            obs.stop()
        if report:
            summary["report"] = str(write_report(summary, out_dir / "report.html"))
        summary["out_dir"] = str(out_dir)
        return summary

    summary = _guard(go)
    if output is not Output.table:
        _emit(summary, output)
    else:
        t = Table(title=f"{summary['pipeline']}: {summary['status']}")
        for col in STAGE_HEAD:
            t.add_column(col)
        for row in stage_rows(summary):
            t.add_row(*map(str, row))
        _out().print(t)
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
            agg = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in summary["aggregate"].items())  # fmt: skip
            typer.echo(f"aggregate: {agg}")
        typer.echo(f"run directory: {summary['out_dir']}")
        if "report" in summary:
            typer.echo(f"report: {summary['report']}")
    if summary["clips"]["errors"]:
        err.print(
            f"[red]{summary['clips']['errors']} clips failed[/red]: see "
            f"{summary['out_dir']}/errors.jsonl; fix the cause and run the same command again "
            "to retry them (finished clips are skipped)"
        )
        raise typer.Exit(1)


@app.command()
def plan(
    pipeline: str = typer.Argument(..., help="directory with pipeline.py, a .py, or module:attr"),
    clips: str = typer.Option(..., "--clips", help="clips to calibrate on (the first one is run)"),
    gpus: int | None = typer.Option(
        None, help="declare N cards (default: the GPUs nvidia-smi lists, else 2 declared)"
    ),
    gpu_mem_mib: int = typer.Option(81920, help="memory of each declared card"),
    cache: str = typer.Option(DEFAULT_CACHE, help="stage cache: expected hits lighten a stage"),
    stage_version: list[str] = typer.Option([], help="STAGE=VERSION, repeatable"),
    storage_option: list[str] = typer.Option([], help="KEY=VALUE for the clips' filesystem"),
    verify_clips: bool = typer.Option(False, help=VERIFY_CLIPS),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """Measure each module on one clip and print which modules share which device."""

    def go() -> tuple[Plan, dict[str, float]]:
        pipe = load_pipeline(pipeline, _pairs(stage_version, "--stage-version"))
        opts_fs = _pairs(storage_option, "--storage-option")
        head = list(itertools.islice(list_clips(clips, storage_options=opts_fs), 8))
        if not head:
            raise BatchError(f"no clips under {clips} to calibrate on")
        devices, _ = _devices(gpus, gpu_mem_mib)
        run_opts = RunOptions(
            Path("."), devices, storage_options=opts_fs, calibrate=True, verify_clips=verify_clips
        )
        drv = Driver(
            pipe, WorkerSpec(None, cache_url=cache or None), make_runner("local"), run_opts
        )
        return drv.plan(head[0], head)

    p, profile = _guard(go)
    if output is not Output.table:
        _emit(
            {
                "replicas": dict(p.replica_counts),
                "rates": dict(p.rates),
                "bottleneck": p.bottleneck,
                "device_load": dict(p.device_load),
                "profile_s": profile,
                "placements": [r.to_dict() for r in p.replicas],
            },
            output,
        )
        return
    _out().print(_plan_table(p))
    typer.echo("device load: " + ", ".join(f"{d} {v:.2f}" for d, v in p.device_load.items()))
    for note in p.notes:
        typer.echo(note)


def vars_of(obj: Any) -> dict[str, Any]:
    return {k: getattr(obj, k) for k in obj.__slots__}


@cache_app.command("ls")
def cache_ls(
    cache: str = typer.Option(DEFAULT_CACHE, help="stage cache URL"),
    stage: str | None = typer.Option(None, help="only this stage"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """List cache entries."""
    entries = _guard(lambda: [e for e in StageCache(cache).entries() if stage in (None, e.stage)])
    if output is not Output.table:
        _emit([vars_of(e) for e in entries], output)
        return
    t = Table()
    for col in ("stage", "key", "bytes", "age"):
        t.add_column(col)
    now = time.time()
    for e in sorted(entries, key=lambda e: (e.stage, e.key)):
        t.add_row(e.stage, e.key[:16], str(e.size), f"{now - e.mtime:.0f} s")
    _out().print(t)


@cache_app.command("du")
def cache_du(
    cache: str = typer.Option(DEFAULT_CACHE, help="stage cache URL"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """Entries and bytes per stage."""
    usage: dict[str, dict[str, int]] = {}
    for e in _guard(lambda: list(StageCache(cache).entries())):
        u = usage.setdefault(e.stage, {"entries": 0, "bytes": 0})
        u["entries"] += 1
        u["bytes"] += e.size
    if output is not Output.table:
        _emit(usage, output)
        return
    t = Table()
    for col in ("stage", "entries", "bytes"):
        t.add_column(col)
    for name, u in sorted(usage.items()):
        t.add_row(name, str(u["entries"]), str(u["bytes"]))
    t.add_row("total", str(sum(u["entries"] for u in usage.values())),
              str(sum(u["bytes"] for u in usage.values())))  # fmt: skip
    _out().print(t)


@cache_app.command("gc")
def cache_gc(
    cache: str = typer.Option(DEFAULT_CACHE, help="stage cache URL"),
    max_age: str | None = typer.Option(None, help="drop entries older than this (30m, 12h, 7d)"),
    max_size: str | None = typer.Option(None, help="then drop the oldest until under (10G)"),
    dry_run: bool = typer.Option(False, help="say what would go, remove nothing"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """Evict entries by age and total size (oldest first)."""

    def go() -> dict[str, Any]:
        if max_age is None and max_size is None:
            raise BatchError("say what to evict: --max-age 7d and/or --max-size 10G")
        store = StageCache(cache)
        gc = plan_gc(
            list(store.entries()),
            time.time(),
            parse_age(max_age) if max_age else None,
            parse_size(max_size) if max_size else None,
        )
        if not dry_run:
            for e in gc.remove:
                store.remove(e)
        return {"removed": len(gc.remove), "freed_bytes": gc.freed_bytes,
                "kept_bytes": gc.keep_bytes, "dry_run": dry_run}  # fmt: skip

    doc = _guard(go)
    if output is not Output.table:
        _emit(doc, output)
    else:
        verb = "would remove" if dry_run else "removed"
        typer.echo(
            f"{verb} {doc['removed']} entries ({doc['freed_bytes']} bytes); "
            f"{doc['kept_bytes']} bytes kept"
        )


@app.command()
def compare(
    run_a: Path = typer.Argument(..., help="run directory (the baseline)"),
    run_b: Path = typer.Argument(..., help="run directory (the candidate)"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """Compare two runs: totals, per-stage compute and cache hits, clips whose results changed."""
    doc = _guard(lambda: compare_runs(run_a, run_b))
    if output is not Output.table:
        _emit(doc, output)
        return
    t = Table(title=f"{run_a} → {run_b}")
    for col in ("", "A", "B", "B/A"):
        t.add_column(col)
    for k, v in doc["totals"].items():
        r = v["b_over_a"]
        t.add_row(k, f"{v['a']:.3f}", f"{v['b']:.3f}", "-" if r is None else f"{r:.2f}")
    _out().print(t)
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
    _out().print(s)
    c = doc["clips"]
    typer.echo(f"clips in both: {c['common']}, only in A: {c['only_a']}, only in B: {c['only_b']}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
