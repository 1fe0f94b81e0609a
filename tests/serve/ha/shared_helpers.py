"""Helpers of the shared-mode tests: routers over one slot table in Redis, the engines' loads
they would read, and a Redis server that a test may kill, pause and restart on the same port
(`conftest.redis_server` is one per session and never dies; this one is the drill's,
`shared_drill.py`)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from gpuplane.config import parse_settings
from gpuplane.serve.ha.loads import Instance, Key
from gpuplane.serve.ha.shared import RedisSlotTable
from gpuplane.serve.ha.shared_layout import Share, SharedOptions
from gpuplane.serve.placer import Admission
from gpuplane.serve.router import ModelRouter
from tests.helpers.services import REDIS, require
from tests.serve.ha.shared_drill import RedisProcess, redis_process

_prefixes = itertools.count()

# Short enough that a test sees a resync and an expiry in a few seconds, long enough that a
# loaded machine does not pass a whole resync window between two steps of a test.
TTL_S = 1.2


def prefix() -> str:
    """A key prefix no other test (nor another run on the same server) uses."""
    return f"t{os.getpid()}-{next(_prefixes)}"


def options(url: str, gateway: str, key: str, **kw: float) -> SharedOptions:
    opts: dict[str, float] = {"ttl_s": TTL_S, "renew_s": 0.15, "sync_s": 0.05, "timeout_s": 0.5}
    opts.update(kw)
    return SharedOptions(url=url, gateway_id=gateway, prefix=key, **opts)


def shared_router(table: RedisSlotTable, capacities: list[int]) -> ModelRouter:
    """Model `m` over instances http://i0, http://i1, ... of these capacities, on `table`."""
    instances = [{"url": f"http://i{n}", "max_concurrency": c} for n, c in enumerate(capacities)]
    settings = parse_settings({"models": [{"name": "m", "instances": instances}]})
    return ModelRouter(settings.models[0], settings.gateway, capacities, shared=table)


@contextmanager
def killable_redis() -> Iterator[RedisProcess]:
    """A Redis server the test may kill, pause and start again on the same port."""
    require(REDIS, "redis-server")
    with redis_process() as server:
        yield server


@dataclass
class Engines:
    """What the instances' engines report: every lease the tables hold on each, as engines
    running exactly the requests their gateways admitted (none in transit)."""

    tables: list[RedisSlotTable] = field(default_factory=list)
    reads: int = 0

    async def read(self, instances: Sequence[Instance]) -> dict[Key, int | None]:
        self.reads += 1
        return {
            (model, iid): sum(len(t._instances[model, iid].held) for t in self.tables)
            for model, iid, _ in instances
        }

    async def aclose(self) -> None:
        pass


INC = "inc-1"


async def acquire(
    s: dict[str, AsyncScript], key: str, lease: str, cap: int, *, ttl_ms: int = 60_000
) -> list[int]:
    """[status, how many leases the set holds after it]"""
    gateway, epoch, _ = lease.split("|")
    keys = [f"{key}:inc", f"{key}:epochs", f"{key}:i0"]
    status, _, *holders = await s["acquire"](keys, [INC, gateway, epoch, lease, cap, ttl_ms])
    return [status, len(holders)]


async def renew(
    s: dict[str, AsyncScript], key: str, gateway: str, epoch: int, *leases: str
) -> list[Any]:
    """[status, leases added, then the set's lease ids]"""
    keys = [f"{key}:inc", f"{key}:epochs", f"{key}:i0"]
    return list(await s["renew"](keys, [INC, gateway, epoch, 60_000, *leases]))


async def gateways(url: str, n: int, capacities: list[int], **kw: float) -> list[ModelRouter]:
    """`n` gateways' routers of model m on one table, over engines that report what they hold,
    once all of them admit through Redis and each counts every other for the local shares."""
    key = prefix()
    engines = Engines()
    tables = [RedisSlotTable(options(url, f"gw{i}", key, **kw), loads=engines) for i in range(n)]
    engines.tables = tables
    routers = [shared_router(t, capacities) for t in tables]
    for t in tables:
        await t.start()
    ids = {t.options.gateway_id for t in tables}
    await until(
        lambda: all(t.state is Share.SHARED and set(t.members) == ids for t in tables),
        5 * TTL_S + 2,
    )
    return routers


def engine_load(routers: list[ModelRouter], instance: str = "http://i0") -> int:
    """The instance's engine's load: the leases every gateway holds on it."""
    return sum(
        len(inst.held)
        for r in routers
        for (_, iid), inst in table(r)._instances.items()
        if iid == instance
    )


def table(router: ModelRouter) -> RedisSlotTable:
    assert isinstance(router.shared, RedisSlotTable)
    return router.shared


async def stop(routers: list[ModelRouter], admissions: list[tuple[ModelRouter, Admission]]) -> None:
    for router, admission in admissions:
        router.finish(admission)
    for router in routers:
        await table(router).stop()


async def until(done: Any, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached within {timeout_s} s")


async def in_redis(url: str, router: ModelRouter) -> int:
    """Leases of every instance in Redis now (expired ones excluded)."""
    client = aioredis.from_url(url)
    try:
        t = table(router)
        now = await client.time()
        ms = now[0] * 1000 + now[1] // 1000
        return sum([await client.zcount(i.key, ms, "+inf") for i in t._instances.values()])
    finally:
        await client.aclose()
