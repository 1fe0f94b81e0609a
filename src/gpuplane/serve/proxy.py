"""One proxied completion as an ASGI callable: wait for a slot, stream the engine's answer, free
the slot on every path.

The whole life of the request runs inside `__call__`, under one loop timer that starts a watcher
of the client's connection when the request is `WATCH_AFTER_S` old, cancels the request at its
deadline, and ends a stream whose engine stays silent between two chunks for
`gateway.idle_timeout_s`. Before the first byte only the deadline counts: a long prefill or a
long non-streamed answer is silent too, and sending it to another instance would run it twice.
If the client leaves (while queued, before the first byte or mid-stream) the work is cancelled,
the engine request is aborted, and the router's `finish` frees the slot exactly once. Then the
tenant's charge is settled with the tokens the request used: the engine's `usage` where its
answer has one, else an estimate (the prompt at 4 characters a token; a streamed answer at one
token per chunk the engine sent), and the seconds it held slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
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
    error_body,
    sse_error_event,
)
from gpuplane.serve.limits import (
    Charge,
    Usage,
    estimate_tokens,
    estimated_completion,
    reported_usage,
    streamed_usage,
)
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.oplog import GatewayLog
from gpuplane.serve.placer import Admission
from gpuplane.serve.prefix import prompt_text
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.tenants import Tenant
from gpuplane.serve.upstream import (
    PASSED_RESPONSE_HEADERS,
    EngineResponse,
    Upstream,
    UpstreamFailure,
)

_DONE = b"data: [DONE]"
# The client's connection is watched from this age of a request on: a request that ends sooner
# starts no watcher task, and a client that leaves earlier is noticed at this age.
WATCH_AFTER_S = 0.02
# the longest the answer to a request the shutdown cuts off may wait on its client
_CUT_OFF_S = 1.0
_PASSED = frozenset(h.encode() for h in PASSED_RESPONSE_HEADERS)
_PASSED_WITH_REFUSAL = frozenset({b"x-request-id"})  # the body is the gateway's JSON then
_JSON = (b"content-type", b"application/json")


class _Cancel(enum.Enum):
    DEADLINE = "deadline"
    CLIENT_LEFT = "client left"
    ENGINE_SILENT = "engine silent"  # between two chunks of a stream: ends the stream


class Next(enum.Enum):
    """What a request does after an attempt on an instance failed."""

    RETRY = "retry"  # nothing reached the client: the same request goes to another instance
    ENDED = "ended"  # the answer had begun: it was ended with an error event, never cut silently
    GIVE_UP = "give up"  # nothing reached the client and no retry is left: a 502


def after_failure(kind: FailureKind, answered: bool, retries_left: int) -> tuple[Next, int]:
    """The step after a failed attempt, and the retries left then. Pure.

    `answered`: a byte of the answer was sent to the client, so the request cannot be re-run
    elsewhere (the client would get two answers spliced). A refused connection uses up no
    retry: nothing reached an engine (an engine killed before the request arrived)."""
    if answered:
        return Next.ENDED, retries_left
    if kind is FailureKind.CONNECT:
        return Next.RETRY, retries_left
    if retries_left <= 0:
        return Next.GIVE_UP, 0
    return Next.RETRY, retries_left - 1


class ProxyCall:
    """An ASGI response whose status is only known once a slot was granted and the engine
    answered."""

    __slots__ = (
        "_receive",
        "_task",
        "_timer",
        "_timer_at",
        "_watcher",
        "cancelled_by",
        "charge",
        "client_left",
        "deadline_s",
        "events",
        "expires_at",
        "finished",
        "idle_s",
        "oplog",
        "parsed",
        "path",
        "payload",
        "reported",
        "request_headers",
        "retries",
        "router",
        "series",
        "show_instance",
        "silent_since",
        "slot_s",
        "started",
        "status",
        "stream",
        "tenant",
        "upstream",
        "usage_asked",
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
        self.reported: Usage | None = None  # what the engine says the request used
        self.events = 0  # chunks streamed, or a whole answer's estimated tokens
        # engines put `usage` in a stream only when the client asks
        options = parsed.get("stream_options") if stream else None
        self.usage_asked = isinstance(options, dict) and options.get("include_usage") is True
        self.slot_s = 0.0
        self.deadline_s = deadline_s
        self.idle_s = idle_s
        self.retries = retries
        # name the instance in x-gpuplane-instance: for admins only, its id is an address
        self.show_instance = show_instance
        self.started = time.monotonic()
        self.status = 0  # HTTP status sent to the client; 0 until the answer starts
        self.finished = False
        self.client_left = False
        self.cancelled_by: _Cancel | None = None
        self.expires_at = 0.0
        # loop time since which a stream waits on the engine's next chunk; None while it does not
        self.silent_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._watcher: asyncio.Task[None] | None = None
        self._receive: Receive | None = None  # the ASGI call's, set by `__call__`
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # one timer per request for the client watcher, the deadline and the engine's silence,
        # instead of asyncio.timeout, an eager watcher task and aiohttp's read timers
        task = self._task = asyncio.current_task()
        assert task is not None
        self._receive = receive
        now = asyncio.get_running_loop().time()
        self.expires_at = now + self.deadline_s
        self._set_timer(min(now + WATCH_AFTER_S, self.expires_at))
        try:
            await self._serve(send)
        except asyncio.CancelledError:
            if self.cancelled_by is None or task.uncancel() > 0:
                await self._cut_off(send)
                raise  # not (only) ours: the server is shutting down
            if self.cancelled_by is _Cancel.DEADLINE:
                await self._expired(send)
        finally:
            assert self._timer is not None
            self._timer.cancel()
            if self._watcher is not None:
                self._watcher.cancel()
            status = 499 if self.client_left or not self.status else self.status
            self.series.answered(status)
            self.series.latency.observe(time.monotonic() - self.started)
            self._settle()

    def _settle(self) -> None:
        """Charge the tenant what the request used: the engine's count, else an estimate when
        the engine answered, else nothing."""
        if self.reported is not None:
            prompt, completion, estimated = self.reported.prompt, self.reported.completion, False
        elif self.status == 200:
            prompt, estimated = estimate_tokens(prompt_text(self.parsed)), True
            completion = max(0, self.events - 1) if self.stream else self.events  # [DONE]
        else:
            prompt, completion, estimated = 0, 0, False
        self.charge.settle(
            prompt, completion, estimated=estimated, slot_s=self.slot_s, now=self.wall()
        )

    def _set_timer(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._on_timer)
        self._timer_at = when

    def _on_timer(self) -> None:
        """Start watching the client (first time), cancel at the deadline, end a stream whose
        engine was silent too long; then set the timer for what is due next."""
        assert self._receive is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self.expires_at:
            self._cancel(_Cancel.DEADLINE)
            return
        silent_since = self.silent_since
        if silent_since is not None and now >= silent_since + self.idle_s:
            self._cancel(_Cancel.ENGINE_SILENT)
            silent_since = None
        if self._watcher is None:
            self._watcher = loop.create_task(self._watch_client(self._receive))
        due = self.expires_at if silent_since is None else silent_since + self.idle_s
        self._set_timer(min(due, self.expires_at))

    def _wait_on_engine(self) -> None:
        """The stream now waits on the engine's next chunk: its silence counts from here."""
        now = asyncio.get_running_loop().time()
        self.silent_since = now
        if self._timer_at > now + self.idle_s:
            self._set_timer(now + self.idle_s)

    def _cancel(self, why: _Cancel) -> None:
        if self.cancelled_by is None:
            assert self._task is not None
            self.cancelled_by = why
            self._task.cancel()

    async def _watch_client(self, receive: Receive) -> None:
        """Cancel the request's task when the client disconnects."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.client_left = not self.finished
                if self.client_left:
                    self._cancel(_Cancel.CLIENT_LEFT)
                return

    async def _expired(self, send: Send) -> None:
        """Answer a request that ran past its deadline: an error, or an error event mid-stream."""
        message = (
            f"the request did not finish within {self.deadline_s:g} s (gateway.request_timeout_s)"
        )
        if not self.status:
            await self._send_error(send, 504, message, "request_timeout")
        elif not self.finished:
            await self._finish(send, sse_error_event(message, "request_timeout"))

    async def _cut_off(self, send: Send) -> None:
        """The server cancelled the request at the end of its drain (SIGTERM): tell the client
        why, in OpenAI's shape (a 503, or an error event that ends a stream that began), so
        that it retries instead of taking a cut stream for a whole answer. Bounded: a client
        that reads nothing does not hold the shutdown."""
        if self.client_left or self.finished:
            return
        message = "the gateway is shutting down and ended the request; retry it"
        with contextlib.suppress(Exception):
            async with asyncio.timeout(_CUT_OFF_S):
                if not self.status:
                    await self._send_error(send, 503, message, "gateway_shutdown")
                elif self.stream:
                    await self._finish(send, sse_error_event(message, "gateway_shutdown", 503))

    async def _serve(self, send: Send) -> None:
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
                await self._send_error(
                    send,
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
                failure = await self._attempt(admission, send)
            except BaseException:
                self.router.finish(admission, dropped=True)  # the engine's request is left
                raise
            finally:
                self.slot_s += time.monotonic() - held_from
            if failure is None:
                self.router.finish(admission)
                return
            self.router.finish(admission, failure.kind, str(failure))
            self.series.failed(admission.lease.instance_id, failure.kind.value)
            step, retries_left = after_failure(failure.kind, bool(self.status), retries_left)
            if step is Next.ENDED:  # _attempt ended the answer with an error event
                return
            avoid = avoid | {admission.lease.instance_id}
            version = admission.version
            if step is Next.GIVE_UP:
                break
            self.series.retried()
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
                    headers.append(_JSON)
                elif response.status == 200:
                    self.reported = reported_usage(body)
                    if self.reported is None:
                        self.events = estimated_completion(body)
                    else:
                        self.router.observe_usage(admission, self.reported)
                headers.append((b"content-length", str(len(body)).encode()))
                await self._start(send, response.status, headers)
                await self._finish(send, body)
            else:
                await self._stream(admission, sent_at, response, headers, send)
        except asyncio.CancelledError:
            if self.cancelled_by is not _Cancel.ENGINE_SILENT:
                raise
            self.cancelled_by = None
            assert self._task is not None
            if self._task.uncancel() > 0:
                raise  # cancelled for another reason too
            return await self._failed(
                send,
                UpstreamFailure(
                    FailureKind.TIMEOUT,
                    f"{admission.url} sent nothing for {self.idle_s:g} s (gateway.idle_timeout_s)",
                ),
            )
        except UpstreamFailure as failure:
            return await self._failed(send, failure)
        finally:
            self.silent_since = None
            if response is not None:
                self.upstream.close(response)
        return None

    async def _failed(self, send: Send, failure: UpstreamFailure) -> UpstreamFailure:
        """An attempt failed: mid-answer, end the stream with an error event (the engine is
        done with: writing to a slow client must not count as its silence)."""
        self.silent_since = None
        if self.status:
            event = sse_error_event(f"the engine failed mid-stream: {failure}", "upstream_error")
            await self._finish(send, event)
        return failure

    async def _stream(
        self,
        admission: Admission,
        sent_at: float,
        response: EngineResponse,
        headers: list[tuple[bytes, bytes]],
        send: Send,
    ) -> None:
        tail = previous = latest = b""
        async for chunk in self.upstream.chunks(response):
            self.silent_since = None  # a slow client is not a silent engine
            if not self.status:
                now = time.monotonic()
                self.series.ttft.observe(now - self.started)
                self.router.observe_first_byte(admission, now - sent_at)
                await self._start(send, 200, headers)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self.events += 1
            previous, latest = latest, chunk
            tail = (tail + chunk)[-64:]
            self._wait_on_engine()
        self.silent_since = None
        if self.usage_asked:  # the usage event comes last before [DONE]
            self.reported = streamed_usage(previous + latest)
            if self.reported is not None:
                self.router.observe_usage(admission, self.reported)
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
        headers = [_JSON]
        headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
        await self._start(send, status, headers)
        await self._finish(send, body)

    async def _finish(self, send: Send, body: bytes) -> None:
        self.finished = True
        await send({"type": "http.response.body", "body": body})
