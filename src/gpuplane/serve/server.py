"""Run the gateway (and, for `gpuplane up`, the embedded engines) until Ctrl-C.

uvicorn serves the ASGI app on the same event loop as the engine supervisor; signals are handled
here so that shutdown is ordered: stop accepting, drain the gateway, then stop the engines.
Each client connection runs the edge's protocol (`edge.py`: corked writes, a cap per client
address, deadlines for a request's head and body).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import signal
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import cast

import uvicorn

from gpuplane.errors import ConfigError
from gpuplane.serve.app import Gateway, create_app
from gpuplane.serve.edge import ClientConnections, Edge, EdgeProtocol
from gpuplane.serve.engines.llamacpp import LlamaCpp, cached_prefix_chars, embedded_launches
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.settings import InstanceConfig, ModelConfig, ServeSettings
from gpuplane.serve.supervisor import EngineState, EngineStatus, Supervisor

log = logging.getLogger("gpuplane.gateway")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `serve_until_signal` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serving(settings: ServeSettings, gateway: Gateway | None = None) -> AsyncIterator[str]:
    """Serve the gateway (`gateway`, else one made from the settings) on
    settings.gateway.host:port while the block runs; yields its URL.

    Port 0 picks a free port (tests and benchmarks use that)."""
    raise_open_files_limit()
    app = create_app(settings, gateway=gateway)
    gw = settings.gateway
    edge = Edge(
        gw, ClientConnections(gw.max_connections_per_client), app.gateway.metrics, app.gateway.oplog
    )
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
        http=cast(type[asyncio.Protocol], functools.partial(EdgeProtocol, edge=edge)),
        ws="none",  # no websocket routes; an upgraded connection would leave the edge's count
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
        url = f"http://{gw.host}:{port}"
        leadership = app.gateway.leadership
        if leadership is not None and leadership.url is None:
            leadership.url = url  # where standbys send clients (gateway.ha.advertise_url)
        yield url
    finally:
        await app.gateway.step_down()  # a standby takes over while admitted requests finish
        server.should_exit = True
        with contextlib.suppress(SystemExit):  # uvicorn exits when it cannot bind
            await serving_task


def raise_open_files_limit() -> None:
    """Raise the process's soft limit of open files to its hard limit (common practice for
    servers): each client connection and each engine connection holds a descriptor, and the
    usual soft limit of 1,024 is a few hundred slow clients."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or hard == resource.RLIM_INFINITY or soft >= hard:
        return  # macOS's unlimited hard limit cannot be the soft one
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return
    log.info("raised the open-file limit from %d to %d", soft, hard)


async def serve_until_signal(
    settings: ServeSettings,
    on_ready: Callable[[], None] | None = None,
    gateway: Gateway | None = None,
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


def with_embedded_model(settings: ServeSettings, urls: list[str]) -> ServeSettings:
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
        router.health.report_engine(
            status.url,
            up=status.state is EngineState.RUNNING,
            error=status.error,
            crash_looping=status.state is EngineState.CRASH_LOOPING,
        )

    return report


async def run_up(
    settings: ServeSettings, log_dir: Path, on_ready: Callable[[ServeSettings], None]
) -> None:
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
