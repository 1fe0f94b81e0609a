"""Delay scheduling through the router: a request waits for a busy instance much quicker to its
first token (it holds the prompt's prefix, or is a faster card) only when that instance is
expected to free a slot for it within what it saves, and then no longer than that
(`serve/delay.py`)."""

from __future__ import annotations

import asyncio

import pytest

from gpuplane.serve.router import ModelRouter
from tests.helpers.serve import SLOW, SYSTEM, Clock, fleet_with_a_slow_card, make_router

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


async def test_waits_for_the_busy_holder_of_its_prefix_then_gives_up() -> None:
    clock = Clock()
    router, _ = make_router([1, 1], clock, placement={"locality_wait_s": 5})
    router.speeds.locality_wait_s = 5.0  # the engine's default before anything was measured
    for _ in range(8):  # hold times are known: generations are short
        router.finish(await router.acquire(SYSTEM))
    holder = await router.acquire(SYSTEM)
    # same prefix, its holder busy, the other instance free: wait for the holder
    waiter = asyncio.create_task(router.acquire(SYSTEM))
    await asyncio.sleep(0)
    assert len(router.queue) == 1
    router.finish(holder)
    got = await waiter
    assert got.lease.instance_id == holder.lease.instance_id
    assert got.choice.reason == "prefix"
    # once patience runs out it takes the free instance instead
    router.speeds.locality_wait_s = 0.01
    impatient = await asyncio.wait_for(router.acquire(SYSTEM), 1)
    assert impatient.lease.instance_id != holder.lease.instance_id
    router.finish(got)
    router.finish(impatient)


async def router_that_learned(hold_s: float, capacities: list[int]) -> ModelRouter:
    """A router whose generations held their slot `hold_s` and where a hit saves about 1 s."""
    clock = Clock()
    router, _ = make_router(capacities, clock, placement={"locality_wait_s": 5})
    router.speeds.locality_wait_s = 1.0
    for _ in range(10):
        admission = await router.acquire(SYSTEM)
        clock.now += hold_s
        router.finish(admission)
    return router


async def test_does_not_wait_for_a_holder_that_frees_slots_slower_than_a_hit_saves() -> None:
    router = await router_that_learned(10.0, [1, 1])  # a slot frees every ~10 s
    holder = await router.acquire(SYSTEM)
    cold = await asyncio.wait_for(router.acquire(SYSTEM), 1)
    assert cold.lease.instance_id != holder.lease.instance_id
    router.finish(cold)
    router.finish(holder)


async def test_waits_for_a_holder_that_frees_slots_in_time_while_others_go_elsewhere() -> None:
    router = await router_that_learned(0.4, [1, 1])  # 2.5 slots free per second a hit saves
    holder = await router.acquire(SYSTEM)
    waiters = [asyncio.create_task(router.acquire(SYSTEM)) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(router.queue) == 2
    third = await asyncio.wait_for(router.acquire(SYSTEM), 1)  # a third would wait too long
    assert third.lease.instance_id != holder.lease.instance_id
    router.finish(holder)
    first = await waiters[0]
    assert first.lease.instance_id == holder.lease.instance_id
    router.finish(first)
    second = await waiters[1]
    assert second.lease.instance_id == holder.lease.instance_id
    router.finish(second)
    router.finish(third)


async def test_a_cold_prompt_waits_for_a_quicker_card_expected_to_free_in_time() -> None:
    router = await fleet_with_a_slow_card(hold_s=0.01)  # slots free every 10 ms
    quick = [await router.acquire({}) for _ in range(2)]
    waiter = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    assert len(router.queue) == 1  # the slow card is free, but a quick one frees sooner
    assert router.slots.get(SLOW).in_flight == 0
    router.finish(quick[0])
    got = await waiter
    assert got.lease.instance_id == quick[0].lease.instance_id
    # with nothing freed, patience (what the quick card saves, ~0.2 s) runs out: the slow card
    late = await asyncio.wait_for(router.acquire({}), 5)
    assert late.lease.instance_id == SLOW
    for admission in [quick[1], got, late]:
        router.finish(admission)
