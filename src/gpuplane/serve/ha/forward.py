"""A standby's forwarding of a completion to the leader (`gateway.ha.proxy_to_leader`).

The request goes on once, marked with `x-gpuplane-forwarded`; a gateway that gets a marked
request and does not lead answers 503 instead of forwarding again, so two standbys never
bounce a request between them. The leader's answer, streamed or not, is passed back as it
comes; a leader that cannot be reached is a 503 with Retry-After, like a standby's refusal.

The tenant is the one the standby resolved (from the caller's key), never the caller's own
`X-Gpuplane-Tenant`: the standby names it in `x-gpuplane-forwarded-tenant` with an HMAC-SHA256
over (tenant, path, the body's digest) under the secret the gateways share. The leader takes a
marked request's tenant from that signature alone, whatever address sent it, and refuses a
marked request whose signature does not verify.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

import httpx
from starlette.types import Receive, Scope, Send

from gpuplane.secrets import read_secret
from gpuplane.serve.errors import Rejection, error_response

FORWARDED = "x-gpuplane-forwarded"
FORWARDED_TENANT = "x-gpuplane-forwarded-tenant"
SIGNATURE = "x-gpuplane-forward-signature"
SECRET_ENV = "GPUPLANE_GATEWAY_SECRET"
_REQUEST = ("content-type", "authorization", "api-key", "accept")
_RESPONSE = (b"content-type", b"cache-control", b"retry-after", b"x-gpuplane-instance")


def load_secret(path: str | None) -> bytes | None:
    """The gateways' shared secret: the file's content (`forward_secret_file`), else
    $GPUPLANE_GATEWAY_SECRET; None without either."""
    if path is not None:
        return read_secret(path, f"gateway.ha.forward_secret_file {path}").encode()
    secret = os.environ.get(SECRET_ENV, "").strip()
    return secret.encode() or None


def sign(secret: bytes, tenant: str, path: str, body: bytes) -> str:
    """The signature a standby sends with the tenant it resolved for this request."""
    message = b"\n".join([tenant.encode(), path.encode(), hashlib.sha256(body).digest()])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def signed_tenant(
    secret: bytes | None, headers: Mapping[str, str], path: str, body: bytes
) -> str | None:
    """The tenant a gateway named for a forwarded request, if its signature verifies."""
    tenant, signature = headers.get(FORWARDED_TENANT), headers.get(SIGNATURE)
    if secret is None or tenant is None or signature is None:
        return None
    expected = sign(secret, tenant, path, body)
    return tenant if hmac.compare_digest(expected, signature) else None


class ForwardToLeader:
    """An ASGI response: the request sent on to the leader at `url`, its answer relayed, as
    the `tenant` this standby resolved, signed with `secret`."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        url: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        by: str,
        tenant: str,
        secret: bytes,
    ) -> None:
        self.client = client
        self.url = url
        self.body = body
        self.headers = {k: v for k, v in headers.items() if k in _REQUEST} | {
            FORWARDED: by,
            FORWARDED_TENANT: tenant,
            SIGNATURE: sign(secret, tenant, path, body),
        }

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
