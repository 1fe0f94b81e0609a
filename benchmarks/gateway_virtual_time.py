"""Placement in virtual time: the gateway's router in front of the simulator's engine core.

The fleet and workload of `gateway_fleet.py` (16 instances, capacities 4 and 5, the `slow`
variant's two 3x slower instances, 16 groups x 32 prompts, Poisson arrivals at 50/90/120 % of
nominal capacity, one router per contender for the three rates in turn, every engine's prefix
cache emptied before each rate), with time made virtual: an event loop whose clock jumps to the
next timer instead of sleeping. The router is the gateway's own `ModelRouter` (slots, fair queue,
prefix index, placement policy) with that clock injected; each instance is the simulator's own
`InstanceCore` (FIFO admission, LRU prefix cache, prefill and inter-token latency), driven the
way `gpuplane engine sim` drives it. A run of 512 requests takes under a second and repeats
exactly for a seed, so contenders are compared over many arrival schedules rather than a few
noisy runs.

What it leaves out is what `gateway_fleet.py` measures: HTTP, the proxy, processes sharing two
cores, and the peer routers. Contenders: `round_robin`, `least_connections`, `power_of_two`,
`gpuplane` (slots + prefix affinity), and `gpuplane:N`, gpuplane with `queue.max_passes` N.

    python benchmarks/gateway_virtual_time.py [--schedules 40] [--contenders ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import selectors
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _results import save
from gateway_fleet import (
    CAPS,
    CONTENDERS,
    GROUPS,
    OUTPUT_TOKENS,
    PER_GROUP,
    SIM,
    gateway_config,
    nominal_capacity,
    pct,
)
from gateway_fleet import workload as make_workload
from gpuplane.config import Settings, parse_settings
from gpuplane.engines.base import get_adapter
from gpuplane.engines.sim import fleet_params
from gpuplane.engines.sim.model import InstanceCore
from gpuplane.serve.prefix import prompt_text
from gpuplane.serve.router import ModelRouter

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

ROOT = Path(__file__).resolve().parent
RATES = (0.5, 0.9, 1.2)
FLEETS: dict[str, dict[int, float]] = {"uniform": {}, "slow": {0: 3.0, 1: 3.0}}
FIRST_SCHEDULE = 7  # the arrival schedule gateway_fleet.py uses
TIE_S = 0.0005  # p99s closer than this count as tied (a cold prefill is the same everywhere)


class _Instant(selectors.BaseSelector):
    """A selector with nothing to watch: waiting for `timeout` moves the virtual clock on."""

    def __init__(self) -> None:
        self.now = 0.0
        self._keys: dict[FileDescriptorLike, selectors.SelectorKey] = {}

    def register(
        self, fileobj: FileDescriptorLike, events: int, data: Any = None
    ) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fd] = selectors.SelectorKey(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._keys.pop(fileobj if isinstance(fileobj, int) else fileobj.fileno())

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError("nothing is scheduled: the run would wait forever")
        self.now += max(timeout, 0.0)
        return []

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._keys


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: `time()` is the clock `_Instant` moves."""

    def __init__(self) -> None:
        self._instant = _Instant()
        super().__init__(self._instant)

    def time(self) -> float:
        return self._instant.now


class Engine:
    """One simulated instance, driven as the simulator's `SimInstance` drives it, minus HTTP."""

    def __init__(self, core: InstanceCore) -> None:
        self.core = core
        self._admitted: dict[int, asyncio.Future[None]] = {}

    async def generate(self, prompt: str, max_tokens: int, first_token: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        req = core.arrive(prompt, max_tokens, loop.time())
        if req.admitted_at is None:
            await self._admitted.setdefault(req.rid, loop.create_future())
        await asyncio.sleep(core.prefill_seconds(req))
        core.prefilled(req)
        first_token()
        per, sent = core.params.tokens_per_chunk, 0
        while sent < req.max_tokens:
            k = min(per, req.max_tokens - sent)
            if sent:
                await asyncio.sleep(core.itl_seconds() * k)
            sent += k
        for admitted in core.release(req, loop.time(), completed=True):
            self._admitted.pop(admitted.rid).set_result(None)


def settings(contender: str) -> Settings:
    """The fleet benchmark's gateway settings for `contender` (`name` or `gpuplane:N`)."""
    name, _, passes = contender.partition(":")
    queue = {"max_passes": int(passes)} if passes else {}
    urls = [f"http://sim{i}" for i in range(len(CAPS))]
    return parse_settings(gateway_config(CONTENDERS[name][1], urls, CAPS, **queue))


async def rate_run(
    router: ModelRouter,
    engines: dict[str, Engine],
    bodies: list[dict[str, Any]],
    rate: float,
    seed: int,
) -> dict[str, Any]:
    """One open-loop run of `bodies` at `rate` through `router`, engine caches emptied first."""
    loop = asyncio.get_running_loop()
    for engine in engines.values():
        engine.core.cache.clear()
    before = {
        i: (e.core.stats.prefix_hit_tokens, e.core.stats.prompt_tokens) for i, e in engines.items()
    }
    ttfts: list[float] = []
    e2es: list[float] = []

    async def request(body: dict[str, Any], arrived: float) -> None:
        admission = await router.acquire(body)
        sent = loop.time()

        def first_token() -> None:
            now = loop.time()
            ttfts.append(now - arrived)
            router.observe_first_byte(admission, now - sent)

        engine = engines[admission.lease.instance_id]
        text = prompt_text(body)
        await engine.generate(text, int(body.get("max_tokens", OUTPUT_TOKENS)), first_token)
        router.finish(admission)
        e2es.append(loop.time() - arrived)

    rng = random.Random(seed)
    start, at, tasks = loop.time(), 0.0, []
    for body in bodies:
        at += rng.expovariate(rate)
        await asyncio.sleep(start + at - loop.time())
        tasks.append(asyncio.create_task(request(body, start + at)))
    await asyncio.gather(*tasks)
    hit = sum(e.core.stats.prefix_hit_tokens - before[i][0] for i, e in engines.items())
    prompt = sum(e.core.stats.prompt_tokens - before[i][1] for i, e in engines.items())
    return {
        "ttft_p50_s": pct(ttfts, 0.5),
        "ttft_p99_s": pct(ttfts, 0.99),
        "e2e_mean_s": round(statistics.mean(e2es), 4),
        "prefix_hit_rate": round(hit / prompt, 3),
    }


def sequence(contender: str, slowdown: dict[int, float], seed: int) -> list[dict[str, Any]]:
    """One router for the three rates in turn, as gateway_fleet.py runs a contender."""
    loop = VirtualLoop()
    try:
        cfg = settings(contender)
        adapter = get_adapter("sim")
        router = ModelRouter(
            cfg.models[0],
            cfg.gateway,
            CAPS,
            locality_wait_s=adapter.locality_wait_s,
            per_request_cache=adapter.prefix_cache_per_request,
            clock=loop.time,
            rng=random.Random(seed),
        )
        params = fleet_params(len(CAPS), CAPS, slowdown, **SIM)
        engines = {
            inst.id: Engine(InstanceCore(p, random.Random(i)))
            for i, (inst, p) in enumerate(zip(router.instances, params, strict=True))
        }
        bodies = make_workload(GROUPS, PER_GROUP, seed=42)
        capacity = nominal_capacity(slowdown)
        return [
            loop.run_until_complete(rate_run(router, engines, bodies, rate * capacity, seed))
            for rate in RATES
        ]
    finally:
        loop.close()


def versus(values: list[float], reference: list[float]) -> dict[str, int]:
    """How many of `values` are below, within `TIE_S` of, and above `reference`, pairwise."""
    diffs = [v - r for v, r in zip(values, reference, strict=True)]
    return {
        "below": sum(d < -TIE_S for d in diffs),
        "tied": sum(abs(d) <= TIE_S for d in diffs),
        "above": sum(d > TIE_S for d in diffs),
    }


def compare(contenders: list[str], schedules: int) -> dict[str, Any]:
    """Per fleet, rate and contender: the figures over `schedules` arrival schedules, and in
    how many the contender's TTFT p99 is below, within `TIE_S` of, or above the first
    contender's on the same schedule."""
    seeds = range(FIRST_SCHEDULE, FIRST_SCHEDULE + schedules)
    out: dict[str, Any] = {}
    for fleet, slowdown in FLEETS.items():
        runs = {c: [sequence(c, slowdown, s) for s in seeds] for c in contenders}
        per_rate: dict[str, Any] = {}
        for r, rate in enumerate(RATES):
            base = [run[r]["ttft_p99_s"] for run in runs[contenders[0]]]
            cells: dict[str, Any] = {}
            for c in contenders:
                rows = [run[r] for run in runs[c]]
                p99s = [row["ttft_p99_s"] for row in rows]
                cells[c] = {
                    "ttft_p99_s_median": round(statistics.median(p99s), 4),
                    "ttft_p99_s_mean": round(statistics.mean(p99s), 4),
                    "ttft_p99_s_range": [min(p99s), max(p99s)],
                    "ttft_p50_s_mean": round(statistics.mean(x["ttft_p50_s"] for x in rows), 4),
                    "e2e_mean_s": round(statistics.mean(x["e2e_mean_s"] for x in rows), 4),
                    "prefix_hit_rate": round(
                        statistics.mean(x["prefix_hit_rate"] for x in rows), 3
                    ),
                    f"p99_vs_{contenders[0]}": versus(p99s, base),
                    "p99_at_benchmark_schedule": p99s[0],
                }
            per_rate[f"{round(rate * 100)}%"] = cells
        out[fleet] = per_rate
    return out


def table(results: dict[str, Any], contenders: list[str], schedules: int) -> str:
    lines = [f"TTFT p99 over {schedules} arrival schedules (first: the fleet benchmark's)"]
    versus_key = f"p99_vs_{contenders[0]}"
    for fleet, per_rate in results.items():
        lines.append(f"\n{fleet} fleet")
        lines.append(
            f"{'rate':>5} {'contender':<20} {'p99 median':>10} {'p99 mean':>9} {'p50 mean':>9} "
            f"{'hit rate':>8} {'e2e mean':>8}  p99 vs {contenders[0]}: below/tied/above"
        )
        for rate, cells in per_rate.items():
            for c, x in cells.items():
                lines.append(
                    f"{rate:>5} {c:<20} {x['ttft_p99_s_median']:>10.4f} "
                    f"{x['ttft_p99_s_mean']:>9.4f} {x['ttft_p50_s_mean']:>9.4f} "
                    f"{x['prefix_hit_rate']:>8.3f} {x['e2e_mean_s']:>8.3f} "
                    f"{x[versus_key]['below']:>4} / {x[versus_key]['tied']:>2} / "
                    f"{x[versus_key]['above']:>2}"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=40, help="arrival schedules per cell")
    parser.add_argument(
        "--contenders",
        nargs="+",
        default=[
            "round_robin",
            "least_connections",
            "power_of_two",
            "gpuplane",
            "gpuplane:1",
            "gpuplane:3",
        ],
        help="the fleet benchmark's gateway contenders (round_robin, least_connections, "
        "power_of_two, gpuplane) or gpuplane:N (queue.max_passes N); the first is the reference",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gateway_virtual_time.json")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = parser.parse_args()
    gateways = [name for name, (kind, _) in CONTENDERS.items() if kind == "gateway"]
    for contender in args.contenders:
        name, _, passes = contender.partition(":")
        if name not in gateways or (passes and (name != "gpuplane" or not passes.isdigit())):
            parser.error(
                f"unknown contender '{contender}'; use {', '.join(gateways)} or gpuplane:N"
            )
    started = time.perf_counter()
    results = compare(args.contenders, args.schedules)
    print(table(results, args.contenders, args.schedules))
    save(
        {
            "config": {
                "contenders": args.contenders,
                "schedules": args.schedules,
                "first_schedule": FIRST_SCHEDULE,
                "wall_s": round(time.perf_counter() - started, 1),
            },
            "fleet": results,
        },
        args.out,
        echo_json=args.json,
    )
