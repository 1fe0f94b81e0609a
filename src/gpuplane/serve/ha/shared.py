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
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisError
from redis.retry import Retry

from gpuplane.serve.ha import expired
from gpuplane.serve.ha.lapse import LeaseClock
from gpuplane.serve.ha.loads import LoadReader
from gpuplane.serve.ha.local import local_share
from gpuplane.serve.hooks import SharedRouter
from gpuplane.serve.slots import Lease

log = logging.getLogger("gpuplane.gateway")
T = TypeVar("T")

# What a Redis call may raise when the server is down, slow or restarting.
_UNREACHABLE = (RedisError, OSError)


class Share(StrEnum):
    """How this gateway admits now."""

    SHARED = "shared"  # Redis decides every admission
    RESYNC = "resync"  # Redis is back: leases are registered again; Redis and the allowance
    LOCAL = "local"  # Redis is unreachable: the local allowance alone (fail closed)
    FENCED = "fenced"  # a newer process runs under this gateway id: admits nothing


def load_scripts() -> dict[str, str]:
    """`shared.lua`'s scripts by name, each with the shared `now` helper in front."""
    text = resources.files(__package__).joinpath("shared.lua").read_text()
    parts = {}
    for chunk in text.split("\n--- ")[1:]:
        name, _, body = chunk.partition("\n")
        parts[name.strip()] = body
    helper = parts.pop("now")
    return {name: helper + body for name, body in parts.items()}


@dataclass(frozen=True, slots=True)
class SharedOptions:
    """`url`: the Redis server; `ttl_s`: a lease (and a heartbeat) not renewed for this long
    expires; `renew_s`: how often held leases are renewed; `sync_s`: how often the others'
    counts are read and the heartbeat sent; `timeout_s`: the longest a Redis call may take;
    `deadline_s`: the longest a request runs (`expired.py`)."""

    url: str
    gateway_id: str
    ttl_s: float
    renew_s: float
    sync_s: float
    timeout_s: float
    prefix: str = "gpuplane"
    deadline_s: float = 600.0  # gateway.request_timeout_s: no request runs longer


@dataclass(slots=True)
class _Instance:
    router: SharedRouter
    id: str
    url: str
    key: str
    capacity: int
    held: dict[str, float] = field(default_factory=dict)  # this gateway's leases → granted at
    pending: int = 0  # acquires sent to Redis and not yet answered
    seen: int = 0  # the set's size, as last answered
    open: int = 0  # its expired leases whose requests may still run, as last answered
    # the least load its engine reported since the table stopped being whole (None: no
    # reading yet): the most the other gateways can hold beyond their shares from then on
    bound: int | None = None


class RedisSlotTable:
    """Admissions of every model of one gateway, committed in Redis.

    The router calls `commit` once its own view granted a slot (True: keep it), and `release`
    once per lease on every path (idempotent, never fails, never waits). `start` before the
    first request; `stop` at shutdown."""

    def __init__(
        self,
        options: SharedOptions,
        client: aioredis.Redis | None = None,
        loads: LoadReader | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.clock = clock  # monotonic: lease ages, settle times
        self.loads = loads  # the engines' own counts (None: none is read, no local admission)
        self.client = client or aioredis.from_url(
            options.url,
            socket_timeout=options.timeout_s,
            socket_connect_timeout=options.timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        p = options.prefix
        self._keys = {
            "incarnation": f"{p}:incarnation",
            "born": f"{p}:incarnation:born",
            "epochs": f"{p}:epochs",
            "live": f"{p}:gateways",
            "synced": f"{p}:gateways:synced",
        }
        self._scripts = {n: self.client.register_script(s) for n, s in load_scripts().items()}
        self.state = Share.LOCAL  # until the first heartbeat: no membership, a share of 0
        self.epoch = 0
        self.gateways: tuple[str, ...] = ()  # live now, as the last heartbeat answered
        # the live gateways while the table was last whole (without this one while it is too
        # new to be counted by all): the shares are cut among these
        self.members: tuple[str, ...] = ()
        self._joined_ms: int | None = None  # Redis time of this process's first heartbeat
        self._beat_ms = 0  # and of its latest
        self._left_at = 0.0  # loop time the table last stopped being whole
        self._took_locally = False  # admitted while Redis was unreachable, since last back
        self._synced_with: frozenset[str] = frozenset()  # live ones registered anew
        self.incarnation = ""  # the one this gateway's leases are registered under
        self._synced = False
        self._instances: dict[tuple[str, str], _Instance] = {}
        self._unreleased: set[tuple[str, str]] = set()  # (key, lease id) to remove from Redis
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self.leases = LeaseClock(options.ttl_s, options.sync_s + options.timeout_s)
        # for /metrics: times each state was entered, refusals for an older epoch, and a hook
        # that gets the seconds of each acquire and heartbeat
        self.entered: Counter[Share] = Counter()
        self.fenced_writes = 0
        self.on_round_trip: Callable[[float], None] = lambda seconds: None

    @property
    def _ttl_ms(self) -> int:
        return int(self.options.ttl_s * 1000)

    def attach(self, router: SharedRouter) -> None:
        """Count the router's instances in this table (the router calls it when made)."""
        for inst in router.slots.instances:
            key = f"{self.options.prefix}:slots:{router.name}:{inst.id}"
            self._instances[router.name, inst.id] = _Instance(
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
        except _UNREACHABLE as exc:
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

    def _take_locally(self, inst: _Instance, lease_id: str) -> bool:
        """Admit on the local allowance alone (registered in Redis on its return)."""
        if self._within_allowance(inst):
            inst.held[lease_id] = self.clock()
            self._took_locally = self._took_locally or self.state is Share.LOCAL
            self._unreleased.discard((inst.key, lease_id))
            return True
        self._show(inst)
        return False

    def _forget(self, inst: _Instance, lease_id: str) -> None:
        """Remove the lease from Redis now (and at every sync until that succeeds)."""
        self._unreleased.add((inst.key, lease_id))
        if self.state is not Share.LOCAL:
            task = asyncio.get_running_loop().create_task(self._remove(inst.key, lease_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _remove(self, key: str, lease_id: str) -> None:
        try:
            await self._scripts["release"]([key], [lease_id])
        except _UNREACHABLE as exc:
            self._unreachable(exc)  # it expires by its TTL, or goes at the next sync
        else:
            self._unreleased.discard((key, lease_id))

    # -- views ------------------------------------------------------------------------------

    def _allowance(self, inst: _Instance) -> int:
        """How many leases this gateway may hold on the instance while the table is not whole:
        its local share less the most the others may hold beyond theirs (see the module)."""
        if self.state is Share.FENCED or inst.bound is None:
            return 0
        share = local_share(inst.capacity, self.members, self.options.gateway_id)
        return max(0, share - inst.bound)

    def _within_allowance(self, inst: _Instance) -> bool:
        """May one more lease be taken on the instance without Redis's word alone?"""
        return len(inst.held) + inst.pending < self._allowance(inst)

    def _observe(self, inst: _Instance, open_: int, holders: Sequence[bytes]) -> None:
        """The instance's set holds these lease ids now, and `open_` expired ones still count."""
        inst.seen, inst.open = len(holders), int(open_)

    def _others(self, inst: _Instance) -> int:
        """Slots of the instance this gateway may not take, beyond its own leases."""
        shared = max(0, inst.seen + inst.open - len(inst.held))
        if self.state is Share.SHARED:
            return shared
        local = inst.capacity - self._allowance(inst)
        return max(shared, local) if self.state is Share.RESYNC else local

    def _show(self, inst: _Instance) -> None:
        inst.router.set_others(inst.id, self._others(inst))

    def _show_all(self) -> None:
        for inst in self._instances.values():
            self._show(inst)

    def _set_state(self, state: Share) -> None:
        if self.state is Share.FENCED or state is self.state:
            return
        log.warning("shared slot table: %s -> %s", self.state.value, state.value)
        self.entered[state] += 1
        if state is not Share.SHARED:
            self._synced = False
        if self.state is Share.SHARED:  # the engines' readings from now on decide
            self._left_at = self.clock()
            for inst in self._instances.values():
                inst.bound = None
        self.state = state
        self._show_all()

    def _unreachable(self, exc: BaseException) -> None:
        if self.state is not Share.LOCAL:
            log.error(
                "Redis at %s is unreachable (%s); admitting on this gateway's local share of "
                "each instance until it returns",
                self.options.url,
                exc,
            )
        self._set_state(Share.LOCAL)

    def _fence(self) -> None:
        self.fenced_writes += 1
        if self.state is not Share.FENCED:
            self.entered[Share.FENCED] += 1
        log.error(
            "another gateway process runs under the id '%s' with a newer epoch; this one "
            "admits nothing: give every gateway its own gateway.ha.gateway_id",
            self.options.gateway_id,
        )
        self.state = Share.FENCED
        self._show_all()

    def _lease_id(self, lease: Lease) -> str:
        return f"{self.options.gateway_id}|{self.epoch}|{lease.id}"

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

    # -- the background sync ----------------------------------------------------------------

    async def start(self) -> None:
        """Take an epoch, join, and keep syncing in the background (Redis down: it retries)."""
        await self.sync()
        self._loop = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        await self.drained()
        with contextlib.suppress(*_UNREACHABLE):  # else its heartbeat expires by the TTL
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
        except _UNREACHABLE as exc:
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

    async def _drain(self, loads: LoadReader, model: str, inst: _Instance) -> None:
        on = expired.Target(inst.key, (model, inst.id, inst.url), inst.held, self.settle_s,
                            self.options.deadline_s)  # fmt: skip
        with contextlib.suppress(*_UNREACHABLE):
            inst.open = await expired.drain(
                self.client, self._scripts["drain"], loads, on, self.clock
            )
            self._show(inst)

    @property
    def settle_s(self) -> float:
        """How long after leaving the shared table an engine's reading counts: by then every
        request admitted before has reached its engine (the module's assumption)."""
        return self.options.sync_s + self.options.timeout_s

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

    async def _timed(self, script: str, keys: list[str], args: list[str | int]) -> Any:
        """Run one script, and tell `on_round_trip` how long it took."""
        began = time.perf_counter()
        answer = await self._scripts[script](keys, args)
        self.on_round_trip(time.perf_counter() - began)
        return answer

    async def _once_more(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call`, and once more on fresh connections if the connection broke: pooled ones to
        a server that restarted fail on first use, and that is not an outage. (Both calls are
        idempotent: an acquire of a lease that landed answers it held.)"""
        try:
            return await call()
        except ConnectionError:
            await self.client.connection_pool.disconnect()
            return await call()

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
