"""The gateway's HTTP surface: OpenAI-compatible routes, auth, validation, admin and metrics.

Request → tenant from the API key (or a trusted proxy's header) → parse and validate → resolve
the model → the tenant's limits (count the request, reserve its tokens) → hand over to a
`ProxyCall` (slot, placement, proxy, release, settle the tokens). Every refusal is an
OpenAI-shaped error that says what was wrong and what to do. `/admin/*` and `/metrics` need an
admin key once any key is configured.

The two completion routes are the hot path: `GatewayApp` dispatches them itself, straight from
the ASGI scope, and hands every other request to a Starlette app (admin, metrics, health).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuplane.engines import EngineAdapter, get_adapter
from gpuplane.serve.discovery import Discovery
from gpuplane.serve.errors import Rejection, error_response
from gpuplane.serve.ha.forward import FORWARDED
from gpuplane.serve.limits import OverLimit, asked_tokens
from gpuplane.serve.metrics import UNKNOWN_MODEL, GatewayMetrics
from gpuplane.serve.openapi import document
from gpuplane.serve.oplog import GatewayLog
from gpuplane.serve.proxy import ProxyCall
from gpuplane.serve.router import ModelRouter
from gpuplane.serve.settings import GatewayConfig, ModelConfig, ServeSettings
from gpuplane.serve.tenants import Identity, Tenant, presented_key
from gpuplane.serve.upstream import Upstream
from gpuplane.serve.validation import invalid

if TYPE_CHECKING:
    from gpuplane.serve.ha.forward import ForwardToLeader
    from gpuplane.serve.ha.leadership import Leadership
    from gpuplane.serve.ha.shared import RedisSlotTable

log = logging.getLogger("gpuplane.gateway")


class Gateway:
    """Routers for every configured model, the callers' identities and accounts, the upstream
    client, metrics and background tasks. `wall` is the clock of the tenants' limit windows."""

    def __init__(
        self,
        settings: ServeSettings,
        *,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        control: str | None = None,
        control_token: str | None = None,
    ) -> None:
        """`control`: a control plane's URL, whose deployments add models and instances while
        the gateway runs (`discovery.py`), called with `control_token` (its API routes need one)."""
        self.settings = settings
        self.cfg = settings.gateway
        self.wall = wall
        self.identity = Identity(settings)
        self.routers: dict[str, ModelRouter] = {}
        self.metrics = GatewayMetrics(lambda: self.routers.values(), self.identity.accounts)
        self.oplog = GatewayLog()
        self._events = replace(
            self.metrics.router_events(), health_changed=self.oplog.health_changed
        )
        self.health_paths: dict[str, str] = {}
        self._rng = rng or random.Random()
        self.adapters: dict[str, EngineAdapter] = {}  # filled by add_model, read by HA lazily
        self.shared = shared_slots(self.cfg, self.adapters)
        self.upstream_names: dict[str, str | None] = {}
        for model in settings.models:
            self.add_model(model)
        self.upstream = Upstream(self.cfg)
        self._tasks: list[asyncio.Task[None]] = []
        self.leadership = leadership(self.cfg, self.routers, self.adapters)
        self.discovery = None if control is None else Discovery(self, control, token=control_token)
        if self.leadership is not None or self.shared is not None:
            from gpuplane.serve.ha import metrics as ha_metrics

            ha_metrics.register(self.metrics.registry, self.leadership, self.shared)

    def add_model(self, model: ModelConfig) -> ModelRouter:
        """Route `model` from now on: its configured instances, and any added later."""
        adapter = self.adapters[model.name] = get_adapter(model.engine)
        capacities = [i.max_concurrency or adapter.default_capacity for i in model.instances]
        router = self.routers[model.name] = ModelRouter(
            model,
            self.cfg,
            capacities,
            events=self._events,
            locality_wait_s=adapter.locality_wait_s,
            per_request_cache=adapter.prefix_cache_per_request,
            rng=random.Random(self._rng.random()),
            shared=self.shared,
        )
        self.health_paths[model.name] = adapter.health_path
        self.upstream_names[model.name] = model.upstream_model
        return router

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.shared is not None:
            await self.shared.start()
        self._tasks = [
            asyncio.create_task(self._reaper(), name="gpuplane-reaper"),
            asyncio.create_task(self._prober(), name="gpuplane-prober"),
        ]
        if self.discovery is not None:
            self._tasks.append(asyncio.create_task(self.discovery.run(), name="gpuplane-discovery"))
        if self.leadership is not None:
            self.leadership.start()

    async def step_down(self) -> None:
        """Hand the leader lease over now (primary/standby), first thing on shutdown: a
        standby takes over while requests admitted here finish. Idempotent."""
        if self.leadership is not None:
            await self.leadership.step_down()

    async def stop(self) -> None:
        if self.leadership is not None:
            await self.leadership.aclose()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.upstream.aclose()
        if self.discovery is not None:
            await self.discovery.aclose()
        if self.shared is not None:
            await self.shared.stop()

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
        """Probe every instance once; mark it healthy or count a failure (a refused
        connection marks it down at once: its engine is gone)."""
        checks = []
        for name, router in self.routers.items():
            for inst in router.instances:
                url = inst.url + self.health_paths[name]
                checks.append(
                    (router, inst.id, self.upstream.probe(url, self.cfg.health.probe_timeout_s))
                )
        results = await asyncio.gather(*(c[2] for c in checks))
        for (router, iid, _), failure in zip(checks, results, strict=True):
            if failure is None:
                router.health.report_success(iid)
            else:
                router.health.report_failure(iid, failure.kind, str(failure))

    # -- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """`/admin/state`: every instance once (with its model), and each model's queue."""
        instances = [
            {
                "model": router.name,
                "id": i.id,
                "url": i.url,
                "state": i.state.value,
                "in_flight": i.in_flight,
                "capacity": i.capacity,
                "last_error": i.last_error,
                "prefix_cache": router.cache_state(i.id),
            }
            for router in self.routers.values()
            for i in router.instances
        ]
        models = [
            {
                "name": router.name,
                "queued": len(router.queue),
                "queued_by_tenant": router.queue.depth_by_tenant(),
                # where a stream's token counts come from when its client asks for `usage`
                "stream_usage": "engine"
                if self.adapters[router.name].stream_usage
                else "estimated",
            }
            for router in self.routers.values()
        ]
        state: dict[str, Any] = {"instances": instances, "models": models}
        if self.leadership is not None:
            state["ha"] = self.leadership.state()
        elif self.shared is not None:
            state["ha"] = self.shared.report()
        return state

    def usage(self) -> dict[str, Any]:
        """`/admin/usage`: each tenant's usage since start, and its limits' current windows."""
        now = self.wall()
        return {"tenants": [account.state(now) for account in self.identity.accounts]}


class GatewayApp:
    """The gateway's ASGI app: completions dispatched by path (one dict lookup, no routing or
    middleware stack on the hot path), everything else through `admin`, a Starlette app."""

    def __init__(self, gateway: Gateway, admin: ASGIApp) -> None:
        self.gateway = gateway
        self.admin = admin
        # path -> whether it is the chat route (else text completions)
        self.routes: dict[str, bool] = {
            "/v1/chat/completions": True,
            "/v1/completions": False,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chat = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if chat is None:
            await self.admin(scope, receive, send)
            return
        if scope["method"] == "POST":
            response = await _completion(self.gateway, scope, receive, chat)
        else:
            response = _method_not_allowed(scope["path"], scope["method"], "POST")
        await response(scope, receive, send)


def leadership(
    cfg: GatewayConfig, routers: Mapping[str, ModelRouter], adapters: Mapping[str, EngineAdapter]
) -> Leadership | None:
    """The lease loop when `gateway.ha.mode` is primary_standby (its store is imported then)."""
    if cfg.ha.mode != "primary_standby":
        return None
    import httpx

    from gpuplane.serve.ha.leadership import Leadership

    timeout = httpx.Timeout(cfg.request_timeout_s, connect=cfg.connect_timeout_s)
    return Leadership(cfg.ha, routers, adapters, forward_timeout=timeout)


def shared_slots(
    cfg: GatewayConfig, adapters: Mapping[str, EngineAdapter]
) -> RedisSlotTable | None:
    """The slot table in Redis when `gateway.ha.mode` is shared (redis is imported only then),
    reading the engines' loads while Redis is out."""
    ha = cfg.ha
    if ha.mode != "shared":
        return None
    from gpuplane.serve.ha.loads import EngineLoads
    from gpuplane.serve.ha.shared import RedisSlotTable, SharedOptions

    assert ha.url is not None  # the settings require it in mode shared
    options = SharedOptions(
        url=ha.url,
        gateway_id=ha.gateway_id or f"{socket.gethostname()}-{os.getpid()}",
        ttl_s=ha.lease_ttl_s,
        renew_s=ha.renew_s,
        sync_s=ha.shared_sync_s,
        timeout_s=ha.shared_timeout_s,
        prefix=ha.key,
        deadline_s=cfg.request_timeout_s,
    )
    return RedisSlotTable(options, loads=EngineLoads(adapters, ha.shared_timeout_s))


def create_app(settings: ServeSettings, *, gateway: Gateway | None = None) -> GatewayApp:
    """The ASGI app of the gateway (lifespan starts and stops its background tasks)."""
    gw = gateway or Gateway(settings)

    async def models(request: Request) -> Response:
        client = request.client.host if request.client else None
        if gw.identity.tenant(request.headers, client) is None:
            return _unauthorized(request.headers)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gpuplane"}
            for name in gw.routers
        ]
        return JSONResponse({"object": "list", "data": data})

    def admin_only(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if not gw.identity.is_admin(request.headers):
                return _not_admin(gw.identity, request)
            return await handler(request)

        return guarded

    @admin_only
    async def metrics(request: Request) -> Response:
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    openapi_document = document()

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document)

    async def readyz(request: Request) -> Response:
        if gw.leadership is not None and (why := gw.leadership.refusal()) is not None:
            ha = gw.leadership.state()
            return JSONResponse(
                {"status": ha["role"], "message": why, "leader_url": ha["leader_url"]}, 503
            )
        down = [name for name, r in gw.routers.items() if not any(i.healthy for i in r.instances)]
        if down:
            return JSONResponse({"status": "unready", "models_without_healthy_instance": down}, 503)
        return JSONResponse({"status": "ready"})

    @admin_only
    async def admin_state(request: Request) -> Response:
        return JSONResponse(gw.state())

    @admin_only
    async def admin_usage(request: Request) -> Response:
        return JSONResponse(gw.usage())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/admin/state", admin_state, methods=["GET"]),
        Route("/admin/usage", admin_usage, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    served = ["POST /v1/chat/completions", "POST /v1/completions"] + [
        f"{method} {route.path}"
        for route in routes
        for method in sorted((route.methods or set()) - {"HEAD"})
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(
            404,
            f"this gateway does not serve {request.method} {request.url.path}; "
            f"it serves {', '.join(served)}",
            "unsupported_endpoint",
        )

    async def wrong_method(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        allowed = (exc.headers or {}).get("Allow", "")
        return _method_not_allowed(request.url.path, request.method, allowed)

    admin = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: wrong_method},
        lifespan=lifespan,
    )
    return GatewayApp(gw, admin)


def _method_not_allowed(path: str, method: str, allowed: str) -> Response:
    """405 naming the methods in `allowed` (the Allow header's list; HEAD goes unsaid)."""
    said = " or ".join(m for m in allowed.split(", ") if m != "HEAD")
    return error_response(
        405,
        f"{path} only accepts {said}, not {method}",
        "method_not_allowed",
        headers={"allow": allowed},
    )


def _unauthorized(headers: Mapping[str, str]) -> Response:
    given = "authorization" in headers or "api-key" in headers
    message = (
        "the API key is not valid for this gateway"
        if given
        else "this gateway requires an API key: send 'Authorization: Bearer <key>'"
    )
    return error_response(401, message, "invalid_api_key")


def _not_admin(identity: Identity, request: Request) -> Response:
    path = request.url.path
    if not identity.admin_digests:
        message = (
            f"{path} needs an admin key because tenants have API keys, and this gateway has "
            "none (gateway.admin.key_sha256): create one with `gpuplane gateway key create "
            "NAME --admin` and add its digest there"
        )
    elif presented_key(request.headers) is None:
        message = (
            f"{path} needs an admin key: send 'Authorization: Bearer ADMIN_KEY' (the CLI: "
            "$GPUPLANE_ADMIN_KEY or --admin-key @FILE)"
        )
    else:
        message = f"the key is not an admin key of this gateway, which {path} needs"
    return error_response(401, message, "invalid_admin_key", headers={"www-authenticate": "Bearer"})


def _limited(refusal: OverLimit) -> Response:
    """429 naming the limit, with `Retry-After` and OpenAI's x-ratelimit-* headers for it."""
    kind = refusal.kind
    return error_response(
        429,
        refusal.message(),
        refusal.code,
        headers={
            "retry-after": str(refusal.retry_after_s),
            f"x-ratelimit-limit-{kind}": str(refusal.limit),
            f"x-ratelimit-remaining-{kind}": str(max(0, refusal.limit - refusal.counted)),
            f"x-ratelimit-reset-{kind}": f"{refusal.retry_after_s}s",
        },
    )


async def _completion(
    gw: Gateway, scope: Scope, receive: Receive, chat: bool
) -> ProxyCall | Response | ForwardToLeader:
    # decoded once: the lookups below would each scan and decode the raw list
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    caller = await _caller(gw, scope, receive, headers)
    if isinstance(caller, Response):
        return caller
    tenant, raw = caller
    if gw.leadership is not None and (why := gw.leadership.refusal()) is not None:
        forward = gw.leadership.forward(scope["path"], raw, headers, tenant.name)
        if forward is not None:
            return forward
        gw.metrics.reject(UNKNOWN_MODEL, Rejection.NOT_LEADER.value)
        return error_response(503, why, Rejection.NOT_LEADER.value, headers={"retry-after": "1"})
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        gw.metrics.reject(UNKNOWN_MODEL, "invalid_request")
        return error_response(
            400, f"the request body is not valid JSON ({exc}); send a JSON object", "invalid_json"
        )
    refused = invalid(payload, chat)
    if refused is not None:
        gw.metrics.reject(UNKNOWN_MODEL, "invalid_request")
        return error_response(
            400, f"invalid request: {refused.message}", "invalid_request", param=refused.param
        )
    model: str = payload["model"]
    router = gw.routers.get(model)
    if router is None:
        gw.metrics.reject(UNKNOWN_MODEL, "unknown_model")
        known = ", ".join(gw.routers) or "none"
        return error_response(
            404,
            f"the model '{model}' does not exist on this gateway; available models: {known}",
            "model_not_found",
            param="model",
        )
    account = tenant.account
    asked = asked_tokens(payload) if account.budgets_tokens else 0
    now = gw.wall()
    limited = account.check(asked, now)
    if limited is not None:
        account.refused(limited)
        gw.metrics.reject(model, limited.code)
        return _limited(limited)
    charge = account.admit(asked, now)
    upstream_model = gw.upstream_names.get(model)
    if upstream_model and upstream_model != model:
        payload["model"] = upstream_model
        raw = orjson.dumps(payload)
    return ProxyCall(
        router=router,
        upstream=gw.upstream,
        metrics=gw.metrics,
        oplog=gw.oplog,
        path=scope["path"],
        body=raw,
        parsed=payload,
        headers=headers,
        stream=payload.get("stream") is True,
        tenant=tenant,
        charge=charge,
        wall=gw.wall,
        deadline_s=gw.cfg.request_timeout_s,
        idle_s=gw.cfg.idle_timeout_s,
        retries=gw.cfg.retries,
        show_instance=gw.identity.is_admin(headers),
    )


async def _caller(
    gw: Gateway, scope: Scope, receive: Receive, headers: Mapping[str, str]
) -> tuple[Tenant, bytes] | Response:
    """The caller's tenant and the request's body, or the refusal to answer. A request that
    another gateway of the group forwarded is the tenant it signed for (`ha/forward.py`),
    whatever address sent it or tenant header it carries; any other is resolved from its key
    (or a trusted proxy's tenant header) before its body is read."""
    if gw.leadership is not None and FORWARDED in headers:
        body = await _read_body(receive, headers, gw.cfg.max_body_bytes)
        if isinstance(body, Response):
            gw.metrics.reject(UNKNOWN_MODEL, "invalid_request")
            return body
        named = gw.leadership.forwarded_tenant(scope["path"], body, headers)
        tenant = None if named is None else gw.identity.named(named)
        if tenant is None:
            gw.metrics.reject(UNKNOWN_MODEL, "unauthorized")
            return error_response(
                401,
                f"the request is marked as forwarded by a gateway ({FORWARDED}) but the tenant "
                "it names is not signed with this gateway group's secret: every gateway of "
                "the group needs the same $GPUPLANE_GATEWAY_SECRET (or "
                "gateway.ha.forward_secret_file), and clients must not send that header",
                "invalid_forward_signature",
            )
        return tenant, body
    client = scope.get("client")
    tenant = gw.identity.tenant(headers, client[0] if client else None)
    if tenant is None:
        gw.metrics.reject(UNKNOWN_MODEL, "unauthorized")
        return _unauthorized(headers)
    body = await _read_body(receive, headers, gw.cfg.max_body_bytes)
    if isinstance(body, Response):
        gw.metrics.reject(UNKNOWN_MODEL, "invalid_request")
        return body
    return tenant, body


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes | Response:
    """The request body, or the error to answer: too large, or the client left mid-body."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return error_response(
                400, "the client disconnected while sending", "client_disconnected"
            )
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return _too_large(limit)
        if not message.get("more_body", False):
            return chunk if not chunks else b"".join([*chunks, chunk])
        chunks.append(chunk)


def _too_large(limit: int) -> Response:
    return error_response(
        413,
        f"the request body exceeds {limit} bytes (gateway.max_body_bytes); send a smaller request",
        "body_too_large",
    )


__all__ = ["Gateway", "GatewayApp", "create_app"]
