"""Instances that come and go (discovery): an added one waits for its first health answer, a
drained one takes nothing new and leaves the table at its last release."""

from __future__ import annotations

import asyncio

import pytest

from gpuplane.serve.errors import FailureKind, Rejected, Rejection
from gpuplane.serve.slots import InstanceState
from tests.helpers.serve import Clock, make_router

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


async def test_an_added_instance_takes_requests_only_once_it_answers() -> None:
    router, _ = make_router([1])
    router.add_instance("new", "http://new/", 2)
    assert router.slots.get("new").state is InstanceState.UNHEALTHY
    held = await router.acquire({})
    assert held.lease.instance_id == "http://i0"
    waiter = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    assert len(router.queue) == 1  # the new one is not ready: the request waits
    router.health.report_success("new")  # its first probe answered
    granted = await waiter
    assert granted.lease.instance_id == "new"
    assert granted.url == "http://new"
    router.finish(held)
    router.finish(granted)


async def test_a_drained_instance_admits_nothing_and_leaves_at_its_last_release() -> None:
    router, _ = make_router([1, 1])
    first = await router.acquire({}, avoid=frozenset({"http://i1"}))
    assert first.lease.instance_id == "http://i0"
    router.drain_instance("http://i0")
    assert router.slots.get("http://i0").state is InstanceState.DRAINING
    router.health.report_success("http://i0")  # a probe answering does not bring it back
    assert not router.slots.get("http://i0").healthy
    assert router.slots.healthy_count == 1
    second = await router.acquire({})
    assert second.lease.instance_id == "http://i1"
    router.finish(first)  # its request finishes where it was admitted
    assert "http://i0" not in router.slots
    assert [i.id for i in router.instances] == ["http://i1"]
    router.finish(second)


async def test_draining_an_idle_instance_removes_it_at_once() -> None:
    router, _ = make_router([1, 1])
    router.drain_instance("http://i1")
    assert [i.id for i in router.instances] == ["http://i0"]
    assert router.slots.healthy_count == 1


async def test_a_failure_after_removal_is_ignored() -> None:
    router, _ = make_router([1, 1])
    admission = await router.acquire({}, avoid=frozenset({"http://i1"}))
    router.drain_instance("http://i0")
    # the engine was stopped at the drain timeout: the request fails and is released
    router.finish(admission, FailureKind.CONNECT, "refused")
    assert "http://i0" not in router.slots
    router.health.report_failure("http://i0", FailureKind.TIMEOUT, "a late probe")


async def test_a_model_with_no_instance_says_so() -> None:
    router, _ = make_router([1])
    router.drain_instance("http://i0")
    with pytest.raises(Rejected) as caught:
        await router.acquire({})
    assert caught.value.reason is Rejection.NO_HEALTHY_INSTANCE
    assert "has no instance now" in str(caught.value)


async def test_the_oldest_wait_is_the_longest_queued_requests() -> None:
    clock = Clock()
    router, _ = make_router([1], clock)
    assert router.oldest_wait_s() == 0.0
    held = await router.acquire({})
    first = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    clock.now = 2.0
    second = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    clock.now = 5.0
    assert router.oldest_wait_s() == 5.0
    router.finish(held)
    granted = await first
    assert router.oldest_wait_s() == 3.0
    router.finish(granted)
    router.finish(await second)
    assert router.oldest_wait_s() == 0.0


async def test_at_zero_a_model_that_scales_to_zero_holds_requests_until_one_is_ready() -> None:
    router, _ = make_router([1])
    router.drain_instance("http://i0")
    router.hold_s = 30.0  # its deployment scales to zero
    waiting = [asyncio.create_task(router.acquire({})) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(router.queue) == 2  # held, not refused: this is the demand the autoscaler sees
    router.add_instance("new", "http://new/", 1)
    await asyncio.sleep(0)
    assert len(router.queue) == 2  # added but not ready yet
    router.health.report_success("new")
    first = await waiting[0]
    assert first.lease.instance_id == "new"
    router.finish(first)
    second = await waiting[1]
    router.finish(second)
    assert len(router.queue) == 0


async def test_a_request_held_at_zero_gets_retry_after_once_the_hold_ends() -> None:
    router, _ = make_router([1], queue={"timeout_s": 600})
    router.drain_instance("http://i0")
    router.hold_s = 0.05  # shorter than the queue's own timeout: the hold is what counts
    with pytest.raises(Rejected) as caught:
        await router.acquire({})
    assert caught.value.reason is Rejection.QUEUE_TIMEOUT
    assert caught.value.retry_after_s == 1
    assert "has no ready instance and none became ready within 0.05 s" in str(caught.value)
    assert len(router.queue) == 0


async def test_a_request_held_at_zero_can_be_cancelled() -> None:
    router, _ = make_router([1])
    router.drain_instance("http://i0")
    router.hold_s = 30.0
    waiting = asyncio.create_task(router.acquire({}))
    await asyncio.sleep(0)
    assert len(router.queue) == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(router.queue) == 0


async def test_idle_time_counts_from_the_last_request_that_left() -> None:
    clock = Clock()
    router, _ = make_router([1], clock)
    clock.now = 4.0
    assert router.idle_s() == 4.0
    held = await router.acquire({})
    clock.now = 10.0
    assert router.idle_s() == 0.0  # a request in flight
    router.finish(held)
    clock.now = 25.0
    assert router.idle_s() == 15.0
