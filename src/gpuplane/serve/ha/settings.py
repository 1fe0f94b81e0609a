"""`gateway.ha`: which gateway leads and where its lease lives, or the slot table several
gateways share in Redis; every combination a store cannot honour is refused when parsed."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from gpuplane.sections import Section

HaMode = Literal["off", "primary_standby", "shared"]
LeaseStoreKind = Literal["file", "postgresql", "redis", "etcd"]
_STORE_SCHEMES: dict[str, tuple[str, ...]] = {
    "postgresql": ("postgresql", "postgres"),
    "redis": ("redis", "rediss"),
    "etcd": ("http", "https"),
}
_DEFAULT_PORTS = {"postgresql": 5432, "redis": 6379, "etcd": 2379}


class HaConfig(Section):
    """Gateway high availability: which gateway leads, decided by a leader lease in a store.

    The defaults fail over within 2 s: a leader that stops renewing is gone from the store
    `lease_ttl_s` (1.5 s) after its last renewal, and a standby asks every `renew_s` (0.25 s),
    so it leads at most 1.75 s after the last renewal, plus its rebuild (one metrics read per
    instance). The leader renews six times per TTL, so it keeps its lease through a store
    answering in 200 ms or a renewal held up by a busy CPU for up to `lease_ttl_s - renew_s -
    stop_margin_s` (1 s)."""

    mode: HaMode = Field(
        default="off",
        description="off: one gateway; primary_standby: one leader admits, standbys answer 503; "
        "shared: several gateways admit through one slot table in Redis",
    )
    lease: LeaseStoreKind = Field(
        default="file", description="where the leader lease lives: file, postgresql, redis, etcd"
    )
    path: str | None = Field(
        default=None,
        description="the lease file (lease: file); every gateway on the machine names the same",
    )
    url: str | None = Field(
        default=None,
        description="the lease store (postgresql://..., redis://..., etcd: http://host:2379)",
    )
    key: str = Field(
        default="gpuplane-gateway",
        min_length=1,
        description="the lease's name in the store: gateways that share it elect one leader",
    )
    lease_ttl_s: float = Field(
        default=1.5,
        gt=0,
        description="a leader that does not renew loses the lease this long after its last "
        "renewal (etcd: rounded up to whole seconds)",
    )
    renew_s: float = Field(
        default=0.25, gt=0, description="how often the leader renews and a standby asks"
    )
    stop_margin_s: float = Field(
        default=0.25,
        ge=0,
        description="the leader stops admitting this long before its lease would run out "
        "unrenewed, so that it has stopped before any standby can take over",
    )
    proxy_to_leader: bool = Field(
        default=False,
        description="a standby forwards completions to the leader instead of answering 503, "
        "naming the tenant it resolved under the gateways' shared secret "
        "($GPUPLANE_GATEWAY_SECRET or forward_secret_file)",
    )
    forward_secret_file: str | None = Field(
        default=None,
        description="a file holding the secret every gateway of the group shares, which signs "
        "the tenant a standby forwards (default: $GPUPLANE_GATEWAY_SECRET)",
    )
    gateway_id: str | None = Field(
        default=None, description="this gateway's name in the lease; default: host-pid"
    )
    advertise_url: str | None = Field(
        default=None,
        description="the URL other gateways forward to while this one leads; default: "
        "http://host:port",
    )
    shared_sync_s: float = Field(
        default=0.05,
        gt=0,
        description="mode shared: how often a gateway sends its heartbeat and reads the slots "
        "the other gateways hold; a slot freed elsewhere reaches this one's queue within it",
    )
    shared_timeout_s: float = Field(
        default=0.25,
        gt=0,
        description="mode shared: the longest one Redis call may take; past it, or with Redis "
        "down, the gateway admits on its local share of each instance",
    )

    @model_validator(mode="after")
    def _store_named(self) -> HaConfig:
        if self.mode == "off":
            return self
        if self.mode == "shared" and self.lease != "redis":
            raise ValueError("mode shared keeps its slot table in Redis: set lease: redis")
        if self.mode == "shared" and "|" in (self.gateway_id or ""):
            raise ValueError(
                f"gateway_id {self.gateway_id!r} contains '|', which separates a shared lease's "
                "gateway id from its epoch; choose a name without it"
            )
        if self.lease == "file":
            if not self.path:
                raise ValueError(
                    "lease: file needs `path`, the lease file every gateway on this machine "
                    "shares, e.g. path: /var/run/gpuplane/gateway.lease"
                )
            if self.url:
                raise ValueError("lease: file takes `path`, not `url`; remove url")
        else:
            schemes = _STORE_SCHEMES[self.lease]
            scheme = urlsplit(self.url or "").scheme
            if scheme not in schemes:
                raise ValueError(
                    f"lease: {self.lease} needs `url` starting with "
                    f"{' or '.join(s + '://' for s in schemes)}"
                    f"{', got ' + repr(self.url) if self.url else ''}, e.g. "
                    f"{schemes[0]}://127.0.0.1:{_DEFAULT_PORTS[self.lease]}"
                )
            if self.path:
                raise ValueError(f"lease: {self.lease} takes `url`, not `path`; remove path")
        if self.renew_s * 3 > self.lease_ttl_s:
            raise ValueError(
                f"renew_s ({self.renew_s}) must be at most a third of lease_ttl_s "
                f"({self.lease_ttl_s}), so that one late renewal does not lose the lease"
            )
        if self.stop_margin_s + self.renew_s >= self.lease_ttl_s:
            raise ValueError(
                f"stop_margin_s + renew_s ({self.stop_margin_s + self.renew_s:g}) must be below "
                f"lease_ttl_s ({self.lease_ttl_s}), or the leader would stop before it renews"
            )
        return self
