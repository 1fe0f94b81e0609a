"""The shared slot table's state and what every part of it uses: this gateway's view of each
instance (its allowance while the table is not whole, the slots the others hold, shown to the
router), the state transitions, releases sent to Redis, and the Redis call wrappers. The router's
side is `shared.py`'s `RedisSlotTable`, the background sync `shared_sync.py`'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError
from redis.retry import Retry

from gpuplane.serve.ha.lapse import LeaseClock
from gpuplane.serve.ha.loads import LoadReader
from gpuplane.serve.ha.local import local_share
from gpuplane.serve.ha.shared_layout import (
    UNREACHABLE,
    Share,
    SharedInstance,
    SharedOptions,
    load_scripts,
    table_keys,
)
from gpuplane.serve.slots import Lease

log = logging.getLogger("gpuplane.gateway")
T = TypeVar("T")


class SharedTableBase:
    """The table's state, views and Redis helpers (see the module)."""

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
        self._keys = table_keys(options.prefix)
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
        self._instances: dict[tuple[str, str], SharedInstance] = {}
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

    def _forget(self, inst: SharedInstance, lease_id: str) -> None:
        """Remove the lease from Redis now (and at every sync until that succeeds)."""
        self._unreleased.add((inst.key, lease_id))
        if self.state is not Share.LOCAL:
            task = asyncio.get_running_loop().create_task(self._remove(inst.key, lease_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _remove(self, key: str, lease_id: str) -> None:
        try:
            await self._scripts["release"]([key], [lease_id])
        except UNREACHABLE as exc:
            self._unreachable(exc)  # it expires by its TTL, or goes at the next sync
        else:
            self._unreleased.discard((key, lease_id))

    def _allowance(self, inst: SharedInstance) -> int:
        """How many leases this gateway may hold on the instance while the table is not whole:
        its local share less the most the others may hold beyond theirs (see the module)."""
        if self.state is Share.FENCED or inst.bound is None:
            return 0
        share = local_share(inst.capacity, self.members, self.options.gateway_id)
        return max(0, share - inst.bound)

    def _within_allowance(self, inst: SharedInstance) -> bool:
        """May one more lease be taken on the instance without Redis's word alone?"""
        return len(inst.held) + inst.pending < self._allowance(inst)

    def _observe(self, inst: SharedInstance, open_: int, holders: Sequence[bytes]) -> None:
        """The instance's set holds these lease ids now, and `open_` expired ones still count."""
        inst.seen, inst.open = len(holders), int(open_)

    def _others(self, inst: SharedInstance) -> int:
        """Slots of the instance this gateway may not take, beyond its own leases."""
        shared = max(0, inst.seen + inst.open - len(inst.held))
        if self.state is Share.SHARED:
            return shared
        local = inst.capacity - self._allowance(inst)
        return max(shared, local) if self.state is Share.RESYNC else local

    def _show(self, inst: SharedInstance) -> None:
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

    @property
    def settle_s(self) -> float:
        """How long after leaving the shared table an engine's reading counts: by then every
        request admitted before has reached its engine (the module's assumption)."""
        return self.options.sync_s + self.options.timeout_s

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
