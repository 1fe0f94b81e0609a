"""Multi-active gateways (`gateway.ha.mode: shared`) on one slot table in Redis: the drill with
gateway kills and a Redis kill, and the latency one admission adds against a single gateway.

drill: G gateway processes (`gpuplane gateway serve --config`, mode shared, each its own
gateway_id) over I simulated instances of capacity C (`gpuplane engine sim` in a child
process), R streamed requests from K clients, each to a gateway drawn at random among those up
(a load balancer takes a killed gateway out until it answers again; requests it was serving
fail); every
`kill_every_s` (drawn around it) a random gateway is SIGKILLed and started again on its port;
with --kill-redis, Redis is SIGKILLed (its data is lost) at a third of the requests and started
again `redis_down_s` later. Ground truth: each instance's `max_running_seen` and
`max_in_flight_seen` (running + waiting inside the engine: above C is over-admission), and the
leases left in Redis right after the load and one lease TTL later (killed gateways' leases
expire by then: any left is a leak).

acquire: one admission (`ModelRouter.acquire`, the request's slot) in mode shared on a loopback
Redis against the same router in local mode, in one process, alternating blocks of
`--acquires` per mode, one round per seed; added latency = shared minus local at p50 and p99,
the median (and range) over seeds. The release of each lease is awaited outside the timing.

    python benchmarks/gateway_shared.py [--requests 10000] [--seeds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
import yaml

from gpuplane.config import parse_settings
from gpuplane.serve.engines.sim import sim_process
from gpuplane.serve.ha.shared import RedisSlotTable, Share, SharedOptions
from gpuplane.serve.router import ModelRouter

ROOT = Path(__file__).resolve().parent
REDIS = "/usr/bin/redis-server"
GPUPLANE = Path(sys.executable).parent / "gpuplane"
PREFIX = "gpuplane-drill"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:g} s")


@dataclass
class RedisProcess:
    """A Redis server without persistence on a fixed loopback port: `kill` (SIGKILL: its data
    is gone) and `start` again, or `pause`/`resume` (SIGSTOP/SIGCONT: calls time out, the data
    stays)."""

    port: int = field(default_factory=free_port)
    tmp: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="gpuplane-redis-"))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", self.tmp]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_port(self.port, self.proc, "redis-server", 30.0)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused server dies too
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def redis_process() -> Iterator[RedisProcess]:
    server = RedisProcess()
    server.start()
    try:
        yield server
    finally:
        server.kill()


# -- the drill ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Drill:
    requests: int = 10_000
    gateways: int = 3
    instances: int = 8
    capacity: int = 4
    clients: int = 48  # more than the 32 slots: every gateway queues, and they contend
    kill_every_s: float = 2.0
    restart_after_s: float = 0.3
    kill_redis: bool = True
    redis_down_s: float = 1.0
    max_tokens: int = 12
    itl_ms: float = 10.0
    seed: int = 0


def gateway_config(d: Drill, urls: list[str], redis_url: str, index: int, port: int) -> str:
    """The YAML of gateway `index` (its own id, the one table), written to a temp file."""
    config = {
        "gateway": {
            "host": "127.0.0.1",
            "port": port,
            "queue": {"max_size": 4096, "timeout_s": 60.0},
            "ha": {
                "mode": "shared",
                "lease": "redis",
                "url": redis_url,
                "key": PREFIX,
                "gateway_id": f"gw{index}",
            },
        },
        "models": [
            {
                "name": "sim",
                "engine": "sim",
                "instances": [{"url": u, "max_concurrency": d.capacity} for u in urls],
            }
        ],
    }
    path = Path(tempfile.mkdtemp(prefix="gpuplane-drill-")) / f"gw{index}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@dataclass
class GatewayProcess:
    config: str
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        argv = [str(GPUPLANE), "gateway", "serve", "--config", self.config]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        async with httpx.AsyncClient(timeout=2.0) as client:
            for _ in range(600):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"gateway exited with {self.proc.returncode}: {argv}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/healthz")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"gateway on {self.url} did not answer /healthz")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.asynccontextmanager
async def gateway_fleet(
    d: Drill, urls: list[str], redis_url: str
) -> AsyncIterator[list[GatewayProcess]]:
    gws = [
        GatewayProcess(gateway_config(d, urls, redis_url, i, port), port)
        for i, port in enumerate(free_port() for _ in range(d.gateways))
    ]
    try:
        await asyncio.gather(*(g.start() for g in gws))
        yield gws
    finally:
        for g in gws:
            g.stop()


async def leases_in_redis(url: str) -> int:
    """Unexpired leases over every instance's set."""
    client = aioredis.from_url(url)
    try:
        sec, usec = await client.time()
        now_ms = sec * 1000 + usec // 1000
        keys = [k async for k in client.scan_iter(f"{PREFIX}:slots:*")]
        return sum([int(await client.zcount(k, now_ms, "+inf")) for k in keys])
    finally:
        await client.aclose()


async def drill(d: Drill, redis: RedisProcess, ttl_s: float = 1.5) -> dict[str, Any]:
    """Run the drill (`ttl_s`: the gateways' gateway.ha.lease_ttl_s, its default)."""
    rng = random.Random(d.seed)
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": d.max_tokens,
        "stream": True,
    }
    outcome = {"ok": 0, "failed": 0}
    events: list[str] = []
    async with (
        sim_process(d.instances, d.capacity, seed=d.seed, itl_ms=d.itl_ms) as sim,
        gateway_fleet(d, sim.urls, redis.url) as gws,
    ):
        started = time.perf_counter()
        sent = 0
        done = asyncio.Event()
        down: list[GatewayProcess] = []  # what the load balancer has taken out

        async def client(k: int, http: httpx.AsyncClient) -> None:
            nonlocal sent
            crng = random.Random(d.seed * 1000 + k)
            while sent < d.requests:
                sent += 1
                gw = crng.choice([g for g in gws if g not in down] or gws)
                try:
                    async with http.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
                        text = b"".join([c async for c in r.aiter_bytes()])
                    ok = r.status_code == 200 and b'"finish_reason":"' in text.replace(b" ", b"")
                except httpx.HTTPError:
                    ok = False
                outcome["ok" if ok else "failed"] += 1

        async def killer() -> None:
            redis_killed = not d.kill_redis
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    pause = rng.uniform(0.5, 1.5) * d.kill_every_s
                    await asyncio.wait_for(done.wait(), pause)
                    return
                if not redis_killed and sent >= d.requests // 3:
                    redis_killed = True
                    redis.kill()
                    events.append(f"{time.perf_counter() - started:.1f}s redis killed")
                    await asyncio.sleep(d.redis_down_s)
                    await asyncio.to_thread(redis.start)
                    events.append(f"{time.perf_counter() - started:.1f}s redis back")
                    continue
                victim = rng.choice(gws)
                victim.kill()
                down.append(victim)
                events.append(f"{time.perf_counter() - started:.1f}s {victim.port} killed")
                await asyncio.sleep(d.restart_after_s)
                await victim.start()
                down.remove(victim)

        limits = httpx.Limits(max_connections=d.clients * 2)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as http:
            kill_task = asyncio.create_task(killer())
            await asyncio.gather(*(client(k, http) for k in range(d.clients)))
            done.set()
            await kill_task
        wall = time.perf_counter() - started
        right_after = await leases_in_redis(redis.url)
        await asyncio.sleep(ttl_s + 0.5)  # one TTL (plus a sync) after the last request
        after_ttl = await leases_in_redis(redis.url)
        stats = await sim.stats()
    kills = sum("killed" in e and "redis" not in e for e in events)
    return {
        "config": dataclasses.asdict(d),
        "requests": outcome["ok"] + outcome["failed"],
        "ok": outcome["ok"],
        "failed": outcome["failed"],
        "wall_s": round(wall, 1),
        "gateway_kills": kills,
        "redis_killed": any("redis killed" in e for e in events),
        "events": events,
        "max_running_seen": [s["max_running_seen"] for s in stats],
        "max_in_flight_seen": [s["max_in_flight_seen"] for s in stats],
        "over_admitted_instances": sum(s["max_in_flight_seen"] > d.capacity for s in stats),
        "leases_in_redis_right_after": right_after,
        "leases_in_redis_after_one_ttl": after_ttl,
    }


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
            d = Drill(requests=args.requests, kill_redis=not args.no_redis_kill, seed=args.seed)
            out["drill"] = await drill(d, redis)
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
    if "drill" in res:
        d = res["drill"]
        lines.append(
            f"drill: {d['requests']} requests ({d['ok']} ok, {d['failed']} failed) in "
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
    parser.add_argument("--seed", type=int, default=0, help="the drill's seed")
    parser.add_argument("--no-redis-kill", action="store_true", help="keep Redis up in the drill")
    parser.add_argument("--acquires", type=int, default=5_000, help="acquires per mode and seed")
    parser.add_argument("--seeds", type=int, default=5, help="rounds of the acquire benchmark")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gateway_shared.json")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    ns = parser.parse_args()
    from _results import save  # here: the tests import this module from the repository root

    res = asyncio.run(main(ns))
    save(res, ns.out)
    print(json.dumps(res) if ns.json else table(res))
