"""The upstream client against simulated engines: each transport failure maps to one kind, and an
abandoned stream drops its connection so that the engine stops generating."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gpuplane.engines.sim import SimFleet, start_sim
from gpuplane.serve.errors import FailureKind
from gpuplane.serve.settings import GatewayConfig
from gpuplane.serve.upstream import Upstream, UpstreamFailure
from tests.helpers.common import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]

HEADERS = {"content-type": "application/json", "authorization": "Bearer not-forwarded"}


def body(max_tokens: int = 4, stream: bool = True) -> bytes:
    chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({**chat, "max_tokens": max_tokens, "stream": stream}).encode()


@asynccontextmanager
async def upstream_and_sim(**sim: Any) -> AsyncIterator[tuple[Upstream, SimFleet, str]]:
    cfg = GatewayConfig(connect_timeout_s=1.0)
    upstream = Upstream(cfg)
    try:
        async with start_sim(1, 4, seed=1, **sim) as fleet:
            yield upstream, fleet, fleet.urls[0] + "/v1/chat/completions"
    finally:
        await upstream.aclose()


async def read_all(upstream: Upstream, url: str, payload: bytes) -> tuple[int, bytes]:
    response = await upstream.open(url, payload, HEADERS)
    try:
        return response.status, b"".join([c async for c in upstream.chunks(response)])
    finally:
        upstream.close(response)


async def test_streams_the_answer_and_reuses_the_connection() -> None:
    async with upstream_and_sim(itl_ms=0.0) as (upstream, _, url):
        for _ in range(3):
            status, data = await read_all(upstream, url, body())
            assert status == 200
            assert data.rstrip().endswith(b"data: [DONE]")
        status, data = await read_all(upstream, url, body(stream=False))
        assert status == 200
        assert json.loads(data)["object"] == "chat.completion"
        assert await upstream.probe(url.rsplit("/v1", 1)[0] + "/health", 1.0) is None


async def test_refused_connection_is_connect() -> None:
    upstream = Upstream(GatewayConfig())
    try:
        url = f"http://127.0.0.1:{free_port()}/v1/chat/completions"
        with pytest.raises(UpstreamFailure) as caught:
            await upstream.open(url, body(), HEADERS)
        assert caught.value.kind is FailureKind.CONNECT
        failed = await upstream.probe(url, 0.5)
        assert failed is not None
        assert failed.kind is FailureKind.CONNECT
        assert "cannot connect" in str(failed)
    finally:
        await upstream.aclose()


async def test_5xx_is_status() -> None:
    async with upstream_and_sim(error_rate=1.0) as (upstream, _, url):
        with pytest.raises(UpstreamFailure) as caught:
            await upstream.open(url, body(), HEADERS)
        assert caught.value.kind is FailureKind.STATUS
        assert caught.value.status is not None
        assert caught.value.status >= 500


async def test_connection_dropped_mid_stream_is_protocol() -> None:
    async with upstream_and_sim(drop_rate=1.0, drop_at_token=2, itl_ms=1.0) as (upstream, _, url):
        with pytest.raises(UpstreamFailure) as caught:
            await read_all(upstream, url, body(max_tokens=8))
        assert caught.value.kind is FailureKind.PROTOCOL


async def test_cancelled_stream_stops_the_engine_request() -> None:
    async with upstream_and_sim(itl_ms=20.0) as (upstream, fleet, url):
        core = fleet.instances[0].core

        async def consume() -> None:
            await read_all(upstream, url, body(max_tokens=10_000))

        task = asyncio.create_task(consume())
        for _ in range(200):
            if core.running:
                break
            await asyncio.sleep(0.01)
        assert core.running, "the engine never started the request"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if not core.running:
                break
            await asyncio.sleep(0.01)
        assert not core.running, "the engine kept generating for a client that left"
