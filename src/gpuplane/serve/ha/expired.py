"""Slots whose lease expired while their request may still run (`shared.py`, `shared.lua`).

Redis expires a lease `ttl_s` after its gateway last renewed it; a gateway paused past that
(SIGSTOP, a stalled VM) still has its requests running on the engines. So an expired lease
frees nothing by itself: `shared.lua` moves it to the instance's lapsed set, which counts
against the capacity like a live lease, until its gateway releases it (the request ended) or
registers it again (back from the pause), or an engine reading shows its request ended. A
gateway that sees lapsed leases on an instance reads that instance's engine at its next sync
(not on every request) and lowers the lapsed count in Redis to what the reading allows (ask,
then commit):

    requests of leases expired before the reading began that still run  ≤  load - sure

where `load` is the engine's running + waiting at some instant of the reading, and `sure` the
reader's own leases held from `settle_s` before the reading began until it ended: each was on
the engine throughout (the assumption of `shared.py`: an admitted request reaches its engine
within `settle_s`), and none is expired. Leases expired after the reading began stay counted,
and the count only falls: a request that ended does not start again. An engine that reports no
load (llama.cpp) keeps them counted until `deadline_s` (gateway.request_timeout_s) after they
expired: by then their gateway has ended them, unless it is still paused.

Pure arithmetic on plain data here (the caller passes its clock's times); `drain` is the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.serve.ha.loads import Instance, LoadReader

Script = Callable[..., Awaitable[Any]]


def sure_running(
    granted: Mapping[str, float], held_after: Collection[str], began: float, settle_s: float
) -> int:
    """How many of the leases granted at these times (`granted`: lease id → time) were on their
    engine throughout a reading that began at `began`: granted `settle_s` before it, and still
    held (`held_after`) once it ended."""
    return sum(1 for lease, at in granted.items() if at <= began - settle_s and lease in held_after)


def expired_bound(load: int | None, sure: int) -> int | None:
    """The most requests of expired leases that can still run, from an engine reading of
    `load` and `sure` leases known to run; None where the engine does not say."""
    return None if load is None else max(0, load - sure)


@dataclass(frozen=True, slots=True)
class Target:
    """An instance to drain: its set's key in Redis, what the load reader needs, and this
    gateway's leases on it (lease id → granted at; read again once the reading ended)."""

    key: str
    instance: Instance
    held: Mapping[str, float]


async def drain(
    client: Any,
    drain_script: Script,
    loads: LoadReader,
    target: Target,
    clock: Callable[[], float],
    settle_s: float,
    deadline_s: float,
) -> int:
    """Read the instance's engine and lower its lapsed count in Redis to what the reading
    allows (ask, then commit); answers the count after."""
    sec, usec = await client.time()  # Redis's clock: the lapsed leases' expiries are on it
    began_ms = sec * 1000 + usec // 1000
    began = clock()
    mine = dict(target.held)
    model, iid, _ = target.instance
    load = (await loads.read([target.instance])).get((model, iid))
    bound = expired_bound(load, sure_running(mine, target.held, began, settle_s))
    args = [began_ms, -1 if bound is None else bound, int(deadline_s * 1000)]
    return int(await drain_script([target.key], args))
