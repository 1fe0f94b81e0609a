"""Primary/standby drills: two real gateway processes on one lease file over simulated
engines, the engines' `max_running_seen` as the ground truth (see `drill.py` for the client's
retry contract). No timing is asserted: only what users rely on across a switch."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import make_store
from tests.serve.ha.drill import CAPACITY, Drill, drill

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RATE = 25.0  # requests per second: what two gateways, the engines and the client carry here


async def _epoch(d: Drill, name: str) -> int | None:
    state = await d.state(next(g for g in d.gateways if g.name == name))
    return None if state is None else state["ha"]["epoch"]


async def test_sigkill_of_the_leader_fails_over_without_over_admitting(tmp_path: Path) -> None:
    async with drill(tmp_path) as d:
        a, b = d.gateways
        epoch_a = await _epoch(d, "a")
        load = asyncio.create_task(d.load(RATE, 6.0))
        await asyncio.sleep(2.0)
        in_flight_at_a = sum(
            i["in_flight"] for i in (await d.state(a) or {"instances": []})["instances"]
        )
        a.signal(signal.SIGKILL)
        killed_at = asyncio.get_running_loop().time()
        outcomes = await load
        assert await d.leader() is b
        epoch_b = await _epoch(d, "b")
        assert epoch_a is not None
        assert epoch_b is not None
        assert epoch_b > epoch_a
        assert max(await d.max_running()) <= CAPACITY
        failed = [o for o in outcomes if o.failed]
        # only streams a was serving when it died can fail; the rest went to b
        assert len(failed) <= in_flight_at_a + CAPACITY * 2, [o.failed for o in failed]
        assert any(o.served_by == "b" for o in outcomes)
        assert all(o.served_by != "a" or o.sent_at < killed_at + 0.1 for o in outcomes)


async def test_sigterm_and_a_rolling_restart_fail_no_request(tmp_path: Path) -> None:
    async with drill(tmp_path) as d:
        a, b = d.gateways
        load = asyncio.create_task(d.load(RATE / 2, 14.0))
        for old, new in ((a, b), (b, a)):
            await asyncio.sleep(1.5)
            old.signal(signal.SIGTERM)
            assert await asyncio.to_thread(old.wait) == 0
            assert await d.leader() is new
            old.start()  # back as the standby
            await d.ready(old)
        outcomes = await load
        failed = [o.failed for o in outcomes if o.failed]
        assert failed == []
        assert {o.served_by for o in outcomes} == {"a", "b"}
        assert max(await d.max_running()) <= CAPACITY


async def test_a_leader_stopped_past_its_lease_writes_nothing_after_it(tmp_path: Path) -> None:
    lease = tmp_path / "gateway.lease"
    async with drill(tmp_path, instances=1) as d:
        a, b = d.gateways
        # generations (~7 s) far longer than the lease's TTL: the engine still runs all the
        # stopped leader admitted when the standby takes over, and more load than the
        # capacity carries, so that the new leader would fill every slot at once
        d.max_tokens, d.deadline_s = 300, 40.0
        load = asyncio.create_task(d.load(2.0, 5.0))
        await asyncio.sleep(3.0)
        a.signal(signal.SIGSTOP)
        await asyncio.sleep(3.0)  # twice the lease's TTL
        assert await d.leader() is b
        epoch_b = await _epoch(d, "b")
        a.signal(signal.SIGCONT)
        store = make_store(HaConfig(mode="primary_standby", path=str(lease)))
        try:
            for _ in range(30):  # 1.5 s after SIGCONT: every journal is b's
                journal = await store.read_journal()
                assert journal is not None
                assert journal.epoch == epoch_b
                await asyncio.sleep(0.05)
        finally:
            await store.aclose()
        outcomes = await load
        state_a = await d.state(a)
        assert state_a is not None
        assert state_a["ha"]["role"] == "standby"
        assert state_a["ha"]["elected"] == 1  # it did not lead again
        assert max(await d.max_running()) <= CAPACITY
        assert [o.failed for o in outcomes if o.failed] == []
