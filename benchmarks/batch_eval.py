"""Offline evaluation: naive vs gpuplane on the drive_eval workload, and framework overhead.

Contenders, side by side in one process tree, on the same clips, the same declared devices
(`--gpus`, default 2) and the same stage code:

- naive: one worker process per declared device; each takes a clip, downloads it, then runs the
  whole chain (perception and the five checks) on its card; no cache. Device-seconds = time the
  card is held (download + compute) x 1 whole card.
- gpuplane: the local runner (as many worker processes as the host has cores, so the same CPU
  as naive's) with prefetch, the stage cache and the packing plan. Device-seconds = sum over
  stage tasks of time x the plan's slice share.

Scenarios: cold cache; release re-run (every stage-B version bumped, perception unchanged).
Each repetition runs naive and gpuplane back to back (the host is shared: alternating gives both
the same load); the ratios reported are medians over `--repeat` repetitions.
Then framework overhead: no-op stages over `--noop-clips` clips (default 100,000) on the local
runner, memory sampled as it goes, and the same pipeline on a Ray runner (`--ray-clips`).

    .venv/bin/python benchmarks/batch_eval.py --clips 32 --json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per worker, for every contender

from _extras import optional_imports  # noqa: E402

with optional_imports():
    import fsspec

    from _results import save
    from gpuplane.batch.clips import ClipRef, list_clips
    from gpuplane.batch.driver import Driver, RunOptions
    from gpuplane.batch.metrics import StageMetrics
    from gpuplane.batch.packing import PackingPlan, declared_devices
    from gpuplane.batch.pipeline import BoundStage, CachePolicy, Pipeline, Stage, load_pipeline
    from gpuplane.batch.runners.base import WorkerSpec, make_runner
    from gpuplane.resources import Slice

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "drive_eval")
B_STAGES = (
    "lane_rules",
    "obstacle_rules",
    "planning_check",
    "lane_prediction",
    "localization_check",
)
RESULTS = ROOT / "benchmarks" / "results" / "batch_eval.json"

# ---- naive: download then compute the whole chain, one clip at a time per device ----------

_NAIVE: dict[str, Any] = {}


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _naive_init(versions: Mapping[str, str], storage: Mapping[str, Any]) -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    pipe = load_pipeline(EXAMPLE, versions)
    _NAIVE["pipe"] = pipe
    _NAIVE["bound"] = [BoundStage(s) for s in pipe.stages]
    _NAIVE["storage"] = dict(storage)


def _naive_clip(url: str) -> tuple[float, float]:
    start = time.time()
    pipe: Pipeline = _NAIVE["pipe"]
    fs, path = fsspec.core.url_to_fs(url, **_NAIVE["storage"])
    clip = pipe.decode(fs.cat_file(path))
    values: dict[str, Any] = {}
    for bound in _NAIVE["bound"]:
        args = tuple(clip if d == "clip" else values[d] for d in bound.stage.inputs)
        values[bound.stage.name] = bound(*args)
    pipe.reduce(url, values)
    return start, time.time()


def run_naive(refs: list[ClipRef], devices: int, versions: Mapping[str, str],
              storage: Mapping[str, Any]) -> dict[str, float]:  # fmt: skip
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(devices, ctx, _naive_init, (versions, storage)) as pool:
        spans = list(pool.map(_naive_clip, [r.url for r in refs], chunksize=1))
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "device_seconds": sum(b - a for a, b in spans),
            "throughput_clips_per_s": len(refs) / wall}  # fmt: skip


def run_gpuplane(refs: list[ClipRef], devices: int, versions: Mapping[str, str],
                 storage: Mapping[str, Any], cache: Path, out: Path,
                 runner: str = "local", **runner_opts: Any) -> dict[str, Any]:  # fmt: skip
    pipe = load_pipeline(EXAMPLE, versions)
    spec = WorkerSpec(EXAMPLE, dict(versions), str(cache))
    opts = RunOptions(out_dir=out, devices=declared_devices(devices), storage_options=storage)
    t0 = time.perf_counter()
    summary = Driver(pipe, spec, make_runner(runner, **runner_opts), opts).run(refs)
    wall = time.perf_counter() - t0  # planning and pool start included, as for naive
    return {"wall_s": wall, "device_seconds": summary["device_seconds"],
            "throughput_clips_per_s": len(refs) / wall,
            "perception_cached": summary["stages"]["perception"]["cached"],
            "replicas": summary["plan"]["replicas"]}  # fmt: skip


# ---- framework overhead: no-op stages, streamed clips ------------------------------------


def noop(x: Any) -> Any:
    return x


def noop_pipeline(stages: int) -> Pipeline:
    chain = [Stage("s0", "1", noop, slice=Slice(gpus=1, gpu_mem_mib=1024, gpu_cores_pct=5),
                   cache=CachePolicy.OFF)]  # fmt: skip
    for i in range(1, stages):
        chain.append(Stage(f"s{i}", "1", noop, inputs=(f"s{i - 1}",), cache=CachePolicy.OFF,
                           slice=Slice(gpus=1, gpu_mem_mib=1024, gpu_cores_pct=5)))  # fmt: skip
    return Pipeline("noop", tuple(chain))


def noop_clips(n: int) -> Iterator[ClipRef]:
    fs = fsspec.filesystem("memory")
    fs.pipe("/gpuplane-bench/noop.bin", b"x" * 64)
    for i in range(n):  # a generator: the source is never materialised
        yield ClipRef(f"c{i:07d}", "memory:///gpuplane-bench/noop.bin", 64, f"c{i}", "size=64")


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


class _RssSampler:
    def __init__(self, every: int) -> None:
        self.every = every
        self.samples: list[tuple[int, float]] = []

    def on_start(self, stages: list[str], total: int | None, plan: PackingPlan) -> None:
        self.samples.append((0, _rss_mib()))

    def on_update(self, metrics: Mapping[str, StageMetrics], done: int) -> None:
        if done >= (len(self.samples)) * self.every:
            self.samples.append((done, _rss_mib()))


def run_overhead(n: int, stages: int, out: Path, runner: str, replicas: int,
                 **opts: Any) -> dict[str, Any]:  # fmt: skip
    pipe = noop_pipeline(stages)
    spec = WorkerSpec("benchmarks.batch_eval:noop_pipeline_3" if runner == "ray" else None)
    profile = {s.name: 0.001 for s in pipe.stages}
    run_opts = RunOptions(
        out_dir=out, devices=declared_devices(2), profile=profile, max_replicas=replicas
    )
    sampler = _RssSampler(max(1, n // 10))
    t0 = time.perf_counter()
    summary = Driver(pipe, spec, make_runner(runner, **opts), run_opts, sampler).run(noop_clips(n))
    wall = time.perf_counter() - t0
    sampler.samples.append((n, _rss_mib()))
    rss = [r for _, r in sampler.samples]
    mid = rss[len(rss) // 2]
    return {
        "clips": n,
        "stages": stages,
        "done": summary["clips"]["done"],
        "wall_s": wall,
        "ms_per_clip_per_stage": wall / (n * stages) * 1000,
        "rss_mib_samples": [(c, round(r, 1)) for c, r in sampler.samples],
        "rss_growth_second_half_mib": round(rss[-1] - mid, 1),
    }


def noop_pipeline_3() -> Pipeline:
    return noop_pipeline(3)


# ---- main ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--gpus", type=int, default=2, help="declared devices, for both contenders")
    ap.add_argument("--latency-s", type=float, default=0.1)
    ap.add_argument("--bandwidth-mb-s", type=float, default=5.0)
    ap.add_argument("--noop-clips", type=int, default=100_000)
    ap.add_argument("--ray-clips", type=int, default=2_000, help="0 skips the Ray runner")
    ap.add_argument("--repeat", type=int, default=3, help="alternating repetitions (median)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where to write the JSON")
    args = ap.parse_args()
    log = (lambda *_: None) if args.json else print
    sys.path.insert(0, str(ROOT))  # so Ray workers and this module agree on benchmarks.*

    storage = {"latency_s": args.latency_s, "bandwidth_mb_s": args.bandwidth_mb_s}
    load_pipeline(EXAMPLE)  # registers slowfile://
    from drive_eval.generate import generate  # type: ignore[import-not-found]

    result: dict[str, Any] = {"clips": args.clips, "gpus": args.gpus, "storage": storage,
                              "cpu_count": os.cpu_count(),
                              "loadavg_1m_start": os.getloadavg()[0]}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuplane-bench-") as tmp:
        work = Path(tmp)
        generate(work / "clips", args.clips, seed=7)
        refs = list(list_clips(f"slowfile://{work / 'clips'}", storage_options=storage))
        reps: list[dict[str, Any]] = []
        for k in range(args.repeat):  # alternate contenders so both see the same host load
            bump = {name: f"r{k + 2}" for name in B_STAGES}  # a new release each repetition
            cache = work / f"cache{k}"
            log(f"[{k + 1}/{args.repeat}] cold, {len(refs)} clips, {args.gpus} declared GPUs")
            naive_cold = run_naive(refs, args.gpus, {}, storage)
            gp_cold = run_gpuplane(refs, args.gpus, {}, storage, cache, work / f"cold{k}")
            log(f"  naive {naive_cold}\n  gpuplane {gp_cold}")
            log(f"[{k + 1}/{args.repeat}] release re-run: every stage-B version bumped")
            naive_re = run_naive(refs, args.gpus, bump, storage)
            gp_re = run_gpuplane(refs, args.gpus, bump, storage, cache, work / f"rerun{k}")
            log(f"  naive {naive_re}\n  gpuplane {gp_re}")
            reps.append({
                "naive_cold": naive_cold, "gpuplane_cold": gp_cold,
                "naive_rerun": naive_re, "gpuplane_rerun": gp_re,
                "cold_speedup":
                    gp_cold["throughput_clips_per_s"] / naive_cold["throughput_clips_per_s"],
                "cold_device_seconds_ratio":
                    gp_cold["device_seconds"] / naive_cold["device_seconds"],
                "rerun_speedup":
                    gp_re["throughput_clips_per_s"] / naive_re["throughput_clips_per_s"],
                "rerun_device_seconds_ratio": gp_re["device_seconds"] / naive_re["device_seconds"],
            })  # fmt: skip
        for key in ("cold_speedup", "cold_device_seconds_ratio", "rerun_speedup",
                    "rerun_device_seconds_ratio"):  # fmt: skip
            result[key] = statistics.median(r[key] for r in reps)  # median over repetitions
        result["repetitions"] = reps

        if args.noop_clips:
            log(f"overhead: 3 no-op stages x {args.noop_clips} clips, local runner (threads)")
            result["overhead_local"] = run_overhead(
                args.noop_clips, 3, work / "noop-local", "local", 4, threads=True, cpu_slots=2
            )
            log(f"  {result['overhead_local']}")
        if args.ray_clips:
            # a private local cluster: its own token in the environment, so Ray (2.59+) neither
            # saves one to ~/.ray/auth_token, which turns auth on for every later cluster on
            # the machine, nor runs without one
            if "RAY_AUTH_MODE" not in os.environ:
                os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
            import ray

            log(f"overhead: 3 no-op stages x {args.ray_clips} clips, Ray runner (local node)")
            ray.init(num_cpus=8, num_gpus=2, resources={"gpu_mem_mib": 2 * 81920},
                     include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
            try:
                result["overhead_ray"] = run_overhead(
                    args.ray_clips, 3, work / "noop-ray", "ray", 1
                )
                log(f"  {result['overhead_ray']}")
                small = refs[: min(len(refs), 16)]
                result["ray_vs_local_drive_eval"] = {
                    "clips": len(small),
                    "local": run_gpuplane(small, args.gpus, {}, storage, work / "c2", work / "l2"),
                    "ray": run_gpuplane(small, args.gpus, {}, storage, work / "c3", work / "r2",
                                        runner="ray"),
                }  # fmt: skip
                log(f"  drive_eval local vs ray: {result['ray_vs_local_drive_eval']}")
            finally:
                ray.shutdown()

    # the host is shared: other processes' load decides how much CPU overlap can win
    result["loadavg_1m_end"] = os.getloadavg()[0]
    save(result, args.results, echo_json=args.json)
    if not args.json:
        for key in ("cold_speedup", "rerun_speedup", "rerun_device_seconds_ratio",
                    "cold_device_seconds_ratio"):  # fmt: skip
            print(f"{key}: {result[key]:.2f}")


if __name__ == "__main__":
    main()
