"""Run the gateway (and, for `gpuplane up`, the embedded engines) until Ctrl-C.

uvicorn serves the ASGI app on the same event loop as the engine supervisor; signals are handled
here so that shutdown is ordered: stop accepting, drain the gateway, then stop the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpuplane.config import InstanceConfig, ModelConfig, Settings
from gpuplane.errors import ConfigError
from gpuplane.serve.app import Gateway, create_app
from gpuplane.serve.engines.llamacpp import LlamaCpp, cached_prefix_chars, embedded_launches
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.supervisor import EngineState, EngineStatus, Supervisor


class CorkedTransport:
    """A transport whose writes within one event-loop iteration go out as one `write`.

    uvicorn writes a response's head and body separately: two syscalls, two TCP segments, two
    wake-ups of the client, for every non-streamed answer. Held here until the loop's next turn,
    they leave together; a streamed answer's chunks that arrive in one turn are merged too.
    Everything but `write` and `close` goes straight to the real transport.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CorkedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CorkedTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, CorkedTransport(transport))


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `serve_until_signal` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serving(settings: Settings, gateway: Gateway | None = None) -> AsyncIterator[str]:
    """Serve the gateway (`gateway`, else one made from the settings) on
    settings.gateway.host:port while the block runs; yields its URL.

    Port 0 picks a free port (tests and benchmarks use that)."""
    app = create_app(settings, gateway=gateway)
    gw = settings.gateway
    config = uvicorn.Config(
        app,
        host=gw.host,
        port=gw.port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
        # the gateway never reads the client's address: skip rewriting it from X-Forwarded-*
        proxy_headers=False,
        access_log=False,  # requests are counted in /metrics, not logged one line each
        # uvicorn's 5 s equals httpx's pool expiry: a client could send on a connection the
        # gateway is closing that instant and lose the request
        timeout_keep_alive=gw.client_keepalive_s,
        http=_CorkedHttpTools,
    )
    server = _Server(config)
    serving_task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving_task.done():
                raise ConfigError(
                    f"the gateway could not listen on {gw.host}:{gw.port}; "
                    "is the port taken? choose another with --port"
                )
            await asyncio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{gw.host}:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(SystemExit):  # uvicorn exits when it cannot bind
            await serving_task


async def serve_until_signal(
    settings: Settings, on_ready: Callable[[], None] | None = None, gateway: Gateway | None = None
) -> None:
    """Serve the gateway until SIGINT/SIGTERM, then shut down in order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with serving(settings, gateway):
            if on_ready:
                on_ready()
            await stop.wait()
    finally:
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
        cached_prefix_chars=cached_prefix_chars(settings.engine),
    )
    return settings.model_copy(update={"models": [*settings.models, model]})


def engine_reporter(router: ModelRouter) -> Callable[[EngineStatus], None]:
    """The supervisor's `on_status` for the router of the model its instances serve (with
    no `name`, an instance's id is its URL)."""

    def report(status: EngineStatus) -> None:
        router.report_engine(
            status.url,
            up=status.state is EngineState.RUNNING,
            error=status.error,
            crash_looping=status.state is EngineState.CRASH_LOOPING,
        )

    return report


async def run_up(settings: Settings, log_dir: Path, on_ready: Callable[[Settings], None]) -> None:
    """Start the embedded llama.cpp instances and the gateway in front of them. An engine that
    fails to start fails this with its diagnosis; one that exits later is marked down in the
    gateway with the supervisor's diagnosis until it answers again."""
    launches = embedded_launches(settings.engine)
    full = with_embedded_model(settings, [url for _, url, _ in launches])
    gateway = Gateway(full)
    supervisor = Supervisor(
        LlamaCpp(),
        launches,
        log_dir=log_dir,
        start_timeout_s=settings.engine.start_timeout_s,
        restart_backoff_s=settings.engine.restart_backoff_s,
        crash_loop_after=settings.engine.crash_loop_after,
        on_status=engine_reporter(gateway.routers[settings.engine.model_name]),
    )
    await supervisor.start()
    try:
        await serve_until_signal(full, lambda: on_ready(full), gateway)
    finally:
        await supervisor.stop()
