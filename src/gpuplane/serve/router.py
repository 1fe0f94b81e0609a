"""One model's router: admit (slot) → place → queue when full → release.

The async shell around the pure cores (SlotTable, FairQueue, PrefixIndex, a placement policy,
instance health).
Everything here runs on one event loop and never awaits while it mutates, so each method is
atomic with respect to the others. `release` is idempotent and hands a freed slot straight to the
next waiter.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import NoReturn

from gpuplane.averages import RunningMean
from gpuplane.serve.errors import Rejected, Rejection
from gpuplane.serve.health import InstanceHealth
from gpuplane.serve.placement import Choice, make_policy
from gpuplane.serve.prefix import PrefixIndex
from gpuplane.serve.queue import FairQueue, Ticket
from gpuplane.serve.settings import GatewayConfig, ModelConfig
from gpuplane.serve.slots import InstanceSlots, Lease, SlotRefusal, SlotTable


@dataclass(slots=True)
class Admission:
    """A granted slot and how it was placed."""

    lease: Lease
    url: str
    choice: Choice
    blocks: Sequence[int] = ()

    @property
    def cached(self) -> bool:
        """Placed where most of its prompt's prefix is (as far as the index knows)."""
        return is_hit(self.choice.matched_blocks, self.blocks)


# A prefix worth waiting for covers at least this share of the prompt's blocks.
LOCALITY_MIN_SHARE = 0.5


def is_hit(matched: int, blocks: Sequence[int]) -> bool:
    """Do `matched` leading blocks of a prompt's `blocks` make a cache hit worth placing for?"""
    return bool(blocks) and matched >= LOCALITY_MIN_SHARE * len(blocks)


# Hold times measured before the router trusts its estimate of how fast slots free.
MIN_HOLD_SAMPLES = 8
# Times to first token measured on an instance before its speed counts (one slow answer on a
# busy machine must not mark it slow: placement would then send it too little to learn better).
MIN_SPEED_SAMPLES = 2
# An instance is much quicker for a prompt when it is expected to reach the first token in at
# most this share of the time another would: worth waiting for, and the other is left out of
# placement while a quicker one has room (between instances of one speed, only a cached prefix
# makes that difference).
MUCH_QUICKER = 0.5


@dataclass(slots=True)
class _Waiter:
    blocks: Sequence[int]
    future: asyncio.Future[Admission]
    ticket: Ticket[_Waiter] | None = None
    timer: asyncio.TimerHandle | None = None
    preferred: frozenset[str] = frozenset()  # busy instances it waits for (delay scheduling)
    patience: asyncio.TimerHandle | None = None  # clears `preferred` when it fires


@dataclass(slots=True)
class RouterEvents:
    """Callbacks the metrics layer hooks into; the defaults do nothing."""

    placed: Callable[[str, Choice], None] = lambda model, choice: None
    rejected: Callable[[str, Rejection], None] = lambda model, reason: None
    reaped: Callable[[str, Lease], None] = lambda model, lease: None
    # (model, instance, healthy, why)
    health_changed: Callable[[str, str, bool, str], None] = lambda model, iid, ok, why: None


class ModelRouter:
    def __init__(
        self,
        model: ModelConfig,
        cfg: GatewayConfig,
        capacities: Sequence[int],
        *,
        events: RouterEvents | None = None,
        locality_wait_s: float = 0.0,
        per_request_cache: bool = False,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.name = model.name
        self.cfg = cfg
        self.slots = SlotTable(
            (inst.id, inst.url.rstrip("/"), cap)
            for inst, cap in zip(model.instances, capacities, strict=True)
        )
        self.queue: FairQueue[_Waiter] = FairQueue(
            cfg.queue.max_size, cfg.queue.fairness_slack, cfg.queue.max_passes
        )
        per_instance = (
            model.cached_prefix_chars // cfg.placement.prefix_block_chars
            if model.cached_prefix_chars
            else None
        )
        self.index = PrefixIndex(
            cfg.placement.prefix_index_blocks,
            blocks_per_instance=per_instance,
            per_request_cache=per_request_cache,
        )
        self.policy = make_policy(cfg.placement.policy, cfg.placement.max_imbalance)
        self.events = events or RouterEvents()
        self.locality_wait_s = locality_wait_s
        self._clock = clock
        self._rng = rng or random.Random()
        self.health = InstanceHealth(self.slots, cfg.health.failure_threshold, self._health_changed)
        ids = [i.id for i in self.slots.instances]
        # how long a lease is held, over the fleet and per instance (a slower card holds longer)
        self._hold = RunningMean(0.1)
        self._holds = {i: RunningMean(0.1) for i in ids}
        # the waiters' demand on busy instances: one per waiter, shared among those it waits for
        self._waiting_for: dict[str, float] = {}
        # time to first token over the fleet by `Admission.cached`, and per instance relative
        # to the fleet's (3.0: a card three times slower)
        self._first_byte = {True: RunningMean(0.2), False: RunningMean(0.2)}
        self._speed = {i: RunningMean(0.1) for i in ids}
        self._speeds_differ = False  # some instance is much quicker than another

    @property
    def instances(self) -> list[InstanceSlots]:
        return self.slots.instances

    def wants_prefix(self) -> bool:
        return self.policy.uses_prefix

    # -- admission ------------------------------------------------------------------------

    async def acquire(
        self,
        blocks: Sequence[int],
        *,
        tenant: str = "default",
        weight: float = 1.0,
        priority: int = 0,
        timeout_s: float | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Admission:
        """A slot on the best instance, now or after waiting in the fair queue.

        Raises `Rejected` for a full queue, a wait past the timeout, or no healthy instance.
        Cancelling the caller withdraws it from the queue and frees any slot it was handed.
        """
        if not self.slots.healthy_count:
            self._reject(Rejection.NO_HEALTHY_INSTANCE, self.health.unhealthy_message(self.name))
        affinity = self._affinity(blocks)
        preferred = None if avoid else self._quicker_busy(blocks, affinity)
        if not len(self.queue) and preferred is None:
            admission = self._place(blocks, affinity, avoid) or (
                self._place(blocks, affinity) if avoid else None
            )
            if admission is not None:
                return admission
        if self.queue.is_full():
            self._reject(
                Rejection.QUEUE_FULL,
                f"model '{self.name}' is at capacity and its queue is full "
                f"({self.queue.max_size} waiting); retry later",
            )
        loop = asyncio.get_running_loop()
        waiter = _Waiter(blocks, loop.create_future())
        waiter.ticket = self.queue.push(waiter, tenant, weight, priority)
        timeout = self.cfg.queue.timeout_s if timeout_s is None else timeout_s
        waiter.timer = loop.call_later(timeout, self._expire, waiter, timeout)
        if preferred is not None:
            waiter.preferred, patience = preferred
            self._add_demand(waiter.preferred, 1.0)
            waiter.patience = loop.call_later(patience, self._lose_patience, waiter)
        self._dispatch(None)  # a slot may be free while earlier waiters wait for theirs
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._withdraw(waiter)
            raise
        finally:
            waiter.timer.cancel()
            if waiter.patience is not None:
                waiter.patience.cancel()
            self._stop_preferring(waiter)

    def release(self, admission: Admission, *, aborted: bool = False) -> None:
        """Free the slot (idempotent) and hand it to the next waiter. `aborted`: the gateway
        dropped the engine's request mid-way; the engine notices only when it next looks, so
        the slot is freed `abort_grace_s` later, or the next request would find it still taken
        and the engine would run one more than its capacity."""
        if aborted and self.cfg.abort_grace_s > 0:
            asyncio.get_running_loop().call_later(self.cfg.abort_grace_s, self.release, admission)
            return
        lease = admission.lease
        if self.slots.release(lease):
            held = self._clock() - lease.acquired_at
            self._hold.add(held)
            self._holds[lease.instance_id].add(held)
            self._dispatch(lease.instance_id)

    def observe_first_byte(self, admission: Admission, seconds: float) -> None:
        """Learn how long a cached and an uncached prompt take to their first token, and how
        much slower each instance is than the fleet. An answer that came at the other kind's
        speed teaches neither: a prefix placed as cached that came back at uncached speed was
        evicted by the engine (the index forgets it there), and an uncached one that came back
        at cached speed was held by the engine without the index knowing."""
        iid = admission.lease.instance_id
        cold, warm = self._first_byte[False], self._first_byte[True]
        if cold.samples:  # (before a cached answer was measured, the midpoint is half of cold)
            looks_cached = seconds / self.speed(iid) < (cold.value + warm.value) / 2
            if admission.cached and not looks_cached:
                matched = admission.blocks[: admission.choice.matched_blocks]
                self.index.forget_prefix(matched, iid)
                return
            if looks_cached and not admission.cached:
                return
        fleet = self._first_byte[admission.cached]
        if fleet.samples and fleet.value > 0:
            self._speed[iid].add(seconds / fleet.value)
            self._speeds_differ = self.policy.uses_speed and self._much_quicker_exists()
        fleet.add(seconds)

    def speed(self, instance_id: str) -> float:
        """How many times longer the instance takes to a first token than the fleet's mean
        (1.0 until `MIN_SPEED_SAMPLES` were measured)."""
        mean = self._speed[instance_id]
        return mean.value if mean.samples >= MIN_SPEED_SAMPLES else 1.0

    def first_byte_s(self, instance_id: str, hit: bool) -> float:
        """Expected time to first token on the instance for a prompt whose prefix it holds
        (`hit`) or not: the fleet's measured time times the instance's `speed`. Before anything
        was measured: the engine's default wait for an uncached prompt, and 0 for a cached one."""
        mean = self._first_byte[hit]
        unmeasured = 0.0 if hit else self.locality_wait_s
        return (mean.value if mean.samples else unmeasured) * self.speed(instance_id)

    def _much_quicker_exists(self) -> bool:
        speeds = [m.value for m in self._speed.values() if m.samples >= MIN_SPEED_SAMPLES]
        return bool(speeds) and min(speeds) < MUCH_QUICKER * max(speeds)

    def reap(self) -> int:
        """Release leases past the TTL; each one is a leak and is reported."""
        expired = self.slots.expired(self._clock(), self.cfg.lease_ttl_s)
        for lease in expired:
            self.events.reaped(self.name, lease)
            inst = self.slots.get(lease.instance_id)
            self.release(Admission(lease, inst.url, Choice(inst.id, "reaped")))
        return len(expired)

    def _health_changed(self, instance_id: str, healthy: bool, why: str) -> None:
        self.events.health_changed(self.name, instance_id, healthy, why)
        if healthy:
            self.index.forget(instance_id)  # a recovered engine has an empty prefix cache
        self._dispatch(instance_id if healthy else None)  # waiters for it may go elsewhere now

    # -- internals ------------------------------------------------------------------------

    def _affinity(self, blocks: Sequence[int]) -> dict[str, int]:
        """Matched leading blocks per instance, best first; empty when prefixes are not used."""
        return self.index.match(blocks) if blocks and self.policy.uses_prefix else {}

    def _place(
        self,
        blocks: Sequence[int],
        affinity: dict[str, int],
        avoid: frozenset[str] = frozenset(),
    ) -> Admission | None:
        candidates = self.slots.available()
        if avoid:
            candidates = [c for c in candidates if c.id not in avoid]
        candidates = self._quick_enough(candidates, blocks, affinity)
        choice = self.policy.choose(candidates, affinity, self._rng)
        if choice is None:
            return None
        lease = self.slots.acquire(choice.instance_id, self._clock())
        if blocks:
            self.index.record(blocks, choice.instance_id)
        self.events.placed(self.name, choice)
        return Admission(lease, self.slots.get(choice.instance_id).url, choice, blocks)

    def _cost(self, inst: InstanceSlots, blocks: Sequence[int], affinity: dict[str, int]) -> float:
        """Expected time to this prompt's first token on `inst`."""
        return self.first_byte_s(inst.id, is_hit(affinity.get(inst.id, 0), blocks))

    def _quick_enough(
        self, candidates: Sequence[InstanceSlots], blocks: Sequence[int], affinity: dict[str, int]
    ) -> Sequence[InstanceSlots]:
        """The candidates not much slower to this prompt's first token than an uncached prefill
        on the quickest of them (all, while every instance runs at about one speed)."""
        if not self._speeds_differ or len(candidates) < 2:
            return candidates
        cold = min(self.first_byte_s(c.id, False) for c in candidates)
        kept = [c for c in candidates if MUCH_QUICKER * self._cost(c, blocks, affinity) <= cold]
        return kept or candidates

    def _quicker_busy(
        self, blocks: Sequence[int], affinity: dict[str, int]
    ) -> tuple[frozenset[str], float] | None:
        """Busy healthy instances much quicker to this prompt's first token than any free one
        (they hold its prefix, or run on faster cards), expected to free a slot for it within
        what they save; with how long to wait for them (delay scheduling). With nothing free,
        the alternative is an uncached prefill on the quickest instance."""
        if self._speeds_differ:
            pool = self.slots.instances
        elif affinity:  # at one speed, only a cached prefix makes an instance much quicker
            pool = [self.slots.get(iid) for iid in affinity]
        else:
            return None
        busy = [i for i in pool if i.healthy and not i.free]
        if not busy:
            return None
        free = self._quick_enough(self.slots.available(), blocks, affinity)
        if free:
            alternative = min(self._cost(c, blocks, affinity) for c in free)
        else:
            alternative = min(self.first_byte_s(i.id, False) for i in self.instances if i.healthy)
        costs = {
            i.id: cost
            for i in busy
            if (cost := self._cost(i, blocks, affinity)) <= MUCH_QUICKER * alternative
        }
        if not costs:
            return None
        patience = self._patience_s(alternative - max(costs.values()))
        if patience <= 0 or not self._frees_in_time(costs, patience):
            return None
        return frozenset(costs), patience

    def _patience_s(self, saving_s: float) -> float:
        """How long a request waits for quicker busy instances: what they save, never more than
        `placement.locality_wait_s` (unset: half the queue timeout)."""
        cap = self.cfg.placement.locality_wait_s
        return min(saving_s, cap if cap is not None else self.cfg.queue.timeout_s / 2)

    def _frees_in_time(self, instance_ids: Collection[str], seconds: float) -> bool:
        """Are the busy instances expected to free a slot for one more waiter within `seconds`?
        Each frees its slots at capacity / mean hold time per second (its own mean once
        `MIN_HOLD_SAMPLES` were measured, the fleet's before), and the waiters already waiting
        for them take the first ones. No until `MIN_HOLD_SAMPLES` hold times were measured.

        With vLLM-like engines a hit saves tens of ms against generations of seconds: waiting
        rarely pays and a failed wait costs the TTFT tail. On a CPU llama.cpp a hit saves
        seconds of prefill, about a generation: waiting usually pays. A card three times slower
        loses twice an uncached prefill, which a fleet of tens of fast slots often frees in.
        """
        if self._hold.samples < MIN_HOLD_SAMPLES:
            return False
        rate = 0.0
        for iid in instance_ids:
            own = self._holds[iid]
            hold = own.value if own.samples >= MIN_HOLD_SAMPLES else self._hold.value
            rate += self.slots.get(iid).capacity / max(hold, 1e-9)
        demand = sum(self._waiting_for.get(iid, 0.0) for iid in instance_ids)
        return rate * seconds >= demand + 1

    def _eligible(self, waiter: _Waiter) -> bool:
        """May this waiter take a free slot now? Not while every busy instance it waits for is
        still full."""
        if not waiter.preferred:
            return True
        full = SlotRefusal.FULL
        return any(self.slots.can_acquire(iid) is not full for iid in waiter.preferred)

    def _lose_patience(self, waiter: _Waiter) -> None:
        self._stop_preferring(waiter)
        self._dispatch(None)

    def _stop_preferring(self, waiter: _Waiter) -> None:
        """The waiter no longer waits for busy instances (idempotent)."""
        if waiter.preferred:
            self._add_demand(waiter.preferred, -1.0)
            waiter.preferred = frozenset()

    def _add_demand(self, instance_ids: frozenset[str], sign: float) -> None:
        """Add (sign 1) or remove (-1) one waiter's demand, shared among `instance_ids`."""
        share = sign / len(instance_ids)
        for iid in instance_ids:
            left = self._waiting_for.get(iid, 0.0) + share
            if left > 1e-9:
                self._waiting_for[iid] = left
            else:
                self._waiting_for.pop(iid, None)

    def _dispatch(self, freed: str | None) -> None:
        """Hand free slots to waiters: fair order, bent toward a waiter whose prefix the freed
        instance holds (across tenants within `queue.fairness_slack` turns; within a tenant past
        waiters passed over fewer than `queue.max_passes` times); a waiter still waiting for
        quicker busy instances is skipped."""
        while len(self.queue) and self.slots.available():
            prefer = None
            if freed is not None and self.policy.uses_prefix:
                prefer = functools.partial(self._hits_on, freed)
            waiter = self.queue.pop(prefer, self._eligible)
            freed = None
            if waiter is None:
                return
            if waiter.future.done():
                continue
            admission = self._place(waiter.blocks, self._affinity(waiter.blocks))
            if admission is None:
                return
            self._stop_preferring(waiter)
            waiter.future.set_result(admission)

    def _hits_on(self, instance_id: str, waiter: _Waiter) -> float:
        """1 when the instance holds enough of the waiter's prefix for a hit, else 0."""
        return float(is_hit(self.index.depth_on(waiter.blocks, instance_id), waiter.blocks))

    def _expire(self, waiter: _Waiter, timeout: float) -> None:
        if waiter.future.done() or waiter.ticket is None:
            return
        self.queue.remove(waiter.ticket)
        capacity = sum(i.capacity for i in self.slots.instances if i.healthy) or 1
        retry = max(1, math.ceil((len(self.queue) + 1) / capacity * self._hold.value))
        self.events.rejected(self.name, Rejection.QUEUE_TIMEOUT)
        waiter.future.set_exception(
            Rejected(
                Rejection.QUEUE_TIMEOUT,
                f"no slot on model '{self.name}' became free within {timeout:g} s; "
                f"retry after {retry} s or raise gateway.queue.timeout_s",
                retry,
            )
        )

    def _withdraw(self, waiter: _Waiter) -> None:
        """The waiter's caller was cancelled: leave the queue, or free the slot it was handed."""
        if waiter.ticket is not None:
            self.queue.remove(waiter.ticket)
        fut = waiter.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self.release(fut.result())
        elif not fut.done():
            fut.cancel()

    def _reject(self, reason: Rejection, message: str) -> NoReturn:
        self.events.rejected(self.name, reason)
        raise Rejected(reason, message)
