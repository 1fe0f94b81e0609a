"""The multi-active drills, bounded: 3 gateway processes in mode shared over 8 simulated
instances of capacity 4, 1,500 streamed requests, with random SIGKILLs and restarts of
gateways, or with Redis SIGKILLed (its data lost) at a third of the run and started again 1 s
later. The engines' own counts are the truth. (The fail-closed and re-sync rules are tested
scenario by scenario in test_shared.py.)"""

from __future__ import annotations

import pytest

from tests.serve.ha.shared_drill import Drill, drill
from tests.serve.ha.shared_helpers import killable_redis

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_gateways_killed_and_restarted_never_over_admit_nor_leak() -> None:
    with killable_redis() as redis:
        result = await drill(Drill(requests=1_500, kills=3, kill_redis=False, seed=3), redis)
    assert result["gateway_kills"] == 3
    assert result["max_in_flight_seen"] == [4] * 8  # full, and never past the capacity
    assert max(result["max_running_seen"]) == 4
    assert result["leases_in_redis_after_one_ttl"] == 0
    assert result["ok"] >= 0.9 * result["requests"]  # what fails was on a killed gateway


@pytest.mark.parametrize("seed", [0, 1])
async def test_redis_killed_mid_run_never_runs_an_engine_past_its_capacity(seed: int) -> None:
    with killable_redis() as redis:
        result = await drill(Drill(requests=1_500, kills=0, seed=seed), redis)
    assert result["redis_killed"]
    assert max(result["max_in_flight_seen"]) <= 4, result["over_capacity_at"]
    assert result["leases_in_redis_after_one_ttl"] == 0
    assert result["failed"] == 0  # fail closed: requests wait in the gateways' queues


async def test_a_gateway_paused_past_its_lease_ttl_under_load_never_over_admits() -> None:
    """SIGSTOP one of two gateways for 4 s (its leases' TTL: 1.5 s) under load, while the other
    refills what expired; on SIGCONT it renews nothing it held and admits on the engines' load
    until a reading counts what runs (`ha/lapse.py`)."""
    d = Drill(requests=600, gateways=2, instances=2, clients=16, kills=0, kill_redis=False,
              pauses=1, pause_s=4.0, seed=5)  # fmt: skip
    with killable_redis() as redis:
        result = await drill(d, redis)
    assert result["gateway_pauses"] == 1
    assert max(result["max_in_flight_seen"]) <= 4, (result["over_capacity_at"], result["events"])
    assert result["leases_in_redis_after_one_ttl"] == 0
    assert result["failed"] == 0


async def test_a_gateway_paused_while_its_long_generations_run_never_over_admits() -> None:
    """Generations that outlast the pause (600 tokens, 6 s and more): SIGSTOP the gateway that
    holds the most leases for 3 s (TTL 1.5 s) while its requests keep running on the engines.
    Redis expires its leases; the other gateway may not refill those slots until the engines
    show them free (`ha/expired.py`). On the code before, an engine ran 8 at capacity 4."""
    d = Drill(requests=48, gateways=2, instances=2, clients=16, kills=0, kill_redis=False,
              pauses=1, pause_s=3.0, max_tokens=600, itl_ms=10.0, seed=0)  # fmt: skip
    with killable_redis() as redis:
        result = await drill(d, redis)
    assert result["gateway_pauses"] == 1
    assert max(result["max_in_flight_seen"]) <= 4, (result["over_capacity_at"], result["events"])
    assert result["leases_in_redis_after_one_ttl"] == 0
    assert result["failed"] == 0
