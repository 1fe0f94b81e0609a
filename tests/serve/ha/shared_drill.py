"""The multi-active drill harness (`gateway.ha.mode: shared`): G real gateway processes
(`gpuplane gateway serve --config`, each its own gateway_id) on one slot table in Redis, over
simulated engines in a child process, a streamed load from clients behind a load balancer
that takes a killed gateway out until it answers again, random SIGKILLs and restarts of
gateways, and Redis killed (its data lost) and started again mid-run. The ground truth is each
engine's own `max_running_seen` and `max_in_flight_seen` (running + waiting: past the capacity
is over-admission), and the leases left in Redis one lease TTL after the load (a leak). The
drill test and `benchmarks/gateway_shared.py` both run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import signal
import socket
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

from gpuplane.engines.sim import sim_process

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
    kills: int = 10  # gateway SIGKILLs, at random points of the run (by requests sent)
    restart_after_s: float = 0.3
    kill_redis: bool = True
    redis_down_s: float = 1.0
    pauses: int = 0  # gateway SIGSTOPs (taken out by the load balancer), SIGCONT after pause_s
    pause_s: float = 4.0
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
        log = Path(self.config).with_suffix(".log").open("ab")  # next to its config
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        log.close()
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


async def busiest(url: str, gws: list[GatewayProcess]) -> GatewayProcess:
    """The gateway holding the most unexpired leases (a lease id starts with its gateway id,
    `gw<index>`): the one whose pause most tempts the others to refill its slots."""
    client = aioredis.from_url(url)
    try:
        sec, usec = await client.time()
        now_ms = sec * 1000 + usec // 1000
        held = [0] * len(gws)
        async for key in client.scan_iter(f"{PREFIX}:slots:*"):
            for lease in await client.zrangebyscore(key, now_ms, "+inf"):
                assert isinstance(lease, bytes)
                held[int(lease.decode().split("|")[0].removeprefix("gw"))] += 1
    finally:
        await client.aclose()
    return gws[held.index(max(held))]


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
        progressed = asyncio.Event()  # a request was sent
        down: list[GatewayProcess] = []  # what the load balancer has taken out
        over: list[tuple[float, int]] = []  # (s, the most in flight on an engine) as it grew

        async def client(k: int, http: httpx.AsyncClient) -> None:
            nonlocal sent
            crng = random.Random(d.seed * 1000 + k)
            while sent < d.requests:
                sent += 1
                progressed.set()
                gw = crng.choice([g for g in gws if g not in down] or gws)
                try:
                    async with http.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
                        text = b"".join([c async for c in r.aiter_bytes()])
                    ok = r.status_code == 200 and b'"finish_reason":"' in text.replace(b" ", b"")
                except httpx.HTTPError:
                    ok = False
                outcome["ok" if ok else "failed"] += 1

        # (requests sent, what then): the gateway kills, and Redis's at a third of the run
        plan = [(int(rng.uniform(0.05, 0.9) * d.requests), "gateway") for _ in range(d.kills)]
        plan += [(d.requests // 3, "redis")] if d.kill_redis else []
        plan += [(int(rng.uniform(0.1, 0.5) * d.requests), "pause") for _ in range(d.pauses)]
        plan.sort()

        async def watch() -> None:
            """Note when an engine first held more than its capacity (to place it among the
            events)."""
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 0.25)
                most = max(s["max_in_flight_seen"] for s in await sim.stats())
                if most > d.capacity and (not over or over[-1][1] < most):
                    over.append((round(time.perf_counter() - started, 2), most))

        async def pause(victim: GatewayProcess) -> None:
            """SIGSTOP past its lease TTL, with what it holds, then SIGCONT."""
            assert victim.proc is not None
            down.append(victim)
            victim.proc.send_signal(signal.SIGSTOP)
            events.append(f"{time.perf_counter() - started:.1f}s {victim.port} paused")
            try:
                await asyncio.sleep(d.pause_s)
            finally:
                victim.proc.send_signal(signal.SIGCONT)
            events.append(f"{time.perf_counter() - started:.1f}s {victim.port} resumed")
            down.remove(victim)

        async def killer() -> None:
            for at, what in plan:
                while sent < at and not done.is_set():
                    progressed.clear()
                    await progressed.wait()
                if done.is_set():
                    return
                if what == "redis":
                    redis.kill()
                    events.append(f"{time.perf_counter() - started:.1f}s redis killed")
                    await asyncio.sleep(d.redis_down_s)
                    await asyncio.to_thread(redis.start)
                    events.append(f"{time.perf_counter() - started:.1f}s redis back")
                    continue
                victim = rng.choice(gws)
                if what == "pause":
                    await pause(await busiest(redis.url, gws))
                    continue
                victim.kill()
                down.append(victim)
                events.append(f"{time.perf_counter() - started:.1f}s {victim.port} killed")
                await asyncio.sleep(d.restart_after_s)
                await victim.start()
                down.remove(victim)

        limits = httpx.Limits(max_connections=d.clients * 2)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as http:
            kill_task = asyncio.create_task(killer())
            watch_task = asyncio.create_task(watch())
            await asyncio.gather(*(client(k, http) for k in range(d.clients)))
            done.set()
            progressed.set()
            await kill_task
            await watch_task
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
        "gateway_pauses": sum("paused" in e for e in events),
        "events": events,
        "over_capacity_at": over,
        "max_running_seen": [s["max_running_seen"] for s in stats],
        "max_in_flight_seen": [s["max_in_flight_seen"] for s in stats],
        "over_admitted_instances": sum(s["max_in_flight_seen"] > d.capacity for s in stats),
        "leases_in_redis_right_after": right_after,
        "leases_in_redis_after_one_ttl": after_ttl,
    }
