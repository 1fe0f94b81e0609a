"""The gateway's identities, limits and usage over simulated engines, and the attacks they stop:
admin routes read without an admin key, a tenant claimed through the tenant header, limits
passed by concurrent requests."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpuplane.cli.main import app
from gpuplane.serve.settings import key_digest
from tests.helpers.serve import CHAT, Clock, error_of, gateway

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]

ADMIN = {"authorization": "Bearer admin-key"}
A = {"authorization": "Bearer key-a"}
B = {"authorization": "Bearer key-b"}


def tenants(**a: Any) -> list[dict[str, Any]]:
    """team-a (priority 5) and team-b, their keys stored as digests."""
    return [
        {"name": "team-a", "key_sha256": [key_digest("key-a")], "priority": 5, **a},
        {"name": "team-b", "key_sha256": [key_digest("key-b")]},
    ]


ADMIN_CONFIG: dict[str, Any] = {"admin": {"key_sha256": [key_digest("admin-key")]}}


async def usage_of(client: httpx.AsyncClient, base: str) -> dict[str, dict[str, Any]]:
    answer = await client.get(f"{base}/admin/usage", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return {t["tenant"]: t for t in answer.json()["tenants"]}


def samples(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


# -- admin routes -----------------------------------------------------------------------------


async def test_only_an_admin_sees_which_instance_answered() -> None:
    """x-gpuplane-instance names an engine by its address (or configured name): a tenant gets
    no such header, streamed or not. A gateway without keys, whose /admin/state is open to any
    caller, names it to every caller (each is an admin there)."""
    async with gateway(tenants=tenants(), **ADMIN_CONFIG) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        tenant = await client.post(url, json=CHAT, headers=A)
        streamed = await client.post(url, json={**CHAT, "stream": True}, headers=A)
    async with gateway() as (base, client, _):
        open_ = await client.post(f"{base}/v1/chat/completions", json=CHAT)
    assert tenant.status_code == streamed.status_code == open_.status_code == 200
    assert "x-gpuplane-instance" not in tenant.headers
    assert "x-gpuplane-instance" not in streamed.headers
    assert open_.headers["x-gpuplane-instance"].startswith("http://127.0.0.1:")


async def test_admin_routes_and_metrics_answer_only_to_an_admin_key_once_keys_exist() -> None:
    async with gateway(tenants=tenants(), **ADMIN_CONFIG) as (base, client, _):
        answers = {
            (path, who): await client.get(f"{base}{path}", headers=headers)
            for path in ("/admin/state", "/admin/usage", "/metrics")
            for who, headers in (("anyone", {}), ("tenant", A), ("admin", ADMIN))
        }
        health = await client.get(f"{base}/healthz")
    for (path, who), answer in answers.items():
        assert answer.status_code == (200 if who == "admin" else 401), (path, who)
    anyone = error_of(answers[("/admin/state", "anyone")])
    assert anyone["code"] == "invalid_admin_key"
    assert "Authorization: Bearer ADMIN_KEY" in anyone["message"]
    assert "not an admin key" in error_of(answers[("/metrics", "tenant")])["message"]
    assert answers[("/metrics", "anyone")].headers["www-authenticate"] == "Bearer"
    assert "gpuplane_tenant_requests_total" in answers[("/metrics", "admin")].text
    assert health.status_code == 200


async def test_tenant_keys_without_an_admin_key_close_the_admin_routes_and_say_how_to_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Keys in clear still work, with a warning that gives the digests to store instead."""
    plain = [{"name": "team-a", "api_keys": ["key-a"]}]
    with caplog.at_level(logging.WARNING, "gpuplane.gateway"):
        async with gateway(tenants=plain) as (base, client, _):
            metrics = await client.get(f"{base}/metrics")
            served = await client.post(f"{base}/v1/chat/completions", json=CHAT, headers=A)
    assert metrics.status_code == 401
    message = error_of(metrics)["message"]
    assert "gateway.admin.key_sha256" in message
    assert "gpuplane gateway key create NAME --admin" in message
    assert served.status_code == 200
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"key_sha256: [{key_digest('key-a')}]" in logged
    assert "key-a]" not in logged  # the key itself is never logged


# -- the tenant header ------------------------------------------------------------------------


async def test_the_tenant_header_from_an_untrusted_client_is_ignored() -> None:
    """team-b's key with a header claiming team-a (higher priority) is served as team-b; a
    header alone gets 401; without keys the header cannot pick a tenant either."""
    spoof = {**B, "x-gpuplane-tenant": "team-a"}
    async with gateway(tenants=tenants(), trusted_proxies=["10.0.0.0/8"], **ADMIN_CONFIG) as (
        base,
        client,
        _,
    ):
        url = f"{base}/v1/chat/completions"
        spoofed = await client.post(url, json=CHAT, headers=spoof)
        alone = await client.post(url, json=CHAT, headers={"x-gpuplane-tenant": "team-a"})
        usage = await usage_of(client, base)
    assert spoofed.status_code == 200
    assert alone.status_code == 401
    assert (usage["team-a"]["requests"], usage["team-b"]["requests"]) == (0, 1)

    async with gateway(tenants=[{"name": "team-a", "priority": 5}]) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        claimed = await client.post(url, json=CHAT, headers={"x-gpuplane-tenant": "team-a"})
        usage = await usage_of(client, base)
    assert claimed.status_code == 200
    assert (usage["team-a"]["requests"], usage["default"]["requests"]) == (0, 1)


async def test_a_trusted_proxy_names_the_tenant() -> None:
    """From a trusted address the header names a configured tenant without a key; a name no
    tenant has is ignored, so the key rule applies."""
    async with gateway(tenants=tenants(), trusted_proxies=["127.0.0.0/8"], **ADMIN_CONFIG) as (
        base,
        client,
        _,
    ):
        url = f"{base}/v1/chat/completions"
        named = await client.post(url, json=CHAT, headers={"x-gpuplane-tenant": "team-a"})
        overrides = await client.post(url, json=CHAT, headers={**B, "x-gpuplane-tenant": "team-a"})
        unknown = await client.post(url, json=CHAT, headers={"x-gpuplane-tenant": "nobody"})
        usage = await usage_of(client, base)
    assert (named.status_code, overrides.status_code, unknown.status_code) == (200, 200, 401)
    assert (usage["team-a"]["requests"], usage["team-b"]["requests"]) == (2, 0)


# -- limits -----------------------------------------------------------------------------------


async def test_a_request_rate_is_exact_under_concurrent_requests_and_429_says_when() -> None:
    clock = Clock()
    clock.now = 30.0  # half-way through the window [0, 60)
    limited = tenants(limits=[{"requests": 5, "window_s": 60}])
    async with gateway(tenants=limited, wall=clock, **ADMIN_CONFIG) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        answers = await asyncio.gather(*(client.post(url, json=CHAT, headers=A) for _ in range(12)))
        other = await client.post(url, json=CHAT, headers=B)  # team-b has no limit
        clock.now = 60.0
        next_window = await client.post(url, json=CHAT, headers=A)
        page = (await client.get(f"{base}/metrics", headers=ADMIN)).text
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 5 + [429] * 7
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["retry-after"] == "30"
    assert refused.headers["x-ratelimit-limit-requests"] == "5"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    error = error_of(refused)
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "rate_limit_error")
    assert error["message"] == (
        "tenant 'team-a' made its 5 requests per 60 s; the window resets in 30 s"
    )
    assert other.status_code == next_window.status_code == 200
    got = samples(page)
    assert (
        got[("gpuplane_tenant_limited_total", (("limit", "requests"), ("tenant", "team-a")))] == 7
    )
    assert got[("gpuplane_tenant_requests_total", (("tenant", "team-a"),))] == 6
    reason = (("model", "m"), ("reason", "rate_limit_exceeded"))
    assert got[("gpuplane_rejections_total", reason)] == 7


async def test_a_token_budget_is_exact_under_concurrent_requests_and_settles_real_use() -> None:
    """Each request may use 20 tokens (a 2-token prompt estimate + max_tokens 18): 5 of 12 fit
    a budget of 100. When they end (each takes 1.8 s: none before all are counted), the
    engine's usage replaces what they reserved."""
    clock = Clock()
    body = {**CHAT, "max_tokens": 18}
    budget = tenants(limits=[{"tokens": 100, "window_s": 3600}])
    async with gateway(
        tenants=budget, capacity=3, sim={"itl_ms": 100.0}, wall=clock, **ADMIN_CONFIG
    ) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        answers = await asyncio.gather(*(client.post(url, json=body, headers=A) for _ in range(12)))
        usage = (await usage_of(client, base))["team-a"]
    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert (len(served), len(refused)) == (5, 7)
    assert error_of(refused[0])["code"] == "token_budget_exceeded"
    assert "this request may use up to 20 more" in error_of(refused[0])["message"]
    assert refused[0].headers["retry-after"] == "3600"
    reported = [a.json()["usage"] for a in served]
    assert usage["prompt_tokens"] == sum(u["prompt_tokens"] for u in reported)
    assert usage["completion_tokens"] == sum(u["completion_tokens"] for u in reported) == 90
    assert usage["estimated_prompt_tokens"] == usage["estimated_completion_tokens"] == 0
    [window] = usage["limits"]
    assert window["used"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert window["reserved"] == 0
    assert usage["limited"] == {"tokens": 7}


# -- usage ------------------------------------------------------------------------------------


async def test_usage_counts_tokens_from_the_engine_else_estimated_and_slot_seconds() -> None:
    """A stream without the engine's usage is estimated (and marked so); one that asks for it
    (`stream_options.include_usage`) and a whole answer are counted as the engine reports."""
    stream = {**CHAT, "stream": True, "max_tokens": 6}
    async with gateway(tenants=tenants(), sim={"itl_ms": 5.0}, **ADMIN_CONFIG) as (
        base,
        client,
        _,
    ):
        url = f"{base}/v1/chat/completions"
        assert (await client.post(url, json=stream, headers=A)).status_code == 200
        asked = {**stream, "stream_options": {"include_usage": True}}
        assert (await client.post(url, json=asked, headers=B)).status_code == 200
        assert (await client.post(url, json=CHAT, headers=B)).status_code == 200
        usage = await usage_of(client, base)
        page = (await client.get(f"{base}/metrics", headers=ADMIN)).text
    a, b = usage["team-a"], usage["team-b"]
    assert a["requests"] == 1
    assert a["prompt_tokens"] == a["estimated_prompt_tokens"] == 2  # "user\x1fhi\x1e"
    assert a["completion_tokens"] == a["estimated_completion_tokens"] > 0  # ~1 a chunk
    assert b["requests"] == 2
    assert b["completion_tokens"] == 6 + 4
    assert b["estimated_prompt_tokens"] == b["estimated_completion_tokens"] == 0
    assert a["slot_seconds"] > 0
    assert b["slot_seconds"] > 0
    got = samples(page)
    estimate = (("source", "estimate"), ("tenant", "team-a"))
    engine = (("source", "engine"), ("tenant", "team-b"))
    assert got[("gpuplane_tenant_prompt_tokens_total", estimate)] == 2
    assert got[("gpuplane_tenant_completion_tokens_total", engine)] == 10
    assert got[("gpuplane_tenant_slot_seconds_total", (("tenant", "team-b"),))] > 0
    tenants_seen = {
        dict(labels)["tenant"] for name, labels in got if name.startswith("gpuplane_tenant_")
    }
    assert tenants_seen == {"team-a", "team-b", "default"}


async def test_gateway_usage_and_status_read_the_admin_routes_with_the_admin_key() -> None:
    async with gateway(tenants=tenants(), **ADMIN_CONFIG) as (base, client, _):
        await client.post(f"{base}/v1/chat/completions", json=CHAT, headers=A)
        runner = CliRunner()

        def cli(*args: str, key: str | None = None) -> Any:
            env = {} if key is None else {"GPUPLANE_ADMIN_KEY": key}
            return runner.invoke(app, ["gateway", *args, "--gateway", base], env=env)

        as_json = await asyncio.to_thread(cli, "usage", "-o", "json", key="admin-key")
        table = await asyncio.to_thread(cli, "usage", key="admin-key")
        keyless = await asyncio.to_thread(cli, "status")
    assert as_json.exit_code == 0, as_json.output
    by_tenant = {t["tenant"]: t for t in json.loads(as_json.output)["tenants"]}
    assert by_tenant["team-a"]["requests"] == 1
    assert table.exit_code == 0, table.output
    header, first = table.output.splitlines()[:2]
    assert header.split()[:3] == ["TENANT", "REQUESTS", "PROMPT"]
    assert first.split()[:2] == ["team-a", "1"]
    assert keyless.exit_code == 1
    assert "401" in keyless.output
    assert "--admin-key" in keyless.output
