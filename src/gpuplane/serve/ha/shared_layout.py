"""The shared slot table's layout in Redis: the Lua scripts of `shared.lua` (acquire, renew,
release, heartbeat, drain, leave), the keys they read, the table's options and states, and one
instance's entry as this gateway sees it (`shared.py` has the design)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources

from redis.exceptions import RedisError

from gpuplane.serve.hooks import SharedRouter

# What a Redis call may raise when the server is down, slow or restarting.
UNREACHABLE = (RedisError, OSError)


def table_keys(prefix: str) -> dict[str, str]:
    """The table's own keys: its incarnation (and when it began), the epochs per gateway id,
    the live gateways and those registered anew in this incarnation."""
    return {
        "incarnation": f"{prefix}:incarnation",
        "born": f"{prefix}:incarnation:born",
        "epochs": f"{prefix}:epochs",
        "live": f"{prefix}:gateways",
        "synced": f"{prefix}:gateways:synced",
    }


def slot_key(prefix: str, model: str, instance_id: str) -> str:
    """The sorted set of one instance's leases (lease id → expiry)."""
    return f"{prefix}:slots:{model}:{instance_id}"


class Share(StrEnum):
    """How this gateway admits now."""

    SHARED = "shared"  # Redis decides every admission
    RESYNC = "resync"  # Redis is back: leases are registered again; Redis and the allowance
    LOCAL = "local"  # Redis is unreachable: the local allowance alone (fail closed)
    FENCED = "fenced"  # a newer process runs under this gateway id: admits nothing


def load_scripts() -> dict[str, str]:
    """`shared.lua`'s scripts by name, each with the shared `now` helper in front."""
    text = resources.files(__package__).joinpath("shared.lua").read_text()
    parts = {}
    for chunk in text.split("\n--- ")[1:]:
        name, _, body = chunk.partition("\n")
        parts[name.strip()] = body
    helper = parts.pop("now")
    return {name: helper + body for name, body in parts.items()}


@dataclass(frozen=True, slots=True)
class SharedOptions:
    """`url`: the Redis server; `ttl_s`: a lease (and a heartbeat) not renewed for this long
    expires; `renew_s`: how often held leases are renewed; `sync_s`: how often the others'
    counts are read and the heartbeat sent; `timeout_s`: the longest a Redis call may take;
    `deadline_s`: the longest a request runs (`expired.py`)."""

    url: str
    gateway_id: str
    ttl_s: float
    renew_s: float
    sync_s: float
    timeout_s: float
    prefix: str = "gpuplane"
    deadline_s: float = 600.0  # gateway.request_timeout_s: no request runs longer


@dataclass(slots=True)
class SharedInstance:
    router: SharedRouter
    id: str
    url: str
    key: str
    capacity: int
    held: dict[str, float] = field(default_factory=dict)  # this gateway's leases → granted at
    pending: int = 0  # acquires sent to Redis and not yet answered
    seen: int = 0  # the set's size, as last answered
    open: int = 0  # its expired leases whose requests may still run, as last answered
    # the least load its engine reported since the table stopped being whole (None: no
    # reading yet): the most the other gateways can hold beyond their shares from then on
    bound: int | None = None
