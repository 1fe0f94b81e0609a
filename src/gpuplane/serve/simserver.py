"""The engine simulator's HTTP shell: K simulated OpenAI-compatible instances in one event loop.

One asyncio process hosts K OpenAI-compatible instances, one listening socket each. Every
instance speaks what gateways and peer routers call: `/v1/chat/completions` and `/v1/completions`
(streaming SSE in OpenAI's chunk format ending with `data: [DONE]`, and non-streaming),
`/v1/models`, vLLM-format `/metrics`, `/health`, `/health_generate`, and the `/model_info` and
`/server_info` probes sglang-router makes. The behaviour (admission, waiting, prefix cache,
latency, failure injection) lives in the pure `gpuplane.serve.simcore`; this module only sleeps,
reads and writes.

Simulator-only endpoints, served by every instance: `GET /sim/stats` (this instance's counters),
`GET /sim/stats/all`, and `POST /sim/instances/{i}/kill|restart|hang|unhang` acting on instance i
of the same process (so a killed instance is controlled through a live one). `POST
/reset_prefix_cache` empties this instance's prefix cache, as vLLM's endpoint of that name does.

The HTTP server is uvicorn's httptools protocol on sockets this module owns, so that killing an
instance can close its listener and abort its connections the way a crashed engine does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gpuplane.serve import simwire as wire
from gpuplane.serve.simcore import Fault, InstanceCore, SimParams, SimRequest, render_metrics

Scope = dict[str, Any]
Receive = Any
Send = Any

log = logging.getLogger(__name__)

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_TEXT = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


@dataclass(slots=True)
class SimInstance:
    """One simulated engine: its core, its socket and the requests it is serving."""

    index: int
    host: str
    port: int
    core: InstanceCore
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


class SimFleet:
    """K simulated instances in this event loop; `start`, then `stop` (both idempotent)."""

    def __init__(
        self,
        params: Sequence[SimParams],
        *,
        seed: int = 0,
        host: str = "127.0.0.1",
        base_port: int = 0,
        model: str = "sim",
    ) -> None:
        if not params:
            raise ValueError("a simulator fleet needs at least one instance")
        self.seed = seed
        self.model = model
        self.host = host
        self.instances = [
            SimInstance(
                index=i,
                host=host,
                port=base_port + i if base_port else 0,
                core=InstanceCore(p, random.Random(seed * 1_000_003 + i)),
            )
            for i, p in enumerate(params)
        ]
        self._config = Config(
            app=self._asgi,
            http="httptools",
            interface="asgi3",
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=75,
        )
        self._config.load()
        self._by_port: dict[int, SimInstance] = {}

    @property
    def urls(self) -> list[str]:
        return [inst.url for inst in self.instances]

    async def start(self) -> None:
        for inst in self.instances:
            if not inst.alive:
                await self._listen(inst)

    async def stop(self) -> None:
        for inst in self.instances:
            self._close(inst, crash=False)

    async def _listen(self, inst: SimInstance) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((inst.host, inst.port))
        except OSError as exc:
            sock.close()
            raise OSError(
                f"simulated instance {inst.index} cannot listen on {inst.host}:{inst.port} "
                f"({exc.strerror}); pick another --base-port, or 0 for free ports"
            ) from None
        sock.listen(1024)
        sock.setblocking(False)
        inst.port = sock.getsockname()[1]
        self._by_port[inst.port] = inst
        loop = asyncio.get_running_loop()
        state = inst.state = ServerState()
        config = self._config
        inst.server = await loop.create_server(
            lambda: HttpToolsProtocol(config=config, server_state=state, app_state={}), sock=sock
        )
        inst.hung = asyncio.Event()
        inst.hung.set()

    def _close(self, inst: SimInstance, crash: bool = True) -> None:
        if inst.server is None:
            return
        inst.server.close()
        inst.server = None
        for conn in list(inst.state.connections):
            conn.transport.abort()  # a crash: no goodbye to anyone
        for task in list(inst.tasks.values()):
            task.cancel()
        for fut in inst.waiters.values():
            if not fut.done():
                fut.cancel()
        inst.waiters.clear()
        inst.core.kill(count=crash)
        if inst.hung is not None:
            inst.hung.set()

    # -- control ----------------------------------------------------------------------------

    def _instance(self, i: int) -> SimInstance:
        if not 0 <= i < len(self.instances):
            raise IndexError(f"no simulated instance {i}; valid: 0..{len(self.instances) - 1}")
        return self.instances[i]

    def kill(self, i: int) -> None:
        """Instance i dies like a crashed engine: listener closed, connections aborted."""
        self._close(self._instance(i))

    async def restart(self, i: int) -> None:
        """Instance i comes back on the same port, with an empty cache and its counters kept."""
        inst = self._instance(i)
        if not inst.alive:
            await self._listen(inst)

    def hang(self, i: int, hung: bool = True) -> None:
        """While hung, instance i accepts connections and answers nothing, probes included."""
        ev = self._instance(i).hung
        if ev is not None:
            if hung:
                ev.clear()
            else:
                ev.set()

    def stats(self) -> list[dict[str, Any]]:
        return [self._stats(inst) for inst in self.instances]

    def _stats(self, inst: SimInstance) -> dict[str, Any]:
        core = inst.core
        return {
            "instance": inst.index,
            "url": inst.url,
            "alive": inst.alive,
            "max_num_seqs": core.params.max_num_seqs,
            "running": len(core.running),
            "waiting": len(core.waiting),
            **core.stats.as_dict(),
        }

    # -- HTTP -------------------------------------------------------------------------------

    async def _asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        inst = self._by_port.get(scope["server"][1], self.instances[0])
        if inst.hung is not None and not inst.hung.is_set():
            await self._hang_until_released(inst, receive)
            if not inst.alive:
                return
        path: str = scope["path"]
        method: str = scope["method"]
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            body = await _read_body(receive)
            await self._generate(inst, path.endswith("chat/completions"), body, receive, send)
        elif method == "POST" and path.startswith("/sim/instances/"):
            await self._control(path, send)
        elif method == "POST" and path == "/reset_prefix_cache":  # as vLLM names it
            inst.core.cache.clear()
            await _json(send, 200, {"instance": inst.index, "prefix_cache_blocks": 0})
        elif method == "GET":
            await self._get(inst, path, send)
        else:
            await _json(send, 404, wire.error(f"no route {method} {path} on the simulator", 404))

    async def _hang_until_released(self, inst: SimInstance, receive: Receive) -> None:
        assert inst.hung is not None
        released = asyncio.ensure_future(inst.hung.wait())
        gone = asyncio.ensure_future(_wait_disconnect(receive))
        await asyncio.wait((released, gone), return_when=asyncio.FIRST_COMPLETED)
        released.cancel()
        gone.cancel()

    async def _get(self, inst: SimInstance, path: str, send: Send) -> None:
        p = inst.core.params
        if path in ("/health", "/health_generate", "/ping"):
            await _full(send, 200, b"")
        elif path == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [self._model_card()]})
        elif path == "/metrics":
            text = render_metrics(inst.core, self.model)
            await send({"type": "http.response.start", "status": 200, "headers": _TEXT})
            await send({"type": "http.response.body", "body": text})
        elif path in ("/model_info", "/get_model_info"):
            await _json(send, 200, wire.model_info(self.model))
        elif path in ("/server_info", "/get_server_info"):
            await _json(send, 200, wire.server_info(self.model, p.max_num_seqs, p.kv_tokens))
        elif path == "/version":
            await _json(send, 200, {"version": "gpuplane-sim"})
        elif path == "/sim/stats":
            await _json(send, 200, self._stats(inst))
        elif path == "/sim/stats/all":
            await _json(send, 200, {"instances": self.stats()})
        else:
            await _json(send, 404, wire.error(f"no route GET {path} on the simulator", 404))

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.model, "object": "model", "created": 0, "owned_by": "gpuplane-sim"}

    async def _control(self, path: str, send: Send) -> None:
        parts = path.strip("/").split("/")  # sim, instances, i, verb
        try:
            i, verb = int(parts[2]), parts[3]
            if len(parts) != 4 or verb not in ("kill", "restart", "hang", "unhang"):
                raise ValueError(verb)
            self._instance(i)
        except (IndexError, ValueError):
            msg = f"{path}: use POST /sim/instances/<0..{len(self.instances) - 1}>/"
            await _json(send, 404, wire.error(msg + "kill|restart|hang|unhang", 404))
            return
        if verb == "kill":
            # answer first: the instance being killed may be the one serving this request
            await _json(send, 200, {"instance": i, "alive": False})
            asyncio.get_running_loop().call_soon(self.kill, i)
            return
        if verb == "restart":
            await self.restart(i)
        else:
            self.hang(i, verb == "hang")
        await _json(send, 200, self._stats(self.instances[i]))

    async def _generate(
        self, inst: SimInstance, chat: bool, body: bytes, receive: Receive, send: Send
    ) -> None:
        try:
            parsed = wire.parse_request(body, chat)
        except ValueError as exc:
            await _json(send, 400, wire.error(str(exc), 400))
            return
        core = inst.core
        req = core.arrive(parsed.prompt, parsed.max_tokens, time.monotonic())
        if req.fault is Fault.ERROR:
            await _json(send, 500, wire.error("simulated engine failure (error_rate)", 500))
            return
        model = str(parsed.payload.get("model") or self.model)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim{inst.index}-{req.rid}"
        task = asyncio.current_task()
        assert task is not None
        inst.tasks[req.rid] = task
        watcher = asyncio.create_task(self._watch(inst, req, receive, task))
        completed = False
        try:
            if req.admitted_at is None:
                fut = inst.waiters[req.rid] = asyncio.get_running_loop().create_future()
                await fut
            prefill = core.prefill_seconds(req)
            if prefill > 0:
                await asyncio.sleep(prefill)
            core.prefilled(req)
            if req.fault is Fault.HANG:
                await asyncio.get_running_loop().create_future()  # until disconnect or kill
            if parsed.stream:
                chunks = wire.Chunks(rid, chat, model, int(time.time()))
                completed = await self._stream(inst, req, chunks, parsed.include_usage, send)
            else:
                completed = await self._respond(inst, req, rid, chat, model, send)
        except asyncio.CancelledError:
            task.uncancel()
            await asyncio.sleep(0)  # let the transport report its loss before uvicorn looks
        finally:
            watcher.cancel()
            inst.tasks.pop(req.rid, None)
            inst.waiters.pop(req.rid, None)
            self._release(inst, req, completed)

    async def _watch(
        self, inst: SimInstance, req: SimRequest, receive: Receive, task: asyncio.Task[Any]
    ) -> None:
        """Free the request's place the moment its client goes away, then stop its handler."""
        await _wait_disconnect(receive)
        if not req.done:
            self._release(inst, req, completed=False)
            task.cancel()

    def _release(self, inst: SimInstance, req: SimRequest, completed: bool) -> None:
        for nxt in inst.core.release(req, time.monotonic(), completed=completed):
            fut = inst.waiters.get(nxt.rid)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def _stream(
        self, inst: SimInstance, req: SimRequest, chunks: wire.Chunks, usage: bool, send: Send
    ) -> bool:
        core = inst.core
        drop_at = core.params.drop_at_token if req.fault is Fault.DROP else None
        if drop_at == 0:
            return await _drop(send)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        if chunks.chat:
            await _body(send, chunks.role())
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
            await _body(send, chunks.content(text))
            if drop_at is not None and sent >= drop_at:
                return await _drop(send)
        await _body(send, chunks.finish())
        if usage:
            await _body(send, chunks.usage(req))
        await send({"type": "http.response.body", "body": wire.DONE})
        return True

    async def _respond(
        self, inst: SimInstance, req: SimRequest, rid: str, chat: bool, model: str, send: Send
    ) -> bool:
        core = inst.core
        n = req.max_tokens
        itl = core.itl_seconds()
        if itl > 0 and n > 1:
            await asyncio.sleep(itl * (n - 1))
        if req.fault is Fault.DROP:
            return await _drop(send)
        text = "".join(core.output_token(req, j, self.seed) for j in range(n))
        core.generated(n)
        await _full(send, 200, wire.completion(rid, chat, model, int(time.time()), text, req))
        return True


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    return b"".join(chunks)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _drop(send: Send) -> bool:
    """Close the connection mid-response, as an engine that crashes on this request does."""
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise ConnectionAbortedError("simulated drop")  # the server closes the connection
    transport.abort()
    await asyncio.sleep(0)  # connection_lost runs before the handler returns to uvicorn
    return False


async def _json(send: Send, status: int, obj: object) -> None:
    await _full(send, status, json.dumps(obj).encode())


async def _full(send: Send, status: int, body: bytes) -> None:
    """A whole JSON body with its length (no chunked encoding: cheaper for every client)."""
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
