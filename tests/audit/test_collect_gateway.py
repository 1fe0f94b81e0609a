"""Gateway traffic per model and instance, from a live gateway over simulated engines."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuplane.audit.collect import CollectError
from gpuplane.audit.collect.gateway import Counts, GatewayReader, traffic
from gpuplane.cli.main import app
from gpuplane.serve.settings import key_digest
from tests.helpers.common import free_port
from tests.helpers.serve import asgi_gateway, gateway

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
A, B = ("chat", "http://i0"), ("chat", "http://i1")


def test_rows_are_counter_deltas_and_a_restarted_counter_counts_from_zero() -> None:
    before = {A: Counts(10, 100, 50), B: Counts(7, 70, 30)}
    after = {A: Counts(13, 160, 80), B: Counts(2, 20, 9)}  # B's gateway/engine restarted
    rows = traffic(NOW, before, after, {A: 4.5}).to_pylist()
    got = {(r["model"], r["instance"]): r for r in rows}
    assert (got[A]["requests"], got[A]["prompt_tokens"], got[A]["completion_tokens"]) == (3, 60, 30)
    assert (got[B]["requests"], got[B]["prompt_tokens"], got[B]["completion_tokens"]) == (2, 20, 9)
    assert (got[A]["slot_seconds"], got[B]["slot_seconds"]) == (4.5, 0.0)


def test_an_engine_without_token_counters_leaves_tokens_unknown() -> None:
    [row] = traffic(NOW, {A: Counts(1)}, {A: Counts(1)}, {}).to_pylist()
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (0, None, None)


@pytest.mark.anyio
async def test_a_live_gateway_reports_requests_tokens_and_slot_seconds_per_instance() -> None:
    async with asgi_gateway(instances=3, itl_ms=40) as (client, _gw):
        reader = GatewayReader("http://gw", client=client)
        await reader.sample(time.monotonic())
        before = await reader.read()
        body = {"model": "m", "prompt": "hello there", "max_tokens": 12}
        started = time.monotonic()
        calls = asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(2)))
        task = asyncio.ensure_future(calls)
        while not task.done():
            await reader.sample(time.monotonic())
            await asyncio.sleep(0.05)
        answers = await task
        held_s = time.monotonic() - started
        await reader.sample(time.monotonic())
        assert [a.status_code for a in answers] == [200, 200]
        rows = traffic(NOW, before, await reader.read(), reader.take_slot_seconds()).to_pylist()
        await reader.aclose()
    assert {r["model"] for r in rows} == {"m"}
    assert len(rows) == 3  # every instance, the ones that served nothing too
    assert sum(r["requests"] for r in rows) == 2
    assert sum(r["completion_tokens"] for r in rows) == 24  # the engines' own counters
    assert all(r["prompt_tokens"] > 0 for r in rows if r["requests"])
    idle = [r for r in rows if r["requests"] == 0]
    assert idle
    assert {(r["completion_tokens"], r["slot_seconds"]) for r in idle} == {(0, 0.0)}
    busy = sum(r["slot_seconds"] for r in rows)
    # two slots held for about the whole time the answers took (sampled every ~50 ms)
    assert 0.5 * held_s < busy <= 2 * held_s


@pytest.mark.anyio
async def test_a_gateway_with_keys_is_read_with_its_admin_key() -> None:
    keys: dict[str, Any] = {"admin": {"key_sha256": [key_digest("ops-key")]}}
    tenants = [{"name": "a", "key_sha256": [key_digest("a-key")]}]
    async with gateway(instances=1, tenants=tenants, **keys) as (base, _, _):
        keyless = GatewayReader(base)
        with pytest.raises(
            CollectError, match=r"needs the gateway.s admin key: set \$GPUPLANE_ADMIN_KEY"
        ):
            await keyless.sample(0.0)
        await keyless.aclose()
        reader = GatewayReader(base, admin_key="ops-key")
        await reader.sample(0.0)
        counts = await reader.read()
        await reader.aclose()
    assert [model for model, _ in counts] == ["m"]


def test_cli_names_an_unreachable_gateway() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        app, ["audit", "collect", "-s", "gateway", "--url", url, "--out", "/nonexistent", "--once"]
    )
    assert result.exit_code == 1
    assert f"cannot reach the gateway at {url}" in result.output
