"""The multi-active gateways' slot table in Redis (`gateway.ha.mode: shared`).

Each instance's slots are one Redis sorted set of lease id → expiry, behind the Lua scripts of
`shared.lua` (acquire, renew, release, heartbeat), which read Redis's own clock: N gateways
behind any load balancer then admit exactly within each instance's capacity. A lease id carries
its gateway's id and epoch (`<gateway>|<epoch>|<n>`); a process that starts under a gateway id
raises the epoch, and the scripts refuse whatever an older process under that id still sends.

The router keeps its own `SlotTable` as this gateway's view: its leases, plus the slots the
others hold (`ModelRouter.set_others`), so that placement and the fair queue work as in one
gateway, and a request asks Redis only for the instance placement chose (`commit`). The fair
queue stays per gateway: tenants are served fairly among the requests that reached the same
gateway, and a freed slot goes to whichever gateway asks first.

**Without Redis** (unreachable: LOCAL; back, but not every live gateway has registered its
leases again: RESYNC) a gateway fails closed: it admits on an instance only while the leases it
holds there are fewer than its local allowance, `share - bound` (`local.py`, with the argument
that no engine then runs past its capacity).

When Redis returns, a gateway that admitted while it was out (or finds that Redis lost its
data) starts a new incarnation of the table, so every gateway registers its leases again (the
same ids: nothing is counted twice); one that admitted nothing (a blip) only re-syncs itself.
Until all the live ones have, and for one TTL (every live one has sent a heartbeat by then), an
admission needs both the rule above and Redis; then Redis counts every lease, and decides alone
again.

A lease Redis expired frees its slot only once an engine reading shows its request ended
(`expired.py`): a gateway paused past the TTL still runs its requests, and the others must not
refill their slots meanwhile.

Limit: a gateway cut off from Redis while the others still reach it (a partition) admits on its
share while the others, once its expired leases have drained (the engine shows their requests
ended), admit the whole capacity: an engine may then run up to that gateway's share over its
capacity, for as long as the cut lasts (what it admits locally is in no table they read).
"""

from __future__ import annotations

import asyncio

from gpuplane.serve.ha.shared_layout import UNREACHABLE, Share, SharedInstance, slot_key
from gpuplane.serve.ha.shared_sync import SharedTableSync
from gpuplane.serve.hooks import SharedRouter
from gpuplane.serve.slots import Lease


class RedisSlotTable(SharedTableSync):
    """Admissions of every model of one gateway, committed in Redis.

    The router calls `commit` once its own view granted a slot (True: keep it), and `release`
    once per lease on every path (idempotent, never fails, never waits). `start` before the
    first request; `stop` at shutdown."""

    def attach(self, router: SharedRouter) -> None:
        """Count the router's instances in this table (the router calls it when made)."""
        for inst in router.slots.instances:
            key = slot_key(self.options.prefix, router.name, inst.id)
            self._instances[router.name, inst.id] = SharedInstance(
                router, inst.id, inst.url, key, inst.capacity
            )
        self._show_all()

    # -- the router's side ------------------------------------------------------------------

    async def commit(self, model: str, lease: Lease) -> bool:
        """Is the slot the router's view granted `lease` free in the shared table (and within
        this gateway's local allowance while the table is not whole)? True: the lease is held."""
        inst = self._instances[model, lease.instance_id]
        lease_id = self._lease_id(lease)
        if self.state is not Share.SHARED and self.state is not Share.RESYNC:
            return self._take_locally(inst, lease_id)
        if self.state is Share.RESYNC and not self._within_allowance(inst):
            self._show(inst)
            return False
        keys = [self._keys["incarnation"], self._keys["epochs"], inst.key]
        args: list[str | int] = [self.incarnation, self.options.gateway_id, self.epoch]
        inst.pending += 1
        sent_at = self.clock()
        try:
            status, open_, *holders = await self._once_more(
                lambda: self._timed("acquire", keys, [*args, lease_id, inst.capacity, self._ttl_ms])
            )
        except UNREACHABLE as exc:
            inst.pending -= 1
            self._unreachable(exc)
            self._unreleased.add((inst.key, lease_id))  # it may have landed before the error
            return self._take_locally(inst, lease_id)
        except asyncio.CancelledError:  # the caller left; the script may have run
            inst.pending -= 1
            self._forget(inst, lease_id)
            raise
        inst.pending -= 1
        if status == -3:
            self._fence()
        elif status == -2:
            self._set_state(Share.RESYNC)  # the acquire did not land
            return False
        self._observe(inst, open_, holders)
        if status == 1 and not self.leases.in_time(sent_at, self.clock()):
            self._forget(inst, lease_id)  # answered after its TTL: Redis may have expired it
        elif status == 1 and (self.state is Share.SHARED or self.state is Share.RESYNC):
            # granted by Redis in the incarnation it named (held before the table stopped being
            # whole, or within the allowance checked above)
            inst.held[lease_id] = self.clock()
            self._show(inst)
            return True
        elif status == 1:  # the state changed while it asked
            self._forget(inst, lease_id)
        self._show(inst)
        return False

    def release(self, model: str, lease: Lease) -> None:
        """The lease's slot is free (idempotent)."""
        inst = self._instances[model, lease.instance_id]
        lease_id = self._lease_id(lease)
        if inst.held.pop(lease_id, None) is not None:
            inst.seen = max(0, inst.seen - 1)
            self._forget(inst, lease_id)

    def _take_locally(self, inst: SharedInstance, lease_id: str) -> bool:
        """Admit on the local allowance alone (registered in Redis on its return)."""
        if self._within_allowance(inst):
            inst.held[lease_id] = self.clock()
            self._took_locally = self._took_locally or self.state is Share.LOCAL
            self._unreleased.discard((inst.key, lease_id))
            return True
        self._show(inst)
        return False

    def report(self) -> dict[str, object]:
        """`/admin/state`'s `ha` part."""
        return {
            "mode": "shared",
            "role": self.state.value,
            "gateway_id": self.options.gateway_id,
            "epoch": self.epoch,
            "gateways": list(self.gateways),
            "members": list(self.members),
            "fenced_writes": self.fenced_writes,
        }
