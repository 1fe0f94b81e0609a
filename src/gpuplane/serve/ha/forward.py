"""A standby's forwarding of a completion to the leader (`gateway.ha.proxy_to_leader`).

The request goes on once, marked with `x-gpuplane-forwarded`; a gateway that gets a marked
request and does not lead answers 503 instead of forwarding again, so two standbys never
bounce a request between them. The leader's answer, streamed or not, is passed back as it
comes; a leader that cannot be reached is a 503 with Retry-After, like a standby's refusal.
"""

from __future__ import annotations

import httpx
from starlette.types import Receive, Scope, Send

from gpuplane.serve.errors import Rejection, error_response

FORWARDED = "x-gpuplane-forwarded"
_REQUEST = ("content-type", "authorization", "api-key", "x-gpuplane-tenant", "accept")
_RESPONSE = (b"content-type", b"cache-control", b"retry-after", b"x-gpuplane-instance")


class ForwardToLeader:
    """An ASGI response: the request sent on to the leader at `url`, its answer relayed."""

    def __init__(
        self, client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str], by: str
    ) -> None:
        self.client = client
        self.url = url
        self.body = body
        self.headers = {k: v for k, v in headers.items() if k in _REQUEST} | {FORWARDED: by}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = self.client.build_request(
            "POST", self.url, content=self.body, headers=self.headers
        )
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            refused = error_response(
                503,
                f"this gateway is a standby and the leader at {self.url} did not answer "
                f"({type(exc).__name__}); retry",
                Rejection.NOT_LEADER.value,
                headers={"retry-after": "1"},
            )
            await refused(scope, receive, send)
            return
        try:
            headers = [(k, v) for k, v in response.headers.raw if k.lower() in _RESPONSE]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": headers}
            )
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError:
                pass  # the leader broke off: end the answer here, as it ended there
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()
