"""One proxied completion as an ASGI callable: wait for a slot, stream the engine's answer, free
the slot on every path.

The whole life of the request runs inside `__call__`, beside a watcher of the client's
connection: if the client leaves (while queued, before the first byte or mid-stream) the work is
cancelled, the engine request is aborted, and the `finally` releases the lease exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from gpuplane.serve.errors import error_body, sse_error_event
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.router import Admission, FailureKind, ModelRouter, Rejected, Rejection
from gpuplane.serve.upstream import (
    PASSED_RESPONSE_HEADERS,
    EngineResponse,
    Upstream,
    UpstreamFailure,
)

_DONE = b"data: [DONE]"
_PASSED = frozenset(h.encode() for h in PASSED_RESPONSE_HEADERS)


@dataclass(slots=True)
class Tenant:
    name: str
    weight: float = 1.0
    priority: int = 0


class ProxyCall:
    """An ASGI response whose status is only known once a slot was granted and the engine
    answered."""

    def __init__(
        self,
        *,
        router: ModelRouter,
        upstream: Upstream,
        metrics: GatewayMetrics,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        stream: bool,
        blocks: Sequence[int],
        tenant: Tenant,
        deadline_s: float,
        retries: int,
    ) -> None:
        self.router = router
        self.upstream = upstream
        self.metrics = metrics
        self.series = metrics.model(router.name)
        self.path = path
        self.payload = body
        self.request_headers = headers
        self.stream = stream
        self.blocks = blocks
        self.tenant = tenant
        self.deadline_s = deadline_s
        self.retries = retries
        self.started = time.monotonic()
        self.status = 0  # HTTP status sent to the client; 0 until the answer starts
        self.finished = False
        self.client_left = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # plain asyncio rather than an anyio task group and cancel scope: a tenth of the
        # gateway's CPU per request went to anyio's scope bookkeeping
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(self._watch_client(receive, task))
        try:
            try:
                async with asyncio.timeout(self.deadline_s) as deadline:
                    await self._serve(send)
            except TimeoutError:
                if not deadline.expired():
                    raise
                message = (
                    f"the request did not finish within {self.deadline_s:g} s "
                    "(gateway.request_timeout_s)"
                )
                if not self.status:
                    await self._send_error(send, 504, message, "request_timeout")
                elif not self.finished:
                    event = sse_error_event(message, "request_timeout")
                    await self._finish(send, event)
        except asyncio.CancelledError:
            if not self.client_left or task.uncancel() > 0:
                raise  # not (only) the watcher's doing: the server is shutting down
        finally:
            watcher.cancel()
            status = 499 if self.client_left or not self.status else self.status
            self.series.answered(status).inc()
            self.series.latency.observe(time.monotonic() - self.started)

    async def _watch_client(self, receive: Receive, task: asyncio.Task[None]) -> None:
        """Cancel the request's task when the client disconnects."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_left = not self.finished
                if self.client_left:
                    task.cancel()
                return

    async def _serve(self, send: Send) -> None:
        avoid: frozenset[str] = frozenset()
        for attempt in range(self.retries + 1):
            try:
                admission = await self.router.acquire(
                    self.blocks,
                    tenant=self.tenant.name,
                    weight=self.tenant.weight,
                    priority=self.tenant.priority,
                    avoid=avoid,
                )
            except Rejected as exc:
                status = 429 if exc.reason is Rejection.QUEUE_FULL else 503
                await self._send_error(
                    send,
                    status,
                    str(exc),
                    exc.reason.value,
                    {"retry-after": str(exc.retry_after_s)},
                )
                return
            if attempt == 0:
                self.series.queue_wait.observe(time.monotonic() - self.started)
            try:
                failure = await self._attempt(admission, send)
            finally:
                self.router.release(admission)
            if failure is None:
                return
            self.metrics.upstream_failures.labels(
                self.router.name, admission.lease.instance_id, failure.kind.value
            ).inc()
            self.router.report_failure(admission.lease.instance_id, failure.kind)
            if self.status:  # the answer had begun: _attempt ended it with an error event
                return
            avoid = avoid | {admission.lease.instance_id}
            if attempt < self.retries:
                self.series.retries.inc()
        await self._send_error(
            send,
            502,
            f"model '{self.router.name}' failed on {len(avoid)} instance(s): {failure}",
            "upstream_error",
        )

    async def _attempt(self, admission: Admission, send: Send) -> UpstreamFailure | None:
        """Proxy once. None on success; the failure otherwise (the caller decides on a retry)."""
        response: EngineResponse | None = None
        sent_at = time.monotonic()
        try:
            response = await self.upstream.open(
                admission.url + self.path, self.payload, self.request_headers
            )
            headers = [(k, v) for k, v in response.raw_headers if k.lower() in _PASSED]
            headers.append((b"x-gpuplane-instance", admission.lease.instance_id.encode()))
            if not self.stream or response.status != 200:
                body = await self.upstream.read(response)
                self.series.ttft.observe(time.monotonic() - self.started)
                headers.append((b"content-length", str(len(body)).encode()))
                await self._start(send, response.status, headers)
                await self._finish(send, body)
            else:
                await self._stream(admission, sent_at, response, headers, send)
        except UpstreamFailure as failure:
            if self.status:
                event = sse_error_event(
                    f"the engine failed mid-stream: {failure}", "upstream_error"
                )
                await self._finish(send, event)
            return failure
        finally:
            if response is not None:
                self.upstream.close(response)
        self.router.report_success(admission.lease.instance_id)
        return None

    async def _stream(
        self,
        admission: Admission,
        sent_at: float,
        response: EngineResponse,
        headers: list[tuple[bytes, bytes]],
        send: Send,
    ) -> None:
        tail = b""
        async for chunk in self.upstream.chunks(response):
            if not self.status:
                now = time.monotonic()
                self.series.ttft.observe(now - self.started)
                self.router.observe_first_byte(admission, now - sent_at)
                await self._start(send, 200, headers)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            tail = (tail + chunk)[-64:]
        if _DONE not in tail:
            raise UpstreamFailure(
                FailureKind.PROTOCOL, "the engine ended the stream without [DONE]"
            )
        await self._finish(send, b"")

    async def _start(self, send: Send, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def _send_error(
        self,
        send: Send,
        status: int,
        message: str,
        code: str,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        body = json.dumps(error_body(status, message, code)).encode()
        headers = [(b"content-type", b"application/json")]
        headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
        await self._start(send, status, headers)
        await self._finish(send, body)

    async def _finish(self, send: Send, body: bytes) -> None:
        self.finished = True
        await send({"type": "http.response.body", "body": body})
