"""The gateway's edge: the HTTP protocol each client connection runs, with its limits.

uvicorn's httptools protocol with corked writes, a cap on each client address's connections, and
deadlines for every request's head and body (uvicorn times only the idle keep-alive between
requests, so a client that trickles a head or a body would hold its connection, and a file
descriptor, for ever). `serving` (`server.py`) hands uvicorn an `EdgeProtocol` per connection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr

from gpuplane.serve.errors import error_body
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.oplog import GatewayLog
from gpuplane.serve.settings import GatewayConfig


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
class Edge:
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


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a `CorkedTransport`, with the edge's limits.

    A connection over its address's cap is closed at once. Every request owes its head within
    `header_timeout_s` (from the connection's start, or the request's first byte on a kept-alive
    connection) and then its body within `body_timeout_s`; past that it gets 408 and the
    connection is closed. One lazily re-armed timer per connection times both, in the style of
    uvicorn's keep-alive timer: a phase that ends in time costs no timer call.
    """

    def __init__(self, *args: Any, edge: Edge, **kwargs: Any) -> None:
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
