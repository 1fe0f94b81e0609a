"""The per-model router with an injected clock: queue hand-off, fairness, finish, reaping, health.

Learned speeds are tested in test_speed.py, waiting for quicker busy instances in test_delay.py.
"""

from __future__ import annotations

import asyncio

import pytest

from gpuplane.serve.errors import FailureKind, Rejected, Rejection
from gpuplane.serve.placer import Admission
from tests.helpers.serve import Clock, assert_released, make_router, prompt

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


async def test_freed_slot_goes_straight_to_the_next_waiter() -> None:
    router, _ = make_router([1])
    held = await router.acquire({})
    waiter = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    assert len(router.queue) == 1
    router.finish(held)
    granted = await waiter
    assert granted.lease.instance_id == "http://i0"
    assert router.slots.get("http://i0").in_flight == 1
    router.finish(granted)
    router.finish(granted)  # idempotent
    assert router.slots.in_flight == 0


async def test_tenants_share_freed_slots_by_weight() -> None:
    router, _ = make_router([1], queue={"max_size": 100, "fairness_slack": 0})
    held = await router.acquire({})
    order: list[str] = []

    async def client(tenant: str, weight: float) -> None:
        admission = await router.acquire({}, tenant=tenant, weight=weight)
        order.append(tenant)
        router.finish(admission)

    tasks = [asyncio.create_task(client("heavy", 3.0)) for _ in range(6)]
    tasks += [asyncio.create_task(client("light", 1.0)) for _ in range(6)]
    await asyncio.sleep(0)
    router.finish(held)
    await asyncio.gather(*tasks)
    assert order[:8].count("heavy") == 6  # 3:1 while both wait
    assert sorted(order) == ["heavy"] * 6 + ["light"] * 6


async def test_freed_slot_prefers_a_waiter_whose_prefix_it_holds() -> None:
    router, _ = make_router([1, 1])
    a_prompt = prompt("tenant A system prompt " * 20)
    b_prompt = prompt("tenant B system prompt " * 20)
    on_0 = await router.acquire(a_prompt)
    on_1 = await router.acquire(b_prompt)
    assert {on_0.lease.instance_id, on_1.lease.instance_id} == {"http://i0", "http://i1"}
    # waiters arrive B first, then A; the instance holding A's prefix frees up
    wait_b = asyncio.create_task(router.acquire(b_prompt, tenant="b"))
    wait_a = asyncio.create_task(router.acquire(a_prompt, tenant="a"))
    await asyncio.sleep(0)
    router.finish(on_0)
    got_a = await wait_a
    assert got_a.lease.instance_id == on_0.lease.instance_id
    assert got_a.choice.reason == "prefix"
    router.finish(on_1)
    got_b = await wait_b
    assert got_b.lease.instance_id == on_1.lease.instance_id
    router.finish(got_a)
    router.finish(got_b)


@pytest.mark.parametrize(("max_passes", "first"), [(1, "a"), (0, "b1")])
async def test_freed_slot_goes_past_a_tenants_earlier_waiters_at_most_max_passes(
    max_passes: int, first: str
) -> None:
    router, _ = make_router([1, 1], queue={"max_passes": max_passes})
    a_prompt = prompt("system prompt A " * 30)
    b_prompt = prompt("system prompt B " * 30)
    on_a = await router.acquire(a_prompt)
    on_b = await router.acquire(b_prompt)
    served: list[tuple[str, str]] = []
    granted: list[Admission] = []

    async def client(name: str, body: dict[str, str]) -> None:
        admission = await router.acquire(body)
        served.append((name, admission.lease.instance_id))
        granted.append(admission)

    # one tenant: b1 and b2 wait before a, and the instance holding A's prefix frees a slot
    tasks = [asyncio.create_task(client(n, b_prompt)) for n in ("b1", "b2")]
    tasks.append(asyncio.create_task(client("a", a_prompt)))
    await asyncio.sleep(0)
    router.finish(on_a)
    await asyncio.sleep(0)
    assert served == [(first, on_a.lease.instance_id)]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for admission in [on_b, *granted]:
        router.finish(admission)


async def test_reaper_frees_only_leases_past_their_ttl() -> None:
    clock = Clock()
    router, reaped = make_router([2], clock, request_timeout_s=10, lease_ttl_s=20)
    old = await router.acquire({})
    clock.now = 15
    young = await router.acquire({})
    clock.now = 25
    assert router.reap() == 1
    assert reaped == [old.lease.instance_id]
    assert router.slots.in_flight == 1
    router.finish(old)  # the request that leaked it ends after all: its slot is not freed twice
    assert router.slots.in_flight == 1
    router.finish(young)


async def test_queue_timeout_and_full() -> None:
    router, _ = make_router([1], queue={"max_size": 1, "timeout_s": 0.05})
    held = await router.acquire({})
    waiting = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    with pytest.raises(Rejected) as full:
        await router.acquire({})
    assert full.value.reason is Rejection.QUEUE_FULL
    with pytest.raises(Rejected) as late:
        await waiting
    assert late.value.reason is Rejection.QUEUE_TIMEOUT
    assert len(router.queue) == 0
    router.finish(held)


async def test_passive_health_marks_down_and_probe_brings_back() -> None:
    router, _ = make_router([1, 1], health={"failure_threshold": 2})
    router.health.report_failure("http://i0", FailureKind.TIMEOUT)
    assert router.slots.get("http://i0").healthy
    router.health.report_failure("http://i0", FailureKind.STATUS)
    assert not router.slots.get("http://i0").healthy
    router.health.report_failure("http://i1", FailureKind.CONNECT)
    assert not router.slots.get("http://i1").healthy
    with pytest.raises(Rejected) as down:
        await router.acquire({})
    assert down.value.reason is Rejection.NO_HEALTHY_INSTANCE
    router.health.report_success("http://i1")
    back = await router.acquire({})
    assert back.lease.instance_id == "http://i1"
    router.finish(back)


async def test_finish_reports_each_attempt_to_health_once() -> None:
    """A failed attempt counts toward marking its instance down, once however often it is
    finished; a dropped one (the client left) says nothing of health; an answered one starts
    the count again."""
    router, _ = make_router([1], health={"failure_threshold": 2}, abort_grace_s=0)
    instance = router.slots.get("http://i0")
    failed = await router.acquire({})
    router.finish(failed, FailureKind.STATUS, "500 from the engine")
    router.finish(failed, FailureKind.STATUS, "500 from the engine")  # finished: no recount
    assert instance.healthy
    dropped = await router.acquire({})
    router.finish(dropped, dropped=True)
    timed_out = await router.acquire({})
    router.finish(timed_out, FailureKind.TIMEOUT, "no answer")
    assert not instance.healthy  # two failures in a row
    router.health.report_success(instance.id)  # a probe brings it back
    for failure in (FailureKind.STATUS, None, FailureKind.STATUS):
        admission = await router.acquire({})
        router.finish(admission, failure)
    assert instance.healthy  # the answer in between started the count again


async def test_a_request_left_running_on_the_engine_frees_its_slot_after_the_grace() -> None:
    """A dropped attempt, a timeout or a broken stream leave the engine's request running
    until the engine notices: the slot is freed `abort_grace_s` later. A refused connection
    or a 5xx answer ended it: freed at once."""
    router, _ = make_router([5], abort_grace_s=0.05)
    dropped, timeout, broken, refused, status = [await router.acquire({}) for _ in range(5)]
    router.finish(dropped, dropped=True)
    router.finish(timeout, FailureKind.TIMEOUT)
    router.finish(broken, FailureKind.PROTOCOL)
    router.finish(refused, FailureKind.CONNECT)
    router.finish(status, FailureKind.STATUS)
    assert router.slots.in_flight == 3
    await assert_released([router])
