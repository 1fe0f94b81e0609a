"""The per-model router with an injected clock: queue hand-off, fairness, reaping, health."""

from __future__ import annotations

import asyncio
import random

import pytest

from gpuplane.config import parse_settings
from gpuplane.serve.errors import FailureKind, Rejected, Rejection
from gpuplane.serve.prefix import block_hashes
from gpuplane.serve.router import MIN_SPEED_SAMPLES, ModelRouter, RouterEvents

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_router(
    capacities: list[int], clock: Clock | None = None, **gateway: object
) -> tuple[ModelRouter, list[str]]:
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


async def test_freed_slot_goes_straight_to_the_next_waiter() -> None:
    router, _ = make_router([1])
    held = await router.acquire([])
    waiter = asyncio.create_task(router.acquire([]))
    await asyncio.sleep(0)
    assert len(router.queue) == 1
    router.release(held)
    granted = await waiter
    assert granted.lease.instance_id == "http://i0"
    assert router.slots.get("http://i0").in_flight == 1
    router.release(granted)
    router.release(granted)  # idempotent
    assert router.slots.in_flight == 0


async def test_tenants_share_freed_slots_by_weight() -> None:
    router, _ = make_router([1], queue={"max_size": 100, "fairness_slack": 0})
    held = await router.acquire([])
    order: list[str] = []

    async def client(tenant: str, weight: float) -> None:
        admission = await router.acquire([], tenant=tenant, weight=weight)
        order.append(tenant)
        router.release(admission)

    tasks = [asyncio.create_task(client("heavy", 3.0)) for _ in range(6)]
    tasks += [asyncio.create_task(client("light", 1.0)) for _ in range(6)]
    await asyncio.sleep(0)
    router.release(held)
    await asyncio.gather(*tasks)
    assert order[:8].count("heavy") == 6  # 3:1 while both wait
    assert sorted(order) == ["heavy"] * 6 + ["light"] * 6


async def test_freed_slot_prefers_a_waiter_whose_prefix_it_holds() -> None:
    router, _ = make_router([1, 1])
    a_blocks = block_hashes("tenant A system prompt " * 20, 64)
    b_blocks = block_hashes("tenant B system prompt " * 20, 64)
    on_0 = await router.acquire(a_blocks)
    on_1 = await router.acquire(b_blocks)
    assert {on_0.lease.instance_id, on_1.lease.instance_id} == {"http://i0", "http://i1"}
    # waiters arrive B first, then A; the instance holding A's prefix frees up
    wait_b = asyncio.create_task(router.acquire(b_blocks, tenant="b"))
    wait_a = asyncio.create_task(router.acquire(a_blocks, tenant="a"))
    await asyncio.sleep(0)
    router.release(on_0)
    got_a = await wait_a
    assert got_a.lease.instance_id == on_0.lease.instance_id
    assert got_a.choice.reason == "prefix"
    router.release(on_1)
    assert (await wait_b).lease.instance_id == on_1.lease.instance_id


@pytest.mark.parametrize(("max_passes", "first"), [(1, "a"), (0, "b1")])
async def test_freed_slot_goes_past_a_tenants_earlier_waiters_at_most_max_passes(
    max_passes: int, first: str
) -> None:
    router, _ = make_router([1, 1], queue={"max_passes": max_passes})
    a_blocks = block_hashes("system prompt A " * 30, 64)
    b_blocks = block_hashes("system prompt B " * 30, 64)
    on_a = await router.acquire(a_blocks)
    on_b = await router.acquire(b_blocks)
    served: list[tuple[str, str]] = []

    async def client(name: str, blocks: list[int]) -> None:
        admission = await router.acquire(blocks)
        served.append((name, admission.lease.instance_id))

    # one tenant: b1 and b2 wait before a, and the instance holding A's prefix frees a slot
    tasks = [asyncio.create_task(client(n, b_blocks)) for n in ("b1", "b2")]
    tasks.append(asyncio.create_task(client("a", a_blocks)))
    await asyncio.sleep(0)
    router.release(on_a)
    await asyncio.sleep(0)
    assert served == [(first, on_a.lease.instance_id)]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    router.release(on_b)


async def test_reaper_frees_only_leases_past_their_ttl() -> None:
    clock = Clock()
    router, reaped = make_router([2], clock, request_timeout_s=10, lease_ttl_s=20)
    old = await router.acquire([])
    clock.now = 15
    await router.acquire([])
    clock.now = 25
    assert router.reap() == 1
    assert reaped == [old.lease.instance_id]
    assert router.slots.in_flight == 1


async def test_queue_timeout_and_full() -> None:
    router, _ = make_router([1], queue={"max_size": 1, "timeout_s": 0.05})
    held = await router.acquire([])
    waiting = asyncio.create_task(router.acquire([]))
    await asyncio.sleep(0)
    with pytest.raises(Rejected) as full:
        await router.acquire([])
    assert full.value.reason is Rejection.QUEUE_FULL
    with pytest.raises(Rejected) as late:
        await waiting
    assert late.value.reason is Rejection.QUEUE_TIMEOUT
    assert len(router.queue) == 0
    router.release(held)
    assert router.slots.in_flight == 0


async def test_passive_health_marks_down_and_probe_brings_back() -> None:
    router, _ = make_router([1, 1], health={"failure_threshold": 2})
    router.health.report_failure("http://i0", FailureKind.TIMEOUT)
    assert router.slots.get("http://i0").healthy
    router.health.report_failure("http://i0", FailureKind.STATUS)
    assert not router.slots.get("http://i0").healthy
    router.health.report_failure("http://i1", FailureKind.CONNECT)
    assert not router.slots.get("http://i1").healthy
    with pytest.raises(Rejected) as down:
        await router.acquire([])
    assert down.value.reason is Rejection.NO_HEALTHY_INSTANCE
    router.health.report_success("http://i1")
    assert (await router.acquire([])).lease.instance_id == "http://i1"


async def test_waits_for_the_busy_holder_of_its_prefix_then_gives_up() -> None:
    clock = Clock()
    router, _ = make_router([1, 1], clock, placement={"locality_wait_s": 5})
    router.locality_wait_s = 5.0  # the engine's default before anything was measured
    system = block_hashes("the shared system prompt " * 30, 64)
    for _ in range(8):  # hold times are known: generations are short
        router.release(await router.acquire(system))
    holder = await router.acquire(system)
    # same prefix, its holder busy, the other instance free: wait for the holder
    waiter = asyncio.create_task(router.acquire(system))
    await asyncio.sleep(0)
    assert len(router.queue) == 1
    router.release(holder)
    got = await waiter
    assert got.lease.instance_id == holder.lease.instance_id
    assert got.choice.reason == "prefix"
    # once patience runs out it takes the free instance instead
    router.locality_wait_s = 0.01
    impatient = await asyncio.wait_for(router.acquire(system), 1)
    assert impatient.lease.instance_id != holder.lease.instance_id
    router.release(got)
    router.release(impatient)
    assert router.slots.in_flight == 0


SYSTEM = block_hashes("the shared system prompt " * 30, 64)


async def router_that_learned(hold_s: float, capacities: list[int]) -> ModelRouter:
    """A router whose generations held their slot `hold_s` and where a hit saves about 1 s."""
    clock = Clock()
    router, _ = make_router(capacities, clock, placement={"locality_wait_s": 5})
    router.locality_wait_s = 1.0
    for _ in range(10):
        lease = await router.acquire(SYSTEM)
        clock.now += hold_s
        router.release(lease)
    return router


async def test_does_not_wait_for_a_holder_that_frees_slots_slower_than_a_hit_saves() -> None:
    router = await router_that_learned(10.0, [1, 1])  # a slot frees every ~10 s
    holder = await router.acquire(SYSTEM)
    cold = await asyncio.wait_for(router.acquire(SYSTEM), 1)
    assert cold.lease.instance_id != holder.lease.instance_id
    router.release(cold)
    router.release(holder)


async def test_waits_for_a_holder_that_frees_slots_in_time_while_others_go_elsewhere() -> None:
    router = await router_that_learned(0.4, [1, 1])  # 2.5 slots free per second a hit saves
    holder = await router.acquire(SYSTEM)
    waiters = [asyncio.create_task(router.acquire(SYSTEM)) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(router.queue) == 2
    third = await asyncio.wait_for(router.acquire(SYSTEM), 1)  # a third would wait too long
    assert third.lease.instance_id != holder.lease.instance_id
    router.release(holder)
    first = await waiters[0]
    assert first.lease.instance_id == holder.lease.instance_id
    router.release(first)
    second = await waiters[1]
    assert second.lease.instance_id == holder.lease.instance_id
    router.release(second)
    router.release(third)
    assert router.slots.in_flight == 0
    assert not len(router.queue)


async def test_learns_the_time_to_first_token_of_cached_and_uncached_prompts() -> None:
    router, _ = make_router([1, 1], placement={"locality_wait_s": 30})
    system = block_hashes("the shared system prompt " * 30, 64)
    cold = await router.acquire(system)
    router.observe_first_byte(cold, 8.0)
    router.release(cold)
    warm = await router.acquire(system)
    assert warm.cached
    router.observe_first_byte(warm, 0.5)
    router.release(warm)
    iid = warm.lease.instance_id
    assert router.first_byte_s(iid, hit=False) == pytest.approx(8.0)
    assert router.first_byte_s(iid, hit=True) == pytest.approx(0.5)
    # a "cached" placement that comes back at cold speed means the engine evicted it
    again = await router.acquire(system)
    router.observe_first_byte(again, 8.0)
    router.release(again)
    assert router.index.match(system).get(again.lease.instance_id, 0) == 0


SLOW = "http://i2"


async def fleet_with_a_slow_card(hold_s: float, policy: str = "slots_prefix") -> ModelRouter:
    """Three one-slot instances; i2 takes three times as long to a first token as the others,
    and every generation held its slot `hold_s`."""
    clock = Clock()
    router, _ = make_router([1, 1, 1], clock, placement={"policy": policy})
    ids = frozenset(i.id for i in router.instances)
    for _ in range(MIN_SPEED_SAMPLES + 1):  # the first answer has no fleet mean to compare
        for iid in sorted(ids):
            admission = await router.acquire([], avoid=ids - {iid})
            router.observe_first_byte(admission, 0.3 if iid == SLOW else 0.1)
            clock.now += hold_s
            router.release(admission)
    return router


async def test_an_answer_at_the_other_kinds_speed_teaches_no_speed() -> None:
    router = await fleet_with_a_slow_card(hold_s=100.0)
    before = router.speed("http://i0")
    # placed as uncached, answered as fast as a hit: the engine held the prefix after all
    surprise = await router.acquire([], avoid=frozenset({"http://i1", SLOW}))
    router.observe_first_byte(surprise, 0.001)
    router.release(surprise)
    assert router.speed("http://i0") == before


async def test_learns_how_much_slower_an_instance_is_and_keeps_cold_prompts_off_it() -> None:
    router = await fleet_with_a_slow_card(hold_s=100.0)  # nothing frees soon: no waiting
    assert router.speed(SLOW) > 2.5 * router.speed("http://i0")
    assert router.first_byte_s(SLOW, hit=False) > 2.5 * router.first_byte_s("http://i1", False)
    quick = [await router.acquire([]) for _ in range(2)]
    assert {a.lease.instance_id for a in quick} == {"http://i0", "http://i1"}
    # the quick ones are full and free nothing in time: the slow card now beats waiting
    slow = await asyncio.wait_for(router.acquire([]), 1)
    assert slow.lease.instance_id == SLOW
    for admission in [*quick, slow]:
        router.release(admission)
    assert router.slots.in_flight == 0


async def test_a_cold_prompt_waits_for_a_quicker_card_expected_to_free_in_time() -> None:
    router = await fleet_with_a_slow_card(hold_s=0.01)  # slots free every 10 ms
    quick = [await router.acquire([]) for _ in range(2)]
    waiter = asyncio.create_task(router.acquire([]))
    await asyncio.sleep(0)
    assert len(router.queue) == 1  # the slow card is free, but a quick one frees sooner
    assert router.slots.get(SLOW).in_flight == 0
    router.release(quick[0])
    got = await waiter
    assert got.lease.instance_id == quick[0].lease.instance_id
    # with nothing freed, patience (what the quick card saves, ~0.2 s) runs out: the slow card
    late = await asyncio.wait_for(router.acquire([]), 5)
    assert late.lease.instance_id == SLOW
    for admission in [quick[1], got, late]:
        router.release(admission)
    assert router.slots.in_flight == 0
    assert not len(router.queue)


async def test_a_prompt_cached_on_the_slow_card_goes_there() -> None:
    router = await fleet_with_a_slow_card(hold_s=100.0)
    system = block_hashes("the shared system prompt " * 30, 64)
    ids = frozenset(i.id for i in router.instances)
    seeded = await router.acquire(system, avoid=ids - {SLOW})
    router.release(seeded)
    warm = await router.acquire(system)  # 3x a hit beats a cold prefill on a quick card
    assert warm.lease.instance_id == SLOW
    assert warm.cached
    router.release(warm)


async def test_baseline_policies_place_on_the_slow_card_as_peer_routers_do() -> None:
    router = await fleet_with_a_slow_card(hold_s=0.01, policy="least_connections")
    tasks = [asyncio.create_task(router.acquire([])) for _ in range(3)]
    await asyncio.sleep(0)
    assert not len(router.queue)  # none waits for a quicker card
    placed = [task.result() for task in tasks]
    assert {a.lease.instance_id for a in placed} == {"http://i0", "http://i1", SLOW}
    for admission in placed:
        router.release(admission)
