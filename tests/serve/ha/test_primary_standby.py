"""Primary/standby in one process: two gateways on one lease file over simulated engines.

The standby answers 503 not_leader with Retry-After and /readyz 503; the leader admits; a
step-down hands over at once; the new leader counts the requests the old one left running
(the engines' own count) before it admits, so the engines never run more than the capacity.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpuplane.cli.main import app
from gpuplane.config import parse_settings
from gpuplane.engines.sim import SimFleet, start_sim
from gpuplane.errors import ConfigError
from gpuplane.serve.app import create_app
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.ha.forward import sign
from gpuplane.serve.server import serving
from gpuplane.serve.settings import key_digest
from tests.helpers.common import gateway_settings

pytestmark = pytest.mark.anyio

CAPACITY = 2  # the gateway's slots per instance; the engines could run 8, so more would show


def _settings(
    urls: list[str],
    lease: Path,
    gateway: dict[str, Any] | None = None,
    tenants: list[dict[str, Any]] | None = None,
    **ha: Any,
) -> Any:
    models = [
        {
            "name": "m",
            "engine": "sim",
            "instances": [{"url": u, "max_concurrency": CAPACITY} for u in urls],
        }
    ]
    ha_cfg = {"mode": "primary_standby", "lease": "file", "path": str(lease), **ha}
    return parse_settings(
        {**gateway_settings(models, ha=ha_cfg, **(gateway or {})), "tenants": tenants or []}
    )


def _secret(tmp_path: Path) -> str:
    """The gateways' shared secret, in a file (gateway.ha.forward_secret_file)."""
    path = tmp_path / "gateway.secret"
    path.write_text(SECRET + "\n")
    return str(path)


SECRET = "the-gateways-shared-secret"


@asynccontextmanager
async def _gateway(settings: Any, gid: str) -> AsyncIterator[tuple[httpx.AsyncClient, Gateway]]:
    ha = settings.gateway.ha.model_copy(update={"gateway_id": gid})
    settings = settings.model_copy(
        update={"gateway": settings.gateway.model_copy(update={"ha": ha})}
    )
    gw = Gateway(settings)
    transport = httpx.ASGITransport(app=create_app(settings, gateway=gw))
    await gw.start()
    try:
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{gid}") as client:
            yield client, gw
    finally:
        await gw.stop()


async def _until(check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        got = check()
        if await got if inspect.isawaitable(got) else got:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {check}")


def _chat(max_tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with start_sim(2, 8, seed=3, itl_ms=40) as fleet:
        yield fleet


async def test_the_standby_refuses_with_retry_after_and_a_step_down_hands_over(
    fleet: SimFleet, tmp_path: Path
) -> None:
    settings = _settings(fleet.urls, tmp_path / "lease")
    async with AsyncExitStack() as stack:
        a, gw_a = await stack.enter_async_context(_gateway(settings, "a"))
        await _until(lambda: _ready(a))
        b, gw_b = await stack.enter_async_context(_gateway(settings, "b"))
        await asyncio.sleep(0.6)  # b has asked a few times by now
        ready = await b.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "standby"
        refused = await b.post("/v1/chat/completions", json=_chat())
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "not_leader"
        assert "the leader is a-" in refused.json()["error"]["message"]
        assert (await a.post("/v1/chat/completions", json=_chat())).status_code == 200
        epoch_a = gw_a.state()["ha"]["epoch"]

        await gw_a.step_down()
        await _until(lambda: _ready(b), timeout_s=3.0)
        assert gw_b.state()["ha"]["epoch"] > epoch_a
        assert (await b.post("/v1/chat/completions", json=_chat())).status_code == 200
        after = await a.post("/v1/chat/completions", json=_chat())
        assert after.status_code == 503
        assert after.json()["error"]["code"] == "not_leader"


async def test_the_new_leader_counts_what_the_old_one_left_running(
    fleet: SimFleet, tmp_path: Path
) -> None:
    settings = _settings(fleet.urls[:1], tmp_path / "lease")
    async with AsyncExitStack() as stack:
        a, gw_a = await stack.enter_async_context(_gateway(settings, "a"))
        await _until(lambda: _ready(a))
        b, gw_b = await stack.enter_async_context(_gateway(settings, "b"))
        # the old leader fills the instance with long generations, then hands over
        old = [
            asyncio.create_task(a.post("/v1/chat/completions", json=_chat(30)))
            for _ in range(CAPACITY)
        ]
        await _until(lambda: len(fleet.instances[0].core.running) == CAPACITY)
        await gw_a.step_down()
        await _until(lambda: _ready(b), timeout_s=3.0)
        assert gw_b.state()["ha"]["inherited"] == CAPACITY
        new = [
            asyncio.create_task(b.post("/v1/chat/completions", json=_chat(4)))
            for _ in range(CAPACITY)
        ]
        answers = await asyncio.gather(*old, *new)
        assert [r.status_code for r in answers] == [200] * (2 * CAPACITY)
        stats = fleet.instances[0].core.stats
        assert stats.max_running_seen == CAPACITY  # never more, across the switch
        # drained as the engine finished them: the leader reads the engine after each renewal,
        # so the last inherited slot goes at the first renewal after the last old request ended
        await _until(lambda: gw_b.state()["ha"]["inherited"] == 0)


async def test_a_leader_that_stops_leading_turns_its_waiters_away(
    fleet: SimFleet, tmp_path: Path
) -> None:
    settings = _settings(fleet.urls[:1], tmp_path / "lease")
    async with _gateway(settings, "a") as (a, gw_a):
        await _until(lambda: _ready(a))
        running = [
            asyncio.create_task(a.post("/v1/chat/completions", json=_chat(20)))
            for _ in range(CAPACITY)
        ]
        await _until(lambda: len(fleet.instances[0].core.running) == CAPACITY)
        waiting = asyncio.create_task(a.post("/v1/chat/completions", json=_chat()))
        await _until(lambda: len(gw_a.routers["m"].queue) > 0)
        await gw_a.step_down()
        refused = await waiting
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "not_leader"
        assert [r.status_code for r in await asyncio.gather(*running)] == [200] * CAPACITY


async def test_a_standby_that_proxies_forwards_to_the_leader_once(
    fleet: SimFleet, tmp_path: Path
) -> None:
    settings = _settings(
        fleet.urls, tmp_path / "lease", proxy_to_leader=True, forward_secret_file=_secret(tmp_path)
    )
    async with _leader_and_standby(settings) as (client, _, url_b):
        via_b = await client.post(url_b + "/v1/chat/completions", json=_chat(stream=True))
        assert via_b.status_code == 200
        assert b"[DONE]" in via_b.content
        assert via_b.headers["x-gpuplane-instance"]  # the leader placed it
        # a request another gateway already forwarded is not forwarded again
        body = json.dumps(_chat()).encode()
        signed = sign(SECRET.encode(), "default", "/v1/chat/completions", body)
        bounced = await client.post(
            url_b + "/v1/chat/completions",
            content=body,
            headers={
                "content-type": "application/json",
                "x-gpuplane-forwarded": "c",
                "x-gpuplane-forwarded-tenant": "default",
                "x-gpuplane-forward-signature": signed,
            },
        )
        assert bounced.status_code == 503
        assert bounced.json()["error"]["code"] == "not_leader"


@asynccontextmanager
async def _leader_and_standby(settings: Any) -> AsyncIterator[tuple[httpx.AsyncClient, str, str]]:
    """Gateways a (the leader) and b (a standby that knows where a serves), served over real
    sockets; yields a client and the URLs of a and b."""
    ha = settings.gateway.ha
    gw_a, gw_b = (
        Gateway(settings.model_copy(update={"gateway": settings.gateway.model_copy(
            update={"ha": ha.model_copy(update={"gateway_id": gid})})}))
        for gid in ("a", "b")
    )  # fmt: skip
    async with AsyncExitStack() as stack:
        url_a = await stack.enter_async_context(serving(gw_a.settings, gw_a))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=10.0))
        await _until(lambda: _ready_at(client, url_a))
        url_b = await stack.enter_async_context(serving(gw_b.settings, gw_b))
        await _until(lambda: gw_b.state()["ha"]["leader_url"] == url_a)
        yield client, url_a, url_b


async def _ready_at(client: httpx.AsyncClient, url: str) -> bool:
    return (await client.get(url + "/readyz")).status_code == 200


async def test_metrics_and_status_show_each_gateways_role(fleet: SimFleet, tmp_path: Path) -> None:
    settings = _settings(fleet.urls, tmp_path / "lease")
    ha = settings.gateway.ha
    gws = []
    for gid in ("a", "b"):
        cfg = settings.gateway.model_copy(update={"ha": ha.model_copy(update={"gateway_id": gid})})
        gws.append(Gateway(settings.model_copy(update={"gateway": cfg})))
    gw_a, gw_b = gws

    async def status(url: str, *args: str) -> str:
        cli = ["gateway", "status", "--gateway", url, *args]
        result = await asyncio.to_thread(CliRunner().invoke, app, cli)
        assert result.exit_code == 0, result.output
        return result.output

    async with AsyncExitStack() as stack:
        url_a = await stack.enter_async_context(serving(gw_a.settings, gw_a))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=10.0))
        await _until(lambda: _ready_at(client, url_a))
        url_b = await stack.enter_async_context(serving(gw_b.settings, gw_b))
        await _until(lambda: gw_b.state()["ha"]["leader"] is not None)
        page_a = (await client.get(url_a + "/metrics")).text
        page_b = (await client.get(url_b + "/metrics")).text
        assert "gpuplane_ha_leader 1.0" in page_a
        assert 'gpuplane_ha_leader_changes_total{change="elected"} 1.0' in page_a
        assert f"gpuplane_ha_epoch {float(gw_a.state()['ha']['epoch'])}" in page_a
        assert "gpuplane_ha_leader 0.0" in page_b
        assert "gpuplane_ha_epoch 0.0" in page_b
        head, row = (await status(url_b)).splitlines()[:2]
        assert head.split()[:3] == ["HA", "MODE", "ROLE"]
        assert row.split()[:3] == ["primary_standby", "standby", "-"]

        await gw_a.step_down()
        await _until(lambda: _ready_at(client, url_b), timeout_s=3.0)
        page_a = (await client.get(url_a + "/metrics")).text
        assert 'gpuplane_ha_leader_changes_total{change="lost"} 1.0' in page_a
        assert "gpuplane_ha_leader 1.0" in (await client.get(url_b + "/metrics")).text
        assert (await status(url_b)).splitlines()[1].split()[:2] == ["primary_standby", "leader"]
        assert json.loads(await status(url_b, "-o", "json"))["ha"]["role"] == "leader"


async def test_the_leader_bills_the_tenant_the_standby_resolved_never_the_callers_header(
    fleet: SimFleet, tmp_path: Path
) -> None:
    """A member of team-a, through the standby, names team-b in X-Gpuplane-Tenant: the leader,
    which trusts the standby's address as a proxy, still bills team-a (the standby forwards the
    tenant it resolved, signed); a request that claims to be forwarded without a valid
    signature is refused, whatever address sends it."""
    tenants = [
        {"name": "team-a", "key_sha256": [key_digest("key-a")]},
        {"name": "team-b", "key_sha256": [key_digest("key-b")]},
    ]
    gateway = {
        "trusted_proxies": ["127.0.0.1/32"],  # the gateways' address, not the client's
        "admin": {"key_sha256": [key_digest("admin-key")]},
    }
    settings = _settings(
        fleet.urls,
        tmp_path / "lease",
        gateway,
        tenants,
        proxy_to_leader=True,
        forward_secret_file=_secret(tmp_path),
    )
    url = "/v1/chat/completions"
    async with AsyncExitStack() as stack:
        client, url_a, url_b = await stack.enter_async_context(_leader_and_standby(settings))
        member = httpx.AsyncClient(  # from another loopback address than the gateways'
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"), timeout=10.0
        )
        await stack.enter_async_context(member)
        laundered = await member.post(
            url_b + url,
            json=_chat(),
            headers={"authorization": "Bearer key-a", "x-gpuplane-tenant": "team-b"},
        )
        forged = await client.post(  # from the trusted address itself
            url_a + url,
            json=_chat(),
            headers={
                "x-gpuplane-forwarded": "b",
                "x-gpuplane-forwarded-tenant": "team-b",
                "x-gpuplane-forward-signature": "0" * 64,
                "x-gpuplane-tenant": "team-b",
            },
        )
        usage = await client.get(
            url_a + "/admin/usage", headers={"authorization": "Bearer admin-key"}
        )
    assert laundered.status_code == 200, laundered.text
    assert forged.status_code == 401
    assert forged.json()["error"]["code"] == "invalid_forward_signature"
    requests = {t["tenant"]: t["requests"] for t in usage.json()["tenants"]}
    assert requests["team-a"] == 1
    assert requests.get("team-b", 0) == 0


def test_proxy_to_leader_without_a_shared_secret_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUPLANE_GATEWAY_SECRET", raising=False)
    settings = _settings(["http://127.0.0.1:9"], tmp_path / "lease", proxy_to_leader=True)
    with pytest.raises(ConfigError, match=r"\$GPUPLANE_GATEWAY_SECRET"):
        Gateway(settings)
