"""HTTP to the engine instances: one pooled httpx client, transport errors mapped once.

Every failure surfaces as `UpstreamFailure` with the kind the router's passive health check needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx

from gpuplane.config import GatewayConfig
from gpuplane.serve.router import FailureKind

# Headers of the client's request that are forwarded to the engine.
FORWARDED_REQUEST_HEADERS = ("accept", "content-type", "user-agent", "x-request-id")
# Headers of the engine's response that are passed back to the client.
PASSED_RESPONSE_HEADERS = ("content-type", "content-encoding", "x-request-id")


class UpstreamFailure(Exception):
    def __init__(self, kind: FailureKind, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def _map(exc: httpx.HTTPError, url: str) -> UpstreamFailure:
    if isinstance(exc, httpx.ConnectError):
        return UpstreamFailure(FailureKind.CONNECT, f"cannot connect to {url}: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamFailure(FailureKind.TIMEOUT, f"{url} timed out: {type(exc).__name__}")
    return UpstreamFailure(FailureKind.PROTOCOL, f"{url} broke the connection: {exc!r}")


class Upstream:
    """One pooled client per engine instance (origin).

    httpcore scans every pooled connection on each request and release (quadratically, in
    httpcore 1.0), so one shared pool in front of a fleet costs milliseconds per request; a pool
    per instance holds only that instance's few connections.
    """

    def __init__(self, cfg: GatewayConfig) -> None:
        self._timeout = httpx.Timeout(
            connect=cfg.connect_timeout_s,
            read=cfg.idle_timeout_s,
            write=cfg.idle_timeout_s,
            pool=cfg.connect_timeout_s,
        )
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _client_for(self, url: str) -> httpx.AsyncClient:
        origin = url[: url.find("/", url.find("//") + 2)] if url.count("/") > 2 else url
        client = self._clients.get(origin)
        if client is None:
            client = self._clients[origin] = httpx.AsyncClient(
                timeout=self._timeout,
                # expire idle connections before an engine's keep-alive (uvicorn: 5 s) closes
                # them, so that a request is never sent on a connection the engine is closing
                limits=httpx.Limits(
                    max_connections=None, max_keepalive_connections=64, keepalive_expiry=4.0
                ),
                trust_env=False,
            )
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()

    async def open(self, url: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """Send the request; return the response with its body still to be streamed.

        A 5xx answer is a failure (closed here); other statuses are the engine's answer.
        """
        client = self._client_for(url)
        request = client.build_request(
            "POST",
            url,
            content=body,
            headers={k: v for k, v in headers.items() if k in FORWARDED_REQUEST_HEADERS},
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _map(exc, url) from None
        if response.status_code >= 500:
            detail = await self._read_quietly(response)
            raise UpstreamFailure(
                FailureKind.STATUS,
                f"{url} answered {response.status_code}: {detail[:200]!r}",
                response.status_code,
            )
        return response

    async def chunks(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The response body as it arrives."""
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise _map(exc, str(response.request.url)) from None

    async def probe(self, url: str, timeout_s: float) -> bool:
        try:
            response = await self._client_for(url).get(url, timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code < 500

    @staticmethod
    async def _read_quietly(response: httpx.Response) -> bytes:
        try:
            return await response.aread()
        except httpx.HTTPError:
            return b""
        finally:
            await response.aclose()
