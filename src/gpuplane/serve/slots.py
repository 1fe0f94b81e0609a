"""Concurrency-slot accounting: which instance holds how many generations, as leases.

Pure: no I/O, no clock reads (callers pass `now`). An instance with capacity N never holds more
than N leases; `release` is idempotent, so every exit path of a request may call it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class SlotRefusal(StrEnum):
    UNKNOWN_INSTANCE = "unknown_instance"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"
    FULL = "full"


class InstanceState(StrEnum):
    """An instance as `/admin/state` shows it."""

    READY = "ready"  # healthy: takes requests
    UNHEALTHY = "unhealthy"  # (a discovered instance is, until it first answers its probe)
    CRASH_LOOPING = "crash_looping"  # down: its engine keeps exiting soon after it starts
    DRAINING = "draining"  # removed: takes no new request; goes when its last lease ends


@dataclass(slots=True)
class InstanceSlots:
    """One engine instance as the slot table sees it."""

    id: str
    url: str
    capacity: int
    in_flight: int = 0
    healthy: bool = True
    leases: set[int] = field(default_factory=set)
    # slots held beyond this table, counted in `in_flight` (gateway.ha.mode shared: the other
    # gateways' leases, or what this one withholds while the shared table is unreachable)
    others: int = 0
    # what the engine's supervisor said when its process last exited (None: never, or not
    # supervised here), and whether it exits soon after every start
    last_error: str | None = None
    crash_looping: bool = False
    # removed (by discovery): it takes no new request, and leaves the table at its last release
    draining: bool = False
    # in_flight / capacity, kept in step by `count`: placement reads it for every
    # candidate of every request, and a plain attribute is several times cheaper than a property
    utilisation: float = field(init=False)

    def __post_init__(self) -> None:
        self.count(0)

    def count(self, delta: int) -> None:
        """Add `delta` to `in_flight` (the slot table's acquire and release) and keep
        `utilisation` in step."""
        self.in_flight += delta
        self.utilisation = self.in_flight / self.capacity

    @property
    def free(self) -> int:
        return self.capacity - self.in_flight

    @property
    def state(self) -> InstanceState:
        if self.draining:
            return InstanceState.DRAINING
        if self.healthy:
            return InstanceState.READY
        return InstanceState.CRASH_LOOPING if self.crash_looping else InstanceState.UNHEALTHY


@dataclass(frozen=True, slots=True)
class Lease:
    """A held slot. Release it exactly once; releasing again is a no-op."""

    id: int
    instance_id: str
    acquired_at: float


class SlotTable:
    """Capacity, in-flight count and leases of every instance of one model."""

    def __init__(self, instances: Iterable[tuple[str, str, int]]) -> None:
        self._instances: dict[str, InstanceSlots] = {}
        for iid, url, capacity in instances:
            if capacity < 1:
                raise ValueError(f"instance {iid}: capacity must be >= 1, got {capacity}")
            self._instances[iid] = InstanceSlots(iid, url, capacity)
        self._leases: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self.healthy_count = len(self._instances)  # kept in step by `set_healthy`
        # `available()`, rebuilt only after an instance fills up, gets room again or changes
        # health: placement asks on every request, and with capacities of tens that is rare
        self._available: list[InstanceSlots] | None = None

    @property
    def instances(self) -> list[InstanceSlots]:
        return list(self._instances.values())

    def get(self, instance_id: str) -> InstanceSlots:
        return self._instances[instance_id]

    def __contains__(self, instance_id: object) -> bool:
        return instance_id in self._instances

    def available(self) -> Sequence[InstanceSlots]:
        """Healthy instances with at least one free slot (shared: do not modify it)."""
        if self._available is None:
            self._available = [
                i for i in self._instances.values() if i.healthy and i.in_flight < i.capacity
            ]
        return self._available

    def can_acquire(self, instance_id: str) -> SlotRefusal | None:
        """None when a slot on `instance_id` can be taken now, else why not."""
        inst = self._instances.get(instance_id)
        if inst is None:
            return SlotRefusal.UNKNOWN_INSTANCE
        if inst.draining:
            return SlotRefusal.DRAINING
        if not inst.healthy:
            return SlotRefusal.UNHEALTHY
        if inst.in_flight >= inst.capacity:
            return SlotRefusal.FULL
        return None

    def acquire(self, instance_id: str, now: float) -> Lease:
        refusal = self.can_acquire(instance_id)
        if refusal is not None:
            raise RuntimeError(f"cannot acquire a slot on {instance_id}: {refusal.value}")
        lease = Lease(next(self._ids), instance_id, now)
        inst = self._instances[instance_id]
        inst.count(1)
        if inst.in_flight == inst.capacity:
            self._available = None
        inst.leases.add(lease.id)
        self._leases[lease.id] = lease
        return lease

    def release(self, lease: Lease) -> bool:
        """Free the lease's slot. True the first time, False (and no change) afterwards."""
        if self._leases.pop(lease.id, None) is None:
            return False
        inst = self._instances[lease.instance_id]
        inst.leases.discard(lease.id)
        if inst.in_flight == inst.capacity:
            self._available = None
        inst.count(-1)
        return True

    def set_others(self, instance_id: str, n: int) -> bool:
        """The instance's slots held beyond this table are `n` now; True when that freed room
        on an instance that had none (waiters may take it)."""
        inst = self._instances[instance_id]
        if n == inst.others:
            return False
        was_full = inst.in_flight >= inst.capacity
        inst.count(n - inst.others)
        inst.others = n
        if was_full != (inst.in_flight >= inst.capacity):
            self._available = None
        return was_full and inst.in_flight < inst.capacity

    def expired(self, now: float, ttl: float) -> list[Lease]:
        """Leases held longer than `ttl`: each is a leak the reaper will release."""
        return [lease for lease in self._leases.values() if now - lease.acquired_at > ttl]

    def add(self, instance_id: str, url: str, capacity: int) -> InstanceSlots:
        """A new instance, unhealthy until it first answers (`set_healthy`)."""
        if instance_id in self._instances:
            raise ValueError(f"instance {instance_id} is already in the table")
        if capacity < 1:
            raise ValueError(f"instance {instance_id}: capacity must be >= 1, got {capacity}")
        inst = self._instances[instance_id] = InstanceSlots(
            instance_id, url, capacity, healthy=False
        )
        return inst

    def drain(self, instance_id: str) -> bool:
        """Take no new lease on the instance (its leases run on); True when it holds none and
        can be `remove`d now."""
        inst = self._instances[instance_id]
        self.set_healthy(instance_id, False)
        inst.draining = True
        return not inst.leases

    def remove(self, instance_id: str) -> None:
        """Forget a drained instance that holds no lease."""
        inst = self._instances[instance_id]
        if inst.leases:
            raise RuntimeError(f"instance {instance_id} still holds {len(inst.leases)} lease(s)")
        self.set_healthy(instance_id, False)
        del self._instances[instance_id]
        self._available = None

    def set_healthy(self, instance_id: str, healthy: bool) -> bool:
        """Mark an instance (a draining one stays out); True when its state changed."""
        inst = self._instances[instance_id]
        if inst.healthy == healthy or (healthy and inst.draining):
            return False
        inst.healthy = healthy
        self.healthy_count += 1 if healthy else -1
        self._available = None
        return True

    @property
    def in_flight(self) -> int:
        return len(self._leases)
