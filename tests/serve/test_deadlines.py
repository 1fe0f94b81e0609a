"""How long the gateway waits on an engine: before the first byte only the request's deadline
counts (a prefill or a whole non-streamed answer is silent while the engine computes, and
sending it to another instance would run it twice); between the chunks of a stream, silence
longer than `idle_timeout_s` ends the stream (tested in test_gateway.py)."""

from __future__ import annotations

import pytest

from tests.helpers.serve import CHAT, error_of, gateway

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


async def test_a_long_non_streamed_answer_is_served_once_by_one_instance() -> None:
    """About 1 s of generation against an idle timeout of 0.2 s: the answer comes, once."""
    async with gateway(
        instances=2, sim={"itl_ms": 100.0}, idle_timeout_s=0.2, request_timeout_s=30
    ) as (base, client, fleet):
        r = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 10})
        metrics = (await client.get(f"{base}/metrics")).text
        stats = fleet.stats()
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"]
    assert sum(s["requests_total"] for s in stats) == 1
    assert "gpuplane_retries_total{" not in metrics
    assert "gpuplane_upstream_failures_total{" not in metrics


async def test_a_long_prefill_before_the_first_streamed_byte_is_served_once() -> None:
    """A 1,000-character prompt at 250 tokens/s: about a second of prefill, five idle
    timeouts, before the stream's first byte."""
    prompt = {"role": "user", "content": "x" * 1000}
    async with (
        gateway(
            instances=2,
            sim={"prefill_tokens_per_s": 250.0},
            idle_timeout_s=0.2,
            request_timeout_s=30,
        ) as (base, client, fleet),
        client.stream(
            "POST",
            f"{base}/v1/chat/completions",
            json={**CHAT, "messages": [prompt], "stream": True},
        ) as s,
    ):
        lines = [line async for line in s.aiter_lines() if line]
        stats = fleet.stats()
    assert s.status_code == 200
    assert lines[-1] == "data: [DONE]"
    assert sum(s["requests_total"] for s in stats) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hung_engine_times_out_at_the_deadline_with_504_and_is_not_sent_again(
    stream: bool,
) -> None:
    async with gateway(
        instances=2,
        sim={"hang_rate": 1.0},
        idle_timeout_s=0.1,
        request_timeout_s=1.0,
        lease_ttl_s=5,
        health={"probe_interval_s": 60},
    ) as (base, client, fleet):
        r = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": stream})
        stats = fleet.stats()
    assert r.status_code == 504
    error = error_of(r)
    assert error["code"] == "request_timeout"
    assert "gateway.request_timeout_s" in error["message"]
    assert sum(s["requests_total"] for s in stats) == 1
