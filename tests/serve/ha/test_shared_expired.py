"""Mode shared: a lease Redis expired frees its slot only once an engine reading shows its
request ended (`ha/expired.py`): the arithmetic on plain data, and the scripts on a real Redis."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from gpuplane.serve.ha.expired import sure_running
from tests.serve.ha.shared_helpers import acquire, renew


def test_only_leases_held_from_settle_before_the_reading_to_its_end_are_sure_to_run() -> None:
    granted = {"old": 10.0, "new": 19.9, "gone": 5.0, "edge": 19.5}
    assert sure_running(granted, {"old", "new", "edge"}, began=20.0, settle_s=0.5) == [
        "edge",
        "old",
    ]
    assert sure_running(granted, set(), began=20.0, settle_s=0.5) == []  # all ended meanwhile
    assert sure_running({}, set(), began=20.0, settle_s=0.5) == []


@dataclass(frozen=True)
class Leases:
    """One slot table's scripts on the session's Redis, under a key no other test uses."""

    s: dict[str, AsyncScript]
    key: str
    url: str

    @property
    def i0(self) -> str:
        return f"{self.key}:i0"

    async def acquire(self, lease: str, cap: int, *, ttl_ms: int = 60_000) -> list[int]:
        return await acquire(self.s, self.key, lease, cap, ttl_ms=ttl_ms)

    async def renew(self, gateway: str, epoch: int, *leases: str) -> list[Any]:
        return await renew(self.s, self.key, gateway, epoch, *leases)

    async def redis_ms(self) -> int:
        """Redis's clock, in ms: when an engine reading begins."""
        client = aioredis.from_url(self.url)
        try:
            sec, usec = await client.time()
            return int(sec * 1000 + usec // 1000)
        finally:
            await client.aclose()


@pytest.fixture
def leases(
    scripts: tuple[dict[str, AsyncScript], str], redis_server: str, leftovers: object
) -> Leases:
    """The scripts on a fresh key; at the test's end nothing may still be leased (`leftovers`)."""
    return Leases(*scripts, redis_server)


@pytest.mark.anyio
async def test_an_expired_lease_keeps_its_slot_until_a_reading_frees_it(
    leases: Leases,
) -> None:
    assert await leases.acquire("a|1|1", 1, ttl_ms=50) == [1, 1]
    await asyncio.sleep(0.1)  # a's lease expired; its request may still run
    assert await leases.acquire("b|1|1", 1) == [0, 0]
    began = await leases.redis_ms()
    assert (
        await leases.s["drain"]([leases.i0], [began, 1, 60_000]) == 1
    )  # the engine still runs one
    assert (
        await leases.s["drain"]([leases.i0], [began, -1, 60_000]) == 1
    )  # no count: nothing is freed
    assert await leases.acquire("b|1|1", 1) == [0, 0]
    assert await leases.s["drain"]([leases.i0], [began, 0, 60_000]) == 0  # the engine is idle
    assert await leases.acquire("b|1|1", 1) == [1, 1]


@pytest.mark.anyio
async def test_a_lease_expired_after_the_reading_began_stays_counted(
    leases: Leases,
) -> None:
    began = await leases.redis_ms()  # the reading begins
    assert await leases.acquire("a|1|1", 2, ttl_ms=50) == [1, 1]
    await asyncio.sleep(0.1)
    assert await leases.acquire("b|1|1", 2) == [1, 1]  # a's is lapsed: 1 slot left
    assert await leases.s["drain"]([leases.i0], [began, 0, 60_000]) == 1  # a's expired after
    assert await leases.acquire("b|1|2", 2) == [0, 1]


@pytest.mark.anyio
async def test_a_lapsed_lease_is_freed_by_its_release_or_counted_once_when_registered_again(
    leases: Leases,
) -> None:
    await leases.acquire("a|1|1", 2, ttl_ms=50)
    await leases.acquire("a|1|2", 2, ttl_ms=50)
    await asyncio.sleep(0.1)  # gateway a paused past the TTL
    assert await leases.renew("b", 1) == [1, 2]  # both lapsed, both still counted
    assert await leases.s["release"]([leases.i0], ["a|1|1"]) == 1  # a's request ended
    assert await leases.renew("a", 1, "a|1|2") == [1, 0, b"a|1|2"]  # live again, once
    assert await leases.acquire("b|1|1", 2) == [1, 2]
    assert await leases.acquire("b|1|2", 2) == [0, 2]


@pytest.mark.anyio
async def test_a_lapsed_lease_past_every_requests_deadline_is_dropped(
    leases: Leases,
) -> None:
    await leases.acquire("a|1|1", 1, ttl_ms=50)
    await asyncio.sleep(0.2)
    began = await leases.redis_ms()
    assert await leases.s["drain"]([leases.i0], [began, -1, 60_000]) == 1
    assert await leases.s["drain"]([leases.i0], [began, -1, 100]) == 0  # deadline 100 ms


@pytest.mark.anyio
async def test_the_readers_live_leases_on_the_engine_are_not_taken_for_expired_ones(
    leases: Leases,
) -> None:
    await leases.acquire("a|1|1", 3, ttl_ms=50)
    await leases.acquire("a|1|2", 3, ttl_ms=50)
    await asyncio.sleep(0.1)  # a's 2 lapsed
    assert await leases.acquire("b|1|1", 3) == [1, 1]
    began = await leases.redis_ms()
    # the engine runs 3: b's own (live: not one of the lapsed) and 2 others, a's
    assert await leases.s["drain"]([leases.i0], [began, 3, 60_000, "b|1|1"]) == 2
    # a lease the reader names that Redis no longer holds live is not subtracted
    assert await leases.s["drain"]([leases.i0], [began, 2, 60_000, "a|1|1"]) == 2
    assert (
        await leases.s["drain"]([leases.i0], [began, 2, 60_000, "b|1|1"]) == 1
    )  # one of a's ended
