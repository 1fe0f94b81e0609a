"""The gateway's HTTP surface: OpenAI-compatible routes, auth, validation, admin and metrics.

Request → tenant from the API key (or a trusted proxy's header) → parse and validate → resolve
the model → the tenant's limits (count the request, reserve its tokens) → hand over to a
`ProxyCall` (slot, placement, proxy, release, settle the tokens). Every refusal is an
OpenAI-shaped error that says what was wrong and what to do. `/admin/*` and `/metrics` need an
admin key once any key is configured.

The two completion routes are the hot path: `GatewayApp` dispatches them itself, straight from
the ASGI scope, and hands every other request to a Starlette app (admin, metrics, health).
The wiring behind the routes (routers, discovery, HA, background tasks) is `gateway.py`'s
`Gateway`, which this module reads and drives but does not build beyond `create_app`'s default.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuplane.serve.errors import Rejection, error_response
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.ha.forward import FORWARDED
from gpuplane.serve.limits import OverLimit, asked_tokens
from gpuplane.serve.metrics import UNKNOWN_MODEL
from gpuplane.serve.openapi import document
from gpuplane.serve.proxy import ProxyCall
from gpuplane.serve.settings import ServeSettings
from gpuplane.serve.tenants import Identity, Tenant, presented_key
from gpuplane.serve.validation import invalid

if TYPE_CHECKING:
    from gpuplane.serve.ha.forward import ForwardToLeader


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


class _Routes:
    """Every route but the completions, over one gateway: the model list, health, readiness,
    the OpenAPI document, and the admin-only state, usage and metrics."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.openapi_document = document()

    def table(self) -> list[Route]:
        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/metrics", self._admin_only(self.metrics), methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/admin/state", self._admin_only(self.admin_state), methods=["GET"]),
            Route("/admin/usage", self._admin_only(self.admin_usage), methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    def _admin_only(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if not self.gw.identity.is_admin(request.headers):
                return _not_admin(self.gw.identity, request)
            return await handler(request)

        return guarded

    async def models(self, request: Request) -> Response:
        client = request.client.host if request.client else None
        if self.gw.identity.tenant(request.headers, client) is None:
            return _unauthorized(request.headers)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gpuplane"}
            for name in self.gw.routers
        ]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(self, request: Request) -> Response:
        return Response(self.gw.metrics.render(), media_type="text/plain; version=0.0.4")

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.openapi_document)

    async def readyz(self, request: Request) -> Response:
        gw = self.gw
        if gw.leadership is not None and (why := gw.leadership.refusal()) is not None:
            ha = gw.leadership.state()
            return JSONResponse(
                {"status": ha["role"], "message": why, "leader_url": ha["leader_url"]}, 503
            )
        down = [name for name, r in gw.routers.items() if not any(i.healthy for i in r.instances)]
        if down:
            return JSONResponse({"status": "unready", "models_without_healthy_instance": down}, 503)
        return JSONResponse({"status": "ready"})

    async def admin_state(self, request: Request) -> Response:
        return JSONResponse(self.gw.state())

    async def admin_usage(self, request: Request) -> Response:
        return JSONResponse(self.gw.usage())


def create_app(settings: ServeSettings, *, gateway: Gateway | None = None) -> GatewayApp:
    """The ASGI app of the gateway (lifespan starts and stops its background tasks)."""
    gw = gateway or Gateway(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    routes = _Routes(gw).table()
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


__all__ = ["GatewayApp", "create_app"]
