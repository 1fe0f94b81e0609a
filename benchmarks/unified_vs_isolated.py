"""Unified pool vs isolated clusters: one job stream, three clusters, unbalanced teams.

Three clusters of different regions and GPU models, 16 nodes x 8 cards each (384 GPUs): us-east
(A100 80 GB), eu-west (L40S 48 GB, 0.8x the A100's speed), ap-south (A10 24 GB, 0.5x). Three
teams, one per home cluster, submit 70 % / 20 % / 10 % of one Poisson job stream of 6,000 jobs
(whole cards 1/2/4/8 and vGPU slices; durations log-normal, mean 2 h on an A100, longer on
slower cards; every job fits its home cluster). The stream is a submission wave: it offers 1.5x
the estate's capacity while it lasts, so both setups end up with a backlog to work off.

(a) isolated: each team's jobs may only run on its home cluster (what separate clusters with
    separate queues give); (b) unified: one queue over one pool, every job anywhere its own
    constraints allow. Both run the same discrete-event simulation and the same scheduler core
    (policy `frag`): at every arrival and completion the whole queue is scanned in FIFO order
    (later jobs backfill around ones that do not fit); a job starts when `schedule` places it and
    `commit` succeeds. Within one scan a shape that did not fit is not tried again (free
    resources only shrink during a scan), which keeps full scans cheap.
The snapshot knows each model's speed (`gpu_speeds`); (b) runs twice: speed-blind (the core's
default, speed weight 0) and with the core's GPU-speed score term (`--speed-weight`, default 1).
Reported: makespan (last completion), throughput (jobs / makespan), mean wait (start - submit),
GPU utilisation (busy GPU-hours / (GPUs x makespan)). Goal: (b) >= 1.5x the throughput of (a).

    .venv/bin/python benchmarks/unified_vs_isolated.py
    .venv/bin/python benchmarks/unified_vs_isolated.py --seeds 11-15 --out /tmp/seeds.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpuplane.control.scheduler import (
    DEFAULT_SPEED_WEIGHT,
    DeviceInfo,
    NodeInfo,
    Request,
    Snapshot,
    feasible,
    make_policy,
    schedule,
)
from gpuplane.control.simulate import parse_seeds
from gpuplane.resources import LABEL_CLUSTER, LABEL_GPU_MODEL, LABEL_REGION, Selector

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "unified_vs_isolated.json"
GIB = 1024

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
    jobs: list[Job], nodes: list[NodeInfo], unified: bool, speed_weight: float
) -> dict[str, Any]:
    """Event-driven replay; returns makespan, throughput, waits and utilisation. The snapshot
    knows each model's speed; `speed_weight` 0 makes the core ignore it."""
    snap = Snapshot(nodes, gpu_speeds=SPEED)
    policy = make_policy("frag", speed_weight=speed_weight)
    rng = np.random.default_rng(0)
    events: list[tuple[float, int, str]] = [(j.submit_h, 1, j.request.job_id) for j in jobs]
    heapq.heapify(events)  # (time, kind 0 = completion first, 1 = arrival, job id)
    by_id = {j.request.job_id: j for j in jobs}
    queue: list[Job] = []
    waits: list[float] = []
    busy_gpu_h = 0.0
    end = 0.0
    decisions = 0
    started = time.perf_counter()
    while events:
        now, kind, job_id = heapq.heappop(events)
        if kind == 0:
            snap.release(job_id)
        else:
            queue.append(by_id[job_id])
        if events and events[0][0] == now:
            continue  # settle simultaneous events first
        free_milli = int(snap.gpu_milli_free.sum())
        kept: list[Job] = []
        failed: set[tuple[object, ...]] = set()  # shapes that did not fit during this scan
        for job in queue:
            req = job.request
            if not unified:
                home = TEAMS[job.team]
                req = replace(req, selector=Selector(match_labels={LABEL_CLUSTER: home}))
            shape = req.shape
            if req.gpu_demand_milli > free_milli or shape in failed:
                kept.append(job)
                continue
            decision = schedule(snap, req, policy, rng)
            if decision.placement is None:
                failed.add(shape)
                kept.append(job)
                continue
            snap.commit(decision.placement)
            decisions += 1
            free_milli -= req.gpu_demand_milli
            model = snap.nodes[snap.index[decision.placement.node]].gpu_model
            duration = job.work_h / SPEED[model]
            heapq.heappush(events, (now + duration, 0, req.job_id))
            waits.append(now - job.submit_h)
            busy_gpu_h += duration * req.gpu_demand_milli / 1000
            end = max(end, now + duration)
        queue = kept
    gpus = sum(len(n.devices) for n in nodes)
    return {
        "mode": "unified" if unified else "isolated",
        "speed_weight": speed_weight,
        "jobs": len(jobs),
        "makespan_h": round(end, 2),
        "throughput_jobs_per_h": round(len(jobs) / end, 2),
        "mean_wait_h": round(float(np.mean(waits)), 2),
        "p95_wait_h": round(float(np.percentile(waits, 95)), 2),
        "gpu_utilisation": round(busy_gpu_h / (gpus * end), 4),
        "placements": decisions,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def scenario(
    args: argparse.Namespace, nodes: list[NodeInfo], shares: list[float], seed: int
) -> dict[str, Any]:
    """One job stream: isolated, unified speed-blind, unified with the speed term."""
    jobs = job_stream(args.jobs, nodes, args.load, shares, np.random.default_rng(seed))
    share = {t: sum(j.team == t for j in jobs) / len(jobs) for t in TEAMS}
    print(
        f"{sum(len(n.devices) for n in nodes)} GPUs in {len(CLUSTERS)} clusters, "
        f"{len(jobs)} jobs (seed {seed}); "
        + ", ".join(f"{t} {s:.0%} (home {TEAMS[t]})" for t, s in share.items())
    )
    rows = [
        simulate(jobs, nodes, unified=False, speed_weight=args.speed_weight),
        simulate(jobs, nodes, unified=True, speed_weight=0.0),  # speed-blind, as before
        simulate(jobs, nodes, unified=True, speed_weight=args.speed_weight),
    ]
    print(
        f"{'mode':<9} {'speed w':>7} {'makespan h':>10} {'jobs/h':>7} {'mean wait h':>11}"
        f" {'GPU util':>8}"
    )
    for r in rows:
        print(
            f"{r['mode']:<9} {r['speed_weight']:>7.2f} {r['makespan_h']:>10.1f}"
            f" {r['throughput_jobs_per_h']:>7.2f} {r['mean_wait_h']:>11.2f}"
            f" {r['gpu_utilisation']:>8.1%}"
        )
    base = rows[0]["throughput_jobs_per_h"]
    blind = rows[1]["throughput_jobs_per_h"] / base
    ratio = rows[2]["throughput_jobs_per_h"] / base
    print(
        f"unified / isolated throughput: {ratio:.3f}x with the speed term, {blind:.3f}x "
        "speed-blind (goal >= 1.5x)\n"
    )
    return {
        "shares": ",".join(f"{x:g}" for x in shares),
        "seed": seed,
        "teams": {t: {"home": h, "share": round(share[t], 3)} for t, h in TEAMS.items()},
        "results": rows,
        "throughput_ratio": round(ratio, 3),
        "throughput_ratio_speed_blind": round(blind, 3),
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
    ap.add_argument(
        "--speed-weight",
        type=float,
        default=1.0,
        help="weight of the core's GPU-speed score term in the speed-aware unified run "
        f"(the core's default is {DEFAULT_SPEED_WEIGHT:g}: off)",
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
            speed = float(np.mean([sc["throughput_ratio"] for sc in rows]))
            blind = float(np.mean([sc["throughput_ratio_speed_blind"] for sc in rows]))
            print(f"  shares {text}: {speed:.3f}x with the speed term, {blind:.3f}x speed-blind")
            summary.append(
                {
                    "shares": text,
                    "mean_throughput_ratio": round(speed, 3),
                    "mean_throughput_ratio_speed_blind": round(blind, 3),
                }
            )
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
        "speed_weight": args.speed_weight,
        "scenarios": scenarios,
        "mean_over_seeds": summary,
        "goal_ratio": 1.5,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
