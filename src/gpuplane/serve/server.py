"""Run the gateway until Ctrl-C (`gpuplane gateway serve`; `gpuplane up` in `plane.py`).

uvicorn serves the ASGI app on the current event loop (`uvicorn_serving`, which `up` uses for
the control API too); signals are handled here (`stop_on_signal`) so that shutdown is ordered:
stop accepting, drain the gateway, then whatever the caller stops after it. Each client
connection runs the edge's protocol (`edge.py`: corked writes, a cap per client address,
deadlines for a request's head and body).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import signal
import socket
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import cast

import uvicorn

from gpuplane.errors import ConfigError
from gpuplane.serve.app import create_app
from gpuplane.serve.edge import ClientConnections, Edge, EdgeProtocol
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.settings import ServeSettings

log = logging.getLogger("gpuplane.gateway")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `stop_on_signal` owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def uvicorn_serving(config: uvicorn.Config, what: str, setting: str) -> AsyncIterator[int]:
    """Serve `config`'s app on the current loop while the block runs; yields the port it
    listens on (port 0 picks a free one). The socket is bound here, not by uvicorn, which exits
    the process when it cannot bind: a taken port is a `ConfigError` naming `what` and its
    `setting`."""
    sock = listen_socket(config.host, config.port, what, setting)
    server = _Server(config)
    serving_task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving_task.done():
                serving_task.result()  # its error, if it raised one
                raise ConfigError(f"the {what} stopped while starting; see the log above")
            await asyncio.sleep(0.02)
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await serving_task
        sock.close()


def check_free(host: str, port: int, what: str, setting: str) -> None:
    """Refuse a taken host:port as `listen_socket` would, before a command starts anything
    that it would have to undo (port 0: any free one will do)."""
    if port != 0:
        listen_socket(host, port, what, setting).close()


def listen_socket(host: str, port: int, what: str, setting: str) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one), as uvicorn binds one."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"the {what} cannot listen on {host}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"the {what} could not listen on {host}:{port} ({exc.strerror}); is the port "
            f"taken? choose another ({setting})"
        ) from None
    sock.set_inheritable(True)
    return sock


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
    async with uvicorn_serving(config, "gateway", "gateway.port, --port") as port:
        try:
            url = f"http://{gw.host}:{port}"
            leadership = app.gateway.leadership
            if leadership is not None and leadership.url is None:
                leadership.url = url  # where standbys send clients (gateway.ha.advertise_url)
            yield url
        finally:
            await app.gateway.step_down()  # a standby takes over while admitted ones finish


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


@contextlib.contextmanager
def stop_on_signal() -> Iterator[asyncio.Event]:
    """An event that SIGINT or SIGTERM sets, on the running loop, while the block runs."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def serve_until_signal(
    settings: ServeSettings,
    on_ready: Callable[[], None] | None = None,
    gateway: Gateway | None = None,
) -> None:
    """Serve the gateway until SIGINT/SIGTERM, then shut down in order."""
    with stop_on_signal() as stop:
        async with serving(settings, gateway):
            if on_ready:
                on_ready()
            await stop.wait()
