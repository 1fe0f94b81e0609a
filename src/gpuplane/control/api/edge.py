"""The control API's edge: ASGI middleware that runs before any handler, for the JSON API and the
console alike.

`Gatekeeper` finds the route's row of `auth.POLICY`, identifies the caller (bearer token, or the
console's session cookie) and applies the row, all before one byte of the body is read: an
anonymous or under-privileged call is answered 401/403 however large a body it announces or
sends. A caller let through has its body read up to the configured limit
(`control.http.max_body_bytes`, `max_form_bytes` for console forms), counting the bytes that
actually arrive (a Content-Length past the limit is refused at once; a chunked body or one whose
Content-Length lies is cut off as soon as it passes), and answered 413 naming the limit. The
handler then gets the body whole from memory, so none ever reads an over-long one.

`Trail` records each call that may change something in the store's trail (`trail.py`): who,
what, from where (the peer, or what a trusted proxy said: `control.http.trusted_proxies`), the
status. Calls that identify no one (mostly 401s) are counted, not recorded, and a gateway's
once-a-second load report is a machine heartbeat, recorded only when refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence

from fastapi.routing import iter_route_contexts
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuplane.control.identity.auth import POLICY, AuthError, Principal, Rule, decide
from gpuplane.control.identity.config import HttpConfig
from gpuplane.control.service.service import ControlService
from gpuplane.control.store import trail

Identify = Callable[[Request, Rule], Awaitable[Principal | None]]
Refuse = Callable[[Request, int, str], Response]


def rule_of(method: str, route_path: str) -> Rule | None:
    """The policy row of a call of `route_path` (a HEAD is its GET)."""
    return POLICY.get(("GET" if method == "HEAD" else method, route_path))


def served(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route `routes` serve, an included router's one by one: FastAPI keeps an included
    router as one route that matches lazily. The routers are included without a prefix, so each
    route's own path is the path served (and `request.scope["route"]`'s)."""
    for context in iter_route_contexts(routes):
        yield context.original_route


class BodyTooLarge(Exception):
    """A request body past its limit (413)."""

    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(
            f"the request body is larger than {limit} bytes, the limit (control.http.{setting}): "
            "send less (split a job batch), or raise the limit in the config"
        )


class _Gone(Exception):
    """The client went away while sending its body: there is no one to answer."""


class Gatekeeper:
    """Identify, authorise, then read a bounded body (module docstring); `identify` finds the
    caller of a route's rule, `refuse` draws a refusal (a JSON error or a console page)."""

    def __init__(
        self, app: ASGIApp, *, router: Router, identify: Identify, refuse: Refuse, http: HttpConfig
    ) -> None:
        self.app = app
        self.router = router
        self.identify = identify
        self.refuse = refuse
        self.http = http

    def _rule(self, scope: Scope) -> Rule | None:
        """The policy row of the route `scope` calls; None: no route matches, and the router
        answers 404 or 405 without reading the body."""
        for route in served(self.router.routes):
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return rule_of(scope["method"], getattr(route, "path", ""))
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rule = self._rule(scope) if scope["type"] == "http" else None
        if rule is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            request.state.principal = await self.identify(request, rule)
            decide(rule, request.state.principal)
        except AuthError as exc:
            await self.refuse(request, exc.status, str(exc))(scope, receive, send)
            return
        setting = "max_form_bytes" if rule.console else "max_body_bytes"
        try:
            limit = getattr(self.http, setting)
            body = await read_body(receive, request.headers.get("content-length"), limit, setting)
        except BodyTooLarge as exc:
            refused = self.refuse(request, 413, str(exc))
            refused.headers["Connection"] = "close"  # the rest of the body is never read
            await refused(scope, receive, send)
            return
        except _Gone:
            return
        await self.app(scope, _replay(body, receive), send)


async def read_body(receive: Receive, declared: str | None, limit: int, setting: str) -> bytes:
    """The whole body, or BodyTooLarge as soon as it passes `limit` bytes: what arrives is
    counted, whatever Content-Length (`declared`) says; one that declares more than `limit`
    is not read at all."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, setting)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, setting)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body read at the edge, then the client's own messages
    (a disconnect, which a long poll waits for)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class Trail:
    """Each call that may change something (POST, PUT, PATCH, DELETE) goes into the store's
    trail once answered, refused ones too: who (the caller `Gatekeeper` left in the request's
    state), what (method and path, never a body), from where, and the HTTP status (module
    docstring for what is counted instead)."""

    def __init__(self, app: ASGIApp, service: ControlService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH", "DELETE"):
            await self.app(scope, receive, send)
            return
        status = 500  # unless a response starts

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            who: Principal | None = scope.get("state", {}).get("principal")
            client = scope.get("client")
            if who is None:
                self.service.metrics.unidentified.labels(str(status)).inc()
            elif trail.recorded(scope["method"], scope["path"], status):
                await run_in_threadpool(
                    trail.record_call,
                    self.service.store,
                    self.service.clock(),
                    f"{scope['method']} {scope['path']} as {who.role}",
                    who,
                    client[0] if client else "unknown",
                    status,
                )
