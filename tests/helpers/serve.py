"""Helpers of the gateway tests: routers on a fake clock, gateways in-process, the slow-card
fleet, and the check that nothing is still leased when a test ends."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx

from gpuplane.config import parse_settings
from gpuplane.engines.sim import start_sim
from gpuplane.serve.app import create_app
from gpuplane.serve.errors import FailureKind
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.hooks import RouterEvents
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.server import serving
from gpuplane.serve.speed import MIN_SPEED_SAMPLES
from tests.helpers.common import gateway_settings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_router(
    capacities: list[int], clock: Clock | None = None, **gateway: object
) -> tuple[ModelRouter, list[str]]:
    """A router over instances http://i0, http://i1, ... of these capacities, with the
    instances whose leases it reaped."""
    instances = [{"url": f"http://i{n}", "max_concurrency": c} for n, c in enumerate(capacities)]
    settings = parse_settings(
        {"gateway": gateway, "models": [{"name": "m", "instances": instances}]}
    )
    reaped: list[str] = []
    events = RouterEvents(reaped=lambda model, lease: reaped.append(lease.instance_id))
    router = ModelRouter(
        settings.models[0],
        settings.gateway,
        capacities,
        events=events,
        clock=clock or Clock(),
        rng=random.Random(0),
    )
    return router, reaped


def prompt(text: str) -> dict[str, Any]:
    """A completion request's body with this prompt."""
    return {"prompt": text}


SYSTEM = prompt("the shared system prompt " * 30)  # 11 blocks of the default 64 characters


SLOW = "http://i2"


async def fleet_with_a_slow_card(hold_s: float, policy: str = "slots_prefix") -> ModelRouter:
    """Three one-slot instances; i2 takes three times as long to a first token as the others,
    and every generation held its slot `hold_s`."""
    clock = Clock()
    router, _ = make_router([1, 1, 1], clock, placement={"policy": policy})
    ids = frozenset(i.id for i in router.instances)
    for _ in range(MIN_SPEED_SAMPLES + 1):  # the first answer has no fleet mean to compare
        for iid in sorted(ids):
            admission = await router.acquire({}, avoid=ids - {iid})
            router.observe_first_byte(admission, 0.3 if iid == SLOW else 0.1)
            clock.now += hold_s
            router.finish(admission)
    return router


async def assert_released(
    routers: Iterable[ModelRouter],
    tasks: Iterable[asyncio.Future[Any]] = (),
    timeout_s: float = 5.0,
) -> None:
    """Wait until none of `routers` holds a lease or a waiter and every one of `tasks` is done
    (an engine request the gateway dropped frees its slot `abort_grace_s` late); fail after
    `timeout_s`, naming what is left."""
    routers, pending = list(routers), set(tasks)
    for _ in range(max(1, int(timeout_s / 0.05))):
        if not _held(routers, pending):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"left behind: {'; '.join(_held(routers, pending))}")


@asynccontextmanager
async def asgi_gateway(
    instances: int = 1, **sim: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    """The gateway in-process (ASGI transport, no lifespan: no prober) over `instances`
    simulated engines of two slots each, with these `SimParams`."""
    async with start_sim(instances, 2, seed=1, **sim) as fleet:
        models = [
            {
                "name": "m",
                "engine": "sim",
                "instances": [{"url": u, "max_concurrency": 2} for u in fleet.urls],
            }
        ]
        settings = parse_settings(gateway_settings(models))
        gw = Gateway(settings)
        transport = httpx.ASGITransport(app=create_app(settings, gateway=gw))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                yield client, gw
        finally:
            await gw.upstream.aclose()


SEGV = "engine 2 was killed by SIGSEGV"


def one_of_each_state(gw: Gateway) -> None:
    """Instance 0 refused a connection; instance 2's engine keeps crashing."""
    router = gw.routers["m"]
    ids = [i.id for i in router.instances]
    router.health.report_failure(ids[0], FailureKind.CONNECT, "refused")
    router.health.report_engine(ids[2], up=False, error=SEGV, crash_looping=True)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@asynccontextmanager
async def gateway(
    instances: int = 2,
    capacity: int = 1,
    tenants: list[dict[str, Any]] | None = None,
    sim: dict[str, Any] | None = None,
    wall: Callable[[], float] = time.time,
    **config: Any,
) -> AsyncIterator[tuple[str, httpx.AsyncClient, Any]]:
    async with start_sim(instances, capacity, seed=1, **(sim or {})) as fleet:
        models = [
            {
                "name": "m",
                "engine": "sim",
                "instances": [{"url": u, "max_concurrency": capacity} for u in fleet.urls],
            }
        ]
        data = gateway_settings(models, **config)
        data["tenants"] = tenants or []
        settings = parse_settings(data)
        gw = Gateway(settings, wall=wall)
        async with serving(settings, gw) as base, httpx.AsyncClient(timeout=30) as client:
            yield base, client, fleet
            # while it still serves: a shutdown would free what a request still holds
            await assert_released(gw.routers.values())


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


NO_ENGINE = "llama-cpp-python is not installed yet (make setup builds it)"


def _held(routers: Iterable[ModelRouter], tasks: set[asyncio.Future[Any]]) -> list[str]:
    """What is still held: leases and waiters per router, and the tasks still running."""
    left = [
        f"model {r.name}: {r.slots.in_flight} lease(s), {len(r.queue)} waiter(s)"
        for r in routers
        if r.slots.in_flight or len(r.queue)
    ]
    return left + [f"task {t!r}" for t in tasks if not t.done()]
