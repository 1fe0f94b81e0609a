"""The `control.auth` and `control.http` sections of gpuplane.yaml: who may call the API (tokens,
OIDC, the hosts it answers) and what the edge accepts before any handler runs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpuplane.control.bounds import bounded
from gpuplane.sections import Section


class OidcConfig(Section):
    """OpenID Connect: bearer JWTs signed by the issuer's keys (a JWKS file), mapped to a role."""

    issuer: str = Field(description="the `iss` every token must carry")
    audience: str = Field(description="the `aud` every token must carry (this service)")
    jwks_file: str = Field(description="the issuer's signing keys (JWKS JSON), read at start")
    team_claim: str = Field(default="team", description="the claim naming the caller's team")
    role_claim: str = Field(
        default="role", description="the claim naming the role: viewer, member or admin"
    )
    algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256"], description="signature algorithms accepted"
    )


class AuthConfig(Section):
    """Who may call the API. There is no switch to turn it off: every route but /healthz and
    the API docs needs a bearer token (an API token, or a JWT when `oidc` is set)."""

    allowed_hosts: list[str] | None = Field(
        default=None,
        description="Host header values the API answers (others get 400); unset: the loopback "
        "names when listening on loopback, and a required setting otherwise",
    )
    oidc: OidcConfig | None = Field(default=None, description="verify JWTs from this issuer")
    from_env: list[str] = Field(
        default_factory=list,
        description="environment variables of the service a job spec may pass through by name "
        "({fromEnv: NAME}); none by default",
    )


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class HttpConfig(Section):
    """What the API and the console accept at the edge (`control/api/edge.py`), before any handler:
    a caller is identified before its body is read, and a body past its limit gets 413."""

    max_body_bytes: Annotated[
        int, bounded(1024, 1 << 30, "largest request body of the JSON API (a job batch)")
    ] = 4 << 20
    max_form_bytes: Annotated[
        int, bounded(256, 1 << 20, "largest console form (login, cancel, logout)")
    ] = 16 << 10
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses of reverse proxies whose X-Forwarded-For names the client; "
        "none by default: the trail records the peer's own address, whatever a client claims",
    )
