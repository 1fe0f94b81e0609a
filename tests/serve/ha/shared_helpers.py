"""Helpers of the shared-mode tests: routers over one slot table in Redis, the engines' loads
they would read, and a Redis server that a test may kill, pause and restart on the same port
(`conftest.redis_server` is one per session and never dies; this one is the drill's,
`shared_drill.py`)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuplane.config import parse_settings
from gpuplane.serve.ha.loads import Instance, Key
from gpuplane.serve.ha.shared import RedisSlotTable, SharedOptions
from gpuplane.serve.router import ModelRouter
from tests.serve.ha.conftest import REDIS, require
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
