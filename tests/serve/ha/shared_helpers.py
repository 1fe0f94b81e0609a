"""Helpers of the shared-mode tests: routers over one slot table in Redis, and a Redis server
that a test may kill, pause and restart on the same port (`conftest.redis_server` is one per
session and never dies)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpuplane.config import parse_settings
from gpuplane.serve.ha.shared import RedisSlotTable, SharedOptions
from gpuplane.serve.router import ModelRouter
from tests.serve.ha.conftest import REDIS, free_port, require, wait_listening

_prefixes = itertools.count()

# Short enough that a test sees a resync and an expiry in about a second.
TTL_S = 0.6


def prefix() -> str:
    """A key prefix no other test (nor another run on the same server) uses."""
    return f"t{os.getpid()}-{next(_prefixes)}"


def options(url: str, gateway: str, key: str, **kw: float) -> SharedOptions:
    opts: dict[str, float] = {"ttl_s": TTL_S, "renew_s": 0.15, "sync_s": 0.05, "timeout_s": 0.2}
    opts.update(kw)
    return SharedOptions(url=url, gateway_id=gateway, prefix=key, **opts)


def shared_router(table: RedisSlotTable, capacities: list[int]) -> ModelRouter:
    """Model `m` over instances http://i0, http://i1, ... of these capacities, on `table`."""
    instances = [{"url": f"http://i{n}", "max_concurrency": c} for n, c in enumerate(capacities)]
    settings = parse_settings({"models": [{"name": "m", "instances": instances}]})
    return ModelRouter(settings.models[0], settings.gateway, capacities, shared=table)


@dataclass
class KillableRedis:
    """A Redis server without persistence on a fixed loopback port: `kill` (SIGKILL: its data
    is gone), `start` again, or `pause`/`resume` it (SIGSTOP/SIGCONT: calls time out, the data
    stays)."""

    port: int
    tmp: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", self.tmp]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_listening(self.port, self.proc, "redis-server", 30.0)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@contextmanager
def killable_redis() -> Iterator[KillableRedis]:
    require(REDIS, "redis-server")
    server = KillableRedis(free_port(), tempfile.mkdtemp(prefix="gpuplane-redis-"))
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.resume()
            server.kill()
