"""Unified pool vs isolated clusters: one job stream, three clusters, unbalanced teams.

Three clusters of different regions and GPU models, 16 nodes x 8 cards each (384 GPUs): us-east
(A100 80 GB), eu-west (L40S 48 GB, 0.8x the A100's speed), ap-south (A10 24 GB, 0.5x). Three
teams, one per home cluster, submit 70 % / 20 % / 10 % of one Poisson job stream of 6,000 jobs
(whole cards 1/2/4/8 and vGPU slices; durations log-normal, mean 2 h on an A100, longer on
slower cards; every job fits its home cluster). The stream is a submission wave: it offers 1.5x
the estate's capacity while it lasts, so both setups end up with a backlog to work off.

(a) isolated: each team's jobs may only run on its home cluster (what separate clusters with
    separate queues give); (b) unified: one queue over one pool, every job anywhere its own
    constraints allow. Both run the same discrete-event simulation around the service's own
    admission pass (`control.admission`: `Estate` + `run_pass`, policy `frag`, teams without
    quota, i.e. not limited): at every arrival and completion one pass goes over the whole queue
    in the service's order (priority, fair share, oldest), later jobs backfill around ones that
    do not fit, and a job starts when the pass admits it. (b) runs without and with node
    reservations for jobs that waited too long (the service's defaults `nominate_after_s` and
    `max_nominations`, or `--reserve-after-h` / `--max-reservations`); (a) runs without them.
The snapshot knows each model's speed (`gpu_speeds`); the core's GPU-speed score term is off (its
default) unless `--speed-weight W` adds a unified run with it. Completions feed the estate's work
history, so the pass's delay scheduling for faster GPUs (`control.admission.delay`, the service's
default `wait_for_faster_gpu`; `--wait-for-faster off` turns it off) works as in the service; in
(a) every job has one GPU model, so it changes nothing there.

Time limits (the job spec's `time_limit`, stated for a card of speed 1.0 and scaled by the
node's speed): the same streams run again with the limits users would set. The model is the
"f-model" of Mu'alem & Feitelson (IEEE TPDS 12(6), 2001, on EASY backfilling): a user's
estimate is the job's run time times a factor drawn uniformly from [1, f] (`--limit-spread`,
default f = 3), here rounded up to whole half hours (`--limit-round-h`), as users give round
values (Tsafrir, Etsion & Feitelson, "Modeling user runtime estimates", JSSPP 2005). The run
time is the job's work on an A100, so on every card it may use it ends within its limit: no job
is killed (checked). With limits, (b) runs with node reservations (the service's default) and (a)
with them too: in (a) limits only act through reservations (backfilling onto a held node; every
job there has one GPU model, so the delay rule does nothing), and without reservations (a) with
limits decides exactly as without. The ratio with limits is taken over the better (a).
Reported: makespan (last completion), throughput (jobs / makespan), mean and p95 wait (start -
submit), GPU utilisation (busy GPU-hours / (GPUs x makespan)). Goal: (b) >= 1.5x the throughput
of (a), both with the service's default settings.

    .venv/bin/python benchmarks/unified_vs_isolated.py
    .venv/bin/python benchmarks/unified_vs_isolated.py --seeds 11-15 --workers 2 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from _extras import optional_imports

with optional_imports():
    import numpy as np

    from _results import save
    from gpuplane.control.admission import Estate, NominationPolicy, PendingJob, run_pass
    from gpuplane.control.admission.quota import QuotaBook
    from gpuplane.control.lab.simulate import parse_seeds
    from gpuplane.control.scheduler import (
        DeviceInfo,
        NodeInfo,
        Request,
        Snapshot,
        feasible,
        make_policy,
    )
    from gpuplane.control.settings import ControlConfig
    from gpuplane.resources import LABEL_CLUSTER, LABEL_GPU_MODEL, LABEL_REGION, Selector

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "unified_vs_isolated.json"
GIB = 1024
HOUR = 3600.0

# cluster, region, GPU model, card memory, speed relative to an A100
CLUSTERS = [
    ("us-east", "us-east-1", "A100", 80 * GIB, 1.0),
    ("eu-west", "eu-west-1", "L40S", 48 * GIB, 0.8),
    ("ap-south", "ap-south-1", "A10", 24 * GIB, 0.5),
]
TEAMS = {"vision": "us-east", "speech": "eu-west", "ranking": "ap-south"}  # team: home cluster
SPEED = {model: speed for _, _, model, _, speed in CLUSTERS}


@dataclass(frozen=True, slots=True)
class Job:
    request: Request
    team: str
    submit_h: float
    work_h: float  # duration on an A100


def inventory(nodes_per_cluster: int) -> list[NodeInfo]:
    return [
        NodeInfo(
            f"{cluster}-{i:03d}",
            cluster,
            96_000,
            768 * GIB,
            tuple(DeviceInfo(d, card_mem) for d in range(8)),
            {LABEL_REGION: region, LABEL_GPU_MODEL: model},
        )
        for cluster, region, model, card_mem, _ in CLUSTERS
        for i in range(nodes_per_cluster)
    ]


def job_stream(
    n: int, nodes: list[NodeInfo], load: float, shares: list[float], rng: np.random.Generator
) -> list[Job]:
    """`n` jobs whose arrival rate offers `load` x the estate's capacity (A100-hours); the
    teams submit `shares` of them."""
    homes = {c: Snapshot([x for x in nodes if x.cluster == c]) for c, *_ in CLUSTERS}
    shapes: list[tuple[float, Request]] = [
        (
            0.30,
            Request("", gpu_milli=250, gpu_mem_mib=10 * GIB, cpu_millis=4000, memory_mib=32 * GIB),
        ),
        (
            0.15,
            Request("", gpu_milli=500, gpu_mem_mib=20 * GIB, cpu_millis=8000, memory_mib=64 * GIB),
        ),
        (0.25, Request("", gpus=1, cpu_millis=8000, memory_mib=64 * GIB)),
        (0.15, Request("", gpus=2, cpu_millis=16_000, memory_mib=128 * GIB)),
        (0.10, Request("", gpus=4, cpu_millis=32_000, memory_mib=256 * GIB)),
        (0.05, Request("", gpus=8, cpu_millis=64_000, memory_mib=512 * GIB)),
    ]
    probs = np.array([p for p, _ in shapes])
    sigma = 0.8
    mean_work = 2.0
    mu = np.log(mean_work) - sigma**2 / 2
    mean_gpus = float(sum(p * r.gpu_demand_milli / 1000 for p, r in shapes))
    capacity = sum(len(x.devices) * SPEED[x.gpu_model] for x in nodes)  # A100-equivalents
    rate = load * capacity / (mean_gpus * mean_work)  # jobs per hour
    team_names = list(TEAMS)
    team_p = np.array(shares) / sum(shares)
    jobs: list[Job] = []
    t = 0.0
    while len(jobs) < n:
        t += rng.exponential(1 / rate)
        team = team_names[int(rng.choice(len(team_names), p=team_p))]
        req = shapes[int(rng.choice(len(shapes), p=probs))][1]
        req = replace(req, job_id=f"{team}-{len(jobs)}")
        if not feasible(homes[TEAMS[team]], req).ok:  # every job can run at home
            continue
        jobs.append(Job(req, team, t, float(rng.lognormal(mu, sigma))))
    return jobs


def user_limits(
    jobs: list[Job], spread: float, round_h: float, rng: np.random.Generator
) -> dict[str, float]:
    """Each job's time limit in hours on an A100 (speed 1.0), as its user sets it: the f-model
    (Mu'alem & Feitelson 2001), run time x U(1, `spread`), rounded up to `round_h`. Drawn from
    its own generator, so the job stream is the same with and without limits."""
    factors = rng.uniform(1.0, spread, len(jobs))
    return {
        j.request.job_id: math.ceil(j.work_h * f / round_h) * round_h
        for j, f in zip(jobs, factors, strict=True)
    }


def simulate(
    jobs: list[Job],
    nodes: list[NodeInfo],
    unified: bool,
    reserve: NominationPolicy | None,
    speed_weight: float = 0.0,
    wait_for_faster: bool = ControlConfig().wait_for_faster_gpu,
    limits: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Event-driven replay through the service's admission pass; returns makespan, throughput,
    waits and utilisation. Times are hours here and seconds inside the pass, as in the service.
    The snapshot knows each model's speed; `speed_weight` 0 makes the core ignore it.
    `limits`: each job's time limit (hours on an A100), carried in its request."""
    estate = Estate.build(Snapshot(nodes, gpu_speeds=SPEED), QuotaBook(), ())
    policy = make_policy("frag", speed_weight=speed_weight)
    longest_first = ControlConfig().longest_first  # the service's default, as for the others
    rng = np.random.default_rng(0)
    events: list[tuple[float, int, str]] = [(j.submit_h, 1, j.request.job_id) for j in jobs]
    heapq.heapify(events)  # (time, kind 0 = completion first, 1 = arrival, job id)
    by_id = {j.request.job_id: j for j in jobs}
    pending: dict[str, PendingJob] = {}
    waits: list[float] = []
    reserved: set[str] = set()  # jobs that held a node reservation at some point
    busy_gpu_h = 0.0
    end = 0.0
    passes = 0
    started = time.perf_counter()
    while events:
        now, kind, job_id = heapq.heappop(events)
        if kind == 0:
            estate.release(job_id, ended_at=now * HOUR)  # completions teach it the mean work
        else:
            job = by_id[job_id]
            req = job.request
            if not unified:
                home = TEAMS[job.team]
                req = replace(req, selector=Selector(match_labels={LABEL_CLUSTER: home}))
            if limits is not None:
                req = replace(req, time_limit_s=limits[job_id] * HOUR)
            pending[job_id] = PendingJob(job_id, job.team, 0, job.submit_h * HOUR, req)
        if events and events[0][0] == now:
            continue  # settle simultaneous events first
        result = run_pass(
            estate,
            pending.values(),
            policy,
            rng,
            now * HOUR,
            reserve,
            wait_for_faster,
            longest_first=longest_first,
        )
        passes += 1
        reserved.update(estate.nominated)
        for a in result.admitted:
            job = by_id[a.job_id]
            del pending[a.job_id]
            assert a.flavor is not None
            duration = job.work_h / SPEED[a.flavor]
            # the limit model keeps every job within its limit on any card: nothing is killed
            assert limits is None or duration <= limits[a.job_id] / SPEED[a.flavor]
            heapq.heappush(events, (now + duration, 0, a.job_id))
            waits.append(now - job.submit_h)
            busy_gpu_h += duration * job.request.gpu_demand_milli / 1000
            end = max(end, now + duration)
    gpus = sum(len(n.devices) for n in nodes)
    return {
        "mode": "unified" if unified else "isolated",
        "reservations": "off" if reserve is None else "on",
        "time_limits": "off" if limits is None else "on",
        "speed_weight": speed_weight,
        "jobs": len(jobs),
        "makespan_h": round(end, 2),
        "throughput_jobs_per_h": round(len(jobs) / end, 2),
        "mean_wait_h": round(float(np.mean(waits)), 2),
        "p95_wait_h": round(float(np.percentile(waits, 95)), 2),
        "gpu_utilisation": round(busy_gpu_h / (gpus * end), 4),
        "passes": passes,
        "jobs_reserved": len(reserved),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def scenario(
    args: argparse.Namespace, nodes: list[NodeInfo], shares: list[float], seed: int
) -> dict[str, Any]:
    """One job stream: isolated (without node reservations: they only lengthen its backlog),
    unified without and with them (and with the GPU-speed term when `--speed-weight` is given);
    with time limits, isolated and unified with node reservations."""
    jobs = job_stream(args.jobs, nodes, args.load, shares, np.random.default_rng(seed))
    share = {t: sum(j.team == t for j in jobs) / len(jobs) for t in TEAMS}
    reserve = NominationPolicy(args.reserve_after_h * HOUR, args.max_reservations)
    wait = args.wait_for_faster == "on"
    rows = []
    ratios: dict[str, float] = {}
    if args.limits in ("off", "both"):
        rows += [
            simulate(jobs, nodes, unified=False, reserve=None, wait_for_faster=wait),
            simulate(jobs, nodes, unified=True, reserve=None, wait_for_faster=wait),
            simulate(jobs, nodes, unified=True, reserve=reserve, wait_for_faster=wait),
        ]
        if args.speed_weight:
            rows.append(simulate(jobs, nodes, True, reserve, args.speed_weight, wait))
        isolated, off, on = (r["throughput_jobs_per_h"] for r in rows[:3])
        ratios["throughput_ratio"] = round(on / isolated, 3)
        ratios["throughput_ratio_no_reservation"] = round(off / isolated, 3)
    if args.limits in ("on", "both"):
        limits = user_limits(
            jobs, args.limit_spread, args.limit_round_h, np.random.default_rng([seed, 1])
        )
        limited = [
            simulate(jobs, nodes, False, reserve, wait_for_faster=wait, limits=limits),
            simulate(jobs, nodes, True, reserve, wait_for_faster=wait, limits=limits),
        ]
        rows += limited
        # (a) with limits but no reservations decides exactly as (a) without limits
        isolated = limited[0]["throughput_jobs_per_h"]
        if args.limits == "both":
            isolated = max(isolated, rows[0]["throughput_jobs_per_h"])
        ratios["throughput_ratio_limits"] = round(limited[1]["throughput_jobs_per_h"] / isolated, 3)
    return {
        "shares": share_key(shares),
        "seed": seed,
        "teams": {t: {"home": h, "share": round(share[t], 3)} for t, h in TEAMS.items()},
        "results": rows,
        **ratios,
    }


def show(sc: dict[str, Any], gpus: int, jobs: int) -> None:
    """Print one scenario's rows and ratios."""
    print(
        f"{gpus} GPUs in {len(CLUSTERS)} clusters, {jobs} jobs (seed {sc['seed']}); "
        + ", ".join(f"{t} {v['share']:.0%} (home {v['home']})" for t, v in sc["teams"].items())
    )
    print(
        f"{'mode':<9} {'reserve':>7} {'limits':>6} {'speed w':>7} {'makespan h':>10} {'jobs/h':>7}"
        f" {'mean wait h':>11} {'p95 wait h':>10} {'GPU util':>8}"
    )
    for r in sc["results"]:
        print(
            f"{r['mode']:<9} {r['reservations']:>7} {r['time_limits']:>6} {r['speed_weight']:>7.2f}"
            f" {r['makespan_h']:>10.1f} {r['throughput_jobs_per_h']:>7.2f}"
            f" {r['mean_wait_h']:>11.2f} {r['p95_wait_h']:>10.2f} {r['gpu_utilisation']:>8.1%}"
        )
    print("unified / isolated throughput (goal >= 1.5x):")
    for key, label in RATIOS.items():
        if key in sc:
            print(f"  {sc[key]:.3f}x {label}")
    print()


RATIOS = {
    "throughput_ratio": "without time limits, unified with node reservations",
    "throughput_ratio_no_reservation": "without time limits, unified without node reservations",
    "throughput_ratio_limits": "with time limits (over the better isolated run with --limits both)",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=6000)
    ap.add_argument("--nodes-per-cluster", type=int, default=16)
    ap.add_argument("--load", type=float, default=1.5, help="offered share of total capacity")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--seeds", default=None, help="several job streams, e.g. '11-15' (default: --seed only)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    ap.add_argument(
        "--shares",
        default="70,20,10",
        help="percent of the jobs per team (vision, speech, ranking); several scenarios: "
        "'60,25,15;70,20,10;80,15,5'",
    )
    defaults = ControlConfig()
    ap.add_argument(
        "--reserve-after-h",
        type=float,
        default=defaults.nominate_after_s / HOUR,
        help="wait before a job gets a node reservation (default: the service's)",
    )
    ap.add_argument(
        "--max-reservations",
        type=int,
        default=defaults.max_nominations,
        help="node reservations at once (default: the service's)",
    )
    ap.add_argument(
        "--speed-weight",
        type=float,
        default=0.0,
        help="also run unified with the core's GPU-speed score term at this weight "
        "(default 0: the core's default, off)",
    )
    ap.add_argument(
        "--wait-for-faster",
        choices=("on", "off"),
        default="on" if defaults.wait_for_faster_gpu else "off",
        help="delay scheduling for faster GPUs (default: the service's)",
    )
    ap.add_argument(
        "--limits",
        choices=("off", "on", "both"),
        default="both",
        help="run without job time limits (the rows before 2026-11-30), with them, or both",
    )
    ap.add_argument(
        "--limit-spread",
        type=float,
        default=3.0,
        help="f of the f-model: a user's limit is the run time x U(1, f) (default 3)",
    )
    ap.add_argument(
        "--limit-round-h",
        type=float,
        default=0.5,
        help="limits are rounded up to a multiple of this many hours (default 0.5)",
    )
    ap.add_argument(
        "--workers", type=int, default=1, help="job streams simulated at once (processes)"
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the streams --out already holds from a run with the same settings and "
        "simulate only the missing ones",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    nodes = inventory(args.nodes_per_cluster)
    seeds = parse_seeds(args.seeds) if args.seeds else [args.seed]
    streams = [
        ([float(x) for x in text.split(",")], seed)
        for text in args.shares.split(";")
        for seed in seeds
    ]
    gpus = sum(len(n.devices) for n in nodes)
    scenarios = finished(args, seeds) if args.resume and args.out.exists() else []
    kept = {(sc["shares"], sc["seed"]) for sc in scenarios}
    streams = [(sh, seed) for sh, seed in streams if (share_key(sh), seed) not in kept]
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(scenario, args, nodes, sh, seed) for sh, seed in streams]
        for future in futures:  # in order, each as soon as it and those before it are done
            scenarios.append(future.result())
            show(scenarios[-1], gpus, args.jobs)
            # written after every stream, so a run stopped early keeps the streams it finished
            last = future is futures[-1]
            save(results(args, seeds, scenarios, echo=last), args.out, echo_json=args.json and last)


def share_key(shares: list[float]) -> str:
    """How a stream's team shares are written in the JSON (its `shares`)."""
    return ",".join(f"{x:g}" for x in shares)


def finished(args: argparse.Namespace, seeds: list[int]) -> list[dict[str, Any]]:
    """The streams of `seeds` that --out already holds (for --resume), provided they were run
    with this run's settings; a run with other settings is refused rather than mixed in."""
    old: dict[str, Any] = json.loads(args.out.read_text())
    here = results(args, seeds, [], echo=False)
    settings = [k for k in here if k not in ("seeds", "seeds_done", "scenarios", "mean_over_seeds")]
    differ = {k: (old.get(k), here[k]) for k in settings if old.get(k) != here[k]}
    if differ:
        raise SystemExit(
            f"--resume: {args.out} was run with other settings (was, now): {differ}; run with "
            "the same options, or without --resume to start over"
        )
    return [sc for sc in old["scenarios"] if sc["seed"] in seeds]


def results(
    args: argparse.Namespace, seeds: list[int], scenarios: list[dict[str, Any]], *, echo: bool
) -> dict[str, Any]:
    """The JSON of the streams simulated so far: each stream's rows, and per share split the
    mean, min and max of each ratio over its streams (printed when `echo`)."""
    summary = []
    done = [sc["seed"] for sc in scenarios]
    for text in args.shares.split(";"):
        key = share_key([float(x) for x in text.split(",")])
        rows = [sc for sc in scenarios if sc["shares"] == key]
        if len(rows) < 2:
            continue
        spread: dict[str, Any] = {"shares": text, "streams": len(rows)}
        if echo:
            print(f"over {len(rows)} streams (seeds {','.join(map(str, done))}), shares {text}:")
        for k, label in RATIOS.items():
            if k not in rows[0]:
                continue
            values = [sc[k] for sc in rows]
            mean, low, high = float(np.mean(values)), min(values), max(values)
            spread |= {f"mean_{k}": round(mean, 3), f"min_{k}": low, f"max_{k}": high}
            if echo:
                print(f"  mean {mean:.3f}x ({low:.3f}-{high:.3f}) {label}")
        summary.append(spread)
    return {
        "benchmark": "unified_vs_isolated",
        "clusters": [
            {"name": c, "region": r, "model": m, "card_mib": mem, "speed": s}
            for c, r, m, mem, s in CLUSTERS
        ],
        "jobs": args.jobs,
        "nodes_per_cluster": args.nodes_per_cluster,
        "offered_load": args.load,
        "seeds": seeds,
        "seeds_done": done,
        "reserve_after_h": args.reserve_after_h,
        "max_reservations": args.max_reservations,
        "speed_weight": args.speed_weight,
        "wait_for_faster_gpu": args.wait_for_faster == "on",
        "time_limits": args.limits,
        "limit_model": {"f": args.limit_spread, "round_up_h": args.limit_round_h},
        "scenarios": scenarios,
        "mean_over_seeds": summary,
        "goal_ratio": 1.5,
    }


if __name__ == "__main__":
    main()
