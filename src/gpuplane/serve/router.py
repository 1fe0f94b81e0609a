"""One model's router: admit (slot) → place → queue when full → finish (release, learn, health).

The async shell around the pure cores: the slot table, the prefix index, a placement policy
(`placer.py`), the fair queue of waiters (`waiting.py`), the rollout's versions (`rollout.py`),
what answers teach (`feedback.py`: learned instance speeds and prefix caches), delay scheduling
(`delay.py`) and instance health (`health.py`).
Everything here runs on one event loop and never awaits while it mutates, so each method is
atomic with respect to the others. A request calls `acquire`, then (streams only)
`observe_first_byte`, then `finish` once on every path; `finish` is idempotent and hands the
freed slot straight to the next waiter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from gpuplane.serve.delay import DelayScheduler, Wait
from gpuplane.serve.errors import FailureKind, Rejected, Rejection
from gpuplane.serve.feedback import Feedback
from gpuplane.serve.health import InstanceHealth
from gpuplane.serve.hooks import RouterEvents, SharedSlots
from gpuplane.serve.limits import Usage
from gpuplane.serve.placement import make_policy
from gpuplane.serve.placer import Admission, Placer
from gpuplane.serve.prefix import PrefixIndex
from gpuplane.serve.queue import FairQueue
from gpuplane.serve.rollout import Rollout
from gpuplane.serve.settings import GatewayConfig, ModelConfig
from gpuplane.serve.slots import InstanceSlots, Lease, SlotTable
from gpuplane.serve.speed import InstanceSpeeds
from gpuplane.serve.waiting import Waiter, Waiters

# Failures that leave the engine's request running until the engine notices the dropped
# connection (a refused connection never reached it; a 5xx answer ended it).
_LEFT_RUNNING = frozenset({FailureKind.TIMEOUT, FailureKind.PROTOCOL})


@dataclass(frozen=True, slots=True)
class _Ask:
    """What one request asks of `acquire`; a shared-slot retry asks again with what is left."""

    body: Mapping[str, Any]
    tenant: str
    weight: float
    priority: int
    timeout_s: float | None
    avoid: frozenset[str]
    version: str | None


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
        shared: SharedSlots | None = None,
    ) -> None:
        self.name = model.name
        self.cfg = cfg
        self.slots = SlotTable(
            (inst.id, inst.url.rstrip("/"), cap)
            for inst, cap in zip(model.instances, capacities, strict=True)
        )
        cached = model.cached_prefix_chars  # the engine cache's size, in blocks per instance
        self.index = PrefixIndex(
            cfg.placement.prefix_index_blocks,
            blocks_per_instance=cached // cfg.placement.prefix_block_chars if cached else None,
            per_request_cache=per_request_cache,
        )
        policy = make_policy(cfg.placement.policy, cfg.placement.max_imbalance)
        ids = [i.id for i in self.slots.instances]
        self.speeds = InstanceSpeeds(ids, locality_wait_s, compare=policy.uses_speed)
        self.feedback = Feedback(self.index, self.speeds)
        self.delay = DelayScheduler(
            self.slots, self.speeds, cfg.placement.locality_wait_s, cfg.queue.timeout_s
        )
        self.health = InstanceHealth(self.slots, cfg.health.failure_threshold, self._health_changed)
        self.events = events or RouterEvents()
        self._clock = clock
        self._rng = rng or random.Random()
        self.rollout = Rollout(self.slots, self._rng)  # versions and weights (discovery)
        self.placer = Placer(
            self.slots,
            self.index,
            self.speeds,
            self.rollout,
            policy,
            block_chars=cfg.placement.prefix_block_chars,
            rng=self._rng,
            clock=clock,
            placed=lambda choice: self.events.placed(self.name, choice),
        )
        queue: FairQueue[Waiter] = FairQueue(
            cfg.queue.max_size, cfg.queue.fairness_slack, cfg.queue.max_passes
        )
        self.waiters = Waiters(queue, self.slots, self.placer, self.rollout, self.delay, clock)
        # a deployment (discovery): while no instance is ready, a request waits in the queue
        # up to this long for the ones the control plane starts or replaces (None: refused)
        self.hold_s: float | None = None
        self._last_active = clock()  # when a request last arrived or left (`idle_s`)
        self.shared = shared
        if shared is not None:
            shared.attach(self)

    @property
    def instances(self) -> list[InstanceSlots]:
        return self.slots.instances

    @property
    def queue(self) -> FairQueue[Waiter]:
        """The model's fair queue of waiters (`Waiters`)."""
        return self.waiters.queue

    # -- instances that come and go (discovery) -----------------------------------------------

    def add_instance(
        self, instance_id: str, url: str, capacity: int, version: str | None = None
    ) -> None:
        """A new instance (of `version`, in a rollout): it takes requests once it first
        answers its health probe (or a request), like one that recovers."""
        self.rollout.add(instance_id, version)
        self.slots.add(instance_id, url.rstrip("/"), capacity)
        self.health.add(instance_id)
        self.speeds.add(instance_id)
        self.delay.add(instance_id)

    def drain_instance(self, instance_id: str) -> None:
        """Admit nothing more to the instance; it leaves once its last lease is released
        (now, when it holds none). Waiters go to the others."""
        if self.slots.drain(instance_id):
            self._remove(instance_id)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The rollout's version weights in percent (`Rollout.set_weights`)."""
        self.rollout.set_weights(weights)

    def _remove(self, instance_id: str) -> None:
        self.rollout.remove(instance_id)
        self.slots.remove(instance_id)
        self.health.remove(instance_id)
        self.speeds.remove(instance_id)
        self.delay.remove(instance_id)
        self.index.forget(instance_id)
        self.feedback.forget(instance_id)

    def oldest_wait_s(self) -> float:
        """How long the longest-waiting queued request has waited (0 with none)."""
        return self.waiters.oldest_wait_s()

    def idle_s(self) -> float:
        """How long the model has had no request in flight or queued (0 while it has one)."""
        if self.slots.in_flight or len(self.queue):
            return 0.0
        return self._clock() - self._last_active

    # -- a request: acquire, observe_first_byte, finish -----------------------------------------

    async def acquire(
        self,
        body: Mapping[str, Any],
        *,
        tenant: str = "default",
        weight: float = 1.0,
        priority: int = 0,
        timeout_s: float | None = None,
        avoid: frozenset[str] = frozenset(),
        version: str | None = None,
    ) -> Admission:
        """A slot on the best instance for the completion request `body` (parsed JSON), now or
        after waiting in the fair queue.

        Raises `Rejected` for a full queue, a wait past the timeout, or no healthy instance
        (with `hold_s`, a deployment whose instances the control plane starts or replaces, it
        waits that long for one instead).
        Cancelling the caller withdraws it from the queue and frees any slot it was handed.
        With shared slots, a slot the view granted but another gateway holds sends the request
        back to placement (or the queue's tail) with what is left of its timeout.
        In a rollout the request picks a version by weight (`Rollout.pick`), or keeps
        `version` (a retry), and is placed only on that version's instances.
        """
        ask = _Ask(body, tenant, weight, priority, timeout_s, avoid, version)
        while True:
            admission, ask = await self._admit(ask)
            if self.shared is None or await self._commit(admission):
                return admission

    async def _admit(self, ask: _Ask) -> tuple[Admission, _Ask]:
        """A slot in this gateway's view, placed now or after a wait in the queue, and what a
        retry then asks (the version kept; after a wait, what is left of the timeout, and any
        instance: waiters are placed without `avoid`)."""
        self._last_active = self._clock()
        held = not self.slots.healthy_count
        if held and self.hold_s is None:
            self._reject(Rejection.NO_HEALTHY_INSTANCE, self.health.unhealthy_message(self.name))
        version = ask.version or self.rollout.pick()
        blocks = self.placer.blocks(ask.body)
        affinity = self.placer.affinity(blocks)
        # delay scheduling waits for busy instances of any version: not in a rollout
        wait = None if ask.avoid or version else self.delay.wait_for(blocks, affinity)
        if not len(self.queue) and wait is None:
            admission = self.placer.place(blocks, affinity, ask.avoid, version) or (
                self.placer.place(blocks, affinity, version=version) if ask.avoid else None
            )
            if admission is not None:
                return admission, dataclasses.replace(ask, version=version)
        timeout = ask.timeout_s if ask.timeout_s is not None else self.cfg.queue.timeout_s
        if held and self.hold_s is not None and ask.timeout_s is None:
            timeout = self.hold_s
        admission, left = await self._wait(ask, blocks, version, timeout, wait)
        return admission, dataclasses.replace(
            ask, timeout_s=left, avoid=frozenset(), version=version
        )

    async def _wait(
        self,
        ask: _Ask,
        blocks: Sequence[int],
        version: str | None,
        limit_s: float,
        wait: Wait | None,
    ) -> tuple[Admission, float]:
        """A slot handed over in the fair queue, and what is left of `limit_s` then."""
        if self.queue.is_full():
            self._reject(
                Rejection.QUEUE_FULL,
                f"model '{self.name}' is at capacity and its queue is full "
                f"({self.queue.max_size} waiting); retry later",
            )
        waiter = self.waiters.join(
            blocks,
            version,
            tenant=ask.tenant,
            weight=ask.weight,
            priority=ask.priority,
            timeout_s=limit_s,
            expire=self._expire,
            wait=wait,
        )
        started = self._clock()
        try:
            admission = await waiter.future
        except asyncio.CancelledError:
            self._withdraw(waiter)
            raise
        finally:
            self.waiters.leave(waiter)
        return admission, max(0.0, limit_s - (self._clock() - started))

    def observe_first_byte(self, admission: Admission, seconds: float) -> None:
        """A streamed answer's first byte came `seconds` after it was sent (`Feedback`)."""
        self.feedback.first_byte(admission, seconds)

    def observe_usage(self, admission: Admission, usage: Usage) -> None:
        """The engine said what the request used (`Feedback`)."""
        self.feedback.usage(admission, usage)

    def cache_state(self, instance_id: str) -> dict[str, Any]:
        """What the index assumes of the instance's prefix cache (`Feedback.cache_state`)."""
        return self.feedback.cache_state(instance_id)

    def finish(
        self,
        admission: Admission,
        failure: FailureKind | None = None,
        detail: str = "",
        *,
        dropped: bool = False,
    ) -> None:
        """The attempt on the admission's instance ended; call it once on every path (again: a
        no-op). With no `failure` and not `dropped`, the engine answered: the instance counts as
        healthy. With a `failure` (`detail`: what failed, for the log), passive health counts it.
        `dropped`: the gateway left the engine's request mid-way (the client left, a deadline),
        which says nothing of the instance's health.

        Then the slot is freed and handed to the next waiter; when the engine's request was left
        running (dropped, timed out, broken mid-stream) `abort_grace_s` later: the engine notices
        the abort only when it next looks, and the next request would find the slot still taken
        and the engine would run one more than its capacity."""
        if admission.finished:
            return
        admission.finished = True
        iid = admission.lease.instance_id
        if failure is None and not dropped:
            self.health.report_success(iid)
        left_running = dropped or failure in _LEFT_RUNNING
        if left_running and self.cfg.abort_grace_s > 0:
            loop = asyncio.get_running_loop()
            loop.call_later(self.cfg.abort_grace_s, self._release, admission.lease)
        else:
            self._release(admission.lease)
        if failure is not None:
            self.health.report_failure(iid, failure, detail)

    async def _commit(self, admission: Admission) -> bool:
        """Do the shared slots grant the admission too? False: its slot is freed in the view
        (which now shows the instance full) and the request asks again."""
        assert self.shared is not None
        lease = admission.lease
        try:
            granted = await self.shared.commit(self.name, lease)
        except BaseException:
            self._release(lease)  # the caller left while it asked
            raise
        if granted:
            return True
        if self.slots.release(lease):  # not held: nothing to learn from, but it frees the view
            self.waiters.dispatch(lease.instance_id)
        return False

    def set_others(self, instance_id: str, n: int) -> None:
        """`n` of the instance's slots are held beyond this gateway (told by the shared
        slots); waiters take what that frees."""
        if self.slots.set_others(instance_id, n):
            self.waiters.dispatch(instance_id)

    def turn_away(self, reason: Rejection, message: str) -> int:
        """Refuse every waiter now with `reason` (a gateway that stops leading: its waiters
        retry at the new leader); returns how many."""
        turned = 0
        while (waiter := self.queue.pop()) is not None:
            if waiter.future.done():
                continue
            self.events.rejected(self.name, reason)
            waiter.future.set_exception(Rejected(reason, message))
            turned += 1
        return turned

    def reap(self) -> int:
        """Release leases past the TTL; each one is a leak and is reported."""
        expired = self.slots.expired(self._clock(), self.cfg.lease_ttl_s)
        for lease in expired:
            self.events.reaped(self.name, lease)
            self._release(lease)
        return len(expired)

    def _health_changed(self, instance_id: str, healthy: bool, why: str) -> None:
        self.events.health_changed(self.name, instance_id, healthy, why)
        if healthy:
            self.index.forget(instance_id)  # a recovered engine has an empty prefix cache
        self.waiters.dispatch(
            instance_id if healthy else None
        )  # waiters for it may go elsewhere now

    # -- freed slots ------------------------------------------------------------------------

    def _release(self, lease: Lease) -> None:
        """Free the lease's slot (idempotent), learn its hold time, hand the slot on."""
        if self.slots.release(lease):
            self._last_active = self._clock()
            if self.shared is not None:
                self.shared.release(self.name, lease)
            self.delay.held(lease.instance_id, self._clock() - lease.acquired_at)
            inst = self.slots.get(lease.instance_id)
            if inst.draining and not inst.leases:
                self._remove(lease.instance_id)
            self.waiters.dispatch(lease.instance_id)

    # -- waiters ----------------------------------------------------------------------------

    def _expire(self, waiter: Waiter, timeout: float) -> None:
        if not self.waiters.expire(waiter):
            return
        self._last_active = self._clock()
        self.events.rejected(self.name, Rejection.QUEUE_TIMEOUT)
        waiter.future.set_exception(self.waiters.timed_out(self.name, timeout, self.hold_s))

    def _withdraw(self, waiter: Waiter) -> None:
        """The waiter's caller was cancelled: leave the queue, or free the slot it was handed."""
        self._last_active = self._clock()
        lease = self.waiters.withdraw(waiter)
        if lease is not None:
            self._release(lease)

    def _reject(self, reason: Rejection, message: str) -> NoReturn:
        self.events.rejected(self.name, reason)
        raise Rejected(reason, message)
