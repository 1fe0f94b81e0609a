"""One proxied completion as an ASGI callable: wait for a slot, stream the engine's answer, free
the slot on every path.

The whole life of the request runs inside `__call__`, under one loop timer (`timer.py`): the
client watcher, the deadline, and the engine's silence between two chunks of a stream. Before
the first byte only the deadline counts: a long prefill or a long non-streamed answer is silent
too, and sending it to another instance would run it twice. If the client leaves (while queued,
before the first byte or mid-stream) the work is cancelled, the engine request is aborted, and
the router's `finish` frees the slot exactly once. A failed attempt is retried elsewhere as
`retry.py` decides. Then the tenant's charge is settled with what the request used
(`settle.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import Receive, Scope, Send

from gpuplane.serve.errors import (
    FailureKind,
    Rejected,
    Rejection,
    engine_error_body,
    sse_error_event,
)
from gpuplane.serve.limits import (
    Charge,
    estimated_completion,
    reported_usage,
    streamed_usage,
)
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.oplog import GatewayLog
from gpuplane.serve.placer import Admission
from gpuplane.serve.reply import JSON_HEADER, Reply
from gpuplane.serve.retry import Next, after_failure
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.settle import Consumption
from gpuplane.serve.tenants import Tenant
from gpuplane.serve.timer import Cancel, RequestTimer
from gpuplane.serve.upstream import (
    PASSED_RESPONSE_HEADERS,
    EngineResponse,
    Upstream,
    UpstreamFailure,
)

_DONE = b"data: [DONE]"
# the longest the answer to a request the shutdown cuts off may wait on its client
_CUT_OFF_S = 1.0
_PASSED = frozenset(h.encode() for h in PASSED_RESPONSE_HEADERS)
_PASSED_WITH_REFUSAL = frozenset({b"x-request-id"})  # the body is the gateway's JSON then


class ProxyCall:
    """An ASGI response whose status is only known once a slot was granted and the engine
    answered."""

    __slots__ = (
        "charge",
        "oplog",
        "parsed",
        "path",
        "payload",
        "request_headers",
        "retries",
        "router",
        "series",
        "show_instance",
        "started",
        "stream",
        "tenant",
        "timer",
        "upstream",
        "used",
        "wall",
    )

    def __init__(
        self,
        *,
        router: ModelRouter,
        upstream: Upstream,
        metrics: GatewayMetrics,
        oplog: GatewayLog,
        path: str,
        body: bytes,
        parsed: Mapping[str, Any],
        headers: Mapping[str, str],
        stream: bool,
        tenant: Tenant,
        charge: Charge,
        wall: Callable[[], float],
        deadline_s: float,
        idle_s: float,
        retries: int,
        show_instance: bool = False,
    ) -> None:
        self.router = router
        self.upstream = upstream
        self.series = metrics.model(router.name)
        self.oplog = oplog
        self.path = path
        self.payload = body
        self.parsed = parsed  # the body as JSON: the router places by its prompt
        self.request_headers = headers
        self.stream = stream
        self.tenant = tenant
        self.charge = charge
        self.wall = wall
        self.used = Consumption(parsed, stream)
        self.timer = RequestTimer(deadline_s, idle_s)
        self.retries = retries
        # name the instance in x-gpuplane-instance: for admins only, its id is an address
        self.show_instance = show_instance
        self.started = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        reply = Reply(send)
        self.timer.start(task, receive, reply)
        try:
            await self._serve(reply)
        except asyncio.CancelledError:
            if self.timer.cancelled_by is None or task.uncancel() > 0:
                await self._cut_off(reply)
                raise  # not (only) ours: the server is shutting down
            if self.timer.cancelled_by is Cancel.DEADLINE:
                await self._expired(reply)
        finally:
            self.timer.stop()
            status = 499 if self.timer.client_left or not reply.status else reply.status
            self.series.answered(status)
            self.series.latency.observe(time.monotonic() - self.started)
            self.used.settle(self.charge, self.parsed, self.stream, reply.status, self.wall())

    async def _expired(self, reply: Reply) -> None:
        """Answer a request that ran past its deadline: an error, or an error event mid-stream."""
        limit_s = self.timer.deadline_s
        message = f"the request did not finish within {limit_s:g} s (gateway.request_timeout_s)"
        if not reply.status:
            await reply.error(504, message, "request_timeout")
        elif not reply.finished:
            await reply.finish(sse_error_event(message, "request_timeout"))

    async def _cut_off(self, reply: Reply) -> None:
        """The server cancelled the request at the end of its drain (SIGTERM): tell the client
        why, in OpenAI's shape (a 503, or an error event that ends a stream that began), so
        that it retries instead of taking a cut stream for a whole answer. Bounded: a client
        that reads nothing does not hold the shutdown."""
        if self.timer.client_left or reply.finished:
            return
        message = "the gateway is shutting down and ended the request; retry it"
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CUT_OFF_S):
                if not reply.status:
                    await reply.error(503, message, "gateway_shutdown")
                elif self.stream:
                    await reply.finish(sse_error_event(message, "gateway_shutdown", 503))

    async def _serve(self, reply: Reply) -> None:
        """Acquire, proxy, finish (release, health: once per attempt, so a lost engine's slot
        is freed exactly once); a failure before the first byte (a refused or broken
        connection, a 5xx answer, an engine killed mid-prefill; never silence) is retried
        elsewhere up to `retries` times (`after_failure`). A refused connection uses up no
        retry: nothing reached an engine, and the instance is marked down at once, so the next
        try goes elsewhere (with every instance down the router refuses with 503, or, for a
        discovered deployment, holds it until one is ready again)."""
        avoid: frozenset[str] = frozenset()
        version: str | None = None  # a retry stays on the rollout version it was placed on
        retries_left = self.retries
        while True:
            try:
                admission = await self.router.acquire(
                    self.parsed,
                    tenant=self.tenant.name,
                    weight=self.tenant.weight,
                    priority=self.tenant.priority,
                    avoid=avoid,
                    version=version,
                )
            except Rejected as exc:
                status = 429 if exc.reason is Rejection.QUEUE_FULL else 503
                self.oplog.rejected(self.router.name, exc.reason, status)
                await reply.error(
                    status,
                    str(exc),
                    exc.reason.value,
                    {"retry-after": str(exc.retry_after_s)},
                )
                return
            held_from = time.monotonic()
            if not avoid:
                self.series.queue_wait.observe(held_from - self.started)
            try:
                failure = await self._attempt(admission, reply)
            except BaseException:
                self.router.finish(admission, dropped=True)  # the engine's request is left
                raise
            finally:
                self.used.slot_s += time.monotonic() - held_from
            if failure is None:
                self.router.finish(admission)
                return
            self.router.finish(admission, failure.kind, str(failure))
            self.series.failed(admission.lease.instance_id, failure.kind.value)
            step, retries_left = after_failure(failure.kind, bool(reply.status), retries_left)
            if step is Next.ENDED:  # _attempt ended the answer with an error event
                return
            avoid = avoid | {admission.lease.instance_id}
            version = admission.version
            if step is Next.GIVE_UP:
                break
            self.series.retried()
        await reply.error(
            502,
            f"model '{self.router.name}' failed on {len(avoid)} instance(s): {failure}",
            "upstream_error",
        )

    async def _attempt(self, admission: Admission, reply: Reply) -> UpstreamFailure | None:
        """Proxy once. None on success; the failure otherwise (the caller decides on a retry)."""
        response: EngineResponse | None = None
        sent_at = time.monotonic()
        try:
            response = await self.upstream.open(
                admission.url + self.path, self.payload, self.request_headers
            )
            refused = 400 <= response.status < 500  # the request's fault, not the instance's
            passed = _PASSED_WITH_REFUSAL if refused else _PASSED
            headers = [(k, v) for k, v in response.raw_headers if k.lower() in passed]
            if self.show_instance:
                headers.append((b"x-gpuplane-instance", admission.lease.instance_id.encode()))
            if not self.stream or response.status != 200:
                body = await self.upstream.read(response)
                self.series.ttft.observe(time.monotonic() - self.started)
                if refused:
                    body = json.dumps(engine_error_body(response.status, body)).encode()
                    headers.append(JSON_HEADER)
                elif response.status == 200:
                    self.used.reported = reported_usage(body)
                    if self.used.reported is None:
                        self.used.events = estimated_completion(body)
                    else:
                        self.router.observe_usage(admission, self.used.reported)
                headers.append((b"content-length", str(len(body)).encode()))
                await reply.start(response.status, headers)
                await reply.finish(body)
            else:
                await self._stream(admission, sent_at, response, headers, reply)
        except asyncio.CancelledError:
            if self.timer.cancelled_by is not Cancel.ENGINE_SILENT:
                raise
            if not self.timer.uncancel_silence():
                raise  # cancelled for another reason too
            idle_s = self.timer.idle_s
            return await self._failed(
                reply,
                UpstreamFailure(
                    FailureKind.TIMEOUT,
                    f"{admission.url} sent nothing for {idle_s:g} s (gateway.idle_timeout_s)",
                ),
            )
        except UpstreamFailure as failure:
            return await self._failed(reply, failure)
        finally:
            self.timer.silent_since = None
            if response is not None:
                self.upstream.close(response)
        return None

    async def _failed(self, reply: Reply, failure: UpstreamFailure) -> UpstreamFailure:
        """An attempt failed: mid-answer, end the stream with an error event (the engine is
        done with: writing to a slow client must not count as its silence)."""
        self.timer.silent_since = None
        if reply.status:
            event = sse_error_event(f"the engine failed mid-stream: {failure}", "upstream_error")
            await reply.finish(event)
        return failure

    async def _stream(
        self,
        admission: Admission,
        sent_at: float,
        response: EngineResponse,
        headers: list[tuple[bytes, bytes]],
        reply: Reply,
    ) -> None:
        tail = previous = latest = b""
        async for chunk in self.upstream.chunks(response):
            self.timer.silent_since = None  # a slow client is not a silent engine
            if not reply.status:
                now = time.monotonic()
                self.series.ttft.observe(now - self.started)
                self.router.observe_first_byte(admission, now - sent_at)
                await reply.start(200, headers)
            await reply.send({"type": "http.response.body", "body": chunk, "more_body": True})
            self.used.events += 1
            previous, latest = latest, chunk
            tail = (tail + chunk)[-64:]
            self.timer.wait_on_engine()
        self.timer.silent_since = None
        if self.used.usage_asked:  # the usage event comes last before [DONE]
            self.used.reported = streamed_usage(previous + latest)
            if self.used.reported is not None:
                self.router.observe_usage(admission, self.used.reported)
        if _DONE not in tail:
            raise UpstreamFailure(
                FailureKind.PROTOCOL, "the engine ended the stream without [DONE]"
            )
        await reply.finish(b"")
