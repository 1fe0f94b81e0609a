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
reader's own leases held from `settle_s` before the reading began until it ended, and still live
in Redis (the script counts those, atomically): each was on the engine throughout (the
assumption of `shared.py`: an admitted request reaches its engine within `settle_s`) and is not
one of the lapsed leases bounded. Leases expired after the reading began stay counted,
and the count only falls: a request that ended does not start again. An engine that reports no
load (llama.cpp) keeps them counted until `deadline_s` (gateway.request_timeout_s) after they
expired: by then their gateway has ended them, unless it is still paused.

Which leases are sure is pure, here (the caller passes its clock's times); the bound is taken in
the `drain` script, atomically with what Redis holds live; `drain` is the edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.serve.ha.loads import Instance, LoadReader

Script = Callable[..., Awaitable[Any]]


def sure_running(
    granted: Mapping[str, float], held_after: Collection[str], began: float, settle_s: float
) -> list[str]:
    """Which of the leases granted at these times (`granted`: lease id → time) were on their
    engine throughout a reading that began at `began`: granted `settle_s` before it, and still
    held (`held_after`) once it ended. (The drain script counts only those Redis still holds
    live: an expired one may be among the lapsed it bounds.)"""
    return sorted(
        lease for lease, at in granted.items() if at <= began - settle_s and lease in held_after
    )


@dataclass(frozen=True, slots=True)
class Target:
    """An instance to drain: its set's key in Redis, what the load reader needs, this
    gateway's leases on it (lease id → granted at; read again once the reading ended), the
    table's `settle_s`, and the longest a request runs (gateway.request_timeout_s)."""

    key: str
    instance: Instance
    held: Mapping[str, float]
    settle_s: float
    deadline_s: float


async def drain(
    client: Any,
    drain_script: Script,
    loads: LoadReader,
    target: Target,
    clock: Callable[[], float],
) -> int:
    """Read the instance's engine and lower its lapsed count in Redis to what the reading
    allows (ask, then commit); answers the count after."""
    sec, usec = await client.time()  # Redis's clock: the lapsed leases' expiries are on it
    began_ms = sec * 1000 + usec // 1000
    began = clock()
    mine = dict(target.held)
    model, iid, _ = target.instance
    load = (await loads.read([target.instance])).get((model, iid))
    sure = sure_running(mine, target.held, began, target.settle_s)
    args = [began_ms, -1 if load is None else load, int(target.deadline_s * 1000), *sure]
    return int(await drain_script([target.key], args))
