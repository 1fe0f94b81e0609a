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
    reservations for jobs that waited too long (the service's defaults `reserve_after_s` and
    `max_reservations`, or `--reserve-after-h` / `--max-reservations`); (a) runs without them.
The snapshot knows each model's speed (`gpu_speeds`); the core's GPU-speed score term is off (its
default) unless `--speed-weight W` adds a unified run with it. Completions feed the estate's work
history, so the pass's delay scheduling for faster GPUs (`control.delay`, the service's default
`wait_for_faster_gpu`; `--wait-for-faster off` turns it off) works as in the service; in (a) every
job has one GPU model, so it changes nothing there.
Reported: makespan (last completion), throughput (jobs / makespan), mean and p95 wait (start -
submit), GPU utilisation (busy GPU-hours / (GPUs x makespan)). Goal: (b) >= 1.5x the throughput
of (a), both with the service's default settings.

    .venv/bin/python benchmarks/unified_vs_isolated.py
    .venv/bin/python benchmarks/unified_vs_isolated.py --seeds 11-15 --out /tmp/seeds.json
"""

from __future__ import annotations

import argparse
import heapq
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from _results import save
from gpuplane.control.admission import PendingJob, ReservePolicy, run_pass
from gpuplane.control.estate import Estate
from gpuplane.control.quota import QuotaBook
from gpuplane.control.scheduler import (
    DeviceInfo,
    NodeInfo,
    Request,
    Snapshot,
    feasible,
    make_policy,
)
from gpuplane.control.settings import ControlConfig
from gpuplane.control.simulate import parse_seeds
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
    jobs, t = [], 0.0
    while len(jobs) < n:
        t += rng.exponential(1 / rate)
        team = team_names[int(rng.choice(len(team_names), p=team_p))]
        req = shapes[int(rng.choice(len(shapes), p=probs))][1]
        req = replace(req, job_id=f"{team}-{len(jobs)}")
        if not feasible(homes[TEAMS[team]], req).ok:  # every job can run at home
            continue
        jobs.append(Job(req, team, t, float(rng.lognormal(mu, sigma))))
    return jobs


def simulate(
    jobs: list[Job],
    nodes: list[NodeInfo],
    unified: bool,
    reserve: ReservePolicy | None,
    speed_weight: float = 0.0,
    wait_for_faster: bool = ControlConfig().wait_for_faster_gpu,
) -> dict[str, Any]:
    """Event-driven replay through the service's admission pass; returns makespan, throughput,
    waits and utilisation. Times are hours here and seconds inside the pass, as in the service.
    The snapshot knows each model's speed; `speed_weight` 0 makes the core ignore it."""
    estate = Estate.build(Snapshot(nodes, gpu_speeds=SPEED), QuotaBook(), ())
    policy = make_policy("frag", speed_weight=speed_weight)
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
            pending[job_id] = PendingJob(job_id, job.team, 0, job.submit_h * HOUR, req)
        if events and events[0][0] == now:
            continue  # settle simultaneous events first
        result = run_pass(
            estate, pending.values(), policy, rng, now * HOUR, reserve, wait_for_faster
        )
        passes += 1
        reserved.update(estate.reserved)
        for a in result.admitted:
            job = by_id[a.job_id]
            del pending[a.job_id]
            assert a.flavor is not None
            duration = job.work_h / SPEED[a.flavor]
            heapq.heappush(events, (now + duration, 0, a.job_id))
            waits.append(now - job.submit_h)
            busy_gpu_h += duration * job.request.gpu_demand_milli / 1000
            end = max(end, now + duration)
    gpus = sum(len(n.devices) for n in nodes)
    return {
        "mode": "unified" if unified else "isolated",
        "reservations": "off" if reserve is None else "on",
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
    unified without and with them (and with the GPU-speed term when `--speed-weight` is given)."""
    jobs = job_stream(args.jobs, nodes, args.load, shares, np.random.default_rng(seed))
    share = {t: sum(j.team == t for j in jobs) / len(jobs) for t in TEAMS}
    print(
        f"{sum(len(n.devices) for n in nodes)} GPUs in {len(CLUSTERS)} clusters, "
        f"{len(jobs)} jobs (seed {seed}); "
        + ", ".join(f"{t} {s:.0%} (home {TEAMS[t]})" for t, s in share.items())
    )
    reserve = ReservePolicy(args.reserve_after_h * HOUR, args.max_reservations)
    wait = args.wait_for_faster == "on"
    rows = [
        simulate(jobs, nodes, unified=False, reserve=None, wait_for_faster=wait),
        simulate(jobs, nodes, unified=True, reserve=None, wait_for_faster=wait),
        simulate(jobs, nodes, unified=True, reserve=reserve, wait_for_faster=wait),
    ]
    if args.speed_weight:
        rows.append(simulate(jobs, nodes, True, reserve, args.speed_weight, wait))
    print(
        f"{'mode':<9} {'reserve':>7} {'speed w':>7} {'makespan h':>10} {'jobs/h':>7}"
        f" {'mean wait h':>11} {'p95 wait h':>10} {'GPU util':>8}"
    )
    for r in rows:
        print(
            f"{r['mode']:<9} {r['reservations']:>7} {r['speed_weight']:>7.2f}"
            f" {r['makespan_h']:>10.1f} {r['throughput_jobs_per_h']:>7.2f}"
            f" {r['mean_wait_h']:>11.2f} {r['p95_wait_h']:>10.2f} {r['gpu_utilisation']:>8.1%}"
        )
    isolated, off, on = (r["throughput_jobs_per_h"] for r in rows[:3])
    ratios = {
        "throughput_ratio": round(on / isolated, 3),
        "throughput_ratio_no_reservation": round(off / isolated, 3),
    }
    print(
        f"unified / isolated throughput: {ratios['throughput_ratio']:.3f}x with node "
        f"reservations, {ratios['throughput_ratio_no_reservation']:.3f}x without "
        "(goal >= 1.5x)\n"
    )
    return {
        "shares": ",".join(f"{x:g}" for x in shares),
        "seed": seed,
        "teams": {t: {"home": h, "share": round(share[t], 3)} for t, h in TEAMS.items()},
        "results": rows,
        **ratios,
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
        default=defaults.reserve_after_s / HOUR,
        help="wait before a job gets a node reservation (default: the service's)",
    )
    ap.add_argument(
        "--max-reservations",
        type=int,
        default=defaults.max_reservations,
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    nodes = inventory(args.nodes_per_cluster)
    scenarios = []
    seeds = parse_seeds(args.seeds) if args.seeds else [args.seed]
    for text in args.shares.split(";"):
        for seed in seeds:
            scenarios.append(scenario(args, nodes, [float(x) for x in text.split(",")], seed))
    summary = []
    if len(seeds) > 1:
        print("mean over seeds " + ",".join(map(str, seeds)))
        for text in args.shares.split(";"):
            key = ",".join(f"{float(x):g}" for x in text.split(","))
            rows = [sc for sc in scenarios if sc["shares"] == key]
            means = {
                f"mean_{k}": round(float(np.mean([sc[k] for sc in rows])), 3)
                for k in ("throughput_ratio", "throughput_ratio_no_reservation")
            }
            print(
                f"  shares {text}: {means['mean_throughput_ratio']:.3f}x with node reservations, "
                f"{means['mean_throughput_ratio_no_reservation']:.3f}x without"
            )
            summary.append({"shares": text, **means})
    out = {
        "benchmark": "unified_vs_isolated",
        "clusters": [
            {"name": c, "region": r, "model": m, "card_mib": mem, "speed": s}
            for c, r, m, mem, s in CLUSTERS
        ],
        "jobs": args.jobs,
        "nodes_per_cluster": args.nodes_per_cluster,
        "offered_load": args.load,
        "seeds": seeds,
        "reserve_after_h": args.reserve_after_h,
        "max_reservations": args.max_reservations,
        "speed_weight": args.speed_weight,
        "wait_for_faster_gpu": args.wait_for_faster == "on",
        "scenarios": scenarios,
        "mean_over_seeds": summary,
        "goal_ratio": 1.5,
    }
    save(out, args.out, echo_json=args.json)


if __name__ == "__main__":
    main()
