"""How the control API runs: the service's tick on a thread beside it while it serves, and
uvicorn's settings for it."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ControlConfig

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("gpuplane.control.api")


class _Ticker:
    """Runs `service.tick()` on a thread until stopped; an error is logged, never fatal."""

    def __init__(self, service: ControlService, interval_s: float) -> None:
        self.service = service
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuplane-control-tick", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.service.tick()
            except Exception:
                log.exception("control loop tick failed; retrying on the next tick")


def lifespan(
    service: ControlService, background: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: with `background`, the service's tick (observe, admit, bind) runs
    every `schedule_interval_s` while it serves."""

    @asynccontextmanager
    async def span(_: FastAPI) -> AsyncIterator[None]:
        ticker = _Ticker(service, service.config.schedule_interval_s) if background else None
        if ticker is not None:
            ticker.start()
        try:
            yield
        finally:
            if ticker is not None:
                ticker.stop()

    return span


def server_config(app: FastAPI, control: ControlConfig) -> uvicorn.Config:
    """uvicorn's settings for the control API on control.host:port."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=control.host,
        port=control.port,
        log_level="warning",
        # X-Forwarded-For is believed from the configured proxies only: by default uvicorn
        # believes any caller on loopback, and every job on the host is one
        proxy_headers=bool(control.http.trusted_proxies),
        forwarded_allow_ips=control.http.trusted_proxies or None,
        # a gateway's deployment watch is a long poll: shut down without waiting it out
        timeout_graceful_shutdown=5,
    )
