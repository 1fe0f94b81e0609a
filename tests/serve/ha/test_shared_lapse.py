"""Mode shared: a gateway that missed its own leases' TTL (paused past it) renews none of them
and admits on the engines' load until a reading counts what runs (`ha/lapse.py`); against a
real Redis, with the lapse's arithmetic on an injected clock."""

from __future__ import annotations

import asyncio

import pytest

from gpuplane.serve.errors import Rejected
from gpuplane.serve.ha.lapse import LeaseClock
from gpuplane.serve.ha.shared import RedisSlotTable
from gpuplane.serve.ha.shared_layout import Share
from tests.serve.ha.shared_helpers import (
    TTL_S,
    Engines,
    engine_load,
    gateways,
    in_redis,
    options,
    prefix,
    shared_router,
    stop,
    table,
    until,
)


def test_a_lapse_is_more_than_the_ttl_since_the_last_renewal_was_sent() -> None:
    clock = LeaseClock(ttl_s=1.5, settle_s=0.5)
    assert not clock.missed(100.0, holding=True)  # never renewed: nothing held in Redis yet
    clock.renewing(100.0)
    assert not clock.missed(101.5, holding=True)
    assert clock.missed(101.6, holding=True)
    assert not clock.missed(101.6, holding=False)  # nothing to renew, nothing lost
    assert clock.in_time(100.0, 101.5)
    assert not clock.in_time(100.0, 101.6)
    clock.lapse(101.6)
    assert not clock.may_rejoin()
    clock.read(101.7)  # too early: a request admitted before may not have reached its engine
    assert not clock.may_rejoin()
    clock.read(102.1)
    assert clock.may_rejoin()
    clock.rejoined()
    assert clock.lapsed_at is None
    assert not clock.missed(103.0, holding=True)  # registered again, not renewed late


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_a_gateway_that_missed_its_ttl_renews_nothing_and_waits_for_the_engines(
    redis_server: str,
) -> None:
    a, b = await gateways(redis_server, 2, [4])
    held = [(a, await a.acquire({})) for _ in range(4)]  # a holds every slot
    loop = table(a)._loop
    assert loop is not None
    loop.cancel()  # a is paused: it renews nothing, its requests still run on the engine
    await until(lambda: table(b)._instances["m", "http://i0"].open == 4, 5 * TTL_S)
    with pytest.raises(Rejected):  # Redis expired a's leases: their slots are not free
        await b.acquire({}, timeout_s=0.3)
    await table(a).sync()  # a wakes
    assert table(a).state is Share.LOCAL
    assert await in_redis(redis_server, a) == 0  # a renewed none of its own
    with pytest.raises(Rejected):
        await a.acquire({}, timeout_s=0.1)
    await asyncio.sleep(table(a).settle_s)
    await table(a).sync()  # reads the engine: a's 4 still run
    await table(a).sync()  # registers them again, in a new incarnation every gateway joins
    assert table(a).state is Share.RESYNC
    assert await in_redis(redis_server, a) == 4
    table(a)._loop = asyncio.get_running_loop().create_task(table(a)._run())
    for router in (a, b):  # the engine runs 4 of 4: neither admits
        with pytest.raises(Rejected):
            await router.acquire({}, timeout_s=0.2)
    assert engine_load([a, b]) == 4
    await until(lambda: all(table(r).state is Share.SHARED for r in (a, b)), 5 * TTL_S + 2)
    for router, admission in held:  # a's requests end
        router.finish(admission)
    held = [(b, await b.acquire({}, timeout_s=5 * TTL_S)) for _ in range(4)]
    await stop([a, b], held)


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_slots_of_a_paused_gateway_free_once_the_engine_shows_its_requests_ended(
    redis_server: str,
) -> None:
    a, b = await gateways(redis_server, 2, [2])
    held = [(a, await a.acquire({})) for _ in range(2)]  # its requests run on the engine
    loop = table(a)._loop
    assert loop is not None
    loop.cancel()  # a is paused past its TTL (and never comes back)
    engines = table(b).loads
    assert isinstance(engines, Engines)
    await until(lambda: table(b)._instances["m", "http://i0"].open == 2, 5 * TTL_S)
    with pytest.raises(Rejected):
        await b.acquire({}, timeout_s=0.3)
    reads = engines.reads
    table(a)._instances["m", "http://i0"].held.popitem()  # one of a's requests ends
    got = [(b, await b.acquire({}, timeout_s=5 * TTL_S))]  # b read the engine: 1 is free
    assert engines.reads > reads
    with pytest.raises(Rejected):
        await b.acquire({}, timeout_s=0.3)
    await stop([a, b], [*held, *got])


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_a_grant_answered_after_the_ttl_is_given_back(redis_server: str) -> None:
    now = [1000.0]
    t = RedisSlotTable(
        options(redis_server, "gw0", prefix()), loads=Engines(), clock=lambda: now[0]
    )
    router = shared_router(t, [1])
    await t.start()
    await until(lambda: t.state is Share.SHARED, 5 * TTL_S + 2)
    t.on_round_trip = lambda _: now.__setitem__(0, now[0] + TTL_S + 1)  # paused as it asked
    with pytest.raises(Rejected):
        await router.acquire({}, timeout_s=0.1)
    t.on_round_trip = lambda _: None
    await t.drained()
    assert await in_redis(redis_server, router) == 0
    await t.stop()
