"""Learned instance speed through the router: the fleet's time to first byte for cached and
uncached prompts, each instance's ratio to it, and placement that keeps prompts off much slower
cards (`serve/speed.py`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuplane.serve.limits import Usage
from gpuplane.serve.speed import Answer, InstanceSpeeds
from tests.helpers.serve import SLOW, SYSTEM, fleet_with_a_slow_card, make_router, prompt

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


async def test_learns_the_time_to_first_token_of_cached_and_uncached_prompts() -> None:
    router, _ = make_router([1, 1], placement={"locality_wait_s": 30})
    cold = await router.acquire(SYSTEM)
    router.observe_first_byte(cold, 8.0)
    router.finish(cold)
    warm = await router.acquire(SYSTEM)
    assert warm.cached
    router.observe_first_byte(warm, 0.5)
    router.finish(warm)
    iid = warm.lease.instance_id
    assert router.speeds.first_byte_s(iid, hit=False) == pytest.approx(8.0)
    assert router.speeds.first_byte_s(iid, hit=True) == pytest.approx(0.5)
    # a "cached" placement that comes back at cold speed means the engine evicted it
    again = await router.acquire(SYSTEM)
    router.observe_first_byte(again, 8.0)
    router.finish(again)
    assert router.index.match(again.blocks).get(again.lease.instance_id, 0) == 0


async def test_an_answer_at_the_other_kinds_speed_says_so_and_teaches_nothing() -> None:
    speeds = InstanceSpeeds(["a", "b"], locality_wait_s=0.0, compare=True)
    for _ in range(3):
        assert speeds.observe("a", cached=False, seconds=1.0) is Answer.LEARNED
        assert speeds.observe("b", cached=False, seconds=1.0) is Answer.LEARNED
    assert speeds.observe("a", cached=True, seconds=0.1) is Answer.LEARNED
    before = (speeds.speed("a"), speeds.first_byte_s("a", False), speeds.first_byte_s("a", True))
    assert speeds.observe("a", cached=True, seconds=1.0) is Answer.EVICTED
    assert speeds.observe("a", cached=False, seconds=0.1) is Answer.HELD
    after = (speeds.speed("a"), speeds.first_byte_s("a", False), speeds.first_byte_s("a", True))
    assert after == before


async def test_an_answer_at_the_other_kinds_speed_teaches_no_speed() -> None:
    router = await fleet_with_a_slow_card(hold_s=100.0)
    before = router.speeds.speed("http://i0")
    # placed as uncached, answered as fast as a hit: the engine held the prefix after all
    surprise = await router.acquire({}, avoid=frozenset({"http://i1", SLOW}))
    router.observe_first_byte(surprise, 0.001)
    router.finish(surprise)
    assert router.speeds.speed("http://i0") == before


async def test_learns_how_much_slower_an_instance_is_and_keeps_cold_prompts_off_it() -> None:
    router = await fleet_with_a_slow_card(hold_s=100.0)  # nothing frees soon: no waiting
    speeds = router.speeds
    assert speeds.speed(SLOW) > 2.5 * speeds.speed("http://i0")
    assert speeds.first_byte_s(SLOW, hit=False) > 2.5 * speeds.first_byte_s("http://i1", False)
    quick = [await router.acquire({}) for _ in range(2)]
    assert {a.lease.instance_id for a in quick} == {"http://i0", "http://i1"}
    # the quick ones are full and free nothing in time: the slow card now beats waiting
    slow = await asyncio.wait_for(router.acquire({}), 1)
    assert slow.lease.instance_id == SLOW
    for admission in [*quick, slow]:
        router.finish(admission)


async def test_a_prompt_cached_on_the_slow_card_goes_there() -> None:
    router = await fleet_with_a_slow_card(hold_s=100.0)
    ids = frozenset(i.id for i in router.instances)
    seeded = await router.acquire(SYSTEM, avoid=ids - {SLOW})
    router.finish(seeded)
    warm = await router.acquire(SYSTEM)  # 3x a hit beats a cold prefill on a quick card
    assert warm.lease.instance_id == SLOW
    assert warm.cached
    router.finish(warm)


async def test_baseline_policies_place_on_the_slow_card_as_peer_routers_do() -> None:
    router = await fleet_with_a_slow_card(hold_s=0.01, policy="least_connections")
    tasks = [asyncio.create_task(router.acquire({})) for _ in range(3)]
    await asyncio.sleep(0)
    assert not len(router.queue)  # none waits for a quicker card
    placed = [task.result() for task in tasks]
    assert {a.lease.instance_id for a in placed} == {"http://i0", "http://i1", SLOW}
    for admission in placed:
        router.finish(admission)


async def test_learns_that_an_engine_keeps_only_its_last_prompt_and_stops_predicting_more() -> None:
    router, _ = make_router([1])  # an external llama.cpp: nothing told of its cache
    iid = "http://i0"
    a, b, c, d = (prompt(f"system prompt {name} " * 40) for name in "abcd")

    async def serve(body: dict[str, Any], seconds: float) -> bool:
        admission = await router.acquire(body)
        router.observe_first_byte(admission, seconds)
        router.finish(admission)
        return admission.cached

    assert not await serve(a, 8.0)
    assert not await serve(b, 8.0)
    assert await serve(a, 8.0)  # predicted a hit; the engine had only b: a miss
    assert router.index.capacity(iid) is not None
    assert not await serve(c, 8.0)
    assert not await serve(d, 8.0)
    assert not await serve(c, 8.0)  # it keeps only d now: c is not predicted to hit
    assert await serve(c, 0.1)  # c is its last prompt: a hit, delivered
    learned = router.index.capacity(iid)
    assert learned is not None
    # placed as uncached, answered at cached speed: it keeps more than that after all
    assert not await serve(a, 0.1)
    assert (router.index.capacity(iid) or 0) > learned


async def test_an_engine_that_counts_its_cached_tokens_decides_hits_not_its_latency() -> None:
    router, _ = make_router([1])
    iid = "http://i0"
    a, b = prompt("system prompt a " * 40), prompt("system prompt b " * 40)

    async def serve(body: dict[str, Any], cached_tokens: int, seconds: float) -> bool:
        admission = await router.acquire(body)
        router.observe_first_byte(admission, seconds)
        router.observe_usage(admission, Usage(160, 4, cached=cached_tokens))
        router.finish(admission)
        return admission.cached

    assert not await serve(a, 0, 8.0)
    assert not await serve(b, 0, 8.0)
    # predicted a hit, answered as fast as one, but the engine says it served no cached token
    assert await serve(a, 0, 0.1)
    assert router.index.capacity(iid) is not None  # it keeps less than the index assumed
    # placed as uncached and slow to its first byte, yet the engine served it from its cache
    bound = router.index.capacity(iid) or 0
    assert not await serve(b, 150, 8.0)
    assert (router.index.capacity(iid) or 0) > bound
    # a hit slow to its first byte (a busy engine) is still a hit: the index keeps the prefix
    assert await serve(b, 150, 8.0)
    assert await serve(b, 150, 0.1)


async def test_an_engine_that_does_not_count_its_cached_tokens_is_still_learned_by_latency() -> (
    None
):
    router, _ = make_router([1])
    a, b = prompt("system prompt a " * 40), prompt("system prompt b " * 40)
    for body in (a, b, a):
        admission = await router.acquire(body)
        router.observe_first_byte(admission, 8.0)  # every answer at uncached speed
        router.observe_usage(admission, Usage(160, 4))  # usage without a cached count
        router.finish(admission)
    assert router.index.capacity("http://i0") is not None
