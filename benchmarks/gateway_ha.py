"""Gateway primary/standby failover: SIGKILL of the leader under streaming load.

Two real gateway processes (`gpuplane gateway serve --config ...`, default HA settings: ttl
1.5 s, renew 0.25 s) on one lease (file by default; --lease redis|etcd|postgresql starts a
throwaway server) in front of simulated engines in a child process, with an open-loop
streaming load spread by a /readyz-checking balancer (the client contract of
tests/serve/ha/drill.py). Each kill: SIGKILL the leader, time from the kill to the first
request answered by the new leader, then restart the killed one as the standby and let the
load settle before the next kill. Reported: failover time median and spread over the kills,
requests failed, and each engine's max running against the gateway's capacity (the engines
could run 4x more, so any over-admission shows).

    .venv/bin/python benchmarks/gateway_ha.py --kills 5 --rate 100
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _extras import optional_imports  # noqa: E402

with optional_imports():
    from tests.serve.ha.conftest import etcd_process, redis_process
    from tests.serve.ha.drill import CAPACITY, drill

    from _results import save


async def run(args: argparse.Namespace, tmp: Path, ha: dict[str, Any] | None) -> dict[str, Any]:
    async with drill(tmp, instances=args.instances, ha=ha) as d:
        d.max_tokens = args.max_tokens
        # the load runs until the last kill has been measured: a restart on a busy machine can
        # take longer than `every_s`, and a kill after the load's end would go unmeasured
        stop = asyncio.Event()
        bound_s = 4 * (args.settle_s + args.kills * args.every_s + args.settle_s)
        load = asyncio.create_task(d.load(args.rate, bound_s, stop))
        await asyncio.sleep(args.settle_s)
        failovers: list[float | None] = []
        for _ in range(args.kills):
            old = await d.leader()
            new = next(g for g in d.gateways if g is not old)
            killed_at = time.monotonic()
            old.signal(signal.SIGKILL)
            await asyncio.to_thread(old.wait)
            await d.leader()
            old.start()  # back as the standby
            await d.ready(old)
            await asyncio.sleep(max(0.0, killed_at + args.every_s - time.monotonic()))
            served = [
                o.first_byte_at
                for o in d.outcomes
                if o.served_by == new.name and o.first_byte_at and o.first_byte_at > killed_at
            ]
            failovers.append(min(served) - killed_at if served else None)
        await asyncio.sleep(args.settle_s)
        stop.set()
        outcomes = await load
        max_running = await d.max_running()
    # the rate the client kept up: arrivals over the time it took to send them all
    wall = max(o.sent_at for o in outcomes) - min(o.sent_at for o in outcomes)
    failed = [o.failed for o in outcomes if o.failed]
    # a kill after which the new leader served nothing before the next one is not measured
    measured = [f for f in failovers if f is not None]
    return {
        "lease": args.lease,
        "rate_offered": args.rate,
        "rate_achieved": round(len(outcomes) / wall, 1),
        "requests": len(outcomes),
        "kills": args.kills,
        "failover_s": [None if f is None else round(f, 3) for f in failovers],
        "failover_unmeasured": len(failovers) - len(measured),
        "failover_median_s": round(statistics.median(measured), 3) if measured else None,
        "failover_min_s": round(min(measured), 3) if measured else None,
        "failover_max_s": round(max(measured), 3) if measured else None,
        "failed": len(failed),
        "failed_examples": failed[:5],
        "retried": sum(1 for o in outcomes if o.retries),
        "max_running_per_engine": max_running,
        "capacity_per_engine": CAPACITY,
        "over_admitted": any(m > CAPACITY for m in max_running),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second offered")
    parser.add_argument("--every-s", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lease", choices=["file", "redis", "etcd"], default="file")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuplane-ha-")))
        ha: dict[str, Any] | None = None
        if args.lease == "redis":
            ha = {"lease": "redis", "url": stack.enter_context(redis_process())}
        elif args.lease == "etcd":
            ha = {"lease": "etcd", "url": stack.enter_context(etcd_process())}
        out = asyncio.run(run(args, tmp, ha))
    print(
        f"lease {out['lease']}: {out['kills']} kills at {out['rate_achieved']} req/s achieved "
        f"({out['rate_offered']:g} offered): failover median {out['failover_median_s']} s "
        f"(min {out['failover_min_s']}, max {out['failover_max_s']}); failed {out['failed']} "
        f"of {out['requests']}; max running {out['max_running_per_engine']} vs capacity "
        f"{CAPACITY}"
    )
    path = args.out or ROOT / "benchmarks" / "results" / f"gateway_ha_{args.lease}.json"
    save(out, path, echo_json=args.json)


if __name__ == "__main__":
    main()
