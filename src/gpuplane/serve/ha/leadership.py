"""Primary/standby for one gateway process: the lease loop, and what a change of role does.

Every `renew_s` the loop claims the leader lease, and a standby also the moment the leader's
lease runs out by the store's clock (`Election.next_claim_at`). A standby keeps probing its
instances (the gateway's prober runs in every role) and admits nothing: `refusal()` tells the
routers why, so a request gets 503 with `Retry-After`. On winning the lease it rebuilds before
admitting: the previous leader's journal and each engine's running count (`rebuild.py`) become
slots held by others; only then does `/readyz` answer 200. While it leads it writes its journal
after each renewal and lowers the inherited slots as the engines finish them. It stops
admitting on its own at the election's deadline, and when the store refuses a write as fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from gpuplane.engines.base import EngineAdapter
from gpuplane.errors import ConfigError
from gpuplane.serve.errors import Rejection
from gpuplane.serve.ha.forward import (
    FORWARDED,
    SECRET_ENV,
    ForwardToLeader,
    load_secret,
    signed_tenant,
)
from gpuplane.serve.ha.lease import Change, Election, Fenced, NotAdmitting, StoreUnavailable
from gpuplane.serve.ha.loads import EngineLoads, Key
from gpuplane.serve.ha.rebuild import (
    Counts,
    decode_journal,
    drained,
    encode_journal,
    inherited,
)
from gpuplane.serve.ha.settings import HaConfig
from gpuplane.serve.ha.store import LeaseStore, make_store
from gpuplane.serve.router import ModelRouter

log = logging.getLogger("gpuplane.gateway.ha")


@dataclass(slots=True)
class HaStats:
    """Counters for `/admin/state` and `/metrics`."""

    elected: int = 0  # times this gateway became leader
    lost: int = 0  # times it stopped leading (deadline, another holder, fenced)
    fenced_writes: int = 0  # journal writes the store refused
    store_errors: int = 0  # claims the store did not answer


def holder_name(cfg: HaConfig) -> str:
    """This process's name in the lease: the configured id (or host-pid) and a random tag, so
    that a restarted gateway under the same id never renews its predecessor's lease."""
    return f"{cfg.gateway_id or f'{socket.gethostname()}-{os.getpid()}'}-{secrets.token_hex(3)}"


class Leadership:
    def __init__(
        self,
        cfg: HaConfig,
        routers: Mapping[str, ModelRouter],
        adapters: Mapping[str, EngineAdapter],
        *,
        store: LeaseStore | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics_timeout_s: float = 1.0,
        forward_timeout: httpx.Timeout | None = None,
    ) -> None:
        self.cfg = cfg
        self.routers = routers
        self.store = store or make_store(cfg)
        self.clock = clock
        self.holder = holder_name(cfg)
        self.url = cfg.advertise_url  # set by the server once it listens, unless configured
        self.election = Election(self.holder, cfg.stop_margin_s)
        self.stats = HaStats()
        self.inherited: Counts = {}
        self.loads = EngineLoads(adapters, metrics_timeout_s)
        # a standby's client to the leader, when it forwards (gateway.ha.proxy_to_leader)
        # the group's shared secret, signing the tenant a standby forwards (`forward.py`)
        self.secret = load_secret(cfg.forward_secret_file)
        if cfg.proxy_to_leader and self.secret is None:
            raise ConfigError(
                "gateway.ha.proxy_to_leader needs a secret every gateway of the group shares, "
                f"to sign the tenant a standby forwards: set ${SECRET_ENV} or "
                "gateway.ha.forward_secret_file on each"
            )
        self.forwarder = (
            httpx.AsyncClient(timeout=forward_timeout or httpx.Timeout(600.0, connect=5.0))
            if cfg.proxy_to_leader
            else None
        )
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._stopped = False
        self._hold_all()  # a standby to begin with

    # -- what the request path asks -------------------------------------------------------

    def refusal(self) -> str | None:
        """None when this gateway admits now, else the message a refused request gets."""
        why = self.election.can_admit(self.clock())
        if why is None:
            return None
        if why is NotAdmitting.REBUILDING:
            return "this gateway has just become leader and is rebuilding its slot table; retry"
        leader = self.election.leader
        if leader is None or leader.holder == self.holder or leader.ttl_s <= 0:
            return "no gateway leads right now (a takeover is under way); retry"
        at = f" at {leader.url}" if leader.url else ""
        return f"this gateway is a standby; the leader is {leader.holder}{at}: send it there"

    def forward(
        self, path: str, body: bytes, headers: dict[str, str], tenant: str
    ) -> ForwardToLeader | None:
        """The request sent on to the leader as `tenant` (the one this standby resolved), when
        this standby forwards and knows where the leader serves (never a request another
        gateway already forwarded)."""
        url = self.leader_url()
        if self.forwarder is None or self.secret is None or url is None or FORWARDED in headers:
            return None
        return ForwardToLeader(
            self.forwarder,
            url.rstrip("/") + path,
            path,
            body,
            headers,
            self.holder,
            tenant,
            self.secret,
        )

    def forwarded_tenant(self, path: str, body: bytes, headers: Mapping[str, str]) -> str | None:
        """The tenant another gateway of the group named for a request it forwarded, if signed
        with the group's secret; None otherwise (the caller refuses the request)."""
        return signed_tenant(self.secret, headers, path, body)

    def leader_url(self) -> str | None:
        """Where the leader serves, when another gateway leads and said so."""
        leader = self.election.leader
        if leader is None or leader.holder == self.holder or leader.ttl_s <= 0:
            return None
        return leader.url

    def state(self) -> dict[str, object]:
        """`/admin/state`'s `ha` part."""
        now = self.clock()
        why = self.election.can_admit(now)
        leader = self.election.leader
        return {
            "mode": "primary_standby",
            "role": "leader" if why is None else why.value,
            "holder": self.holder,
            "epoch": self.election.epoch,
            "leader": None if leader is None else leader.holder,
            "leader_url": None if leader is None else leader.url,
            "inherited": sum(self.inherited.values()),
            "elected": self.stats.elected,
            "lost": self.stats.lost,
            "fenced_writes": self.stats.fenced_writes,
            "store_errors": self.stats.store_errors,
        }

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gpuplane-leadership")

    async def step_down(self) -> None:
        """Stop leading and give the lease up, so a standby takes over now (shutdown, first
        thing). Idempotent; requests already admitted run on."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        epoch = self.election.epoch
        self._lose(self.election.fence())
        if epoch is not None:
            await self.store.release(self.holder, epoch)

    async def aclose(self) -> None:
        """Step down, then stop: a stopped gateway counts nothing as held (idempotent)."""
        await self.step_down()
        if self._watchdog is not None:
            self._watchdog.cancel()
        for router in self.routers.values():
            for inst in router.instances:
                router.set_others(inst.id, 0)
        await self.loads.aclose()
        if self.forwarder is not None:
            await self.forwarder.aclose()
        await self.store.aclose()

    # -- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            began = self.clock()
            await self.tick()
            next_at = self.election.next_claim_at(began, self.cfg.renew_s)
            await asyncio.sleep(max(0.0, next_at - self.clock()))

    async def tick(self) -> None:
        """One claim and what follows from its answer (the loop calls it every `renew_s`)."""
        sent = self.clock()
        try:
            lease = await self.store.claim(self.holder, self.url, self.cfg.lease_ttl_s)
        except StoreUnavailable as exc:
            self.stats.store_errors += 1
            if self.election.leading(self.clock()):
                log.warning("could not renew the leader lease: %s", exc)
            lease = None
        change = self.election.answered(sent, lease, self.clock())
        self._arm_watchdog()
        if change is Change.LOST:
            self._lose(change)
        elif change is Change.ELECTED:
            assert self.election.epoch is not None
            await self._take_over(self.election.epoch)
        epoch = self.election.epoch
        if epoch is not None and self.election.can_admit(self.clock()) is None:
            await self._journal(epoch)
            if self.inherited:
                await self._drain()

    async def _take_over(self, epoch: int) -> None:
        self.stats.elected += 1
        log.warning("leading in epoch %d: rebuilding the slot table", epoch)
        try:
            journal = await self.store.read_journal()
        except StoreUnavailable:
            journal = None
        counts = decode_journal(journal.data) if journal and journal.epoch < epoch else {}
        running = await self._running()
        self.inherited = {}
        for model, router in self.routers.items():
            for inst in router.instances:
                key = (model, inst.id)
                self.inherited[key] = inherited(inst.capacity, counts.get(key), running[key])
        if self.election.epoch != epoch:
            return  # lost while rebuilding: nothing to admit
        for (model, iid), n in self.inherited.items():
            self.routers[model].set_others(iid, n)
        self.inherited = {k: n for k, n in self.inherited.items() if n}
        self.election.rebuilt(epoch)
        log.warning(
            "admitting in epoch %d; %d slot(s) held by the previous leader's requests",
            epoch,
            sum(self.inherited.values()),
        )

    def _lose(self, change: Change) -> None:
        """No longer leading: admit nothing until a takeover's rebuild (idempotent)."""
        if change is not Change.LOST:
            return
        self.stats.lost += 1
        log.warning("no longer leading: admitting nothing")
        self._hold_all()
        for router in self.routers.values():
            router.turn_away(Rejection.NOT_LEADER, self.refusal() or "no longer leading; retry")

    def _hold_all(self) -> None:
        """Count every slot as held by others, so nothing is placed until a rebuild."""
        self.inherited = {}
        for router in self.routers.values():
            for inst in router.instances:
                router.set_others(inst.id, inst.capacity)

    async def _journal(self, epoch: int) -> None:
        in_flight = {
            (model, inst.id): inst.in_flight
            for model, router in self.routers.items()
            for inst in router.instances
        }
        try:
            await self.store.write_journal(epoch, encode_journal(in_flight))
        except Fenced as exc:
            self.stats.fenced_writes += 1
            log.error("%s", exc)
            self._lose(self.election.fence())
        except StoreUnavailable:
            self.stats.store_errors += 1  # the next renewal decides

    async def _drain(self) -> None:
        running = await self._running(set(self.inherited))
        for key, held in list(self.inherited.items()):
            left = drained(held, running[key])
            if left != held:
                self.routers[key[0]].set_others(key[1], left)
            if left:
                self.inherited[key] = left
            else:
                del self.inherited[key]

    async def _running(self, only: set[Key] | None = None) -> dict[Key, int | None]:
        """Requests each engine holds (running + waiting); None when it does not say."""
        return await self.loads.read(
            [
                (model, inst.id, inst.url)
                for model, router in self.routers.items()
                for inst in router.instances
                if only is None or (model, inst.id) in only
            ]
        )

    def _arm_watchdog(self) -> None:
        """Act on the deadline when it passes, even if the store has not answered by then."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.election.epoch is None or math.isinf(self.election.deadline):
            return
        delay = max(0.0, self.election.deadline - self.clock())
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(
            delay, lambda: self._lose(self.election.expire(self.clock()))
        )
