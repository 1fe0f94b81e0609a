"""Who calls the gateway: a tenant from its API key (looked up by the key's SHA-256 digest), or
from the `X-Gpuplane-Tenant` header when a trusted proxy sends it; and whether a caller holds
an admin key (`/admin/*`, `/metrics`).

Pure: the shell hands in the request's headers (lower-case names) and the client's address.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from gpuplane.serve.limits import Account
from gpuplane.serve.settings import ServeSettings, key_digest

log = logging.getLogger("gpuplane.gateway")

TENANT_HEADER = "x-gpuplane-tenant"
DEFAULT_TENANT = "default"  # keyless callers, unless a trusted proxy names another tenant
KEY_PREFIX = "gpk-"
# Client addresses whose trust is remembered; past it the memory starts again (a bound on what
# clients can make the gateway hold).
_TRUST_MEMORY = 4096


def new_key() -> str:
    """A new API key: 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(slots=True)
class Tenant:
    name: str
    account: Account  # its limits and usage
    weight: float = 1.0
    priority: int = 0


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY`, else `api-key: KEY` (Azure
    OpenAI clients' header); None without either."""
    auth = headers.get("authorization")
    if auth is not None and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("api-key")


class Identity:
    """Tenants by key digest and by name, the admin keys' digests and the trusted proxies."""

    def __init__(self, settings: ServeSettings) -> None:
        self.tenants: dict[str, Tenant] = {
            t.name: Tenant(t.name, Account(t.name, t.limits), t.weight, t.priority)
            for t in settings.tenants
        }
        self.default = self.tenants.get(DEFAULT_TENANT) or Tenant(
            DEFAULT_TENANT, Account(DEFAULT_TENANT)
        )
        self.by_digest = {d: self.tenants[t.name] for t in settings.tenants for d in t.digests}
        self.admin_digests = frozenset(settings.gateway.admin.key_sha256)
        self.keys_required = bool(self.by_digest)
        # any key configured closes /admin/* and /metrics to callers without an admin key
        self.admin_required = self.keys_required or bool(self.admin_digests)
        self.proxies = tuple(settings.gateway.trusted_proxies)
        self._trust: dict[str, bool] = {}
        for t in settings.tenants:
            if t.api_keys:
                log.warning(
                    "tenant '%s' has API keys in clear in the config (tenants[].api_keys); "
                    "replace them with their digests: key_sha256: [%s]",
                    t.name,
                    ", ".join(key_digest(k.get_secret_value()) for k in t.api_keys),
                    extra={"event": "plain_api_keys", "tenant": t.name},
                )
        if self.keys_required and not self.admin_digests:
            log.warning(
                "tenants have API keys but gateway.admin.key_sha256 is empty, so /admin/* and "
                "/metrics answer 401 to everyone; add an admin key (`gpuplane gateway key "
                "create NAME --admin`)",
                extra={"event": "no_admin_key"},
            )

    @property
    def accounts(self) -> list[Account]:
        """Every tenant's account, the default one included."""
        tenants = list(self.tenants.values())
        if self.default.name not in self.tenants:
            tenants.append(self.default)
        return [t.account for t in tenants]

    def tenant(self, headers: Mapping[str, str], client: str | None) -> Tenant | None:
        """The caller's tenant: the one a trusted proxy names in `X-Gpuplane-Tenant`, else the
        key's; without configured keys, the default tenant. None when keys are configured and
        the request has no valid one (a name the proxy sends that no tenant has is ignored)."""
        if self.proxies:
            named = headers.get(TENANT_HEADER)
            if named is not None and client is not None and self.trusted(client):
                tenant = self.tenants.get(named)
                if tenant is not None:
                    return tenant
        if not self.keys_required:
            return self.default
        key = presented_key(headers)
        return None if key is None else self.by_digest.get(key_digest(key))

    def named(self, name: str) -> Tenant | None:
        """The tenant of this name (the default one included), as another gateway of the
        group resolved it for a request it forwarded."""
        return self.tenants.get(name) or (self.default if name == self.default.name else None)

    def is_admin(self, headers: Mapping[str, str]) -> bool:
        """May the caller read /admin/* and /metrics? Anyone while no key is configured."""
        if not self.admin_required:
            return True
        key = presented_key(headers)
        return key is not None and key_digest(key) in self.admin_digests

    def trusted(self, client: str) -> bool:
        """Is the client's address in one of `gateway.trusted_proxies`?"""
        known = self._trust.get(client)
        if known is None:
            try:
                addr = ipaddress.ip_address(client)
            except ValueError:  # a Unix socket's path, a test transport's name
                return False
            if len(self._trust) >= _TRUST_MEMORY:
                self._trust.clear()
            known = self._trust[client] = any(addr in net for net in self.proxies)
        return known
