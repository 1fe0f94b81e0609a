"""One simulated engine instance: its core, its socket's state, and how it serves a completion.

A completion arrives at the core, waits inside the engine for a sequence slot, prefills, then
streams SSE chunks or answers whole (with the seeded faults: a hang, a drop at a given token);
its place is released on every path, the moment its client goes away included. The fleet
(`server.py`) owns the sockets and routes requests here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from uvicorn.server import ServerState

from gpuplane.engines.sim import wire
from gpuplane.engines.sim.asgi import (
    Receive,
    Send,
    drop,
    send_chunk,
    send_full,
    send_json,
    wait_disconnect,
)
from gpuplane.engines.sim.model import Fault, InstanceCore, SimRequest

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass(slots=True)
class SimInstance:
    """One simulated engine: its core, its socket and the requests it is serving."""

    index: int
    host: str
    port: int
    core: InstanceCore
    model: str  # answered when a request names none
    seed: int  # the fleet's seed: fixes the generated text
    server: asyncio.Server | None = None
    state: ServerState = field(default_factory=ServerState)
    waiters: dict[int, asyncio.Future[None]] = field(default_factory=dict)
    tasks: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    hung: asyncio.Event | None = None  # set = answering normally

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.server is not None

    async def generate(self, chat: bool, body: bytes, receive: Receive, send: Send) -> None:
        """Serve one completion request (chat or not) from its body; the fleet routes it here."""
        try:
            parsed = wire.parse_request(body, chat)
        except ValueError as exc:
            await send_json(send, 400, wire.error(str(exc), 400))
            return
        core = self.core
        if (refusal := core.too_long(parsed.prompt, parsed.max_tokens)) is not None:
            await send_json(send, 400, wire.error(refusal, 400))
            return
        req = core.arrive(parsed.prompt, parsed.max_tokens, time.monotonic())
        if req.fault is Fault.ERROR:
            await send_json(send, 500, wire.error("simulated engine failure (error_rate)", 500))
            return
        model = str(parsed.payload.get("model") or self.model)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim{self.index}-{req.rid}"
        task = asyncio.current_task()
        assert task is not None
        self.tasks[req.rid] = task
        watcher = asyncio.create_task(self._watch(req, receive, task))
        completed = False
        try:
            if req.admitted_at is None:
                fut = self.waiters[req.rid] = asyncio.get_running_loop().create_future()
                await fut
            prefill = core.prefill_seconds(req)
            if prefill > 0:
                await asyncio.sleep(prefill)
            core.prefilled(req)
            if req.fault is Fault.HANG:
                await asyncio.get_running_loop().create_future()  # until disconnect or kill
            if parsed.stream:
                chunks = wire.Chunks(rid, chat, model, int(time.time()))
                completed = await self._stream(req, chunks, parsed.include_usage, send)
            else:
                completed = await self._respond(req, rid, chat, model, send)
        except asyncio.CancelledError:
            task.uncancel()
            await asyncio.sleep(0)  # let the transport report its loss before uvicorn looks
        finally:
            watcher.cancel()
            self.tasks.pop(req.rid, None)
            self.waiters.pop(req.rid, None)
            self._release(req, completed)

    async def _watch(self, req: SimRequest, receive: Receive, task: asyncio.Task[Any]) -> None:
        """Free the request's place the moment its client goes away, then stop its handler."""
        await wait_disconnect(receive)
        if not req.done:
            self._release(req, completed=False)
            task.cancel()

    def _release(self, req: SimRequest, completed: bool) -> None:
        for nxt in self.core.release(req, time.monotonic(), completed=completed):
            fut = self.waiters.get(nxt.rid)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def _stream(self, req: SimRequest, chunks: wire.Chunks, usage: bool, send: Send) -> bool:
        core = self.core
        drop_at = core.params.drop_at_token if req.fault is Fault.DROP else None
        if drop_at == 0:
            return await drop(send)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        if chunks.chat:
            await send_chunk(send, chunks.role())
        n, per, sent = req.max_tokens, core.params.tokens_per_chunk, 0
        while sent < n:
            k = min(per, n - sent)
            if drop_at is not None:
                k = min(k, drop_at - sent)
            if sent:
                itl = core.itl_seconds()
                if itl > 0:
                    await asyncio.sleep(itl * k)
            text = "".join(core.output_token(req, j, self.seed) for j in range(sent, sent + k))
            sent += k
            core.generated(k)
            await send_chunk(send, chunks.content(text))
            if drop_at is not None and sent >= drop_at:
                return await drop(send)
        await send_chunk(send, chunks.finish())
        if usage:
            await send_chunk(send, chunks.usage(req))
        await send({"type": "http.response.body", "body": wire.DONE})
        return True

    async def _respond(self, req: SimRequest, rid: str, chat: bool, model: str, send: Send) -> bool:
        core = self.core
        n = req.max_tokens
        itl = core.itl_seconds()
        if itl > 0 and n > 1:
            await asyncio.sleep(itl * (n - 1))
        if req.fault is Fault.DROP:
            return await drop(send)
        text = "".join(core.output_token(req, j, self.seed) for j in range(n))
        core.generated(n)
        await send_full(send, 200, wire.completion(rid, chat, model, int(time.time()), text, req))
        return True
