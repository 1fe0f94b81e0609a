"""The engine simulator's HTTP shell: K simulated OpenAI-compatible instances in one event loop.

One asyncio process hosts K OpenAI-compatible instances, one listening socket each. Every
instance speaks what gateways and peer routers call: `/v1/chat/completions` and `/v1/completions`
(streaming SSE in OpenAI's chunk format ending with `data: [DONE]`, and non-streaming),
`/v1/models`, vLLM-format `/metrics`, `/health`, `/health_generate`, and the `/model_info` and
`/server_info` probes sglang-router makes. The behaviour (admission, waiting, prefix cache,
latency, failure injection) lives in the pure `model.py`; one instance serves a completion in
`instance.py`; this module owns the sockets, routes requests and controls the instances.

Simulator-only endpoints, served by every instance: `GET /sim/stats` (this instance's counters),
`GET /sim/stats/all`, and `POST /sim/instances/{i}/kill|restart|hang|unhang` acting on instance i
of the same process (so a killed instance is controlled through a live one). `POST
/reset_prefix_cache` empties this instance's prefix cache, as vLLM's endpoint of that name does.

The HTTP server is uvicorn's httptools protocol on sockets this module owns, so that killing an
instance can close its listener and abort its connections the way a crashed engine does.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Sequence
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gpuplane.engines.sim import wire
from gpuplane.engines.sim.asgi import (
    Receive,
    Scope,
    Send,
    read_body,
    send_full,
    send_json,
    wait_disconnect,
)
from gpuplane.engines.sim.instance import SimInstance
from gpuplane.engines.sim.metrics import render_metrics
from gpuplane.engines.sim.model import InstanceCore, SimParams

_TEXT = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


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
        self.model = model
        self.host = host
        self.instances = [
            SimInstance(
                index=i,
                host=host,
                port=base_port + i if base_port else 0,
                core=InstanceCore(p, random.Random(seed * 1_000_003 + i)),
                model=model,
                seed=seed,
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
            body = await read_body(receive)
            await inst.generate(path.endswith("chat/completions"), body, receive, send)
        elif method == "POST" and path.startswith("/sim/instances/"):
            await self._control(path, send)
        elif method == "POST" and path == "/reset_prefix_cache":  # as vLLM names it
            inst.core.cache.clear()
            await send_json(send, 200, {"instance": inst.index, "prefix_cache_blocks": 0})
        elif method == "GET":
            await self._get(inst, path, send)
        else:
            await send_json(
                send, 404, wire.error(f"no route {method} {path} on the simulator", 404)
            )

    async def _hang_until_released(self, inst: SimInstance, receive: Receive) -> None:
        assert inst.hung is not None
        released = asyncio.ensure_future(inst.hung.wait())
        gone = asyncio.ensure_future(wait_disconnect(receive))
        await asyncio.wait((released, gone), return_when=asyncio.FIRST_COMPLETED)
        released.cancel()
        gone.cancel()

    async def _get(self, inst: SimInstance, path: str, send: Send) -> None:
        p = inst.core.params
        if path in ("/health", "/health_generate", "/ping"):
            await send_full(send, 200, b"")
        elif path == "/v1/models":
            await send_json(send, 200, {"object": "list", "data": [self._model_card()]})
        elif path == "/metrics":
            text = render_metrics(inst.core, self.model)
            await send({"type": "http.response.start", "status": 200, "headers": _TEXT})
            await send({"type": "http.response.body", "body": text})
        elif path in ("/model_info", "/get_model_info"):
            await send_json(send, 200, wire.model_info(self.model))
        elif path in ("/server_info", "/get_server_info"):
            await send_json(send, 200, wire.server_info(self.model, p.max_num_seqs, p.kv_tokens))
        elif path == "/version":
            await send_json(send, 200, {"version": "gpuplane-sim"})
        elif path == "/sim/stats":
            await send_json(send, 200, self._stats(inst))
        elif path == "/sim/stats/all":
            await send_json(send, 200, {"instances": self.stats()})
        else:
            await send_json(send, 404, wire.error(f"no route GET {path} on the simulator", 404))

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
            await send_json(send, 404, wire.error(msg + "kill|restart|hang|unhang", 404))
            return
        if verb == "kill":
            # answer first: the instance being killed may be the one serving this request
            await send_json(send, 200, {"instance": i, "alive": False})
            asyncio.get_running_loop().call_soon(self.kill, i)
            return
        if verb == "restart":
            await self.restart(i)
        else:
            self.hang(i, verb == "hang")
        await send_json(send, 200, self._stats(self.instances[i]))
