"""A request in flight on an engine that dies: retried on another instance when no byte of the
answer reached the client yet, else ended with an error event (never cut silently); the lost
instance's slots are freed exactly once, and a refused health probe takes it out of rotation at
once (not after `failure_threshold` probes)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gpuplane.config import parse_settings
from gpuplane.engines.sim import sim_process
from gpuplane.serve.errors import FailureKind
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.retry import Next, after_failure
from gpuplane.serve.server import serving
from tests.helpers.common import free_port, gateway_settings
from tests.helpers.serve import assert_released


def test_a_failure_before_the_first_byte_is_retried_after_it_ends_the_stream() -> None:
    assert after_failure(FailureKind.PROTOCOL, False, 1) == (Next.RETRY, 0)
    assert after_failure(FailureKind.STATUS, False, 2) == (Next.RETRY, 1)
    assert after_failure(FailureKind.PROTOCOL, False, 0) == (Next.GIVE_UP, 0)
    # nothing reached an engine: no retry used up, even with none left
    assert after_failure(FailureKind.CONNECT, False, 0) == (Next.RETRY, 0)
    # a byte reached the client: the request cannot run again elsewhere
    for kind in FailureKind:
        assert after_failure(kind, True, 3) == (Next.ENDED, 3)


@pytest.mark.anyio
async def test_one_refused_health_probe_takes_an_instance_out_of_rotation() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    models = [{"name": "m", "engine": "sim", "instances": [{"url": dead}]}]
    gateway = Gateway(parse_settings(gateway_settings(models, health={"failure_threshold": 3})))
    try:
        assert gateway.routers["m"].slots.get(dead).healthy
        await gateway.probe_once()  # its engine is gone: not three probes, one
        inst = gateway.routers["m"].slots.get(dead)
        assert not inst.healthy
        assert "cannot connect" in str(inst.last_error)
    finally:
        await gateway.upstream.aclose()


async def _wait(what: str, check: Any, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what} within {timeout_s} s")


def _chat(content: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": max_tokens,
    }


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("leftovers")
async def test_an_engine_killed_mid_request_retries_or_ends_with_an_error_event() -> None:
    spare_port = free_port()
    # instance a: slow to prefill (a long prompt sends no byte for seconds), slow to stream
    async with sim_process(1, 4, prefill_tokens_per_s=20.0, itl_ms=200.0) as a:
        spare = f"http://127.0.0.1:{spare_port}"
        models = [{"name": "m", "engine": "sim", "instances": [{"url": a.urls[0]}, {"url": spare}]}]
        settings = parse_settings(gateway_settings(models, health={"probe_interval_s": 0.2}))
        gateway = Gateway(settings)
        router = gateway.routers["m"]
        async with serving(settings, gateway) as url, httpx.AsyncClient(timeout=120) as client:
            # nothing listens on the spare's port: one refused probe takes it out of rotation
            await _wait("the spare out of rotation", lambda: not router.slots.get(spare).healthy)
            lines: list[str] = []

            async def streamed() -> tuple[int, str]:
                body = _chat("hi", 100)
                async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        lines.append(line)
                return r.status_code, "\n".join(lines)

            async def prefilling() -> httpx.Response:
                return await client.post(url + "/v1/chat/completions", json=_chat("word " * 400, 5))

            stream = asyncio.create_task(streamed())
            await _wait("the stream's first tokens", lambda: len(lines) >= 4)
            waiting = asyncio.create_task(prefilling())
            await _wait("two requests on instance a", lambda: router.slots.in_flight == 2)
            async with sim_process(1, 4, base_port=spare_port, itl_ms=1.0):
                await _wait("the spare in rotation", lambda: router.slots.get(spare).healthy)
                a.proc.kill()  # kill -9: both requests lose their engine
                status, text = await stream
                assert status == 200
                # the answer had begun: an error event ends it, the client knows it is cut
                last = text.rstrip().rsplit("\n", 1)[-1]
                assert last.startswith('data: {"error"'), text
                assert "the engine failed mid-stream" in last
                assert "data: [DONE]" not in text
                retried = await waiting  # no byte had been sent: it ran again on the spare
                assert retried.status_code == 200, retried.text
                assert retried.headers["x-gpuplane-instance"] == spare
                assert "data: [DONE]" in retried.text
                assert '"error"' not in retried.text
                await _wait("a out of rotation", lambda: not router.slots.get(a.urls[0]).healthy)
                after = await client.post(url + "/v1/chat/completions", json=_chat("hi", 3))
                assert after.status_code == 200
                assert after.headers["x-gpuplane-instance"] == spare
                await assert_released([router], timeout_s=30)
                assert router.slots.in_flight == 0
