"""OpenID Connect: a bearer JWT checked against the configured issuer's keys (PyJWT), its claims
mapped to a team and a role. The keys are a JWKS file read at start (no network at request
time); PyJWT's errors become None here, at the edge."""

from __future__ import annotations

from pathlib import Path

import jwt

from gpuplane.control.identity.auth import Principal, Role
from gpuplane.control.identity.config import OidcConfig
from gpuplane.errors import ConfigError


class OidcVerifier:
    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        try:
            self.keys = jwt.PyJWKSet.from_json(Path(config.jwks_file).read_text())
        except (OSError, jwt.PyJWTError, ValueError) as exc:
            raise ConfigError(
                f"control.auth.oidc.jwks_file {config.jwks_file} holds no usable keys ({exc}); "
                "point it at the issuer's JWKS document (its jwks_uri), saved as JSON"
            ) from None

    def verify(self, token: str) -> Principal | None:
        """The caller of a valid token (signature, issuer, audience, expiry, a known role and,
        unless admin, a team); None otherwise."""
        c = self.config
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            key = self.keys[kid] if kid else self.keys.keys[0]
            claims = jwt.decode(
                token,
                key,
                algorithms=c.algorithms,
                audience=c.audience,
                issuer=c.issuer,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except (jwt.PyJWTError, KeyError, IndexError):
            return None
        role, team = claims.get(c.role_claim), claims.get(c.team_claim)
        if role not in Role.__members__ or (role != Role.admin and not isinstance(team, str)):
            return None
        return Principal(
            subject=str(claims["sub"]),
            role=Role(str(role)),
            team=team if isinstance(team, str) else None,
        )
