"""Delay scheduling: whether a request waits for busy instances much quicker to its first token
than any free one (they hold its prompt's prefix, or run on faster cards), and for how long.

Pure: it reads the slot table and the learned speeds it is given, and keeps what it learns from
released leases (how long they were held, over the fleet and per instance) and the demand of the
requests already waiting for busy instances. The router owns the waiters and their timers: it
asks `wait_for` before queueing a request, and reports each waiter's start and end of waiting
(`add_waiter`, `remove_waiter`) and each release (`held`).

With vLLM-like engines a hit saves tens of ms against generations of seconds: waiting rarely pays
and a failed wait costs the TTFT tail. On a CPU llama.cpp a hit saves seconds of prefill, about a
generation: waiting usually pays. A card three times slower loses twice an uncached prefill,
which a fleet of tens of fast slots often frees in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpuplane.averages import RunningMean
from gpuplane.serve.slots import SlotRefusal, SlotTable
from gpuplane.serve.speed import MUCH_QUICKER, InstanceSpeeds

# Hold times measured before the router trusts its estimate of how fast slots free.
MIN_HOLD_SAMPLES = 8


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait for a slot on one of `instances` (busy, much quicker for the prompt), at most
    `patience_s`."""

    instances: frozenset[str]
    patience_s: float


class DelayScheduler:
    """`max_wait_s`: the cap on any wait (`placement.locality_wait_s`; None: half of
    `queue_timeout_s`)."""

    def __init__(
        self,
        slots: SlotTable,
        speeds: InstanceSpeeds,
        max_wait_s: float | None,
        queue_timeout_s: float,
    ) -> None:
        self.slots = slots
        self.speeds = speeds
        self.max_wait_s = max_wait_s if max_wait_s is not None else queue_timeout_s / 2
        # how long a lease is held, over the fleet and per instance (a slower card holds longer)
        self._hold = RunningMean(0.1)
        self._holds = {i.id: RunningMean(0.1) for i in slots.instances}
        # the waiters' demand on busy instances: one per waiter, shared among those it waits for
        self._waiting_for: dict[str, float] = {}

    @property
    def mean_hold_s(self) -> float:
        """How long a lease is held, over the fleet (0 before any was released)."""
        return self._hold.value

    def add(self, instance_id: str) -> None:
        """A new instance: no hold time measured yet."""
        self._holds[instance_id] = RunningMean(0.1)

    def remove(self, instance_id: str) -> None:
        self._holds.pop(instance_id, None)
        self._waiting_for.pop(instance_id, None)

    def held(self, instance_id: str, seconds: float) -> None:
        """A lease on the instance was released after `seconds`."""
        self._hold.add(seconds)
        self._holds[instance_id].add(seconds)

    def wait_for(self, blocks: Sequence[int], affinity: Mapping[str, int]) -> Wait | None:
        """Busy healthy instances much quicker to this prompt's first token than any free one,
        expected to free a slot for it within what they save; with how long to wait for them.
        With nothing free, the alternative is an uncached prefill on the quickest instance.
        None: take what is free (or queue for any slot)."""
        slots, speeds = self.slots, self.speeds
        if speeds.differ:
            pool = slots.instances
        elif affinity:  # at one speed, only a cached prefix makes an instance much quicker
            pool = [slots.get(iid) for iid in affinity]
        else:
            return None
        busy = [i for i in pool if i.healthy and not i.free]
        if not busy:
            return None
        free = speeds.quick_enough(slots.available(), blocks, affinity)
        if free:
            alternative = min(speeds.cost(c.id, blocks, affinity) for c in free)
        else:
            healthy = [i for i in slots.instances if i.healthy]
            alternative = min(speeds.first_byte_s(i.id, False) for i in healthy)
        costs = {
            i.id: cost
            for i in busy
            if (cost := speeds.cost(i.id, blocks, affinity)) <= MUCH_QUICKER * alternative
        }
        if not costs:
            return None
        patience = self.patience_s(alternative - max(costs.values()))
        if patience <= 0 or not self.frees_in_time(costs, patience):
            return None
        return Wait(frozenset(costs), patience)

    def patience_s(self, saving_s: float) -> float:
        """How long a request waits for quicker busy instances: what they save, never more than
        `max_wait_s`."""
        return min(saving_s, self.max_wait_s)

    def frees_in_time(self, instance_ids: Collection[str], seconds: float) -> bool:
        """Are the busy instances expected to free a slot for one more waiter within `seconds`?
        Each frees its slots at capacity / mean hold time per second (its own mean once
        `MIN_HOLD_SAMPLES` were measured, the fleet's before), and the waiters already waiting
        for them take the first ones. No until `MIN_HOLD_SAMPLES` hold times were measured."""
        if self._hold.samples < MIN_HOLD_SAMPLES:
            return False
        rate = 0.0
        for iid in instance_ids:
            own = self._holds[iid]
            hold = own.value if own.samples >= MIN_HOLD_SAMPLES else self._hold.value
            rate += self.slots.get(iid).capacity / max(hold, 1e-9)
        demand = sum(self._waiting_for.get(iid, 0.0) for iid in instance_ids)
        return rate * seconds >= demand + 1

    def still_full(self, instance_ids: frozenset[str]) -> bool:
        """Is every one of these busy instances still full? Then a request waiting for them
        may not take another free slot."""
        full = SlotRefusal.FULL
        return all(self.slots.can_acquire(iid) is full for iid in instance_ids)

    def add_waiter(self, instance_ids: frozenset[str]) -> None:
        """A waiter now waits for these busy instances (`Wait.instances`)."""
        self._share(instance_ids, 1.0)

    def remove_waiter(self, instance_ids: frozenset[str]) -> None:
        """A waiter no longer waits for them (call once per `add_waiter`)."""
        self._share(instance_ids, -1.0)

    def _share(self, instance_ids: frozenset[str], sign: float) -> None:
        """Add (sign 1) or remove (-1) one waiter's demand, shared among `instance_ids`."""
        share = sign / len(instance_ids)
        for iid in instance_ids:
            left = self._waiting_for.get(iid, 0.0) + share
            if left > 1e-9:
                self._waiting_for[iid] = left
            else:
                self._waiting_for.pop(iid, None)
