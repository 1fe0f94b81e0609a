"""HTTP to the engine instances: one pooled aiohttp client, transport errors mapped once.

Every failure surfaces as `UpstreamFailure` with the kind the router's passive health check needs.
aiohttp's client costs a fraction of httpx's CPU per proxied request (it parses with a C parser
and keeps no per-request pool scan), which is most of the gateway's own overhead. Only
connecting is timed here: how long an engine may stay silent (`gateway.idle_timeout_s`) is the
caller's to enforce (`ProxyCall`, on the timer it has anyway; aiohttp's read timeout arms and
cancels further loop timers for every response).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import aiohttp

from gpuplane.serve.errors import FailureKind
from gpuplane.serve.settings import GatewayConfig

# Headers of the client's request that are forwarded to the engine.
FORWARDED_REQUEST_HEADERS = ("accept", "content-type", "user-agent", "x-request-id")
# Headers of the engine's response that are passed back to the client.
PASSED_RESPONSE_HEADERS = ("content-type", "content-encoding", "x-request-id")
# Idle pooled connections are closed before an engine's keep-alive (uvicorn: 5 s) closes them,
# so that a request is never sent on a connection the engine is closing (POST is not retried).
KEEPALIVE_S = 4.0

EngineResponse = aiohttp.ClientResponse


class UpstreamFailure(Exception):
    def __init__(self, kind: FailureKind, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def _map(exc: Exception, url: object) -> UpstreamFailure:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamFailure(FailureKind.CONNECT, f"cannot connect to {url}: {exc}")
    if isinstance(exc, TimeoutError):
        return UpstreamFailure(FailureKind.TIMEOUT, f"{url} timed out: {type(exc).__name__}")
    return UpstreamFailure(FailureKind.PROTOCOL, f"{url} broke the connection: {exc!r}")


class Upstream:
    """One client session whose connector keeps a keep-alive pool per engine instance
    (host:port), with the connect timeout of the gateway's config.

    The session is made on first use, inside the event loop that serves the gateway.
    """

    def __init__(self, cfg: GatewayConfig) -> None:
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            session = self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                timeout=self._timeout,
                # the body is passed through as the engine encoded it, with its content-encoding
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def open(self, url: str, body: bytes, headers: Mapping[str, str]) -> EngineResponse:
        """Send the request; return the response with its body still to be streamed.

        A 5xx answer is a failure (closed here); other statuses are the engine's answer. The
        caller closes the response (`close`); cancelling the caller drops the connection, which
        aborts the engine's request.
        """
        forwarded = {k: v for k in FORWARDED_REQUEST_HEADERS if (v := headers.get(k)) is not None}
        try:
            response = await self._client().post(url, data=body, headers=forwarded)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _map(exc, url) from None
        if response.status >= 500:
            detail = await self._read_quietly(response)
            raise UpstreamFailure(
                FailureKind.STATUS,
                f"{url} answered {response.status}: {detail[:200]!r}",
                response.status,
            )
        return response

    async def read(self, response: EngineResponse) -> bytes:
        """The whole response body."""
        try:
            return await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _map(exc, response.url) from None

    async def chunks(self, response: EngineResponse) -> AsyncIterator[bytes]:
        """The response body as it arrives."""
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _map(exc, response.url) from None

    @staticmethod
    def close(response: EngineResponse) -> None:
        """Done with the response: a fully read one has already gone back to the pool; an
        unfinished one closes its connection, so that the engine stops generating."""
        response.close()

    async def probe(self, url: str, timeout_s: float) -> UpstreamFailure | None:
        """GET a health URL: None when it answers below 500 within `timeout_s`, else the
        failure, of the kind passive health counts (a refused connection: the engine is gone)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client().get(url, timeout=timeout) as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = _map(exc, url)
            return UpstreamFailure(failure.kind, f"health probe: {failure}")
        if response.status >= 500:
            return UpstreamFailure(
                FailureKind.STATUS, f"health probe: {url} answered {response.status}"
            )
        return None

    async def _read_quietly(self, response: EngineResponse) -> bytes:
        """The body of an answer that is a failure anyway (for its message), then closed."""
        try:
            return await self.read(response)
        except UpstreamFailure:
            return b""
        finally:
            self.close(response)
