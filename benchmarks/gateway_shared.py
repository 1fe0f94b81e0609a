"""Multi-active gateways (`gateway.ha.mode: shared`) on one slot table in Redis: the drill with
gateway kills and a Redis kill, and the latency one admission adds against a single gateway.

drill (`tests/serve/ha/shared_drill.py`): G gateway processes (`gpuplane gateway serve
--config`, mode shared, each its own gateway_id) over I simulated instances of capacity C, R
streamed requests from K clients, each to a gateway drawn at random among those up (a load
balancer takes a killed gateway out until it answers again; requests it was serving fail);
`kills` random gateways SIGKILLed at random points of the run and started again on their
ports; Redis SIGKILLed (its data lost) at a third of the requests and started again
`redis_down_s` later. Ground truth: each instance's `max_running_seen` and
`max_in_flight_seen` (running + waiting inside the engine: above C is over-admission), and the
leases left in Redis right after the load and one lease TTL later (any left is a leak).

acquire: one admission (`ModelRouter.acquire`, the request's slot) in mode shared on a loopback
Redis against the same router in local mode, in one process, alternating blocks of
`--acquires` per mode, one round per seed; added latency = shared minus local at p50 and p99,
the median (and range) over seeds. The release of each lease is awaited outside the timing.

    python benchmarks/gateway_shared.py [--requests 10000] [--seeds 5] [--drill-seeds 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT.parent), str(ROOT)]  # the drill harness lives with its test

from _extras import optional_imports  # noqa: E402

with optional_imports():
    from tests.serve.ha.shared_drill import Drill, drill, redis_process

    from _results import save
    from gpuplane.config import parse_settings
    from gpuplane.serve.ha.shared import RedisSlotTable
    from gpuplane.serve.ha.shared_layout import Share, SharedOptions
    from gpuplane.serve.router import ModelRouter

    # -- added latency per acquire -----------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def acquire_latency(redis_url: str, n: int, seed: int) -> dict[str, float]:
    """p50/p99 (ms) of one acquire, local vs shared, alternating blocks of 100."""
    caps = [4] * 8
    instances = [{"url": f"http://i{i}", "max_concurrency": c} for i, c in enumerate(caps)]
    settings = parse_settings({"models": [{"name": "m", "instances": instances}]})
    model, cfg = settings.models[0], settings.gateway
    options = SharedOptions(redis_url, f"bench{seed}", 1.5, 0.25, 0.05, 0.25, prefix=f"b{seed}")
    table = RedisSlotTable(options)
    shared = ModelRouter(model, cfg, caps, rng=random.Random(seed), shared=table)
    local = ModelRouter(model, cfg, caps, rng=random.Random(seed))
    await table.start()
    try:
        for _ in range(300):
            if table.state is Share.SHARED:
                break
            await asyncio.sleep(0.02)
        assert table.state is Share.SHARED, table.state
        times: dict[str, list[float]] = {"local": [], "shared": []}
        for _ in range(n // 100):
            for name, router in (("local", local), ("shared", shared)):
                for _ in range(100):
                    t0 = time.perf_counter()
                    admission = await router.acquire({})
                    times[name].append((time.perf_counter() - t0) * 1000)
                    router.finish(admission)
                    await table.drained()
    finally:
        await table.stop()
    out = {f"{m}_p{q}_ms": pct(v, q / 100) for m, v in times.items() for q in (50, 99)}
    out["added_p50_ms"] = out["shared_p50_ms"] - out["local_p50_ms"]
    out["added_p99_ms"] = out["shared_p99_ms"] - out["local_p99_ms"]
    return out


def summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    return {
        key: {
            "median": statistics.median(r[key] for r in rounds),
            "min": min(r[key] for r in rounds),
            "max": max(r[key] for r in rounds),
        }
        for key in rounds[0]
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load = os.getloadavg()[0]
    out: dict[str, Any] = {}
    with redis_process() as redis:
        if args.part in ("all", "acquire"):
            rounds = [await acquire_latency(redis.url, args.acquires, s) for s in range(args.seeds)]
            out["acquire"] = {"acquires_per_mode": args.acquires, "seeds": args.seeds}
            out["acquire"] |= {"per_seed": rounds, "summary": summary(rounds)}
        if args.part in ("all", "drill"):
            out["drills"] = []
            for seed in range(args.seed, args.seed + args.drill_seeds):
                d = Drill(
                    args.requests, kills=args.kills, kill_redis=not args.no_redis_kill, seed=seed
                )
                out["drills"].append(await drill(d, redis))
    out["load_average_at_start_and_end"] = [load, os.getloadavg()[0]]
    return out


def table(res: dict[str, Any]) -> str:
    lines = []
    if "acquire" in res:
        s = res["acquire"]["summary"]
        for key in ("local_p50_ms", "local_p99_ms", "shared_p50_ms", "shared_p99_ms"):
            lines.append(
                f"{key:16} {s[key]['median']:.3f} ({s[key]['min']:.3f}-{s[key]['max']:.3f})"
            )
        for key in ("added_p50_ms", "added_p99_ms"):
            lines.append(
                f"{key:16} {s[key]['median']:.3f} ({s[key]['min']:.3f}-{s[key]['max']:.3f})"
            )
    for d in res.get("drills", []):
        lines.append(
            f"drill, seed {d['config']['seed']}: {d['requests']} requests ({d['ok']} ok, "
            f"{d['failed']} failed) in "
            f"{d['wall_s']} s, {d['gateway_kills']} gateway kills, redis killed: "
            f"{d['redis_killed']}; max in flight per engine {max(d['max_in_flight_seen'])} "
            f"(over-admitted instances {d['over_admitted_instances']}); leases in Redis right "
            f"after {d['leases_in_redis_right_after']}, after one TTL "
            f"{d['leases_in_redis_after_one_ttl']}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "acquire", "drill"], default="all")
    parser.add_argument("--requests", type=int, default=10_000, help="requests in the drill")
    parser.add_argument("--seed", type=int, default=0, help="the first drill's seed")
    parser.add_argument("--drill-seeds", type=int, default=1, help="drills, one per seed")
    parser.add_argument("--kills", type=int, default=10, help="gateway kills in the drill")
    parser.add_argument("--no-redis-kill", action="store_true", help="keep Redis up in the drill")
    parser.add_argument("--acquires", type=int, default=5_000, help="acquires per mode and seed")
    parser.add_argument("--seeds", type=int, default=5, help="rounds of the acquire benchmark")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gateway_shared.json")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    ns = parser.parse_args()
    res = asyncio.run(main(ns))
    save(res, ns.out)
    print(json.dumps(res) if ns.json else table(res))
