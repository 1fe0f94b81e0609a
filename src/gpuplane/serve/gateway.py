"""The gateway's wiring: a router per model, the callers' identities and accounts, the upstream
client, metrics, the reaper and prober tasks, discovery from a control plane, and high
availability (the leader lease, or the slot table shared in Redis).

`Gateway` holds no HTTP routes: the ASGI app (`app.py`) reads and drives it, and the composition
roots (`server.py`, `plane.py`, the CLI) build it and hand it to the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuplane.engines import EngineAdapter, get_adapter
from gpuplane.serve.discovery import Discovery
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.oplog import GatewayLog
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.settings import GatewayConfig, ModelConfig, ServeSettings
from gpuplane.serve.tenants import Identity
from gpuplane.serve.upstream import Upstream

if TYPE_CHECKING:
    from gpuplane.serve.ha.leadership import Leadership
    from gpuplane.serve.ha.shared import RedisSlotTable

log = logging.getLogger("gpuplane.gateway")


class Gateway:
    """Routers for every configured model, the callers' identities and accounts, the upstream
    client, metrics and background tasks. `wall` is the clock of the tenants' limit windows."""

    def __init__(
        self,
        settings: ServeSettings,
        *,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        control: str | None = None,
        control_token: str | None = None,
    ) -> None:
        """`control`: a control plane's URL, whose deployments add models and instances while
        the gateway runs (`discovery.py`), called with `control_token` (its API routes need one)."""
        self.settings = settings
        self.cfg = settings.gateway
        self.wall = wall
        self.identity = Identity(settings)
        self.routers: dict[str, ModelRouter] = {}
        self.metrics = GatewayMetrics(lambda: self.routers.values(), self.identity.accounts)
        self.oplog = GatewayLog()
        self._events = replace(
            self.metrics.router_events(), health_changed=self.oplog.health_changed
        )
        self.health_paths: dict[str, str] = {}
        self._rng = rng or random.Random()
        self.adapters: dict[str, EngineAdapter] = {}  # filled by add_model, read by HA lazily
        self.shared = shared_slots(self.cfg, self.adapters)
        self.upstream_names: dict[str, str | None] = {}
        for model in settings.models:
            self.add_model(model)
        self.upstream = Upstream(self.cfg)
        self._tasks: list[asyncio.Task[None]] = []
        self.leadership = leadership(self.cfg, self.routers, self.adapters)
        self.discovery = None if control is None else Discovery(self, control, token=control_token)
        if self.leadership is not None or self.shared is not None:
            from gpuplane.serve.ha import metrics as ha_metrics

            ha_metrics.register(self.metrics.registry, self.leadership, self.shared)

    def add_model(self, model: ModelConfig) -> ModelRouter:
        """Route `model` from now on: its configured instances, and any added later."""
        adapter = self.adapters[model.name] = get_adapter(model.engine)
        capacities = [i.max_concurrency or adapter.default_capacity for i in model.instances]
        router = self.routers[model.name] = ModelRouter(
            model,
            self.cfg,
            capacities,
            events=self._events,
            locality_wait_s=adapter.locality_wait_s,
            per_request_cache=adapter.prefix_cache_per_request,
            rng=random.Random(self._rng.random()),
            shared=self.shared,
        )
        self.health_paths[model.name] = adapter.health_path
        self.upstream_names[model.name] = model.upstream_model
        return router

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.shared is not None:
            await self.shared.start()
        self._tasks = [
            asyncio.create_task(self._reaper(), name="gpuplane-reaper"),
            asyncio.create_task(self._prober(), name="gpuplane-prober"),
        ]
        if self.discovery is not None:
            self._tasks.append(asyncio.create_task(self.discovery.run(), name="gpuplane-discovery"))
        if self.leadership is not None:
            self.leadership.start()

    async def step_down(self) -> None:
        """Hand the leader lease over now (primary/standby), first thing on shutdown: a
        standby takes over while requests admitted here finish. Idempotent."""
        if self.leadership is not None:
            await self.leadership.step_down()

    async def stop(self) -> None:
        if self.leadership is not None:
            await self.leadership.aclose()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.upstream.aclose()
        if self.discovery is not None:
            await self.discovery.aclose()
        if self.shared is not None:
            await self.shared.stop()

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.reaper_interval_s)
            for router in self.routers.values():
                if reaped := router.reap():
                    log.error("reaped %d leaked lease(s) on model %s", reaped, router.name)

    async def _prober(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.cfg.health.probe_interval_s)

    async def probe_once(self) -> None:
        """Probe every instance once; mark it healthy or count a failure (a refused
        connection marks it down at once: its engine is gone)."""
        checks = []
        for name, router in self.routers.items():
            for inst in router.instances:
                url = inst.url + self.health_paths[name]
                checks.append(
                    (router, inst.id, self.upstream.probe(url, self.cfg.health.probe_timeout_s))
                )
        results = await asyncio.gather(*(c[2] for c in checks))
        for (router, iid, _), failure in zip(checks, results, strict=True):
            if failure is None:
                router.health.report_success(iid)
            else:
                router.health.report_failure(iid, failure.kind, str(failure))

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """`/admin/state`: every instance once (with its model), and each model's queue."""
        instances = [
            {
                "model": router.name,
                "id": i.id,
                "url": i.url,
                "state": i.state.value,
                "in_flight": i.in_flight,
                "capacity": i.capacity,
                "last_error": i.last_error,
                "prefix_cache": router.cache_state(i.id),
            }
            for router in self.routers.values()
            for i in router.instances
        ]
        models = [
            {
                "name": router.name,
                "queued": len(router.queue),
                "queued_by_tenant": router.queue.depth_by_tenant(),
                # where a stream's token counts come from when its client asks for `usage`
                "stream_usage": "engine"
                if self.adapters[router.name].stream_usage
                else "estimated",
            }
            for router in self.routers.values()
        ]
        state: dict[str, Any] = {"instances": instances, "models": models}
        if self.leadership is not None:
            state["ha"] = self.leadership.state()
        elif self.shared is not None:
            state["ha"] = self.shared.report()
        return state

    def usage(self) -> dict[str, Any]:
        """`/admin/usage`: each tenant's usage since start, and its limits' current windows."""
        now = self.wall()
        return {"tenants": [account.state(now) for account in self.identity.accounts]}


def leadership(
    cfg: GatewayConfig, routers: Mapping[str, ModelRouter], adapters: Mapping[str, EngineAdapter]
) -> Leadership | None:
    """The lease loop when `gateway.ha.mode` is primary_standby (its store is imported then)."""
    if cfg.ha.mode != "primary_standby":
        return None
    import httpx

    from gpuplane.serve.ha.leadership import Leadership

    timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
    return Leadership(cfg.ha, routers, adapters, forward_timeout=timeout)


def shared_slots(
    cfg: GatewayConfig, adapters: Mapping[str, EngineAdapter]
) -> RedisSlotTable | None:
    """The slot table in Redis when `gateway.ha.mode` is shared (redis is imported only then),
    reading the engines' loads while Redis is out."""
    ha = cfg.ha
    if ha.mode != "shared":
        return None
    from gpuplane.serve.ha.loads import EngineLoads
    from gpuplane.serve.ha.shared import RedisSlotTable
    from gpuplane.serve.ha.shared_layout import SharedOptions

    assert ha.url is not None  # the settings require it in mode shared
    options = SharedOptions(
        url=ha.url,
        gateway_id=ha.gateway_id or f"{socket.gethostname()}-{os.getpid()}",
        ttl_s=ha.lease_ttl_s,
        renew_s=ha.renew_s,
        sync_s=ha.shared_sync_s,
        timeout_s=ha.shared_timeout_s,
        prefix=ha.key,
        deadline_s=cfg.request_timeout_s,
    )
    return RedisSlotTable(options, loads=EngineLoads(adapters, ha.shared_timeout_s))


__all__ = ["Gateway", "leadership", "shared_slots"]
