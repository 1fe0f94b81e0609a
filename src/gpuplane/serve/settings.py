"""The online-inference tier's settings: the gateway, the models and their instances, tenants,
and the embedded engine (`gpuplane up`). The gateway's `ha` section is `ha/settings.py`'s and
the `engine` section `engines/config.py`'s (the control plane reads it too)."""

from __future__ import annotations

import hashlib
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, IPvAnyNetwork, SecretStr, field_validator, model_validator

from gpuplane.engines.base import adapter_class
from gpuplane.engines.config import EngineConfig
from gpuplane.sections import Section, passes
from gpuplane.serve.ha.settings import HaConfig

PlacementPolicy = Literal[
    "slots_prefix", "slots", "round_robin", "least_connections", "power_of_two"
]


class InstanceConfig(Section):
    """One engine instance behind the gateway."""

    url: str = Field(description="base URL of the engine's OpenAI API, e.g. http://10.0.0.5:8000")
    max_concurrency: int | None = Field(
        default=None, ge=1, description="slots; unset = the engine's own default (llama.cpp: 1)"
    )
    name: str | None = Field(default=None, description="label in metrics; defaults to the url")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            example = url if "://" in url else f"http://{url}"
            raise ValueError(
                f"'{url}' is not an http(s) URL with a host; write it as e.g. {example}"
            )
        return url

    @property
    def id(self) -> str:
        return self.name or self.url.rstrip("/")


class ModelConfig(Section):
    """A model name clients ask for, and the instances that serve it."""

    name: str = Field(description="the name clients send as `model`")
    engine: str = Field(
        default="llamacpp",
        description="llamacpp, vllm, sglang, lmdeploy, trtllm, sim or openai (any other server)",
    )
    instances: list[InstanceConfig] = Field(min_length=1, description="engine instances")
    cached_prefix_chars: int | None = Field(
        default=None,
        ge=1,
        description="prompt characters one instance's prefix cache holds; the prefix index "
        "forgets the oldest beyond it (unset: bounded only by what misses reveal)",
    )
    upstream_model: str | None = Field(
        default=None, description="model name sent to the instances; defaults to `name`"
    )

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, engine: str) -> str:
        return passes(adapter_class, engine)


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def key_digest(key: str) -> str:
    """The SHA-256 hex digest a key is stored as (`key_sha256`). Keys are random and long
    (`gpuplane gateway key create`), so a fast unsalted hash is enough: nobody can search
    their space, and a lookup by digest reveals nothing of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def _digests(values: list[str]) -> list[str]:
    out = []
    for value in values:
        digest = value.strip().lower()
        if not _SHA256_HEX.fullmatch(digest):
            raise ValueError(
                f"'{value}' is not a SHA-256 hex digest (64 hex digits); "
                "`gpuplane gateway key create NAME` makes a key and prints its digest"
            )
        out.append(digest)
    return out


class LimitConfig(Section):
    """A tenant's allowance per fixed window: requests admitted, tokens used, or both."""

    requests: int | None = Field(default=None, ge=1, description="requests admitted per window")
    tokens: int | None = Field(
        default=None,
        ge=1,
        description="prompt + completion tokens per window; a request reserves its prompt's "
        "estimate (4 characters a token) plus its max_tokens when admitted, and its real use "
        "(the engine's `usage`, else the estimate) replaces that when it ends",
    )
    window_s: float = Field(
        default=60.0,
        gt=0,
        description="window length; windows start at multiples of it since the Unix epoch "
        "(86400: UTC days)",
    )

    @model_validator(mode="after")
    def _something_limited(self) -> LimitConfig:
        if self.requests is None and self.tokens is None:
            raise ValueError(
                "a limit needs `requests`, `tokens` or both, e.g. {requests: 600, window_s: 60}"
            )
        return self


class TenantConfig(Section):
    """A client of the gateway: its API keys, its share of queued capacity, its priority and
    its limits."""

    name: str = Field(description="tenant name in metrics and the queue")
    key_sha256: list[str] = Field(
        default_factory=list,
        description="SHA-256 hex digests of the keys it sends as `Authorization: Bearer KEY` "
        "(`gpuplane gateway key create NAME` makes one); any key configured makes keys "
        "mandatory",
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="keys in clear, as key_sha256 (accepted with a warning at start that "
        "gives their digests: keep digests in the file instead)",
    )
    weight: float = Field(default=1.0, gt=0, description="share of freed slots while queued")
    priority: int = Field(default=0, description="higher is served first when queued")
    limits: list[LimitConfig] = Field(
        default_factory=list,
        description="request rates and token budgets per window; over one: 429 with Retry-After",
    )

    @field_validator("key_sha256")
    @classmethod
    def _hex_digests(cls, values: list[str]) -> list[str]:
        return _digests(values)

    @property
    def digests(self) -> list[str]:
        """The digests of all its keys, stored hashed or in clear."""
        return self.key_sha256 + [key_digest(k.get_secret_value()) for k in self.api_keys]


class QueueConfig(Section):
    max_size: int = Field(default=256, ge=0, description="waiting requests per model; beyond: 429")
    timeout_s: float = Field(default=30.0, gt=0, description="longest wait for a slot; then 503")
    fairness_slack: float = Field(
        default=2.0,
        ge=0,
        description="how many turns a tenant may be passed over so that a freed slot goes to a "
        "waiter whose prompt prefix that instance holds",
    )
    max_passes: int = Field(
        default=0,
        ge=0,
        description="how many times a waiter may be passed over by a later one of its tenant "
        "whose prompt prefix the freed instance holds; 0 (default): FIFO within a tenant, "
        "the best TTFT p99; 1-3 buy a lower p50 under a backlog",
    )


class PlacementConfig(Section):
    policy: PlacementPolicy = Field(default="slots_prefix", description="placement policy")
    prefix_block_chars: int = Field(
        default=64, ge=8, description="prompt characters per block of the prefix index"
    )
    prefix_index_blocks: int = Field(default=200_000, ge=1, description="bound of the index")
    locality_wait_s: float | None = Field(
        default=None,
        ge=0,
        description="cap on how long a request waits for busy instances much quicker to its "
        "first token than a free one: holding its prompt's prefix, or on faster cards (the wait "
        "itself is learned: the time to first token they save); 0 turns waiting off; unset: "
        "half of queue.timeout_s",
    )
    max_imbalance: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="skip the prefix-affinity instance when its utilisation exceeds the least "
        "utilised candidate's by more than this",
    )


class HealthConfig(Section):
    probe_interval_s: float = Field(default=2.0, gt=0, description="active health probe period")
    probe_timeout_s: float = Field(default=2.0, gt=0, description="a slower probe fails")
    failure_threshold: int = Field(
        default=3, ge=1, description="consecutive failures that mark an instance unhealthy"
    )


class AdminConfig(Section):
    """Who may read the gateway's state and metrics (`/admin/*`, `/metrics`)."""

    key_sha256: list[str] = Field(
        default_factory=list,
        description="SHA-256 hex digests of admin keys (`gpuplane gateway key create NAME "
        "--admin`). With any key configured, tenant or admin, /admin/* and /metrics answer only "
        "to `Authorization: Bearer ADMIN_KEY`; with none, to anyone (the embedded default)",
    )

    @field_validator("key_sha256")
    @classmethod
    def _hex_digests(cls, values: list[str]) -> list[str]:
        return _digests(values)


class GatewayConfig(Section):
    host: str = Field(default="127.0.0.1", description="listen address (--host)")
    port: int = Field(default=8000, ge=0, le=65535, description="listen port (--port); 0: any")
    request_timeout_s: float = Field(default=600.0, gt=0, description="whole request deadline")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="connecting to an engine")
    idle_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="longest silence between two chunks of a streamed answer; the stream then "
        "ends with an error event. Before the first byte (a prefill, a whole non-streamed "
        "answer) only request_timeout_s applies, so an engine still computing is never "
        "sent the request a second time",
    )
    client_keepalive_s: int = Field(
        default=75,
        ge=1,
        description="an idle client connection is closed after this; keep it above clients' own "
        "pool expiry (httpx, the OpenAI SDK's client: 5 s) so that they close first",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a client sends a request's whole head (request line and headers) within "
        "this, counted from its connection's start or the request's first byte; else 408 and "
        "the connection is closed",
    )
    body_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a client sends a request's whole body within this of its head; else 408 "
        "and the connection is closed",
    )
    max_connections_per_client: int = Field(
        default=512,
        ge=1,
        description="open connections one client address may hold; a further one is closed at "
        "once. Behind a load balancer all clients share its address: raise it there",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="larger request bodies get 413"
    )
    lease_ttl_s: float = Field(
        default=900.0, gt=0, description="a lease older than this is reaped (and counted as a leak)"
    )
    reaper_interval_s: float = Field(default=10.0, gt=0, description="how often leases are checked")
    retries: int = Field(default=1, ge=0, description="retries of a failure before the first byte")
    abort_grace_s: float = Field(
        default=0.1,
        ge=0,
        description="an engine request the gateway aborted (client left, timeout, broken stream) "
        "keeps its slot this long, until the engine has seen the abort",
    )
    trusted_proxies: list[IPvAnyNetwork] = Field(
        default_factory=list,
        description="networks (CIDR) of proxies whose `X-Gpuplane-Tenant` header names the "
        "tenant; from any other address the header is ignored and the tenant comes from the key",
    )
    admin: AdminConfig = AdminConfig()
    queue: QueueConfig = QueueConfig()
    placement: PlacementConfig = PlacementConfig()
    health: HealthConfig = HealthConfig()
    ha: HaConfig = HaConfig()

    @model_validator(mode="after")
    def _ttl_covers_requests(self) -> GatewayConfig:
        if self.lease_ttl_s <= self.request_timeout_s:
            raise ValueError(
                f"lease_ttl_s ({self.lease_ttl_s}) must exceed request_timeout_s "
                f"({self.request_timeout_s}), or live requests would be reaped"
            )
        return self


class ServeSettings(Section):
    """The gateway's part of gpuplane.yaml: the top-level `gateway`, `models`, `tenants` and
    `engine` sections."""

    gateway: GatewayConfig = GatewayConfig()
    models: list[ModelConfig] = Field(default_factory=list)
    tenants: list[TenantConfig] = Field(default_factory=list)
    engine: EngineConfig = EngineConfig()

    @model_validator(mode="after")
    def _unique_names(self) -> ServeSettings:
        for what, names in (
            ("model", [m.name for m in self.models]),
            ("tenant", [t.name for t in self.tenants]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{what} names must be unique; repeated: {', '.join(dupes)}")
        keys = [d for t in self.tenants for d in set(t.digests)]
        if len(keys) != len(set(keys)):
            raise ValueError("an API key is given to more than one tenant")
        if set(keys) & set(self.gateway.admin.key_sha256):
            raise ValueError(
                "a key is both a tenant's and an admin key (gateway.admin.key_sha256); "
                "give admins keys of their own"
            )
        return self
