"""The gateway's HTTP surface: OpenAI-compatible routes, auth, validation, admin and metrics.

Request → parse and validate → resolve the model → tenant from the API key → hand over to a
`ProxyCall` (slot, placement, proxy, release). Every refusal is an OpenAI-shaped error that says
what was wrong and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuplane.config import Settings
from gpuplane.serve.engines import get_adapter
from gpuplane.serve.errors import error_response
from gpuplane.serve.metrics import GatewayMetrics
from gpuplane.serve.prefix import block_hashes, prompt_text
from gpuplane.serve.proxy import ProxyCall, Tenant
from gpuplane.serve.router import FailureKind, ModelRouter
from gpuplane.serve.upstream import Upstream

log = logging.getLogger("gpuplane.gateway")

DEFAULT_TENANT = Tenant("default")


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[Any] | None = None


class _CommonRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    stream: bool = False


class ChatRequest(_CommonRequest):
    messages: list[_Message] = Field(min_length=1)


class CompletionRequest(_CommonRequest):
    prompt: str | list[str] | list[int] | list[list[int]]


class Gateway:
    """Routers for every configured model, the upstream client, metrics and background tasks."""

    def __init__(self, settings: Settings, *, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.cfg = settings.gateway
        self.routers: dict[str, ModelRouter] = {}
        self.metrics = GatewayMetrics(lambda: self.routers.values())
        self.health_paths: dict[str, str] = {}
        rng = rng or random.Random()
        for model in settings.models:
            adapter = get_adapter(model.engine)
            capacities = [i.max_concurrency or adapter.default_capacity for i in model.instances]
            self.routers[model.name] = ModelRouter(
                model,
                self.cfg,
                capacities,
                events=self.metrics.router_events(),
                locality_wait_s=adapter.locality_wait_s,
                per_request_cache=adapter.prefix_cache_per_request,
                rng=random.Random(rng.random()),
            )
            self.health_paths[model.name] = adapter.health_path
        self.upstream_names = {m.name: m.upstream_model for m in settings.models}
        self.tenants_by_key = {
            key.get_secret_value(): Tenant(t.name, t.weight, t.priority)
            for t in settings.tenants
            for key in t.api_keys
        }
        self.tenants_by_name = {
            t.name: Tenant(t.name, t.weight, t.priority) for t in settings.tenants
        }
        self.upstream = Upstream(self.cfg)
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._reaper(), name="gpuplane-reaper"),
            asyncio.create_task(self._prober(), name="gpuplane-prober"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.upstream.aclose()

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.reaper_interval_s)
            for router in self.routers.values():
                if reaped := router.reap():
                    log.error("reaped %d leaked lease(s) on model %s", reaped, router.name)

    async def _prober(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self.cfg.health.probe_interval_s)

    async def probe_once(self) -> None:
        """Probe every instance once; mark it healthy or count a failure."""
        checks = []
        for name, router in self.routers.items():
            for inst in router.instances:
                url = inst.url + self.health_paths[name]
                checks.append(
                    (router, inst.id, self.upstream.probe(url, self.cfg.health.probe_timeout_s))
                )
        results = await asyncio.gather(*(c[2] for c in checks))
        for (router, iid, _), ok in zip(checks, results, strict=True):
            if ok:
                router.report_success(iid)
            else:
                router.report_failure(iid, FailureKind.TIMEOUT)

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        models = []
        instances = []
        for router in self.routers.values():
            insts = [
                {
                    "model": router.name,
                    "id": i.id,
                    "url": i.url,
                    "capacity": i.capacity,
                    "in_flight": i.in_flight,
                    "healthy": i.healthy,
                }
                for i in router.instances
            ]
            instances += insts
            models.append(
                {
                    "name": router.name,
                    "queued": len(router.queue),
                    "queued_by_tenant": router.queue.depth_by_tenant(),
                    "instances": insts,
                }
            )
        return {"models": models, "instances": instances}

    def resolve_tenant(self, headers: Mapping[str, str]) -> Tenant | None:
        """The caller's tenant; None when keys are configured and the request has no valid one."""
        if not self.tenants_by_key:
            return self.tenants_by_name.get(headers.get("x-gpuplane-tenant", ""), DEFAULT_TENANT)
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("api-key", "")
        return self.tenants_by_key.get(key)


def create_app(settings: Settings, *, gateway: Gateway | None = None) -> Starlette:
    """The ASGI app of the gateway (lifespan starts and stops its background tasks)."""
    gw = gateway or Gateway(settings)

    async def chat(request: Request) -> Response:
        return await _completion(gw, request, "/v1/chat/completions", ChatRequest)

    async def completions(request: Request) -> Response:
        return await _completion(gw, request, "/v1/completions", CompletionRequest)

    async def models(request: Request) -> Response:
        if gw.resolve_tenant(request.headers) is None:
            return _unauthorized(request.headers)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gpuplane"}
            for name in gw.routers
        ]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        down = [name for name, r in gw.routers.items() if not any(i.healthy for i in r.instances)]
        if down:
            return JSONResponse({"status": "unready", "models_without_healthy_instance": down}, 503)
        return JSONResponse({"status": "ready"})

    async def admin_state(request: Request) -> Response:
        return JSONResponse(gw.state())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/admin/state", admin_state, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.gateway = gw
    return app


def _unauthorized(headers: Mapping[str, str]) -> Response:
    given = "authorization" in headers or "api-key" in headers
    message = (
        "the API key is not valid for this gateway"
        if given
        else "this gateway requires an API key: send 'Authorization: Bearer <key>'"
    )
    return error_response(401, message, "invalid_api_key")


async def _completion(
    gw: Gateway, request: Request, path: str, schema: type[_CommonRequest]
) -> Response:
    model_name = "unknown"
    tenant = gw.resolve_tenant(request.headers)
    if tenant is None:
        gw.metrics.reject(model_name, "unauthorized")
        return _unauthorized(request.headers)
    body_or_error = await _read_body(request, gw.cfg.max_body_bytes)
    if isinstance(body_or_error, Response):
        gw.metrics.reject(model_name, "invalid_request")
        return body_or_error
    raw = body_or_error
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        gw.metrics.reject(model_name, "invalid_request")
        return error_response(
            400, f"the request body is not valid JSON ({exc}); send a JSON object", "invalid_json"
        )
    try:
        req = schema.model_validate(payload)
    except ValidationError as exc:
        gw.metrics.reject(model_name, "invalid_request")
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        return error_response(
            400,
            f"invalid request: {param or 'body'}: {first['msg']}",
            "invalid_request",
            param=param,
        )
    router = gw.routers.get(req.model)
    if router is None:
        gw.metrics.reject(req.model, "unknown_model")
        known = ", ".join(gw.routers) or "none"
        return error_response(
            404,
            f"the model '{req.model}' does not exist on this gateway; available models: {known}",
            "model_not_found",
            param="model",
        )
    upstream_model = gw.upstream_names.get(req.model)
    if upstream_model and upstream_model != req.model:
        payload["model"] = upstream_model
        raw = json.dumps(payload).encode()
    blocks = (
        block_hashes(prompt_text(payload), gw.cfg.placement.prefix_block_chars)
        if router.wants_prefix()
        else []
    )
    return ProxyCall(
        router=router,
        upstream=gw.upstream,
        metrics=gw.metrics,
        path=path,
        body=raw,
        headers=request.headers,
        stream=req.stream,
        blocks=blocks,
        tenant=tenant,
        deadline_s=gw.cfg.request_timeout_s,
        retries=gw.cfg.retries,
    )


async def _read_body(request: Request, limit: int) -> bytes | Response:
    too_large = error_response(
        413,
        f"the request body exceeds {limit} bytes (gateway.max_body_bytes); send a smaller request",
        "body_too_large",
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return too_large
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return too_large
            chunks.append(chunk)
    except ClientDisconnect:
        return error_response(400, "the client disconnected while sending", "client_disconnected")
    return b"".join(chunks)


__all__ = ["Gateway", "create_app"]
