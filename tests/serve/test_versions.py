"""Rollouts in the gateway: each request picks a version by weight among the versions with a
ready instance, and stays on it (placement, queue, retry)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from gpuplane.serve.router import ModelRouter
from gpuplane.serve.versions import VersionPicker
from tests.helpers.serve import make_router

REQUESTS = 1000


def shares(weights: dict[str, float], ready: set[str], seed: int = 7) -> dict[str, float]:
    picker = VersionPicker(random.Random(seed))
    got = Counter(picker.pick(weights, ready) for _ in range(REQUESTS))
    return {v: 100 * n / REQUESTS for v, n in got.items() if v is not None}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "weights",
    [{"v1": 90, "v2": 10}, {"v1": 50, "v2": 50}, {"v1": 70, "v2": 20, "v3": 10}],
)
def test_the_weights_hold_within_two_points_over_a_thousand_requests(
    weights: dict[str, float], seed: int
) -> None:
    got = shares(weights, set(weights), seed)
    for version, weight in weights.items():
        assert abs(got.get(version, 0.0) - weight) <= 2, (version, got)


def test_a_version_without_a_ready_instance_gets_nothing_and_its_share_goes_to_the_others() -> None:
    got = shares({"v1": 60, "v2": 10, "v3": 30}, {"v1", "v3"})
    assert "v2" not in got
    assert abs(got["v1"] - 100 * 60 / 90) <= 2
    assert abs(got["v3"] - 100 * 30 / 90) <= 2


def test_only_ready_versions_of_weight_zero_share_evenly_and_none_ready_picks_none() -> None:
    assert VersionPicker(random.Random(0)).pick({"v1": 100, "v2": 0}, set()) is None
    got = shares({"v1": 100, "v2": 0, "v3": 0}, {"v2", "v3"})
    assert set(got) == {"v2", "v3"}
    assert shares({"v1": 100, "v2": 0}, {"v1", "v2"}) == {"v1": 100.0}


def rollout(capacity: int, ready: tuple[str, ...] = ("a", "b")) -> ModelRouter:
    """A router over instance a (v1) and b (v2), weighted 90/10, `ready` answering."""
    router, _ = make_router([1])
    router.drain_instance("http://i0")  # idle: it leaves at once
    router.add_instance("a", "http://a", capacity, "v1")
    router.add_instance("b", "http://b", capacity, "v2")
    for iid in ready:
        router.health.report_success(iid)
    router.set_weights({"v1": 90, "v2": 10})
    return router


@pytest.mark.anyio
async def test_a_request_is_placed_on_its_versions_instances_and_waits_for_them() -> None:
    router = rollout(1)
    first = await router.acquire({}, version="v2")
    assert (first.lease.instance_id, first.version) == ("b", "v2")
    # v2's one slot is taken and v1's is free: a v2 request waits for v2
    waiter = asyncio.create_task(router.acquire({}, version="v2"))
    await asyncio.sleep(0)
    assert len(router.queue) == 1
    assert router.slots.get("a").free == 1
    router.finish(first)
    second = await waiter
    assert second.lease.instance_id == "b"
    router.finish(second)
    # a retry that avoids the only v2 instance stays on v2
    again = await router.acquire({}, version="v2", avoid=frozenset({"b"}))
    assert again.lease.instance_id == "b"
    router.finish(again)


@pytest.mark.anyio
async def test_a_queued_request_whose_version_drains_picks_another() -> None:
    router = rollout(1)
    held_a = await router.acquire({}, version="v1")
    held_b = await router.acquire({}, version="v2")
    waiter = asyncio.create_task(router.acquire({}, version="v2"))
    await asyncio.sleep(0)
    router.drain_instance("b")  # rolled back: v2 has no ready instance left
    router.finish(held_b)  # its request finished on v2
    router.finish(held_a)
    moved = await waiter
    assert (moved.lease.instance_id, moved.version) == ("a", "v1")
    router.finish(moved)


@pytest.mark.anyio
async def test_requests_split_by_weight_and_none_goes_to_an_unready_version() -> None:
    router = rollout(2000, ready=("a",))  # b has not answered its probe yet
    held = [await router.acquire({}) for _ in range(200)]
    assert {h.lease.instance_id for h in held} == {"a"}
    router.health.report_success("b")
    held += [await router.acquire({}) for _ in range(REQUESTS)]
    on_b = sum(h.lease.instance_id == "b" for h in held[200:])
    assert abs(100 * on_b / REQUESTS - 10) <= 2
    for h in held:
        router.finish(h)
