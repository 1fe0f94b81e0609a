"""A model's waiters: the requests in its fair queue, their timers, and the hand-out of freed
slots to them.

A request that finds no free slot (or waits for a quicker busy instance: `delay.py`) joins the
fair queue as a future with a timeout timer (the router's, which refuses it) and, when it waits
for busy instances, a patience timer after which any instance will do. `dispatch` hands free
slots to waiters in fair order, bent toward one whose prefix the freed instance holds (within
the queue's slack), and passes over a waiter still waiting for its busy instances or for a free
slot of its rollout version. Everything runs on the router's event loop, without awaiting.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuplane.serve.delay import DelayScheduler, Wait
from gpuplane.serve.errors import Rejected, Rejection
from gpuplane.serve.placer import Admission, Placer
from gpuplane.serve.queue import FairQueue, Ticket
from gpuplane.serve.rollout import Rollout
from gpuplane.serve.slots import Lease, SlotTable


@dataclass(slots=True)
class Waiter:
    """A request waiting in the fair queue (or for a quicker busy instance)."""

    blocks: Sequence[int]
    future: asyncio.Future[Admission]
    ticket: Ticket[Waiter] | None = None
    timer: asyncio.TimerHandle | None = None
    preferred: frozenset[str] = frozenset()  # busy instances it waits for (delay scheduling)
    patience: asyncio.TimerHandle | None = None  # clears `preferred` when it fires
    since: float = 0.0  # when it joined the queue (the router's clock)
    version: str | None = None  # placed only on this version's instances (a rollout)


class Waiters:
    """The fair queue of one model's waiters; the router owns the parts it reads (slots,
    placer, rollout, delay scheduler) and calls `join`, then `leave` once the waiter's future
    is done, and `dispatch` whenever a slot may have been freed."""

    def __init__(
        self,
        queue: FairQueue[Waiter],
        slots: SlotTable,
        placer: Placer,
        rollout: Rollout,
        delay: DelayScheduler,
        clock: Callable[[], float],
    ) -> None:
        self.queue = queue
        self._slots = slots
        self._placer = placer
        self._rollout = rollout
        self._delay = delay
        self._clock = clock

    def join(
        self,
        blocks: Sequence[int],
        version: str | None,
        *,
        tenant: str,
        weight: float,
        priority: int,
        timeout_s: float,
        expire: Callable[[Waiter, float], None],
        wait: Wait | None,
    ) -> Waiter:
        """Queue a request; `expire(waiter, timeout_s)` refuses it after `timeout_s` (the
        router's); `wait`: the busy instances it waits for, and how long. The caller checked
        that the queue has room."""
        loop = asyncio.get_running_loop()
        waiter = Waiter(blocks, loop.create_future(), since=self._clock(), version=version)
        waiter.ticket = self.queue.push(waiter, tenant, weight, priority)
        waiter.timer = loop.call_later(timeout_s, expire, waiter, timeout_s)
        if wait is not None:
            waiter.preferred = wait.instances
            self._delay.add_waiter(waiter.preferred)
            waiter.patience = loop.call_later(wait.patience_s, self._lose_patience, waiter)
        self.dispatch(None)  # a slot may be free while earlier waiters wait for theirs
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """The waiter's wait is over, whichever way: stop its timers (idempotent)."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        if waiter.patience is not None:
            waiter.patience.cancel()
        self._stop_preferring(waiter)

    def expire(self, waiter: Waiter) -> bool:
        """Take a waiter whose timeout fired out of the queue; False when it was handed a
        slot (or withdrawn) already."""
        if waiter.future.done() or waiter.ticket is None:
            return False
        self.queue.remove(waiter.ticket)
        return True

    def timed_out(self, model: str, timeout: float, hold_s: float | None) -> Rejected:
        """The refusal of a waiter `expire` took out after `timeout` seconds, with when to
        retry: for a deployment that holds requests (`hold_s`) while none of its instances is
        ready, about when the one it awaits serves; else about when the queue ahead drains."""
        if not self._slots.healthy_count and hold_s is not None:
            retry = max(1, math.ceil(hold_s))
            message = (
                f"model '{model}' has no ready instance and none became ready within "
                f"{timeout:g} s (its deployment's scaling.max_queue_wait_s, else "
                f"gateway.queue.timeout_s); retry after {retry} s, or see "
                f"`gpuplane deploy describe {model}`"
            )
        else:
            capacity = sum(i.capacity for i in self._slots.instances if i.healthy) or 1
            retry = max(1, math.ceil((len(self.queue) + 1) / capacity * self._delay.mean_hold_s))
            message = (
                f"no slot on model '{model}' became free within {timeout:g} s; "
                f"retry after {retry} s or raise gateway.queue.timeout_s"
            )
        return Rejected(Rejection.QUEUE_TIMEOUT, message, retry)

    def withdraw(self, waiter: Waiter) -> Lease | None:
        """The waiter's caller was cancelled: leave the queue; the lease of a slot it was
        handed meanwhile, for the caller to release."""
        if waiter.ticket is not None:
            self.queue.remove(waiter.ticket)
        fut = waiter.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            return fut.result().lease
        if not fut.done():
            fut.cancel()
        return None

    def oldest_wait_s(self) -> float:
        """How long the longest-waiting queued request has waited (0 with none)."""
        since = min((w.since for w in self.queue.items()), default=None)
        return 0.0 if since is None else self._clock() - since

    def dispatch(self, freed: str | None) -> None:
        """Hand free slots to waiters: fair order, bent toward a waiter whose prefix the freed
        instance holds (across tenants within `queue.fairness_slack` turns; within a tenant past
        waiters passed over fewer than `queue.max_passes` times); a waiter still waiting for
        quicker busy instances is skipped."""
        while len(self.queue) and self._slots.available():
            prefer = None
            if freed is not None and self._placer.by_prefix:
                prefer = functools.partial(self._hits_on, freed)
            waiter = self.queue.pop(prefer, self._eligible)
            freed = None
            if waiter is None:
                return
            if waiter.future.done():
                continue
            admission = self._placer.place(
                waiter.blocks, self._placer.affinity(waiter.blocks), version=waiter.version
            )
            if admission is None:
                return
            self._stop_preferring(waiter)
            waiter.future.set_result(admission)

    def _hits_on(self, instance_id: str, waiter: Waiter) -> float:
        """1 when the instance holds enough of the waiter's prefix for a hit, else 0."""
        return float(self._placer.hits_on(instance_id, waiter.blocks))

    def _eligible(self, waiter: Waiter) -> bool:
        """May this waiter take a free slot now? Not while it waits for busy instances, nor
        when no instance of its version has one (a waiter whose version has no ready instance
        left, rolled back or down, picks a version again)."""
        if waiter.version is not None and waiter.version not in self._rollout.ready():
            waiter.version = self._rollout.pick()  # its version lost every ready instance
        if waiter.version is not None and not self._placer.available(waiter.version):
            return False
        return not waiter.preferred or not self._delay.still_full(waiter.preferred)

    def _lose_patience(self, waiter: Waiter) -> None:
        self._stop_preferring(waiter)
        self.dispatch(None)

    def _stop_preferring(self, waiter: Waiter) -> None:
        """The waiter no longer waits for busy instances (idempotent)."""
        if waiter.preferred:
            self._delay.remove_waiter(waiter.preferred)
            waiter.preferred = frozenset()
