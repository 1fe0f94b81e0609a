"""Run the gateway (and, for `gpuplane up`, the embedded engines) until Ctrl-C.

uvicorn serves the ASGI app on the same event loop as the engine supervisor; signals are handled
here so that shutdown is ordered: stop accepting, drain the gateway, then stop the engines.
The gateway's edge is here too: uvicorn's httptools protocol with corked writes, a cap on each
client address's connections, and deadlines for every request's head and body (uvicorn times
only the idle keep-alive between requests, so a client that trickles a head or a body would hold
its connection, and a file descriptor, for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import resource
import signal
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr

from gpuplane.errors import ConfigError
from gpuplane.serve.app import Gateway, create_app
from gpuplane.serve.engines.llamacpp import LlamaCpp, cached_prefix_chars, embedded_launches
from gpuplane.serve.errors import error_body
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.oplog import GatewayLog
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.settings import GatewayConfig, InstanceConfig, ModelConfig, ServeSettings
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


log = logging.getLogger("gpuplane.gateway")


class Refusal(StrEnum):
    """Why the edge closed a client's connection (`gpuplane_connections_refused_total{reason}`)."""

    PER_CLIENT_LIMIT = "per_client_limit"
    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"


@dataclass(slots=True)
class ClientConnections:
    """Open connections per client address, at most `limit` each. An address leaves the table
    with its last connection, so it holds no more entries than there are connections."""

    limit: int
    open: dict[str, int] = field(default_factory=dict)

    def can_open(self, client: str) -> bool:
        return self.open.get(client, 0) < self.limit

    def opened(self, client: str) -> None:
        self.open[client] = self.open.get(client, 0) + 1

    def closed(self, client: str) -> None:
        left = self.open.get(client, 0) - 1
        if left > 0:
            self.open[client] = left
        else:
            self.open.pop(client, None)


@dataclass(slots=True)
class _Edge:
    """What the connections of one gateway share: its limits, the open connections per client,
    and where a refused connection is counted and logged."""

    cfg: GatewayConfig
    clients: ClientConnections
    metrics: GatewayMetrics
    oplog: GatewayLog

    def refuse(self, reason: Refusal, client: str) -> None:
        self.metrics.connections_refused.inc(reason)
        self.oplog.connection_refused(reason, client, self.why(reason))

    def why(self, reason: Refusal) -> str:
        cfg = self.cfg
        if reason is Refusal.PER_CLIENT_LIMIT:
            return (
                f"that client holds {cfg.max_connections_per_client} connections already "
                "(gateway.max_connections_per_client); raise it if the client is a proxy or a "
                "load balancer"
            )
        if reason is Refusal.HEADER_TIMEOUT:
            return (
                f"the request's headers did not arrive within {cfg.header_timeout_s:g} s "
                "(gateway.header_timeout_s); send the whole request without pauses"
            )
        return (
            f"the request's body did not arrive within {cfg.body_timeout_s:g} s of its headers "
            "(gateway.body_timeout_s); send the whole request without pauses"
        )


class _EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CorkedTransport`, with the edge's limits.

    A connection over its address's cap is closed at once. Every request owes its head within
    `header_timeout_s` (from the connection's start, or the request's first byte on a kept-alive
    connection) and then its body within `body_timeout_s`; past that it gets 408 and the
    connection is closed. One lazily re-armed timer per connection times both, in the style of
    uvicorn's keep-alive timer: a phase that ends in time costs no timer call.
    """

    def __init__(self, *args: Any, edge: _Edge, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.edge = edge
        self._admitted = False
        self._counted: str | None = None  # the client address, while it counts toward its cap
        self._owed: Refusal | None = None  # what the client owes before `_due`: head, body
        self._began = False  # bytes of the owed head arrived
        self._due = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        addr = get_remote_addr(transport)
        if addr is not None:
            if not self.edge.clients.can_open(addr[0]):
                self.edge.refuse(Refusal.PER_CLIENT_LIMIT, addr[0])
                transport.close()
                return
            self.edge.clients.opened(addr[0])
            self._counted = addr[0]
        self._admitted = True
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, CorkedTransport(transport))
        self._owe(Refusal.HEADER_TIMEOUT)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted is not None:
            self.edge.clients.closed(self._counted)
            self._counted = None
        if self._admitted:
            super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._owed is None:  # a later request on a kept-alive connection
            self._owe(Refusal.HEADER_TIMEOUT)
        self._began = True

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if self.pipeline:  # queued behind a request in progress: reading is paused, not slow
            self._owed = None
        else:
            self._owe(Refusal.BODY_TIMEOUT)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._owed = None
        self._began = False

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle  # the last request parsed; started now if nothing else is queued
        started = not self.pipeline and not cycle.response_complete
        if started and self._owed is None and cycle.more_body:
            self._owe(Refusal.BODY_TIMEOUT)  # it owes the rest of its body from now on

    def _owe(self, what: Refusal) -> None:
        cfg = self.edge.cfg
        timeout = cfg.header_timeout_s if what is Refusal.HEADER_TIMEOUT else cfg.body_timeout_s
        self._owed = what
        self._due = self.loop.time() + timeout
        if self._timer is None or self._timer_at > self._due:
            self._arm(self._due)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._on_timer)
        self._timer_at = when

    def _on_timer(self) -> None:
        self._timer = None
        if self._owed is None:
            return
        if self.loop.time() < self._due:  # a later phase: wait for its own deadline
            self._arm(self._due)
            return
        self._expire(self._owed)

    def _expire(self, reason: Refusal) -> None:
        """The client is late with what it owed: 408 where an answer fits, then close."""
        self.edge.refuse(reason, self.client[0] if self.client else "a local socket")
        cycle = self.cycle
        if reason is Refusal.BODY_TIMEOUT:
            can_answer = not cycle.response_started
        else:  # not to a connection that sent nothing yet, nor into a response being written
            can_answer = self._began and (cycle is None or cycle.response_complete)
        if can_answer:
            body = json.dumps(error_body(408, self.edge.why(reason), reason.value)).encode()
            head = [STATUS_LINE[408]]
            head += [n + b": " + v + b"\r\n" for n, v in self.server_state.default_headers]
            head.append(b"content-type: application/json\r\nconnection: close\r\n")
            head.append(b"content-length: %d\r\n\r\n" % len(body))
            self.transport.write(b"".join([*head, body]))
        self.transport.close()


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
    edge = _Edge(
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
        http=cast(type[asyncio.Protocol], functools.partial(_EdgeProtocol, edge=edge)),
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
        yield f"http://{gw.host}:{port}"
    finally:
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
        router.report_engine(
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
