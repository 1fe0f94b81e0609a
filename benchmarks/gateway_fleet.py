"""Fleet benchmark: gpuplane's gateway against peer routers on 16 simulated engine instances.

Contenders, each a real process in front of the same simulated instances (`gpuplane engine sim`
in a child process, one per fleet variant):
  round_robin, least_connections, power_of_two  the gpuplane gateway with that placement policy
  sglang_cache_aware, sglang_power_of_two       sglang-router from PyPI
  vllm_router                                   vllm-router from PyPI (its default, cache_aware)
  gpuplane                                      the gateway with slots + prefix affinity
  gpuplane_baseline                             the same, from the source tree --baseline-src
                                                (e.g. the main checkout's src: before vs after)

Fleet: 16 instances, capacities alternating 4 and 5 (the simulator's max_num_seqs, and the
gateway's max_concurrency); variant `slow`: instances 0 and 1 are 3x slower. Workload: 16 groups
x 32 prompts, 1,024-token system prompt per group, 128-token question, 256 output tokens,
streamed; Poisson arrivals at 50/90/120 % of the fleet's nominal capacity. Per contender and rate:
TTFT p50/p99, end-to-end p99, throughput, seconds requests waited inside engines (admitted past
capacity), prefix-cache hit rate, errors.

Overhead: added latency against going straight to an instance, with zero-delay instances and one
request at a time; sustained rate: closed loop, 32 clients, zero-delay instances, the median of
5 rounds interleaved across contenders, and gpuplane's over the fastest Rust router's. All
processes (simulator, routers, this load generator) share the machine's cores.

    python benchmarks/gateway_fleet.py [--quick] [--json]
    python benchmarks/gateway_fleet.py --only overhead --contenders gpuplane gpuplane_baseline \
        --baseline-src ../main/src --out benchmarks/results/gateway_overhead_vs_baseline.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httptools
import httpx
import uvloop
import yaml

from _extras import require_programs
from _results import save
from gpuplane.engines.sim import SimProcess, sim_process

ROOT = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
CAPS = [4, 5] * 8
GROUPS, PER_GROUP, SYSTEM_TOKENS, QUESTION_TOKENS, OUTPUT_TOKENS = 16, 32, 1024, 128, 256
SIM = {
    "itl_ms": 10.0,
    "itl_growth": 0.05,
    "prefill_tokens_per_s": 20_000.0,  # a cold 1,152-token prompt: 58 ms; with its prefix: 6 ms
    "prefix_cache_tokens": 6144,  # about five system prompts per instance
    "tokens_per_chunk": 32,  # 8 SSE chunks per answer: keeps 2 shared cores out of the way
}
PROGRAMS = {"sglang": "sglang-router", "vllm": "vllm-router"}  # the bench extra's peer routers
PIDS: dict[str, int] = {}  # contender base URL -> its process, for CPU time per request
CONTENDERS = {
    "round_robin": ("gateway", "round_robin"),
    "least_connections": ("gateway", "least_connections"),
    "power_of_two": ("gateway", "power_of_two"),
    "sglang_cache_aware": ("sglang", "cache_aware"),
    "sglang_power_of_two": ("sglang", "power_of_two"),
    "vllm_router": ("vllm", "cache_aware"),
    "gpuplane": ("gateway", "slots_prefix"),
    "gpuplane_baseline": ("baseline", "slots_prefix"),
}
BASELINE_SRC: list[Path] = []  # --baseline-src, where gpuplane_baseline's code comes from


def words(seed: str, tokens: int) -> str:
    """Text of `tokens` simulator tokens (4 characters each), distinct per seed."""
    rng = random.Random(seed)
    out = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(tokens * 4))
    return out[: tokens * 4]


def workload(groups: int, per_group: int, seed: int) -> list[dict[str, Any]]:
    systems = [f"[group {g}] " + words(f"system-{g}", SYSTEM_TOKENS) for g in range(groups)]
    bodies = [
        {
            "model": "sim",
            "messages": [
                {"role": "system", "content": systems[g]},
                {"role": "user", "content": words(f"q-{g}-{q}", QUESTION_TOKENS)},
            ],
            "max_tokens": OUTPUT_TOKENS,
            "stream": True,
        }
        for g in range(groups)
        for q in range(per_group)
    ]
    random.Random(seed).shuffle(bodies)
    return bodies


def nominal_capacity(slowdown: dict[int, float]) -> float:
    """Requests/s the fleet completes when every slot is busy (cold prefill, full batch ITL)."""
    total = 0.0
    for i, cap in enumerate(CAPS):
        slow = slowdown.get(i, 1.0)
        prefill = (SYSTEM_TOKENS + QUESTION_TOKENS) / SIM["prefill_tokens_per_s"] * slow
        decode = OUTPUT_TOKENS * SIM["itl_ms"] / 1000 * slow * (1 + SIM["itl_growth"] * (cap - 1))
        total += cap / (prefill + decode)
    return total


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, round(q * (len(s) - 1)))], 4)


# -- contenders as processes ------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_config(
    policy: str, urls: list[str], caps: list[int], **queue: object
) -> dict[str, Any]:
    """The gateway's settings for the fleet: one model `sim` over `urls`, a queue deep and
    patient enough that no request is refused, `queue` overriding its other fields."""
    return {
        "gateway": {
            "queue": {"max_size": 4096, "timeout_s": 120.0, **queue},
            "placement": {"policy": policy},
        },
        "models": [
            {
                "name": "sim",
                "engine": "sim",
                "instances": [
                    {"url": u, "max_concurrency": c} for u, c in zip(urls, caps, strict=True)
                ],
            }
        ],
    }


def contender_argv(
    kind: str, policy: str, urls: list[str], caps: list[int], port: int
) -> list[str]:
    if kind in PROGRAMS:
        return [
            str(BIN / PROGRAMS[kind]),
            *(["launch"] if kind == "sglang" else []),
            "--worker-urls",
            *urls,
            "--policy",
            policy,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "error",
            "--prometheus-port",
            str(free_port()),
        ]
    if kind == "baseline" and not BASELINE_SRC:
        raise SystemExit("the contender gpuplane_baseline needs --baseline-src PATH (a src dir)")
    config = gateway_config(policy, urls, caps)
    config["gateway"] |= {"host": "127.0.0.1", "port": port}
    path = Path(tempfile.mkdtemp(prefix="gpuplane-bench-")) / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    # the CLI's own entry point, as a user starts it
    return [sys.executable, "-m", "gpuplane.cli.main", "gateway", "serve", "--config", str(path)]


def programs(contenders: list[str]) -> list[str]:
    """The peer routers' programs that these contenders start (the bench extra installs them)."""
    return sorted({PROGRAMS[k] for k, _ in (CONTENDERS[c] for c in contenders) if k in PROGRAMS})


@contextlib.asynccontextmanager
async def running(
    name: str, urls: list[str], caps: list[int], spec: tuple[str, str] | None = None
) -> AsyncIterator[str]:
    """The contender `name` (or `spec`: (kind, policy)) as a process in front of `urls`."""
    kind, policy = spec or CONTENDERS[name]
    port = free_port()
    argv = contender_argv(kind, policy, urls, caps, port)
    env = {**os.environ, "PYTHONPATH": str(BASELINE_SRC[0])} if kind == "baseline" else None
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # noqa: ASYNC220
    base = f"http://127.0.0.1:{port}"
    PIDS[base] = proc.pid
    try:
        async with httpx.AsyncClient(timeout=5.0) as c:
            for _ in range(600):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {' '.join(argv)}")
                with contextlib.suppress(httpx.HTTPError):
                    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
                    if (await c.post(base + "/v1/chat/completions", json=body)).status_code == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"{name} never answered on {base}")
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- load -------------------------------------------------------------------------------------


FINISHED = re.compile(rb'"finish_reason":\s*"')  # a finish_reason that is not null


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    ttft = None
    done = finished = False
    pending = b""  # an SSE event not yet complete: a read may hold several events, or part of one
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return {"ok": False, "error": f"status {resp.status_code}"}
            async for chunk in resp.aiter_bytes():
                *events, pending = (pending + chunk).split(b"\n\n")
                for event in events:
                    if ttft is None and b'"content":"' in event and b'"content":""' not in event:
                        ttft = time.perf_counter() - start
                    finished = finished or FINISHED.search(event) is not None
                    if event == b"data: [DONE]":
                        done = True
    except httpx.HTTPError as exc:
        return {"ok": False, "error": type(exc).__name__}
    end = time.perf_counter()
    if not done or ttft is None:
        return {"ok": False, "error": "incomplete stream"}
    if not finished:  # [DONE] without a finish_reason: the engine cut the answer short
        return {"ok": False, "error": "cut answer"}
    return {"ok": True, "ttft": ttft, "e2e": end - start, "end": end}


async def open_loop(
    base: str, bodies: list[dict[str, Any]], rate: float, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    url = base + "/v1/chat/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=300.0, limits=limits) as client:
        t0 = time.perf_counter()
        at, tasks = 0.0, []
        for body in bodies:
            at += rng.expovariate(rate)
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_stream(client, url, body)))
        results = await asyncio.gather(*tasks)
    ok = [r for r in results if r["ok"]]
    span = (max(r["end"] for r in ok) - t0) if ok else 0.0
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "ttft_p50_s": pct([r["ttft"] for r in ok], 0.5),
        "ttft_p99_s": pct([r["ttft"] for r in ok], 0.99),
        "e2e_p99_s": pct([r["e2e"] for r in ok], 0.99),
        "throughput_rps": len(ok) / span if span else 0.0,
        "makespan_s": round(span, 3),
    }


def engine_delta(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    def d(key: str) -> float:
        return float(sum(a[key] - b[key] for a, b in zip(after, before, strict=True)))

    prompt = d("prompt_tokens")
    return {
        "engine_wait_s": round(d("waiting_time_total_s"), 3),
        "requests_waited_in_engine": int(d("requests_waited")),
        "prefix_hit_rate": round(d("prefix_hit_tokens") / prompt, 4) if prompt else None,
    }


async def reset(sim: SimProcess) -> None:
    async with httpx.AsyncClient(timeout=10.0) as c:
        await asyncio.gather(*(c.post(u + "/reset_prefix_cache") for u in sim.urls))


async def fleet_runs(args: argparse.Namespace) -> dict[str, Any]:
    rates = [0.9] if args.quick else [0.5, 0.9, 1.2]
    groups, per_group = (4, 8) if args.quick else (GROUPS, PER_GROUP)
    variants = {"uniform": {}} if args.quick else {"uniform": {}, "slow": {0: 3.0, 1: 3.0}}
    bodies = workload(groups, per_group, seed=42)
    out: dict[str, Any] = {}
    for variant, slowdown in variants.items():
        capacity = nominal_capacity(slowdown)
        out[variant] = {"nominal_capacity_rps": round(capacity, 2), "rates": {}}
        async with sim_process(16, CAPS, seed=1, slowdown=slowdown, **SIM) as sim:
            if args.quick:  # the overhead on this fleet with one-token requests: no second run
                args.overhead = {"direct": {"sustained_rps": await sustained(sim.urls, 1.0)}}
            for name in args.contenders:
                async with running(name, sim.urls, CAPS) as base:
                    for load in rates:
                        await reset(sim)
                        before = await sim.stats()
                        result = await open_loop(base, bodies, load * capacity, seed=7)
                        result.update(engine_delta(before, await sim.stats()))
                        out[variant]["rates"].setdefault(f"{round(load * 100)}%", {})[name] = result
                        log(f"{variant} {round(load * 100)}% {name}: {short(result)}")
                    if args.quick:
                        args.overhead[name] = await overhead_of(sim.urls, base, TINY, 20, 0.7)
    return out


TINY = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def overhead_runs(args: argparse.Namespace) -> dict[str, Any]:
    """Added latency (one request at a time, each router request paired with a direct one so
    that both see the same background load; one router up at a time) and the sustained rate,
    zero-delay instances.

    For the sustained rate every contender runs at once and is measured in `ROUNDS` interleaved
    rounds, so that a burst of background load on this shared machine hits one round of every
    contender rather than all rounds of one; medians are reported."""
    n = 40 if args.quick else 400
    seconds = 1.5 if args.quick else 4.0
    rounds = 1 if args.quick else ROUNDS
    caps = [64] * 16
    out: dict[str, Any] = {}
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "ping " * 64}],
        "max_tokens": 16,
        "stream": True,
    }
    async with sim_process(16, 1000, seed=1, zero_delay=True, tokens_per_chunk=16) as sim:
        for name in args.contenders:  # latency alone: no other router's background work
            async with running(name, sim.urls, caps) as base:
                out[name] = await added_latency(sim.urls, base, body, n)
            log(f"overhead {name}: {out[name]}")
        samples = await interleaved_sustained(args.contenders, sim.urls, caps, seconds, rounds)
    for name, runs in samples.items():
        rates = [rate for rate, _ in runs]
        cpus = [cpu for _, cpu in runs if cpu is not None]
        out.setdefault(name, {}).update(
            sustained_rps=round(statistics.median(rates), 1),
            sustained_rps_rounds=rates,
            **(
                {
                    "cpu_ms_per_request": round(statistics.median(cpus), 3),
                    "cpu_ms_per_request_rounds": [round(c, 3) for c in cpus],
                }
                if cpus
                else {}
            ),
        )
    out["sustained_vs_rust"] = sustained_vs_rust(out)
    return out


ROUNDS = 5  # interleaved sustained-rate rounds per contender


async def interleaved_sustained(
    names: list[str], urls: list[str], caps: list[int], seconds: float, rounds: int
) -> dict[str, list[tuple[float, float | None]]]:
    """(rate, CPU ms per request) of every contender and of going direct, `rounds` times, all
    routers up at once and measured one after the other in each round."""
    samples: dict[str, list[tuple[float, float | None]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        bases = {n: await stack.enter_async_context(running(n, urls, caps)) for n in names}
        for _ in range(rounds):
            samples.setdefault("direct", []).append((await sustained(urls, seconds), None))
            for name, base in bases.items():
                samples.setdefault(name, []).append(await sustained_with_cpu(base, seconds))
    return samples


RUST_ROUTERS = ("sglang_cache_aware", "sglang_power_of_two", "vllm_router")


def sustained_vs_rust(overhead: dict[str, Any]) -> dict[str, Any]:
    """gpuplane's median sustained rate over the fastest Rust router's (the issue's goal: 0.5)."""
    rust = {n: overhead[n]["sustained_rps"] for n in RUST_ROUTERS if n in overhead}
    if "gpuplane" not in overhead or not rust:
        return {}
    fastest = max(rust, key=rust.__getitem__)
    return {
        "fastest_rust_router": fastest,
        "ratio": round(overhead["gpuplane"]["sustained_rps"] / rust[fastest], 3),
    }


async def added_latency(
    direct_urls: list[str], base: str, body: dict[str, Any], n: int
) -> dict[str, Any]:
    """Paired added latency, p50 and p99, of the router at `base` against going direct."""
    direct, routed = await paired(direct_urls, base, {**body, "stream": True}, n)
    return {
        "direct_p50_ms": pct(direct, 0.5),
        "direct_p99_ms": pct(direct, 0.99),
        "latency_p50_ms": pct(routed, 0.5),
        "latency_p99_ms": pct(routed, 0.99),
        "added_p50_ms": round((pct(routed, 0.5) or 0) - (pct(direct, 0.5) or 0), 3),
        "added_p99_ms": round((pct(routed, 0.99) or 0) - (pct(direct, 0.99) or 0), 3),
    }


async def sustained_with_cpu(base: str, seconds: float) -> tuple[float, float | None]:
    """Sustained rate through the router at `base`, and its CPU time per request meanwhile."""
    cpu_before = cpu_seconds(PIDS[base])
    rate, count = await sustained_count([base], seconds)
    cpu = cpu_seconds(PIDS[base]) - cpu_before
    return rate, (cpu * 1000 / count if count else None)


async def overhead_of(
    direct_urls: list[str], base: str, body: dict[str, Any], n: int, seconds: float
) -> dict[str, Any]:
    """Added latency, sustained rate, and the router's CPU time per request (the quick run)."""
    rate, cpu = await sustained_with_cpu(base, seconds)
    return {
        **await added_latency(direct_urls, base, body, n),
        "sustained_rps": rate,
        "cpu_ms_per_request": round(cpu, 3) if cpu is not None else None,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def paired(
    direct_bases: list[str], base: str, body: dict[str, Any], n: int
) -> tuple[list[float], list[float]]:
    """Latency in ms of n direct and n routed requests, alternating (after 20 warm-up pairs)."""
    direct: list[float] = []
    routed: list[float] = []
    async with httpx.AsyncClient(timeout=30.0) as client:
        for i in range(n + 20):
            urls = [(direct, direct_bases[i % len(direct_bases)]), (routed, base)]
            for sink, url in urls if i % 2 else urls[::-1]:
                start = time.perf_counter()
                r = await one_stream(client, url + "/v1/chat/completions", body)
                if i >= 20 and r["ok"]:
                    sink.append(round((time.perf_counter() - start) * 1000, 3))
    return direct, routed


class _RawConnection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection parsed by httptools: a client cheap enough that the
    sustained-rate figures measure the routers, not the load generator."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.done: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("closed"))

    async def request(self, raw: bytes) -> int:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.done


async def sustained(bases: list[str], seconds: float, clients: int = 32) -> float:
    return (await sustained_count(bases, seconds, clients))[0]


async def sustained_count(bases: list[str], seconds: float, clients: int = 32) -> tuple[float, int]:
    """Requests/s (and how many) with `clients` connections each sending the next request as
    soon as one ends."""
    body = json.dumps(
        {"model": "sim", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    ).encode()
    done = 0
    loop = asyncio.get_running_loop()
    end = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        url = httpx.URL(bases[k % len(bases)])
        port = url.port or 80
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        raw = head.encode() + body
        _, conn = await loop.create_connection(_RawConnection, url.host, port)
        try:
            while time.perf_counter() < end:
                if await conn.request(raw) == 200:
                    done += 1
        finally:
            if conn.transport is not None:
                conn.transport.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    return round(done / (time.perf_counter() - start), 1), done


def short(r: dict[str, Any]) -> str:
    keys = (
        "ttft_p50_s",
        "ttft_p99_s",
        "e2e_p99_s",
        "throughput_rps",
        "engine_wait_s",
        "prefix_hit_rate",
        "errors",
    )
    return " ".join(f"{k}={round(r[k], 3) if isinstance(r[k], float) else r[k]}" for k in keys)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def table(results: dict[str, Any]) -> str:
    lines = []
    for variant, v in results["fleet"].items():
        lines.append(f"\n{variant} fleet (nominal capacity {v['nominal_capacity_rps']} req/s)")
        lines.append(
            f"{'rate':>5} {'contender':<20} {'ttft p50':>9} {'ttft p99':>9} {'e2e p99':>8} "
            f"{'req/s':>7} {'engine wait s':>13} {'hit rate':>8} {'err':>4} {'p99 vs gp':>9}"
        )
        for rate, per in v["rates"].items():
            ref = per.get("gpuplane", {}).get("ttft_p99_s")
            for name, r in per.items():
                ratio = f"{r['ttft_p99_s'] / ref:.2f}x" if ref and r["ttft_p99_s"] else "-"
                p50, p99 = r["ttft_p50_s"] or 0, r["ttft_p99_s"] or 0
                lines.append(
                    f"{rate:>5} {name:<20} {p50:>9.3f} {p99:>9.3f} "
                    f"{r['e2e_p99_s'] or 0:>8.3f} {r['throughput_rps']:>7.2f} "
                    f"{r['engine_wait_s']:>13.2f} {r['prefix_hit_rate'] or 0:>8.3f} "
                    f"{r['errors']:>4} {ratio:>9}"
                )
    lines.append("\noverhead (zero-delay engines), ms: routed p50/p99, added vs direct p50/p99")
    for name, r in results["overhead"].items():
        if name == "sustained_vs_rust":
            continue
        if name == "direct":
            lines.append(f"{'direct':<20} sustained {r['sustained_rps']:>8.1f} req/s")
            continue
        lines.append(
            f"{name:<20} {r['latency_p50_ms']:>7.2f} / {r['latency_p99_ms']:>7.2f}  "
            f"added {r['added_p50_ms']:>+7.2f} / {r['added_p99_ms']:>+7.2f}  "
            f"sustained {r['sustained_rps']:>8.1f} req/s  cpu/req {r.get('cpu_ms_per_request')} ms"
        )
    vs = results["overhead"].get("sustained_vs_rust")
    if vs:
        lines.append(
            f"gpuplane sustained / {vs['fastest_rust_router']}: {vs['ratio']:.2f}x (goal >= 0.5x)"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    load_at_start = os.getloadavg()[0]  # the machine is shared: other work skews the figures
    results: dict[str, Any] = {
        "config": {
            "caps": CAPS,
            "sim": SIM,
            "quick": args.quick,
            "cores": os.cpu_count(),
            "workload": {
                "groups": GROUPS,
                "per_group": PER_GROUP,
                "system_tokens": SYSTEM_TOKENS,
                "question_tokens": QUESTION_TOKENS,
                "output_tokens": OUTPUT_TOKENS,
            },
        },
        "fleet": await fleet_runs(args) if args.only != "overhead" else {},
        "overhead": {},
    }
    if args.quick:
        results["overhead"] = {
            **args.overhead,
            "sustained_vs_rust": sustained_vs_rust(args.overhead),
        }
    elif args.only != "fleet":
        results["overhead"] = await overhead_runs(args)
    results["config"]["wall_s"] = round(time.perf_counter() - started, 1)
    results["config"]["load_average_at_start_and_end"] = [load_at_start, os.getloadavg()[0]]
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one rate, fewer requests (~1 min)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument(
        "--contenders",
        nargs="*",
        default=[c for c in CONTENDERS if c != "gpuplane_baseline"],
        choices=list(CONTENDERS),
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="the src dir gpuplane_baseline runs from (side by side with this tree's gateway)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gateway_fleet.json")
    parser.add_argument(
        "--only",
        choices=["fleet", "overhead"],
        help="run one part and replace just that part of the results file",
    )
    ns = parser.parse_args()
    require_programs(*programs(ns.contenders))
    if ns.baseline_src is not None:
        BASELINE_SRC.append(ns.baseline_src.resolve())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        res = runner.run(main(ns))
    if ns.only and not ns.quick and ns.out.exists():  # keep the other part of an earlier run
        earlier = json.loads(ns.out.read_text())
        earlier[ns.only] = res[ns.only]
        earlier["config"][f"{ns.only}_rerun"] = res["config"]
        res = earlier
    save(res, ns.out, quick=ns.quick)
    print(json.dumps(res) if ns.json else table(res))
