"""Discovery: the gateway takes models and instances from a control plane's deployments.

A watch by long poll (`GET /deployments/watch?resource_version=V&timeout_s=T`): the control plane
answers as soon as its endpoints differ from version V, or with V again after T seconds; the gateway
then asks again with the version it holds. Each answer is applied as a difference (`apply`, no I/O):
a new deployment gets a router, a new instance is added unready and admitted to only once it answers
its engine's health probe (the gateway's prober), and an instance no longer listed (scaled down,
replaced, deleted) drains: no new requests, and it leaves once its last lease is released (its
engine is stopped by the control plane after the deployment's `drain_timeout_s`). A model that the
gateway's own config lists is never touched. When the control plane cannot be reached, what was
discovered keeps serving and the watch retries with a pause that doubles up to `MAX_RETRY_S`. While
none of a discovered deployment's instances is ready (it scaled to zero, or they all crashed or were
lost with their node or cluster), its requests wait in the fair queue for the instances the control
plane starts or replaces, up to its `hold_s` (an autoscaled deployment's `max_queue_wait_s`) or else
the gateway's own `queue.timeout_s`, instead of being refused (not once it is being deleted: its
`hold` is false); then 503 with `Retry-After`. Every `REPORT_S` the gateway also reports each
discovered model's exact slot use (leases held, requests queued, the oldest one's wait, how long it
has been idle, ready instances, leases per instance it still has) to `POST /deployments/load`: the
control plane's autoscaler acts on it (a request held at zero is the demand that starts an
instance), and an instance drained here and gone from every report is stopped without waiting out
its drain timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from gpuplane.serve.router import ModelRouter
from gpuplane.serve.settings import ModelConfig

log = logging.getLogger("gpuplane.gateway")

WATCH_TIMEOUT_S = 30.0  # the control plane answers within this even when nothing changed
MAX_RETRY_S = 10.0
REPORT_S = 1.0  # how often the discovered models' slot use goes to the control plane


class Routers(Protocol):
    """What discovery needs of the gateway: its routers by model name, to add instances to and
    drain them from, and a way to route a model it discovers (`Gateway` is one)."""

    @property
    def routers(self) -> Mapping[str, ModelRouter]: ...

    def add_model(self, model: ModelConfig) -> ModelRouter: ...


class Discovery:
    def __init__(
        self,
        gateway: Routers,
        control: str,
        *,
        watch_timeout_s: float = WATCH_TIMEOUT_S,
        report_s: float = REPORT_S,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`token`: the control plane's API token (its deployment routes need an admin's)."""
        self.gateway = gateway
        self.control = control.rstrip("/")
        self.watch_timeout_s = watch_timeout_s
        self.report_s = report_s
        self.gateway_id = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.resource_version: str | None = None
        self.owned: set[str] = set()  # models this discovery made (not the config's)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(watch_timeout_s + 10.0, connect=5.0),
            transport=transport,
            headers={"authorization": f"Bearer {token}"} if token else None,
        )

    async def run(self) -> None:
        """Watch, and report the discovered models' load, until cancelled."""
        reporter = asyncio.create_task(self._report_loop(), name="gpuplane-load-report")
        try:
            await self._watch_loop()
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter

    async def _watch_loop(self) -> None:
        pause = 0.5
        while True:
            try:
                body = await self.watch_once()
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning(
                    "cannot watch the control plane at %s (%s); serving what was discovered, "
                    "retrying in %g s",
                    self.control,
                    exc,
                    pause,
                    extra={"event": "discovery_failed"},
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_RETRY_S)
                continue
            pause = 0.5
            self.apply(body["models"])
            self.resource_version = body["resource_version"]

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.report_s)
            try:
                await self.report_once()
            except httpx.HTTPError as exc:  # the watch says so already; the next report retries
                log.debug("cannot report load to %s: %s", self.control, exc)

    async def report_once(self) -> None:
        """Tell the control plane each discovered model's exact slot use and queue wait (its
        autoscaler acts on them)."""
        models = [
            {
                "name": name,
                "in_flight": router.slots.in_flight,
                "queued": len(router.queue),
                "oldest_wait_s": router.oldest_wait_s(),
                "idle_s": router.idle_s(),
                "ready": router.slots.healthy_count,
                "instances": {i.id: len(i.leases) for i in router.instances},
                "ready_ids": [i.id for i in router.instances if i.healthy],
            }
            for name in sorted(self.owned)
            for router in (self.gateway.routers[name],)
        ]
        if models:
            response = await self._client.post(
                self.control + "/deployments/load",
                json={"gateway": self.gateway_id, "models": models},
            )
            response.raise_for_status()

    async def watch_once(self) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout_s": self.watch_timeout_s}
        if self.resource_version is not None:
            params["resource_version"] = self.resource_version
        response = await self._client.get(self.control + "/deployments/watch", params=params)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def apply(self, models: Sequence[Mapping[str, Any]]) -> None:
        """Bring the routers in line with the control plane's `models` (its watch's answer)."""
        gw = self.gateway
        seen = set()
        for model in models:
            name = str(model["name"])
            seen.add(name)
            if name not in gw.routers:
                gw.add_model(
                    ModelConfig.model_construct(
                        name=name,
                        engine=str(model["engine"]),
                        instances=[],
                        cached_prefix_chars=None,
                        upstream_model=model.get("upstream_model"),
                    )
                )
                self.owned.add(name)
                log.info("discovered model %s", name, extra={"event": "model_discovered"})
            elif name not in self.owned:
                log.warning(
                    "deployment %s has the name of a model in the gateway's config; the "
                    "config's instances serve it, the deployment's are not used",
                    name,
                    extra={"event": "discovery_conflict"},
                )
                continue
            self._sync(name, {str(i["id"]): i for i in model["instances"]})
            gw.routers[name].set_weights(model.get("weights") or {})
            router = gw.routers[name]
            hold_s = model.get("hold_s") or router.cfg.queue.timeout_s
            router.hold_s = hold_s if model.get("hold") else None
        for name in self.owned - seen:  # deleted: refused at once from now on
            self._sync(name, {})
            gw.routers[name].hold_s = None

    def _sync(self, name: str, wanted: Mapping[str, Mapping[str, Any]]) -> None:
        router = self.gateway.routers[name]
        current = {i.id for i in router.instances if not i.draining}
        for iid in sorted(wanted.keys() - current):
            if iid in router.slots:  # draining and listed again: cannot be, ids are jobs
                continue
            inst = wanted[iid]
            router.add_instance(iid, str(inst["url"]), int(inst["capacity"]), inst.get("version"))
            log.info(
                "instance %s of %s added (%s); admitted once it answers its health probe",
                iid,
                name,
                inst["url"],
                extra={"event": "instance_added", "model": name, "instance": iid},
            )
        for iid in sorted(current - wanted.keys()):
            router.drain_instance(iid)
            log.info(
                "instance %s of %s draining: no new requests",
                iid,
                name,
                extra={"event": "instance_draining", "model": name, "instance": iid},
            )

    async def aclose(self) -> None:
        await self._client.aclose()
