"""Mode shared against a real Redis: the Lua scripts' semantics, and routers of several
gateways over one slot table (exact admission, renewal and expiry, fail closed, re-sync,
fencing)."""

from __future__ import annotations

import asyncio
import random
import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from redis.commands.core import AsyncScript

from gpuplane.serve.errors import Rejected
from gpuplane.serve.ha import metrics as ha_metrics
from gpuplane.serve.ha.shared import RedisSlotTable
from gpuplane.serve.ha.shared_layout import Share
from gpuplane.serve.placer import Admission
from gpuplane.serve.router import ModelRouter
from tests.serve.ha.shared_helpers import (
    TTL_S,
    Engines,
    acquire,
    engine_load,
    gateways,
    in_redis,
    killable_redis,
    options,
    prefix,
    renew,
    shared_router,
    stop,
    table,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


# -- the scripts ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
async def test_capacity_is_exact_under_concurrent_acquirers_and_releases(
    scripts: tuple[dict[str, AsyncScript], str], seed: int
) -> None:
    s, key = scripts
    rng = random.Random(seed)
    cap = rng.randint(1, 6)
    held: set[str] = set()
    most = 0
    for round_ in range(12):  # a burst of acquirers racing, then some of the holders leave
        burst = [f"g{rng.randint(0, 2)}|1|{round_}-{n}" for n in range(rng.randint(1, 12))]
        free = cap - len(held)
        answers = await asyncio.gather(*(acquire(s, key, lease, cap) for lease in burst))
        held |= {lease for lease, (status, _) in zip(burst, answers, strict=True) if status == 1}
        assert all(status in (0, 1) for status, _ in answers)
        assert sum(status for status, _ in answers) == min(len(burst), free)
        assert len(held) <= cap
        most = max(most, len(held))
        for lease in rng.sample(sorted(held), rng.randint(0, len(held))):
            released = await s["release"]([f"{key}:i0"], [lease])
            assert released == 1
            held.discard(lease)
    assert most == cap  # the bursts did fill it


async def test_full_set_refuses_and_answers_the_count(
    scripts: tuple[dict[str, AsyncScript], str],
) -> None:
    s, key = scripts
    assert await acquire(s, key, "a|1|1", 2) == [1, 1]
    assert await acquire(s, key, "b|1|1", 2) == [1, 2]
    assert await acquire(s, key, "a|1|2", 2) == [0, 2]
    assert await acquire(s, key, "a|1|1", 2) == [1, 2]  # a retry of one that landed: no new slot


async def test_expired_leases_are_purged_before_capacity_is_checked(
    scripts: tuple[dict[str, AsyncScript], str],
) -> None:
    s, key = scripts
    assert (await acquire(s, key, "a|1|1", 1, ttl_ms=150))[0] == 1
    assert (await acquire(s, key, "b|1|1", 1))[0] == 0
    await asyncio.sleep(0.3)  # past the lease's expiry by Redis's own clock
    assert await acquire(s, key, "b|1|1", 1) == [0, 0]  # purged, counted until a reading
    assert await s["drain"]([f"{key}:i0"], [2**50, 0, 60_000]) == 0  # the engine is idle
    assert await acquire(s, key, "b|1|1", 1) == [1, 1]


async def test_release_is_idempotent(scripts: tuple[dict[str, AsyncScript], str]) -> None:
    s, key = scripts
    await acquire(s, key, "a|1|1", 2)
    await acquire(s, key, "a|1|2", 2)
    assert await s["release"]([f"{key}:i0"], ["a|1|1"]) == 1
    assert await s["release"]([f"{key}:i0"], ["a|1|1"]) == 0
    assert await s["release"]([f"{key}:i0"], ["never|1|9"]) == 0
    assert (await renew(s, key, "a", 1))[2:] == [b"a|1|2"]  # one lease left: counted once


async def test_renew_of_another_gateways_lease_is_refused(
    scripts: tuple[dict[str, AsyncScript], str],
) -> None:
    s, key = scripts
    await acquire(s, key, "a|1|1", 2, ttl_ms=200)
    assert await renew(s, key, "b", 1, "a|1|1") == [-4, 0]
    assert await renew(s, key, "a", 2, "a|1|1") == [-4, 0]  # not its epoch's either
    await asyncio.sleep(0.3)
    assert await renew(s, key, "b", 1) == [1, 1]  # not extended: it expired (counted, `open`)


async def test_stale_epoch_is_refused(scripts: tuple[dict[str, AsyncScript], str]) -> None:
    s, key = scripts
    assert (await renew(s, key, "a", 2))[0] == 1  # epoch 2 of gateway a registers
    assert await acquire(s, key, "a|1|7", 4) == [-3, 0]
    assert await renew(s, key, "a", 1) == [-3, 0]
    assert (await acquire(s, key, "a|2|7", 4))[0] == 1


async def test_another_incarnation_is_refused(
    scripts: tuple[dict[str, AsyncScript], str],
) -> None:
    s, key = scripts
    keys = [f"{key}:inc", f"{key}:epochs", f"{key}:i0"]
    assert await s["acquire"](keys, ["inc-0", "a", 1, "a|1|1", 4, 1000]) == [-2, 0]


# -- routers over the shared table --------------------------------------------------------------


def bounds(routers: list[ModelRouter]) -> list[int | None]:
    """Each gateway's bound on every instance: the least load it has read since Redis went."""
    return [inst.bound for r in routers for inst in table(r)._instances.values()]


async def test_gateways_admit_exactly_the_capacity_between_them(redis_server: str) -> None:
    routers = await gateways(redis_server, 3, [2, 2])
    rng = random.Random(4)
    held: list[tuple[ModelRouter, Admission]] = []
    order = [rng.choice(routers) for _ in range(4)]
    held = [
        (r, a)
        for r, a in zip(order, await asyncio.gather(*(r.acquire({}) for r in order)), strict=True)
    ]
    assert sorted(a.lease.instance_id for _, a in held) == ["http://i0"] * 2 + ["http://i1"] * 2
    for router in routers:  # every gateway now sees the model full and queues
        with pytest.raises(Rejected, match="no slot"):
            await router.acquire({}, timeout_s=0.2)
    # a slot freed on one gateway goes to a request waiting on another
    waiting = asyncio.create_task(routers[2].acquire({}, timeout_s=5))
    await asyncio.sleep(0.1)
    freed_by = next((r, a) for r, a in held if r is not routers[2])
    held.remove(freed_by)
    freed_by[0].finish(freed_by[1])
    held.append((routers[2], await waiting))
    assert await in_redis(redis_server, routers[0]) == 4
    await stop(routers, held)
    assert await in_redis(redis_server, routers[0]) == 0


async def test_leases_of_long_generations_are_renewed_and_a_dead_gateways_expire(
    redis_server: str,
) -> None:
    a, b = await gateways(redis_server, 2, [2])
    held = [(a, await a.acquire({})), (a, await a.acquire({}))]
    await asyncio.sleep(3 * TTL_S)  # renewed meanwhile
    with pytest.raises(Rejected):
        await b.acquire({}, timeout_s=0.1)
    loop = table(a)._loop
    assert loop is not None
    loop.cancel()  # gateway a dies: no renewal, no release reaches Redis
    engines = table(b).loads
    assert isinstance(engines, Engines)
    engines.tables.remove(table(a))  # its connections closed: the engine ended its requests
    waiting = asyncio.create_task(b.acquire({}, timeout_s=5 * TTL_S))
    got = await waiting  # within one TTL of a's last renewal
    assert got.lease.instance_id == "http://i0"
    await stop([a, b], [*held, (b, got)])


async def take_all(router: ModelRouter, timeout_s: float = 0.1) -> list[Admission]:
    """Every slot the router admits now, until it refuses."""
    taken = []
    while True:
        try:
            taken.append(await router.acquire({}, timeout_s=timeout_s))
        except Rejected:
            return taken


async def test_redis_down_fails_closed_to_local_shares() -> None:
    with killable_redis() as server:
        routers = await gateways(server.url, 2, [3, 3])
        server.kill()
        await until(lambda: all(table(r).state is Share.LOCAL for r in routers), 2.0)
        await until(lambda: bounds(routers) == [0] * 4, 2.0)  # each has seen the engines idle
        # each admits its share of each instance, no more: 3 // 2, the remainder unused
        held = [(r, a) for r in routers for a in await take_all(r, timeout_s=1.0)]
        per_instance = [sum(a.lease.instance_id == f"http://i{i}" for _, a in held) for i in (0, 1)]
        assert per_instance == [2, 2]
        assert sorted(sum(r is router for r, _ in held) for router in routers) == [2, 2]
        await stop(routers, held)


async def test_redis_lost_right_after_another_gateway_filled_up_never_over_admits() -> None:
    """The drills' over-admission: b fills the instance after a's last look at the table, then
    Redis goes. a's stale view says 2 are free; the engine says none is."""
    with killable_redis() as server:
        a, b = await gateways(server.url, 2, [4])
        held = [(a, await a.acquire({})), (b, await b.acquire({}))]
        await until(lambda: table(a)._instances["m", "http://i0"].seen == 2, 2.0)
        loop = table(a)._loop
        assert loop is not None
        loop.cancel()  # a looks no more
        held += [(b, await b.acquire({})), (b, await b.acquire({}))]  # b holds 3 of 4, past its 2
        server.kill()
        await until(lambda: table(b).state is Share.LOCAL, 2.0)
        with pytest.raises(Rejected):  # a finds Redis gone as it asks
            await a.acquire({}, timeout_s=0.1)
        assert table(a).state is Share.LOCAL
        await asyncio.sleep(table(a).settle_s)
        await table(a).sync()  # a reads the engine: 4 running
        for router in (a, b):
            with pytest.raises(Rejected):
                await router.acquire({}, timeout_s=0.1)
        assert engine_load([a, b]) == 4
        for router, admission in [h for h in held if h[0] is b]:  # b's requests end
            router.finish(admission)
        held = [h for h in held if h[0] is a]
        await table(a).sync()  # the engine runs a's 1: neither holds more than 1 past its share
        more = [(r, x) for r in (a, b) for x in await take_all(r, timeout_s=1.0)]
        assert sorted(r is a for r, _ in more) == [False]  # b takes 1 of its 2, a none
        held += more
        assert engine_load([a, b]) == 2
        await stop([a, b], held)


async def test_resync_holds_room_for_a_gateway_that_has_not_registered_again() -> None:
    with killable_redis() as server:
        a, b = await gateways(server.url, 2, [4])
        server.kill()
        await until(lambda: all(table(r).state is Share.LOCAL for r in (a, b)), 2.0)
        await until(lambda: bounds([a, b]) == [0, 0], 2.0)
        held = [(r, await r.acquire({}, timeout_s=1.0)) for r in (a, a, b, b)]  # 2 shares of 2
        loop = table(b)._loop
        assert loop is not None
        loop.cancel()  # b does not see Redis return: its two leases stay unregistered
        server.start()
        await until(lambda: table(a).state is Share.RESYNC and table(a)._synced, 3.0)
        assert table(a).gateways == ("gw0",)  # Redis lost who was live: a alone so far
        with pytest.raises(Rejected):  # b's share stays held for it
            await a.acquire({}, timeout_s=0.2)
        await stop([a, b], held)


async def test_resync_after_redis_lost_its_data_counts_every_lease_once() -> None:
    with killable_redis() as server:
        a, b = await gateways(server.url, 2, [4])
        held = [(a, await a.acquire({})), (a, await a.acquire({})), (b, await b.acquire({}))]
        server.kill()  # its data is gone
        await until(lambda: all(table(r).state is Share.LOCAL for r in (a, b)), 2.0)
        await until(lambda: bounds([a, b]) == [3, 3], 2.0)
        for router in (a, b):  # with 3 running, either may be the one past its share
            with pytest.raises(Rejected):
                await router.acquire({}, timeout_s=0.1)
        server.start()
        await until(lambda: table(a).state is Share.RESYNC and table(b).state is Share.RESYNC, 3)
        # re-syncing: both registered again, exactly once each; nobody admits past the total
        await until(lambda: table(a)._synced and table(b)._synced, 3)
        assert await in_redis(server.url, a) == 3
        for router in (a, b):
            with pytest.raises(Rejected):
                await router.acquire({}, timeout_s=0.1)
        await until(lambda: table(a).state is Share.SHARED, 5 * TTL_S + 2)
        assert await in_redis(server.url, a) == 3
        held.append((b, await b.acquire({}, timeout_s=2)))  # Redis decides alone again
        with pytest.raises(Rejected):
            await a.acquire({}, timeout_s=0.1)
        assert await in_redis(server.url, a) == 4
        await stop([a, b], held)


async def test_resync_after_redis_paused_keeps_the_same_leases() -> None:
    with killable_redis() as server:
        a, b = await gateways(server.url, 2, [4])
        held = [(a, await a.acquire({}))]
        server.pause()  # calls time out; what Redis holds stays
        await until(lambda: all(table(r).state is Share.LOCAL for r in (a, b)), 2.0)
        # the engine runs 1: each may hold its share (2) less 1
        held.append((b, await b.acquire({}, timeout_s=2)))
        with pytest.raises(Rejected):
            await a.acquire({}, timeout_s=0.1)
        server.resume()
        await until(lambda: all(table(r).state is Share.SHARED for r in (a, b)), 5 * TTL_S + 2)
        assert await in_redis(server.url, a) == 2  # the one from before once, the new one too
        held += [(a, await a.acquire({}, timeout_s=1)), (a, await a.acquire({}, timeout_s=1))]
        with pytest.raises(Rejected):
            await b.acquire({}, timeout_s=0.1)
        await stop([a, b], held)


async def test_a_gateway_back_from_a_blip_in_which_it_admitted_nothing_disturbs_no_other(
    redis_server: str,
) -> None:
    a, b = await gateways(redis_server, 2, [2])
    held = [(a, await a.acquire({}))]
    incarnation = table(b).incarnation
    table(a)._unreachable(OSError("a timeout under load"))  # as if one call had timed out
    assert table(a).state is Share.LOCAL
    await until(lambda: table(a).state is Share.SHARED, 5 * TTL_S + 2)
    assert table(b).incarnation == incarnation  # b went on admitting through Redis throughout
    assert table(b).entered[Share.RESYNC] == 1  # only when it started
    assert await in_redis(redis_server, a) == 1
    await stop([a, b], held)


async def test_metrics_and_state_show_how_the_gateway_admits_and_redis_round_trips() -> None:
    with killable_redis() as server:
        routers = await gateways(server.url, 2, [2])
        registry = CollectorRegistry()
        ha_metrics.register(registry, None, table(routers[0]))
        held = [(routers[0], await routers[0].acquire({}))]
        page = generate_latest(registry).decode()
        assert 'gpuplane_ha_shared_state{state="shared"} 1.0' in page
        trips = re.search(r"gpuplane_ha_redis_round_trip_seconds_count ([0-9.]+)", page)
        assert trips is not None
        assert float(trips[1]) >= 1  # the acquire, and the heartbeats since
        server.kill()
        await until(lambda: table(routers[0]).state is Share.LOCAL, 2.0)
        page = generate_latest(registry).decode()
        assert 'gpuplane_ha_shared_state{state="local"} 1.0' in page
        assert 'gpuplane_ha_shared_state{state="shared"} 0.0' in page
        assert 'gpuplane_ha_shared_state_changes_total{state="local"} 1.0' in page
        report = table(routers[0]).report()
        assert (report["mode"], report["role"], report["gateway_id"]) == ("shared", "local", "gw0")
        await stop(routers, held)


async def test_a_process_under_a_newer_epoch_fences_the_old_one(redis_server: str) -> None:
    key = prefix()
    old = RedisSlotTable(options(redis_server, "gw", key))
    router = shared_router(old, [2])
    await old.start()
    await until(lambda: old.state is Share.SHARED, 5 * TTL_S + 2)
    admission = await router.acquire({})
    new = RedisSlotTable(options(redis_server, "gw", key))  # the same gateway id, restarted
    await new.start()
    await until(lambda: old.state is Share.FENCED, 2.0)
    assert old.fenced_writes >= 1  # on /metrics as gpuplane_ha_fenced_writes_total
    with pytest.raises(Rejected):
        await router.acquire({}, timeout_s=0.1)
    router.finish(admission)
    await old.stop()
    await new.stop()
