"""Run the gateway (and, for `gpuplane up`, the embedded engines) until Ctrl-C.

uvicorn serves the ASGI app on the same event loop as the engine supervisor; signals are handled
here so that shutdown is ordered: stop accepting, drain the gateway, then stop the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Generator
from pathlib import Path

import uvicorn

from gpuplane.config import InstanceConfig, ModelConfig, Settings
from gpuplane.errors import ConfigError
from gpuplane.serve.app import create_app
from gpuplane.serve.engines.llamacpp import LlamaCpp, embedded_launches
from gpuplane.serve.supervisor import Supervisor


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `serve_until_signal` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_until_signal(
    settings: Settings, on_ready: Callable[[], None] | None = None
) -> None:
    """Serve the gateway on settings.gateway.host:port until SIGINT/SIGTERM."""
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.gateway.host,
        port=settings.gateway.port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = _Server(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                await serving
                raise ConfigError(
                    f"the gateway could not listen on {settings.gateway.host}:"
                    f"{settings.gateway.port}; is the port taken? choose another with --port"
                )
            await asyncio.sleep(0.05)
        if on_ready:
            on_ready()
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        server.should_exit = True
        await serving
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def with_embedded_model(settings: Settings, urls: list[str]) -> Settings:
    """Add the embedded engine's instances to the settings as one model."""
    name = settings.engine.model_name
    if any(m.name == name for m in settings.models):
        raise ConfigError(
            f"model '{name}' is both in `models` and the embedded engine (engine.model_name); "
            "rename one"
        )
    model = ModelConfig(
        name=name,
        engine=LlamaCpp.name,
        instances=[InstanceConfig(url=u, max_concurrency=LlamaCpp.default_capacity) for u in urls],
    )
    return settings.model_copy(update={"models": [*settings.models, model]})


async def run_up(settings: Settings, log_dir: Path, on_ready: Callable[[Settings], None]) -> None:
    """Start the embedded llama.cpp instances and the gateway in front of them."""
    launches = embedded_launches(settings.engine)
    supervisor = Supervisor(
        LlamaCpp(),
        launches,
        log_dir=log_dir,
        start_timeout_s=settings.engine.start_timeout_s,
        restart_backoff_s=settings.engine.restart_backoff_s,
    )
    full = with_embedded_model(settings, [url for _, url, _ in launches])
    await supervisor.start()
    try:
        await serve_until_signal(full, lambda: on_ready(full))
    finally:
        await supervisor.stop()
