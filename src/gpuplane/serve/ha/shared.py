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

When Redis is unreachable the table fails closed: each gateway admits on its local share of
every instance (`local_share`: capacity // live gateways, the remainder spread by rank), counting
the leases it already holds. On its return the gateway starts a new incarnation of the table, so
every gateway registers its leases again (the same ids: nothing is counted twice); until all the
live gateways have, and for one TTL (every live one has sent a heartbeat by then), admissions
need both Redis and the local share. Limit: a gateway cut off from Redis while the others still
reach it may exceed its share's worth of what the others admit, for as long as the cut lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from typing import Any, Protocol, TypeVar

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisError
from redis.retry import Retry

from gpuplane.serve.slots import Lease, SlotTable

log = logging.getLogger("gpuplane.gateway")
T = TypeVar("T")

# What a Redis call may raise when the server is down, slow or restarting.
_UNREACHABLE = (RedisError, OSError)


class Share(StrEnum):
    """How this gateway admits now."""

    SHARED = "shared"  # Redis decides every admission
    RESYNC = "resync"  # Redis is back: leases are registered again; Redis and the local share
    LOCAL = "local"  # Redis is unreachable: the local share alone (fail closed)
    FENCED = "fenced"  # a newer process runs under this gateway id: admits nothing


def local_share(capacity: int, gateways: Sequence[str], me: str, offset: int) -> int:
    """This gateway's part of an instance's `capacity` while the table is unreachable: the
    same cut every gateway makes from the same list, summing to exactly `capacity`.

    `capacity // len(gateways)` each, and one more to the `capacity % len(gateways)` gateways
    after `offset` in id order (`offset`: the instance's index, so that with fewer slots than
    gateways each gateway gets some instance); 0 for a gateway not in the list (one that never
    reached Redis does not know who else admits)."""
    if me not in gateways:
        return 0
    ranked = sorted(gateways)
    base, extra = divmod(capacity, len(ranked))
    return base + ((ranked.index(me) - offset) % len(ranked) < extra)


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
    counts are read and the heartbeat sent; `timeout_s`: the longest a Redis call may take."""

    url: str
    gateway_id: str
    ttl_s: float
    renew_s: float
    sync_s: float
    timeout_s: float
    prefix: str = "gpuplane"


class SharedRouter(Protocol):
    """What the table needs of a model's router."""

    name: str
    slots: SlotTable

    def set_others(self, instance_id: str, n: int) -> None: ...


@dataclass(slots=True)
class _Instance:
    router: SharedRouter
    id: str
    key: str
    capacity: int
    offset: int
    held: set[str] = field(default_factory=set)  # this gateway's leases (their ids in Redis)
    seen: int = 0  # the set's size, as last answered
    by_gateway: Counter[str] = field(default_factory=Counter)  # its leases per gateway, then
    # `by_gateway` when the table was last whole: until it is again, a gateway that has not yet
    # registered its leases anew (Redis lost them) is counted as holding at least those
    before: Counter[str] = field(default_factory=Counter)


class RedisSlotTable:
    """Admissions of every model of one gateway, committed in Redis.

    The router calls `commit` once its own view granted a slot (True: keep it), and `release`
    once per lease on every path (idempotent, never fails, never waits). `start` before the
    first request; `stop` at shutdown."""

    def __init__(self, options: SharedOptions, client: aioredis.Redis | None = None) -> None:
        self.options = options
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
        # the live gateways while the table was last whole: the shares are cut among these, the
        # same cut every gateway makes after an outage
        self.members: tuple[str, ...] = ()
        self._synced_with: frozenset[str] = frozenset()  # live ones registered anew
        self.incarnation = ""  # the one this gateway's leases are registered under
        self._synced = False
        self._instances: dict[tuple[str, str], _Instance] = {}
        self._unreleased: set[tuple[str, str]] = set()  # (key, lease id) to remove from Redis
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._renewed_at = 0.0

    @property
    def _ttl_ms(self) -> int:
        return int(self.options.ttl_s * 1000)

    def attach(self, router: SharedRouter) -> None:
        """Count the router's instances in this table (the router calls it when made)."""
        for offset, inst in enumerate(router.slots.instances):
            key = f"{self.options.prefix}:slots:{router.name}:{inst.id}"
            self._instances[router.name, inst.id] = _Instance(
                router, inst.id, key, inst.capacity, offset
            )
        self._show_all()

    # -- the router's side ------------------------------------------------------------------

    async def commit(self, model: str, lease: Lease) -> bool:
        """Is the slot the router's view granted `lease` free in the shared table (and within
        this gateway's local share while the table is not whole)? True: the lease is held."""
        inst = self._instances[model, lease.instance_id]
        lease_id = self._lease_id(lease)
        if self.state is Share.LOCAL or self.state is Share.FENCED:
            return self._take_locally(inst, lease_id)
        capacity = inst.capacity - self._unregistered(inst)
        keys = [self._keys["incarnation"], self._keys["epochs"], inst.key]
        args: list[str | int] = [self.incarnation, self.options.gateway_id, self.epoch]
        try:
            status, _, *holders = await self._once_more(
                lambda: self._scripts["acquire"](keys, [*args, lease_id, capacity, self._ttl_ms])
            )
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            self._unreleased.add((inst.key, lease_id))  # it may have landed before the error
            return self._take_locally(inst, lease_id)
        except asyncio.CancelledError:  # the caller left; the script may have run
            self._forget(inst, lease_id)
            raise
        if status == -3:
            self._fence()
        elif status == -2:
            self._set_state(Share.RESYNC)
            return self._take_locally(inst, lease_id)
        self._observe(inst, holders)
        if status == 1 and (self.state is Share.SHARED or self.state is Share.RESYNC):
            inst.held.add(lease_id)
            self._show(inst)
            return True
        if status == 1:  # the state changed while it asked
            self._forget(inst, lease_id)
        self._show(inst)
        return False

    def release(self, model: str, lease: Lease) -> None:
        """The lease's slot is free (idempotent)."""
        inst = self._instances[model, lease.instance_id]
        lease_id = self._lease_id(lease)
        if lease_id in inst.held:
            inst.held.discard(lease_id)
            inst.seen = max(0, inst.seen - 1)
            inst.by_gateway[self.options.gateway_id] -= 1
            self._forget(inst, lease_id)

    def _take_locally(self, inst: _Instance, lease_id: str) -> bool:
        """Admit on the local share alone (registered in Redis on its return)."""
        if len(inst.held) < self._allowance(inst):
            inst.held.add(lease_id)
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
        its local share, less what the other gateways held beyond theirs when it last looked
        (they only drain those, and admit again only within their own shares; a gateway that
        is not live has a share of 0)."""
        if self.state is Share.FENCED:
            return 0
        me, live = self.options.gateway_id, self.members
        beyond = sum(
            max(0, n - local_share(inst.capacity, live, gateway, inst.offset))
            for gateway, n in (inst.by_gateway | inst.before).items()
            if gateway != me
        )
        return max(0, local_share(inst.capacity, live, me, inst.offset) - beyond)

    def _unregistered(self, inst: _Instance) -> int:
        """While re-syncing: the most leases on the instance that gateways which have not yet
        registered theirs anew may hold beyond what Redis shows of them (what they held when
        the table was last whole, or their local share if more: they may have admitted on it)."""
        if self.state is not Share.RESYNC:
            return 0
        me, members = self.options.gateway_id, self.members
        suspects = set(members) | set(inst.before) | set(self.gateways)
        return sum(
            max(
                0,
                max(inst.before[g], local_share(inst.capacity, members, g, inst.offset))
                - inst.by_gateway[g],
            )
            for g in suspects - self._synced_with - {me}
        )

    def _observe(self, inst: _Instance, holders: Sequence[bytes]) -> None:
        """The instance's set holds these lease ids now."""
        inst.seen = len(holders)
        inst.by_gateway = Counter(lease.rsplit(b"|", 2)[0].decode() for lease in holders)

    def _others(self, inst: _Instance) -> int:
        """Slots of the instance this gateway may not take, beyond its own leases."""
        shared = max(0, inst.seen - len(inst.held))
        if self.state is Share.SHARED:
            return shared
        if self.state is Share.RESYNC:
            return shared + self._unregistered(inst)
        return inst.capacity - self._allowance(inst)

    def _show(self, inst: _Instance) -> None:
        inst.router.set_others(inst.id, self._others(inst))

    def _show_all(self) -> None:
        for inst in self._instances.values():
            self._show(inst)

    def _set_state(self, state: Share) -> None:
        if self.state is Share.FENCED or state is self.state:
            return
        log.warning("shared slot table: %s -> %s", self.state.value, state.value)
        if state is not Share.SHARED:
            self._synced = False
        for inst in self._instances.values():  # what the others held when it was last whole
            if self.state is Share.SHARED:
                inst.before = inst.by_gateway.copy()
            elif state is Share.SHARED:
                inst.before = Counter()
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
        log.error(
            "another gateway process runs under the id '%s' with a newer epoch; this one "
            "admits nothing: give every gateway its own gateway.ha.gateway_id",
            self.options.gateway_id,
        )
        self.state = Share.FENCED
        self._show_all()

    def _lease_id(self, lease: Lease) -> str:
        return f"{self.options.gateway_id}|{self.epoch}|{lease.id}"

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

    async def drained(self) -> None:
        """Wait until the releases sent so far have reached Redis (or failed)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.options.sync_s)
            await self.sync()

    async def sync(self) -> None:
        """One round: heartbeat, renew (or register again) this gateway's leases, read every
        instance's count, then update the routers' views and the state."""
        try:
            await self._once_more(self._sync)
        except _UNREACHABLE as exc:
            self._unreachable(exc)

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
        if self.state is Share.FENCED:
            return
        gateway = self.options.gateway_id
        if not self.epoch:
            self.epoch = int(await self.client.hincrby(self._keys["epochs"], gateway, 1))
        k = self._keys
        was_local = self.state is Share.LOCAL and bool(self.incarnation)
        synced = self.incarnation if self._synced else ""
        answer = await self._scripts["heartbeat"](
            [k["incarnation"], k["born"], k["live"], k["synced"]],
            [gateway, self._ttl_ms, synced, secrets.token_hex(8), "1" if was_local else "0"],
        )
        incarnation, age_ms, n = answer[0].decode(), int(answer[1]), int(answer[2])
        self.gateways = tuple(g.decode() for g in answer[3 : 3 + n])
        self._synced_with = frozenset(g.decode() for g in answer[3 + n :])
        all_synced = len(self._synced_with) == n
        if self.state is Share.SHARED:
            self.members = self.gateways
        if incarnation != self.incarnation or was_local:
            self.incarnation, self._synced = incarnation, False
            self._set_state(Share.RESYNC)
        now = asyncio.get_running_loop().time()
        renew = not self._synced or now - self._renewed_at >= self.options.renew_s
        await self._renew(renew)
        if renew:
            self._renewed_at = now
        if self.state is Share.RESYNC and self._synced and all_synced and age_ms >= self._ttl_ms:
            self.members = self.gateways
            self._set_state(Share.SHARED)
        self._show_all()

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
        for inst, (status, _added, *holders) in zip(instances, results, strict=False):
            if status == -3:
                self._fence()
                return
            if status == -2:  # a new incarnation began between the heartbeat and now
                self._set_state(Share.RESYNC)
                return
            self._observe(inst, holders)
        self._unreleased.difference_update(unreleased)
        if renew:
            self._synced = True
