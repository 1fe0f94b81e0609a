"""One matrix for the gateway's placement: workloads x contenders, each cell over many seeds.

Every cell runs each contender on the same instances, the same requests and the same arrival
schedule, once per seed, and reports per contender the median over seeds (and the range) of
TTFT p50, TTFT p99, end-to-end p99, makespan (first arrival to last answer), prefix hit rate,
seconds requests waited inside engines, requests admitted past an engine's capacity, and errors.
An answer counts only when its stream ends with a `finish_reason`; a cut answer is an error.

Parts (`--parts`):
  virtual  simulated fleets in virtual time (`gateway_virtual_time.py`'s loop): the gateway's own
           `ModelRouter` with each placement policy, and client-side policies that send straight
           to the instances, in front of the simulator's `InstanceCore`. Fleets: 16 instances of
           capacity 4 and 5 (`uniform`), the same with two 3x slower cards (`slow`), 32 instances
           (`wide`); prefix groups 4 / 16 / 64 with system prompts of 200-2,000 tokens; loads
           50 / 90 / 120 % of nominal capacity; no shared prefixes; bursty arrivals; and
           llama.cpp-like fleets (3 instances of capacity 1 whose cache keeps the last prompt,
           or 4 with `--cache`; 6 tenants; closed loop at concurrency 6).
  peers    sglang-router and vllm-router (`cache_aware`, `power_of_two`) and gpuplane's default
           as real processes in front of `gpuplane engine sim`, on reduced workloads (the same
           requests and schedule run in virtual time for the other contenders).
  llama    real llama.cpp (`llama_cpp.server`, the embedded default model): 3 external instances
           with default settings (no prompt cache but the last prompt's state), and 3 started
           with `--cache`; 6 tenants with their own system prompts; a reduced request count.
  cpu      router CPU per request on a zero-delay fleet, gpuplane beside vllm-router, interleaved
           rounds (`gateway_fleet.interleaved_sustained`).

The judgement (`judge`): the floor (gpuplane's default: TTFT p50, p99 and makespan each at most
1.05x the gateway's own slots + round robin, TTFT p99 at most the best peer router's, nothing
admitted past capacity) and the goal (lowest TTFT p99, TTFT p50 and makespan at most the best
contender's, no time waiting inside engines; on llama.cpp TTFT p50 at most 0.5x round robin's).

    python benchmarks/gateway_matrix.py [--quick] [--seeds 10] [--parts virtual peers llama cpu]
                                        [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvloop

from _extras import require_programs
from _results import save
from gateway_fleet import (
    PROGRAMS,
    SIM,
    gateway_config,
    interleaved_sustained,
    open_loop,
    pct,
    running,
    words,
)
from gateway_real_engine import api_key, one_request, system_prompt
from gateway_virtual_time import Engine, VirtualLoop
from gpuplane.config import parse_settings
from gpuplane.engines.base import get_adapter
from gpuplane.engines.config import EngineConfig
from gpuplane.engines.llamacpp import LlamaCpp, embedded_launches
from gpuplane.engines.sim import fleet_params, sim_process
from gpuplane.engines.sim.model import CHARS_PER_TOKEN, InstanceCore, SimParams
from gpuplane.serve.prefix import prompt_text
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.server import serving
from gpuplane.serve.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent
DEFAULT = "gpuplane"  # the contender judged
REFERENCE = "round_robin"  # the floor's reference: the gateway's own slots + round robin
FLOOR = 1.05
# contender -> (where it runs, policy); the gateway ones keep the slot gate
GATEWAY = {
    "round_robin": "round_robin",
    "least_connections": "least_connections",
    "power_of_two": "power_of_two",
    "slots": "slots",
    "gpuplane": "slots_prefix",
}
CLIENT = ("client_round_robin", "client_least_loaded")  # straight to the instances, no gate
PEERS = {
    "sglang_cache_aware": ("sglang", "cache_aware"),
    "sglang_power_of_two": ("sglang", "power_of_two"),
    "vllm_cache_aware": ("vllm", "cache_aware"),
    "vllm_power_of_two": ("vllm", "power_of_two"),
    "gpuplane_process": ("gateway", "slots_prefix"),  # gpuplane under the peers' conditions
}
VIRTUAL = (*CLIENT, *GATEWAY)
LLAMA_CONTENDERS = ("client_round_robin", "client_least_loaded", "round_robin", "slots", DEFAULT)


@dataclass(frozen=True, slots=True)
class Fleet:
    """Instances and the engine simulated on each, with the prompts its workloads send."""

    caps: tuple[int, ...]
    slowdown: tuple[tuple[int, float], ...] = ()
    sim: tuple[tuple[str, Any], ...] = tuple(SIM.items())
    system_tokens: tuple[int, int] = (200, 2000)  # drawn per prefix group
    question_tokens: int = 128
    output_tokens: int = 256
    engine: str = "sim"  # the gateway's engine adapter (its locality wait, its cache kind)

    def params(self) -> list[SimParams]:
        return fleet_params(len(self.caps), list(self.caps), dict(self.slowdown), **dict(self.sim))

    def nominal_rps(self, prompt_tokens: float) -> float:
        """Requests/s when every slot is busy: cold prefill, full-batch inter-token latency."""
        total = 0.0
        for p in self.params():
            prefill = prompt_tokens / p.prefill_tokens_per_s
            decode = (
                self.output_tokens * p.itl_ms / 1000 * (1 + p.itl_growth * (p.max_num_seqs - 1))
            )
            total += p.max_num_seqs / ((prefill + decode) * p.slowdown)
        return total


# llama.cpp on a CPU, as the simulator models it: ~700-token system prompts prefill in ~4 s cold
# and a 16-token question in ~0.1 s; one generation at a time; the cache keeps whole prompts.
_LLAMA_SIM = (
    ("prefill_tokens_per_s", 175.0),
    ("itl_ms", 40.0),
    ("itl_growth", 0.0),
    ("tokens_per_chunk", 4),
    ("cache_kind", "prompts"),
)
FLEETS = {
    "uniform": Fleet((4, 5) * 8),
    "slow": Fleet((4, 5) * 8, slowdown=((0, 3.0), (1, 3.0))),
    "wide": Fleet((4, 5) * 16),
    "llama": Fleet(
        (1, 1, 1), (), (*_LLAMA_SIM, ("cache_prompts", 1)), (700, 700), 16, 16, "llamacpp"
    ),
    "llama_cache": Fleet(
        (1, 1, 1), (), (*_LLAMA_SIM, ("cache_prompts", 4)), (700, 700), 16, 16, "llamacpp"
    ),
}


@dataclass(frozen=True, slots=True)
class Workload:
    """One row of the matrix. `groups` 0: every request has its own system prompt.
    `concurrency` > 0: a closed loop of that many clients instead of Poisson arrivals."""

    name: str
    fleet: str = "uniform"
    groups: int = 16
    load: float = 0.9
    requests: int = 512
    bursty: bool = False
    concurrency: int = 0
    peers: bool = False  # the peer routers run too (as processes)
    tenants: bool = False  # each prefix group is a tenant of its own (else one tenant)

    def bodies(self, seed: int) -> list[dict[str, Any]]:
        """The requests in the seed's order; prompts are the same for every seed."""
        bodies = list(_bodies(self))
        random.Random(seed).shuffle(bodies)
        return bodies

    def rate(self) -> float:
        """Mean arrivals per second: `load` times the fleet's nominal capacity for these prompts."""
        return _rate(self)

    def arrivals(self, seed: int) -> list[float]:
        """Arrival offsets: Poisson at `rate()` (the fleet benchmark's draws for a seed), or
        bursty: 4 s periods whose first second arrives at 3x the rate and the rest at 1/3."""
        rng, rate = random.Random(seed), self.rate()
        out: list[float] = []
        at = 0.0
        while len(out) < self.requests:
            if not self.bursty:
                at += rng.expovariate(rate)
                out.append(at)
                continue
            at += rng.expovariate(3 * rate)  # thinning: candidates at the peak rate
            if rng.random() < (1.0 if at % 4.0 < 1.0 else 1 / 9):
                out.append(at)
        return out


@functools.cache
def _bodies(work: Workload) -> tuple[dict[str, Any], ...]:
    """The workload's requests in a fixed order (the text is drawn once per workload)."""
    fleet = FLEETS[work.fleet]
    groups = work.groups or work.requests
    lo, hi = fleet.system_tokens
    systems = [
        f"[group {g}] " + words(f"system-{g}", random.Random(f"len-{g}").randint(lo, hi))
        for g in range(groups)
    ]
    return tuple(
        {
            "model": "sim",
            "messages": [
                {"role": "system", "content": systems[i % groups]},
                {"role": "user", "content": words(f"q-{i}", fleet.question_tokens)},
            ],
            "max_tokens": fleet.output_tokens,
            "stream": True,
        }
        for i in range(work.requests)
    )


@functools.cache
def _rate(work: Workload) -> float:
    tokens = statistics.mean(len(prompt_text(b)) / CHARS_PER_TOKEN for b in _bodies(work))
    return work.load * FLEETS[work.fleet].nominal_rps(tokens)


WORKLOADS = [
    *(
        Workload(f"{f}-g16-{round(x * 100)}", f, load=x)
        for f in ("uniform", "slow")
        for x in (0.5, 0.9, 1.2)
    ),
    Workload("wide-g16-90", "wide"),
    *(
        Workload(f"uniform-g{g}-{round(x * 100)}", groups=g, load=x)
        for g in (4, 64)
        for x in (0.9, 1.2)
    ),
    Workload("uniform-unshared-90", groups=0),
    Workload("uniform-bursty-90", bursty=True),
    Workload("llama-sim", "llama", groups=6, requests=60, concurrency=6, tenants=True),
    Workload("llama-sim-cache", "llama_cache", groups=6, requests=60, concurrency=6, tenants=True),
    Workload("peers-uniform-90", requests=160, peers=True),
    Workload("peers-slow-90", "slow", requests=160, peers=True),
    Workload("peers-uniform-120", load=1.2, requests=160, peers=True),
]
QUICK = [
    Workload("uniform-g16-90", requests=256),
    Workload("slow-g16-90", "slow", requests=256),
    Workload("uniform-g64-120", groups=64, load=1.2, requests=256),
    Workload("llama-sim", "llama", groups=6, requests=30, concurrency=6, tenants=True),
    Workload("peers-uniform-90", requests=96, peers=True),
]


# -- one run ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """What one run measured; `row()` is its figures."""

    ttfts: list[float] = field(default_factory=list)
    e2es: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    errors: int = 0
    start: float = 0.0

    def row(self, engine: dict[str, float]) -> dict[str, Any]:
        return {
            "ttft_p50_s": pct(self.ttfts, 0.5),
            "ttft_p99_s": pct(self.ttfts, 0.99),
            "e2e_p99_s": pct(self.e2es, 0.99),
            "makespan_s": round(max(self.ends) - self.start, 3) if self.ends else None,
            "errors": self.errors,
            **engine,
        }


def engine_figures(cores: Sequence[InstanceCore]) -> dict[str, float]:
    prompt = sum(c.stats.prompt_tokens for c in cores)
    return {
        "prefix_hit_rate": round(sum(c.stats.prefix_hit_tokens for c in cores) / prompt, 3)
        if prompt
        else 0.0,
        "engine_wait_s": round(sum(c.stats.waiting_time_total_s for c in cores), 3),
        "over_admitted": sum(c.stats.requests_waited for c in cores),
    }


def gateway_router(policy: str, fleet: Fleet, clock: Callable[[], float], seed: int) -> ModelRouter:
    urls = [f"http://sim{i}" for i in range(len(fleet.caps))]
    cfg = parse_settings(gateway_config(policy, urls, list(fleet.caps)))
    adapter = get_adapter(fleet.engine)
    return ModelRouter(
        cfg.models[0],
        cfg.gateway,
        list(fleet.caps),
        locality_wait_s=adapter.locality_wait_s,
        per_request_cache=adapter.prefix_cache_per_request,
        clock=clock,
        rng=random.Random(seed),
    )


class Client:
    """A client-side policy: sends straight to an instance, which queues what it cannot run."""

    def __init__(self, policy: str, caps: Sequence[int], seed: int) -> None:
        self.policy = policy
        self.caps = caps
        self.outstanding = [0] * len(caps)
        self._next = 0
        self._rng = random.Random(seed)

    def pick(self) -> int:
        if self.policy == "client_round_robin":
            self._next = (self._next + 1) % len(self.caps)
            return self._next
        loads = [o / c for o, c in zip(self.outstanding, self.caps, strict=True)]
        low = min(loads)
        return self._rng.choice([i for i, x in enumerate(loads) if x == low])


async def virtual_run(contender: str, work: Workload, seed: int) -> dict[str, Any]:
    """One contender on one seed of `work`, in virtual time, on fresh instances and router."""
    loop = asyncio.get_running_loop()
    fleet = FLEETS[work.fleet]
    cores = [InstanceCore(p, random.Random(i)) for i, p in enumerate(fleet.params())]
    engines = [Engine(c) for c in cores]
    router = (
        gateway_router(GATEWAY[contender], fleet, loop.time, seed) if contender in GATEWAY else None
    )
    client = Client(contender, fleet.caps, seed)
    ids = [i.id for i in router.instances] if router else []
    tally = Tally(start=loop.time())

    async def request(body: dict[str, Any]) -> None:
        sent = loop.time()
        if router is not None:
            tenant = prompt_text(body)[:16] if work.tenants else "default"  # the group's name
            admission = await router.acquire(body, tenant=tenant)
            target = ids.index(admission.lease.instance_id)
            began = loop.time()
        else:
            target = client.pick()
            client.outstanding[target] += 1

        def first_token() -> None:
            tally.ttfts.append(loop.time() - sent)
            if router is not None:
                router.observe_first_byte(admission, loop.time() - began)

        text = prompt_text(body)
        await engines[target].generate(text, int(body["max_tokens"]), first_token)
        if router is not None:
            router.finish(admission)
        else:
            client.outstanding[target] -= 1
        tally.e2es.append(loop.time() - sent)
        tally.ends.append(loop.time())

    bodies = work.bodies(seed)
    if work.concurrency:
        pending = list(reversed(bodies))

        async def worker() -> None:
            while pending:
                await request(pending.pop())

        await asyncio.gather(*(worker() for _ in range(work.concurrency)))
    else:
        tasks = []
        for body, at in zip(bodies, work.arrivals(seed), strict=True):
            await asyncio.sleep(tally.start + at - loop.time())
            tasks.append(asyncio.create_task(request(body)))
        await asyncio.gather(*tasks)
    return tally.row(engine_figures(cores))


def run_virtual(contender: str, work: Workload, seed: int) -> dict[str, Any]:
    """`virtual_run` on its own virtual-time loop (in a thread of its own: the caller's loop
    runs in real time)."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(virtual_run(contender, work, seed))
    finally:
        loop.close()


# -- peers: real processes in front of the simulator -----------------------------------------


def engine_delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, float]:
    def d(key: str) -> float:
        return float(sum(a[key] - b[key] for a, b in zip(after, before, strict=True)))

    prompt = d("prompt_tokens")
    return {
        "prefix_hit_rate": round(d("prefix_hit_tokens") / prompt, 3) if prompt else 0.0,
        "engine_wait_s": round(d("waiting_time_total_s"), 3),
        "over_admitted": int(d("requests_waited")),
    }


async def peer_runs(
    work: Workload, seeds: Sequence[int], names: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """Each peer (one process per workload) over every seed; engine caches emptied between."""
    fleet = FLEETS[work.fleet]
    out: dict[str, list[dict[str, Any]]] = {}
    sim_opts = dict(fleet.sim)
    async with sim_process(
        len(fleet.caps), list(fleet.caps), seed=1, slowdown=dict(fleet.slowdown), **sim_opts
    ) as sim:
        for name in names:
            async with running(name, sim.urls, list(fleet.caps), PEERS[name]) as base:
                for seed in seeds:
                    async with httpx.AsyncClient(timeout=10.0) as c:
                        await asyncio.gather(*(c.post(u + "/reset_prefix_cache") for u in sim.urls))
                    before = await sim.stats()
                    r = await open_loop(base, work.bodies(seed), work.rate(), seed)
                    row = {
                        "ttft_p50_s": r["ttft_p50_s"],
                        "ttft_p99_s": r["ttft_p99_s"],
                        "e2e_p99_s": r["e2e_p99_s"],
                        "makespan_s": r["makespan_s"],
                        "errors": r["errors"],
                        **engine_delta(before, await sim.stats()),
                    }
                    out.setdefault(name, []).append(row)
                    log(f"{work.name} seed {seed} {name}: {short(row)}")
    return out


# -- real llama.cpp ---------------------------------------------------------------------------

LLAMA_SENTENCES = 26  # a ~700-token system prompt per tenant
LLAMA_TENANTS, LLAMA_CONCURRENCY, LLAMA_MAX_TOKENS = 6, 6, 16


async def llama_run(
    contender: str, cache_bytes: int, requests: int, seed: int, ports: list[int]
) -> dict[str, Any]:
    """One contender on freshly started llama.cpp instances (cold caches)."""
    rng = random.Random(seed)
    prompts = [system_prompt(t, LLAMA_SENTENCES) for t in range(LLAMA_TENANTS)]
    work = []
    for i in range(requests):
        tenant = rng.randrange(LLAMA_TENANTS)
        messages = [
            {"role": "system", "content": prompts[tenant]},
            {"role": "user", "content": f"Question {i}: what is case {rng.randrange(1000)}?"},
        ]
        body = {
            "model": "smollm2",
            "messages": messages,
            "max_tokens": LLAMA_MAX_TOKENS,
            "temperature": 0,
            "stream": True,
        }
        work.append((tenant, body))
    engine = EngineConfig(cache_bytes=cache_bytes)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = Path(tempfile.gettempdir()) / "gpuplane-matrix-logs"
    supervisor = Supervisor(LlamaCpp(), embedded_launches(engine, ports), log_dir=logs)
    await supervisor.start()
    try:
        if contender in GATEWAY:
            settings = parse_settings(
                {
                    "gateway": {
                        "port": 0,
                        "placement": {"policy": GATEWAY[contender]},
                        "queue": {"timeout_s": 900, "max_size": 4096},
                    },
                    "tenants": [
                        {"name": f"tenant-{t}", "api_keys": [api_key(t)]}
                        for t in range(LLAMA_TENANTS)
                    ],
                    # external instances: the gateway is not told what their caches keep
                    "models": [
                        {
                            "name": "smollm2",
                            "engine": "llamacpp",
                            "instances": [{"url": u, "max_concurrency": 1} for u in urls],
                        }
                    ],
                }
            )
            async with serving(settings) as base:
                return await llama_drive(work, lambda: base, lambda i: None)
        client = Client(contender, [1] * len(urls), seed)

        def pick() -> str:
            i = client.pick()
            client.outstanding[i] += 1
            return urls[i]

        return await llama_drive(work, pick, lambda url: client_done(client, urls, url))
    finally:
        await supervisor.stop()


def client_done(client: Client, urls: list[str], url: str | None) -> None:
    if url is not None:
        client.outstanding[urls.index(url)] -= 1


async def llama_drive(
    work: list[tuple[int, dict[str, Any]]],
    pick: Callable[[], str],
    done: Callable[[str | None], None],
) -> dict[str, Any]:
    tally = Tally(start=time.perf_counter())
    pending = list(reversed(work))

    async def worker(client: httpx.AsyncClient) -> None:
        while pending:
            request = pending.pop()
            url = pick()
            sent = time.perf_counter()
            ok, ttft = await one_request(client, url + "/v1/chat/completions", request)
            done(url)
            if not ok:
                tally.errors += 1
                continue
            assert ttft is not None
            tally.ttfts.append(ttft)
            tally.e2es.append(time.perf_counter() - sent)
            tally.ends.append(time.perf_counter())

    async with httpx.AsyncClient(timeout=900) as client:
        await asyncio.gather(*(worker(client) for _ in range(LLAMA_CONCURRENCY)))
    return tally.row({})


# -- the matrix -------------------------------------------------------------------------------


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over seeds of each figure, and the range of the TTFT percentiles."""
    out: dict[str, Any] = {"seeds": len(runs)}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if not values:
            out[key] = None
            continue
        out[key] = round(statistics.median(values), 4)
        if key in ("ttft_p50_s", "ttft_p99_s", "makespan_s"):
            out[key + "_range"] = [min(values), max(values)]
    return out


def judge(cells: dict[str, dict[str, Any]], llama: bool) -> dict[str, Any]:
    """The floor and the goal of gpuplane's default in one row (medians over seeds)."""
    me, ref = cells[DEFAULT], cells[REFERENCE]
    peers = [cells[p] for p in PEERS if p in cells and p != "gpuplane_process"]
    mine = [me] + ([cells["gpuplane_process"]] if "gpuplane_process" in cells else [])
    others = [c for n, c in cells.items() if n not in (DEFAULT, "gpuplane_process")]

    def ratio(key: str) -> float | None:
        return round(me[key] / ref[key], 3) if me[key] and ref[key] else None

    ratios = {k: ratio(k) for k in ("ttft_p50_s", "ttft_p99_s", "makespan_s")}
    best_peer_p99 = min((p["ttft_p99_s"] for p in peers if p["ttft_p99_s"]), default=None)
    floor = {
        **{f"{k}_vs_round_robin": r is not None and r <= FLOOR for k, r in ratios.items()},
        "p99_le_best_peer": best_peer_p99 is None
        or all(m["ttft_p99_s"] <= best_peer_p99 for m in mine),
        "no_over_admission": all(m["over_admitted"] == 0 for m in mine) and me["errors"] == 0,
    }

    def best(key: str) -> float:
        return float(min(c[key] for c in others if c[key] is not None))

    goal = {
        "lowest_p99": me["ttft_p99_s"] <= best("ttft_p99_s"),
        "p50_le_best": me["ttft_p50_s"] <= best("ttft_p50_s"),
        "makespan_le_best": me["makespan_s"] <= best("makespan_s"),
        "no_engine_wait": me["engine_wait_s"] == 0,
    }
    if llama:
        goal["p50_le_half_round_robin"] = (
            ratios["ttft_p50_s"] is not None and ratios["ttft_p50_s"] <= 0.5
        )
    return {
        "vs_round_robin": ratios,
        "best_peer_p99_s": best_peer_p99,
        "floor": floor,
        "floor_holds": all(floor.values()),
        "goal": goal,
        "goal_met": all(goal.values()),
    }


async def matrix(args: argparse.Namespace) -> dict[str, Any]:
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows = QUICK if args.quick else WORKLOADS
    out: dict[str, Any] = {}
    for work in rows:
        if work.name not in args.only and args.only:
            continue
        runs: dict[str, list[dict[str, Any]]] = {}
        if "virtual" in args.parts:
            for contender in VIRTUAL:
                runs[contender] = [
                    await asyncio.to_thread(run_virtual, contender, work, s) for s in seeds
                ]
            log(f"{work.name}: virtual done")
        if work.peers and "peers" in args.parts:
            names = ["sglang_cache_aware", "vllm_cache_aware"] if args.quick else list(PEERS)
            runs |= await peer_runs(work, seeds, names)
        if DEFAULT not in runs or REFERENCE not in runs:
            continue
        cells = {name: summarise(r) for name, r in runs.items()}
        out[work.name] = {
            "workload": workload_info(work),
            "cells": cells,
            "judgement": judge(cells, False),
        }
    return out


def workload_info(work: Workload) -> dict[str, Any]:
    fleet = FLEETS[work.fleet]
    return {
        "fleet": work.fleet,
        "instances": len(fleet.caps),
        "slots": sum(fleet.caps),
        "groups": work.groups or "none shared",
        "load": work.load if not work.concurrency else f"closed loop, {work.concurrency} clients",
        "requests": work.requests,
        "bursty": work.bursty,
        "rate_rps": round(work.rate(), 2) if not work.concurrency else None,
    }


async def llama_matrix(args: argparse.Namespace) -> dict[str, Any]:
    seeds = range(args.first_seed, args.first_seed + args.llama_seeds)
    out: dict[str, Any] = {}
    for name, cache_bytes in (("llama-default", 0), ("llama-cache", EngineConfig().cache_bytes)):
        runs: dict[str, list[dict[str, Any]]] = {}
        for seed in seeds:
            for contender in args.llama_contenders:
                row = await llama_run(
                    contender, cache_bytes, args.llama_requests, seed, [8161, 8162, 8163]
                )
                runs.setdefault(contender, []).append(
                    row | {"prefix_hit_rate": None, "engine_wait_s": None, "over_admitted": 0}
                )
                log(f"{name} seed {seed} {contender}: {short(row)}")
        cells = {c: summarise(r) for c, r in runs.items()}
        out[name] = {
            "workload": {
                "instances": 3,
                "tenants": LLAMA_TENANTS,
                "requests": args.llama_requests,
                "concurrency": LLAMA_CONCURRENCY,
                "cache_bytes": cache_bytes,
            },
            "cells": cells,
            "judgement": judge_llama(cells),
        }
    return out


def judge_llama(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """As `judge`, without engine-side figures (llama.cpp exports none): cut answers count as
    errors, and waiting inside the engine cannot happen behind the slot gate."""
    filled = {n: {**c, "engine_wait_s": 0 if n in GATEWAY else None} for n, c in cells.items()}
    return judge(filled, True)


async def cpu_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Router CPU ms per request on a zero-delay fleet, gpuplane beside vllm-router."""
    rounds, seconds = (1, 1.5) if args.quick else (5, 4.0)
    async with sim_process(16, 1000, seed=1, zero_delay=True, tokens_per_chunk=16) as sim:
        samples = await interleaved_sustained(
            ["gpuplane", "vllm_router"], sim.urls, [64] * 16, seconds, rounds
        )
    out: dict[str, Any] = {}
    for name in ("gpuplane", "vllm_router"):
        cpus = [cpu for _, cpu in samples[name] if cpu is not None]
        out[name] = {
            "cpu_ms_per_request": round(statistics.median(cpus), 3),
            "rounds": [round(c, 3) for c in cpus],
            "sustained_rps": statistics.median(rate for rate, _ in samples[name]),
        }
    return out


def short(r: dict[str, Any]) -> str:
    keys = ("ttft_p50_s", "ttft_p99_s", "makespan_s", "prefix_hit_rate", "engine_wait_s", "errors")
    return " ".join(f"{k}={r.get(k)}" for k in keys)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def table(results: dict[str, Any]) -> str:
    lines = []
    for part in ("matrix", "llama"):
        for row, cell in results.get(part, {}).items():
            j = cell["judgement"]
            lines.append(
                f"\n{row} {cell['workload']}  floor {'holds' if j['floor_holds'] else 'MISSED'}"
                f" {j['vs_round_robin']}  goal {'met' if j['goal_met'] else 'missed'}"
            )
            lines.append(
                f"{'contender':<22} {'p50 s':>8} {'p99 s':>8} {'e2e p99':>8} {'makespan':>9} "
                f"{'hit':>6} {'eng wait':>9} {'over':>5} {'err':>4}"
            )
            for name, c in cell["cells"].items():
                lines.append(
                    f"{name:<22} {fmt(c['ttft_p50_s']):>8} {fmt(c['ttft_p99_s']):>8} "
                    f"{fmt(c['e2e_p99_s']):>8} {fmt(c['makespan_s']):>9} "
                    f"{fmt(c['prefix_hit_rate']):>6} {fmt(c['engine_wait_s']):>9} "
                    f"{c['over_admitted']:>5} {c['errors']:>4}"
                )
    if "cpu" in results:
        lines.append("\nrouter CPU per request, zero-delay fleet (median of rounds)")
        for name, c in results["cpu"].items():
            lines.append(f"{name:<22} {c['cpu_ms_per_request']:.3f} ms  rounds {c['rounds']}")
    return "\n".join(lines)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


async def main(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    results: dict[str, Any] = {}
    if {"virtual", "peers"} & set(args.parts):
        results["matrix"] = await matrix(args)
    if "llama" in args.parts:
        results["llama"] = await llama_matrix(args)
    if "cpu" in args.parts:
        results["cpu"] = await cpu_cost(args)
    results["config"] = {
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "llama_seeds": args.llama_seeds if "llama" in args.parts else None,
        "quick": args.quick,
        "parts": args.parts,
        "wall_s": round(time.perf_counter() - started, 1),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()[0]],
    }
    return results


def merge(path: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """Keep the parts and rows of an earlier results file that this run did not redo; each
    run's `config` is kept, in order, under `runs`."""
    if not path.exists():
        return {**fresh, "runs": [fresh.pop("config")]}
    import json

    earlier: dict[str, Any] = json.loads(path.read_text())
    runs = earlier.pop("runs", [])
    if "config" in earlier:  # a file written before runs were kept
        runs.append(earlier.pop("config"))
    runs.append(fresh.pop("config"))
    for part, value in fresh.items():
        if isinstance(value, dict) and isinstance(earlier.get(part), dict):
            earlier[part] |= value
        else:
            earlier[part] = value
    return {**earlier, "runs": runs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one seed of a reduced matrix (< 2 min)"
    )
    parser.add_argument("--seeds", type=int, default=10, help="arrival seeds per cell")
    parser.add_argument("--first-seed", type=int, default=7)
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["virtual", "peers", "llama", "cpu"],
        choices=["virtual", "peers", "llama", "cpu"],
    )
    parser.add_argument("--only", nargs="*", default=[], help="run only these matrix rows")
    parser.add_argument("--llama-seeds", type=int, default=10)
    parser.add_argument("--llama-requests", type=int, default=24)
    parser.add_argument(
        "--llama-contenders",
        nargs="+",
        default=list(LLAMA_CONTENDERS),
        choices=LLAMA_CONTENDERS,
        help="the contenders of the llama part (the floor needs round_robin and gpuplane)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gateway_matrix.json")
    parser.add_argument("--json", action="store_true", help="print the whole table as JSON")
    ns = parser.parse_args()
    if not {DEFAULT, REFERENCE} <= set(ns.llama_contenders):
        parser.error(f"--llama-contenders must include {REFERENCE} and {DEFAULT}: the floor")
    if ns.quick:
        ns.seeds = 1
        ns.parts = [p for p in ns.parts if p != "llama"]
    if "peers" in ns.parts:  # sglang-router and vllm-router
        require_programs(*PROGRAMS.values())
    if "cpu" in ns.parts:  # gpuplane beside vllm-router
        require_programs(PROGRAMS["vllm"])
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        res = runner.run(main(ns))
    print(table(res))
    save(res if ns.quick else merge(ns.out, res), ns.out, quick=ns.quick, echo_json=ns.json)
