"""The shared slot table's background sync: heartbeat, renew (or register again) this gateway's
leases, read every instance's count, fence an older process, handle a lapse past the leases' TTL
(`lapse.py`), and, while the table is not whole, read the engines' loads (`shared.py` has the
design)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

from gpuplane.serve.ha import expired
from gpuplane.serve.ha.loads import LoadReader
from gpuplane.serve.ha.shared_base import SharedTableBase, log
from gpuplane.serve.ha.shared_layout import UNREACHABLE, Share, SharedInstance


class SharedTableSync(SharedTableBase):
    """The table's rounds with Redis and the engines (`start` runs them; `stop` ends them)."""

    async def start(self) -> None:
        """Take an epoch, join, and keep syncing in the background (Redis down: it retries)."""
        await self.sync()
        self._loop = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        await self.drained()
        with contextlib.suppress(*UNREACHABLE):  # else its heartbeat expires by the TTL
            await self._scripts["leave"](
                [self._keys["live"], self._keys["synced"]], [self.options.gateway_id]
            )
        await self.client.aclose()
        if self.loads is not None:
            await self.loads.aclose()

    async def drained(self) -> None:
        """Wait until the releases sent so far have reached Redis (or failed)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.options.sync_s)
            await self.sync()

    async def sync(self) -> None:
        """One round: heartbeat, renew (or register again) this gateway's leases, read every
        instance's count, then update the routers' views and the state; while the table is not
        whole, read the engines' loads too."""
        try:
            await self._once_more(self._sync)
        except UNREACHABLE as exc:
            self._unreachable(exc)
        if self.state is Share.LOCAL or self.state is Share.RESYNC:
            await self._read_engines()
        if self.state is Share.SHARED or self.state is Share.RESYNC:
            await self._drain_expired()

    async def _drain_expired(self) -> None:
        """Read the engines of the instances whose expired leases still count, all at once
        (each within the load reader's timeout, so renewals are not held up), and lower that
        count in Redis to what they show (`expired.py`)."""
        if self.loads is not None:
            lapsed = [(m, inst) for (m, _), inst in self._instances.items() if inst.open]
            await asyncio.gather(*(self._drain(self.loads, m, inst) for m, inst in lapsed))

    async def _drain(self, loads: LoadReader, model: str, inst: SharedInstance) -> None:
        on = expired.Target(inst.key, (model, inst.id, inst.url), inst.held, self.settle_s,
                            self.options.deadline_s)  # fmt: skip
        with contextlib.suppress(*UNREACHABLE):
            inst.open = await expired.drain(
                self.client, self._scripts["drain"], loads, on, self.clock
            )
            self._show(inst)

    async def _read_engines(self) -> None:
        """Lower each instance's `bound` to its engine's load now, once readings count."""
        began = self.clock()
        if began < self._left_at + self.settle_s:
            return
        if self.loads is None:  # nothing to read: no local admission, nothing to wait for
            self.leases.read(began)
            return
        open_ = [
            (key, inst)
            for key, inst in self._instances.items()
            if inst.bound is None or inst.bound > 0
        ]
        if not open_:
            self.leases.read(began)  # every engine was seen idle since the table was left
            return
        left = self._left_at
        read = await self.loads.read([(model, inst.id, inst.url) for (model, _), inst in open_])
        if self._left_at != left:  # the table was whole again and lost since: too early a reading
            return
        self.leases.read(began)
        for key, inst in open_:
            n = read.get(key)
            if n is not None and (inst.bound is None or n < inst.bound):
                inst.bound = n
        self._show_all()

    async def _sync(self) -> None:
        if self.state is Share.FENCED or not self._may_rejoin():
            return
        gateway = self.options.gateway_id
        if not self.epoch:
            self.epoch = int(await self.client.hincrby(self._keys["epochs"], gateway, 1))
        k = self._keys
        was_local = self.state is Share.LOCAL and bool(self.incarnation)
        # back with leases Redis never saw: every gateway registers its own again (else, back
        # from a blip in which it admitted nothing, its leases are all in Redis already)
        fresh = was_local and self._took_locally
        synced = self.incarnation if self._synced else ""
        answer = await self._timed(
            "heartbeat",
            [k["incarnation"], k["born"], k["live"], k["synced"]],
            [gateway, self._ttl_ms, synced, secrets.token_hex(8), "1" if fresh else "0"],
        )
        incarnation, age_ms, now_ms = answer[0].decode(), int(answer[1]), int(answer[2])
        n = int(answer[3])
        self.gateways = tuple(g.decode() for g in answer[4 : 4 + n])
        self._synced_with = frozenset(g.decode() for g in answer[4 + n :])
        all_synced = len(self._synced_with) == n
        if self._joined_ms is None or now_ms - self._beat_ms > self._ttl_ms:
            self._joined_ms = now_ms  # (again: its heartbeat ran out, the others dropped it)
        self._beat_ms = now_ms
        if self.state is Share.SHARED:
            self.members = self._counted()
        if incarnation != self.incarnation or was_local:
            self.incarnation, self._synced, self._took_locally = incarnation, False, False
            self._set_state(Share.RESYNC)
        now = self.clock()
        if self._lapsed(now):
            return
        last = self.leases.renewed_at
        renew = not self._synced or last is None or now - last >= self.options.renew_s
        await self._renew(renew)
        if renew:
            self.leases.renewing(now)
        if self.state is Share.RESYNC and self._synced and all_synced and age_ms >= self._ttl_ms:
            self.members = self._counted()
            self._set_state(Share.SHARED)
        self._show_all()

    def _lapsed(self, now: float) -> bool:
        """Has this gateway missed its leases' TTL (`lapse.py`)? Then it renews nothing and
        leaves the shared table as if Redis were lost, and, back, starts a new incarnation in
        which every gateway registers its leases again and admits on the engines' load until
        all have."""
        holding = any(inst.held for inst in self._instances.values())
        if not self.leases.missed(now, holding):
            return False
        assert self.leases.renewed_at is not None
        log.error(
            "this gateway renewed its leases %.1f s ago, past their TTL of %g s (was it paused "
            "or starved?): Redis has expired them and may have granted their slots to others; "
            "it admits on the engines' load until they show room, then registers them again",
            now - self.leases.renewed_at,
            self.options.ttl_s,
        )
        self._set_state(Share.LOCAL)
        self._left_at = now
        for inst in self._instances.values():
            inst.bound = None
        self._took_locally = True
        self.leases.lapse(now)
        self._show_all()
        return True

    def _may_rejoin(self) -> bool:
        """After a lapse: once the engines have been read (`sync` reads them meanwhile)."""
        if not self.leases.may_rejoin():
            return False
        if self.leases.lapsed_at is not None:
            self.leases.rejoined()
        return True

    def _counted(self) -> tuple[str, ...]:
        """The live gateways to cut the local shares among: this one only once it has been
        live for `settle_s` (every other live gateway has seen its heartbeat by then, so every
        gateway that takes a share counts it)."""
        me = self.options.gateway_id
        assert self._joined_ms is not None
        if self._beat_ms - self._joined_ms >= self.settle_s * 1000:
            return self.gateways
        return tuple(g for g in self.gateways if g != me)

    async def _renew(self, renew: bool) -> None:
        """Renew every held lease (`renew`), else only count; drop what Redis has released."""
        k = self._keys
        pipe = self.client.pipeline(transaction=False)
        head: list[str | int] = [
            self.incarnation,
            self.options.gateway_id,
            self.epoch,
            self._ttl_ms,
        ]
        instances = list(self._instances.values())
        for inst in instances:
            leases = sorted(inst.held) if renew else []
            await self._scripts["renew"](
                [k["incarnation"], k["epochs"], inst.key], [*head, *leases], client=pipe
            )
        unreleased = sorted(self._unreleased)
        for key, lease_id in unreleased:
            await self._scripts["release"]([key], [lease_id], client=pipe)
        results: list[Any] = await pipe.execute()
        for inst, (status, open_, *holders) in zip(instances, results, strict=False):
            if status == -3:
                self._fence()
                return
            if status == -2:  # a new incarnation began between the heartbeat and now
                self._set_state(Share.RESYNC)
                return
            self._observe(inst, open_, holders)
        self._unreleased.difference_update(unreleased)
        if renew:
            self._synced = True
