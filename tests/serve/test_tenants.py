"""Who a request is (`serve/tenants.py`), row by row: keys by digest, the tenant header only from
trusted proxies, the default tenant, admin keys."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.config import parse_settings
from gpuplane.serve.settings import key_digest
from gpuplane.serve.tenants import Identity

TENANTS: list[dict[str, Any]] = [
    {"name": "team-a", "key_sha256": [key_digest("key-a")], "priority": 5},
    {"name": "team-b", "api_keys": ["key-b"]},  # in clear: hashed when the gateway starts
]
PROXY = "10.1.2.3"


def identity(tenants: list[dict[str, Any]], **gateway: Any) -> Identity:
    return Identity(parse_settings({"gateway": gateway, "tenants": tenants}))


@pytest.mark.parametrize(
    ("headers", "client", "tenant"),
    [
        ({"authorization": "Bearer key-a"}, "127.0.0.1", "team-a"),
        ({"authorization": "bearer key-b"}, "127.0.0.1", "team-b"),
        ({"api-key": "key-a"}, "127.0.0.1", "team-a"),
        ({"authorization": "Bearer nope"}, "127.0.0.1", None),
        ({}, "127.0.0.1", None),
        # the header from an untrusted address is ignored: the key decides
        ({"authorization": "Bearer key-b", "x-gpuplane-tenant": "team-a"}, "127.0.0.1", "team-b"),
        ({"x-gpuplane-tenant": "team-a"}, "10.9.0.1", None),
        ({"x-gpuplane-tenant": "team-a"}, None, None),
        ({"x-gpuplane-tenant": "team-a"}, "not-an-address", None),
        # from a trusted proxy it names the tenant, if one has that name
        ({"x-gpuplane-tenant": "team-a"}, PROXY, "team-a"),
        ({"authorization": "Bearer key-b", "x-gpuplane-tenant": "team-a"}, PROXY, "team-a"),
        ({"authorization": "Bearer key-b", "x-gpuplane-tenant": "nobody"}, PROXY, "team-b"),
        ({"x-gpuplane-tenant": "nobody"}, PROXY, None),
    ],
)
def test_a_tenant_comes_from_its_key_or_a_trusted_proxy_s_header(
    headers: dict[str, str], client: str | None, tenant: str | None
) -> None:
    who = identity(TENANTS, trusted_proxies=["10.1.0.0/16", "fd00::/8"])
    found = who.tenant(headers, client)
    assert (found.name if found else None) == tenant


def test_without_keys_everyone_is_the_default_tenant_which_may_be_configured() -> None:
    plain = identity([{"name": "team-a", "priority": 5}])
    assert plain.tenant({"x-gpuplane-tenant": "team-a"}, "127.0.0.1") is plain.default
    assert plain.default.name == "default"
    assert [a.name for a in plain.accounts] == ["team-a", "default"]
    limited = identity([{"name": "default", "limits": [{"requests": 10}]}])
    assert limited.tenant({}, "127.0.0.1") is limited.default
    assert limited.default.account.windows[0].limit == 10
    assert [a.name for a in limited.accounts] == ["default"]


def test_admin_routes_are_open_until_a_key_is_configured_then_need_an_admin_key() -> None:
    admin = {"authorization": "Bearer ops"}
    assert identity([]).is_admin({})
    keyed = identity(TENANTS)
    assert not keyed.is_admin({})
    assert not keyed.is_admin({"authorization": "Bearer key-a"})
    assert not keyed.is_admin(admin)  # no admin key configured: closed to everyone
    both = identity(TENANTS, admin={"key_sha256": [key_digest("ops")]})
    assert both.is_admin(admin)
    assert not both.is_admin({"authorization": "Bearer key-a"})
    only_admin = identity([], admin={"key_sha256": [key_digest("ops")]})
    assert only_admin.tenant({}, "127.0.0.1") is only_admin.default  # completions stay open
    assert not only_admin.is_admin({})
