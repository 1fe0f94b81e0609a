"""The gateway's contract over simulated engines: errors, auth, queueing, retries, release."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuplane.serve.timer import WATCH_AFTER_S
from tests.helpers.serve import CHAT, error_of, gateway

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


async def test_chat_and_completions_stream_and_not() -> None:
    async with gateway() as (base, client, _):
        r = await client.post(f"{base}/v1/chat/completions", json=CHAT)
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"]
        r = await client.post(f"{base}/v1/completions", json={"model": "m", "prompt": "x"})
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"]
        async with client.stream(
            "POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in s.aiter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        models = (await client.get(f"{base}/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["m"]
        assert (await client.get(f"{base}/healthz")).status_code == 200
        assert (await client.get(f"{base}/readyz")).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "code", "needle"),
    [
        (b"{not json", 400, "invalid_json", "not valid JSON"),
        (b"[1, 2]", 400, "invalid_request", "body"),
        (json.dumps({"model": "m"}).encode(), 400, "invalid_request", "messages"),
        (json.dumps({**CHAT, "model": "gpt-9"}).encode(), 404, "model_not_found", "available"),
        (json.dumps({**CHAT, "messages": "hi"}).encode(), 400, "invalid_request", "messages"),
    ],
)
async def test_bad_requests_get_clear_errors(
    body: bytes, status: int, code: str, needle: str
) -> None:
    async with gateway() as (base, client, _):
        r = await client.post(
            f"{base}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == status
        err = error_of(r)
        assert err["code"] == code
        assert needle in err["message"]


async def test_completions_only_accept_post() -> None:
    async with gateway() as (base, client, _):
        r = await client.get(f"{base}/v1/chat/completions")
        assert r.status_code == 405
        assert r.headers["allow"] == "POST"
        err = error_of(r)
        assert err["code"] == "method_not_allowed"
        assert err["type"] == "invalid_request_error"
        assert "only accepts POST" in err["message"]


async def test_oversized_body_is_refused() -> None:
    async with gateway(max_body_bytes=2048) as (base, client, _):
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        r = await client.post(f"{base}/v1/chat/completions", json=big)
        assert r.status_code == 413
        assert "max_body_bytes" in error_of(r)["message"]


async def test_api_keys_when_tenants_have_them() -> None:
    tenants = [{"name": "team-a", "api_keys": ["key-a"]}]
    async with gateway(tenants=tenants) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        missing = await client.post(url, json=CHAT)
        wrong = await client.post(url, json=CHAT, headers={"authorization": "Bearer nope"})
        good = await client.post(url, json=CHAT, headers={"authorization": "Bearer key-a"})
        models = await client.get(f"{base}/v1/models")
    assert missing.status_code == 401
    assert "requires an API key" in error_of(missing)["message"]
    assert wrong.status_code == 401
    assert "not valid" in error_of(wrong)["message"]
    assert good.status_code == 200
    assert models.status_code == 401


async def test_queue_full_is_429_and_queue_timeout_is_503_with_retry_after() -> None:
    slow = {"itl_ms": 100.0}
    async with gateway(instances=1, sim=slow, queue={"max_size": 1, "timeout_s": 0.5}) as (
        base,
        client,
        _,
    ):
        url = f"{base}/v1/chat/completions"
        holder = asyncio.create_task(client.post(url, json={**CHAT, "max_tokens": 20}))
        await asyncio.sleep(0.2)
        waiter = asyncio.create_task(client.post(url, json=CHAT))
        await asyncio.sleep(0.1)
        full = await client.post(url, json=CHAT)
        timed_out = await waiter
        held = await holder
    assert full.status_code == 429
    assert error_of(full)["code"] == "queue_full"
    assert "queue is full" in error_of(full)["message"]
    assert timed_out.status_code == 503
    assert error_of(timed_out)["code"] == "queue_timeout"
    assert int(timed_out.headers["retry-after"]) >= 1
    assert held.status_code == 200


async def test_client_leaving_the_queue_is_withdrawn() -> None:
    async with gateway(instances=1, sim={"itl_ms": 100.0}) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        holder = asyncio.create_task(client.post(url, json={**CHAT, "max_tokens": 15}))
        await asyncio.sleep(0.2)
        leaver = asyncio.create_task(client.post(url, json=CHAT))
        for _ in range(50):
            if (await client.get(f"{base}/admin/state")).json()["models"][0]["queued"]:
                break
            await asyncio.sleep(0.02)
        leaver.cancel()
        for _ in range(50):
            state = (await client.get(f"{base}/admin/state")).json()
            if not state["models"][0]["queued"]:
                break
            await asyncio.sleep(0.02)
        assert state["models"][0]["queued"] == 0
        assert state["instances"][0]["in_flight"] == 1  # the holder is still running
        assert (await holder).status_code == 200


async def test_slots_bound_concurrency_per_instance() -> None:
    async with gateway(instances=2, capacity=2, sim={"itl_ms": 5.0}) as (base, client, fleet):
        url = f"{base}/v1/chat/completions"
        results = await asyncio.gather(
            *(client.post(url, json={**CHAT, "max_tokens": 8}) for _ in range(20))
        )
        stats = fleet.stats()
    assert all(r.status_code == 200 for r in results)
    assert [s["max_running_seen"] for s in stats] == [2, 2]
    assert sum(s["waiting_time_total_s"] for s in stats) == 0  # nothing waited inside engines


async def test_dead_instance_is_retried_elsewhere_and_marked_unhealthy() -> None:
    async with gateway(instances=2, health={"probe_interval_s": 60}) as (base, client, fleet):
        fleet.kill(0)
        url = f"{base}/v1/chat/completions"
        # two at once: with both slots taken, one of them must try the dead instance
        results = await asyncio.gather(*(client.post(url, json=CHAT) for _ in range(2)))
        results += [await client.post(url, json=CHAT) for _ in range(2)]
        state = (await client.get(f"{base}/admin/state")).json()
        metrics = (await client.get(f"{base}/metrics")).text
    assert all(r.status_code == 200 for r in results)
    assert [i["state"] for i in state["instances"]] == ["unhealthy", "ready"]
    assert "gpuplane_upstream_failures_total{instance=" in metrics


async def test_refused_connection_costs_no_retry() -> None:
    """With retries 0, a request that meets a dead instance (connection refused) still goes on
    to a live one: nothing reached an engine, and the dead one is marked down at once."""
    async with gateway(instances=3, retries=0, health={"probe_interval_s": 60}) as (
        base,
        client,
        fleet,
    ):
        fleet.kill(0)
        fleet.kill(1)
        url = f"{base}/v1/chat/completions"
        # placement ties are broken at random: six requests meet a dead instance all but surely
        results = [await client.post(url, json=CHAT) for _ in range(6)]
        state = (await client.get(f"{base}/admin/state")).json()
    assert [r.status_code for r in results] == [200] * 6
    assert state["instances"][2]["state"] == "ready"


async def test_all_instances_down_is_503_and_recovers() -> None:
    async with gateway(instances=1, health={"probe_interval_s": 0.1}) as (base, client, fleet):
        fleet.kill(0)
        url = f"{base}/v1/chat/completions"
        first = await client.post(url, json=CHAT)
        second = await client.post(url, json=CHAT)
        ready = await client.get(f"{base}/readyz")
        await fleet.restart(0)
        for _ in range(100):
            if (await client.get(f"{base}/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.05)
        after = await client.post(url, json=CHAT)
    # the first request finds the engine down (connection refused) and marks it unhealthy
    assert first.status_code == 503
    assert second.status_code == 503
    assert error_of(second)["code"] == "no_healthy_instance"
    assert ready.status_code == 503
    assert after.status_code == 200


async def test_failure_mid_stream_ends_with_an_error_event() -> None:
    sim = {"drop_rate": 1.0, "drop_at_token": 3}
    async with (
        gateway(instances=1, sim=sim) as (base, client, _),
        client.stream(
            "POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 10}
        ) as s,
    ):
        lines = [line async for line in s.aiter_lines() if line]
    assert s.status_code == 200
    assert "data: [DONE]" not in lines
    assert json.loads(lines[-1][6:])["error"]["code"] == "upstream_error"


async def test_an_engine_silent_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async with (
        gateway(instances=1, sim={"itl_ms": 5000.0}, idle_timeout_s=0.3) as (base, client, _),
        client.stream("POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True}) as s,
    ):
        lines = [line async for line in s.aiter_lines() if line]
    assert s.status_code == 200
    assert len(lines) > 1  # the first token came before the silence
    error = json.loads(lines[-1][6:])["error"]
    assert error["code"] == "upstream_error"
    assert "gateway.idle_timeout_s" in error["message"]


@pytest.mark.parametrize("timeout_s", [0.5, WATCH_AFTER_S / 2])
async def test_request_timeout_is_504_and_frees_the_slot(timeout_s: float) -> None:
    """Also with a deadline that comes before the client's connection is watched."""
    async with gateway(
        instances=1, sim={"hang_rate": 1.0}, request_timeout_s=timeout_s, lease_ttl_s=5
    ) as (base, client, _):
        r = await client.post(f"{base}/v1/chat/completions", json=CHAT)
    assert r.status_code == 504
    assert "request_timeout_s" in error_of(r)["message"]


async def test_request_timeout_mid_stream_ends_with_an_error_event() -> None:
    async with (
        gateway(instances=1, sim={"itl_ms": 200.0}, request_timeout_s=0.5) as (base, client, _),
        client.stream(
            "POST", f"{base}/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 15}
        ) as s,
    ):
        lines = [line async for line in s.aiter_lines() if line]
    assert s.status_code == 200
    assert len(lines) > 1  # tokens came before the deadline
    assert json.loads(lines[-1][6:])["error"]["code"] == "request_timeout"


async def test_aborted_request_keeps_its_slot_until_the_engine_has_seen_the_abort() -> None:
    """The deadline drops the engine's request mid-stream: the slot stays taken for
    `abort_grace_s`, so the next request cannot reach the engine while it still runs the old one."""
    async with gateway(
        instances=1, sim={"itl_ms": 200.0}, request_timeout_s=1.0, abort_grace_s=0.3
    ) as (base, client, fleet):
        url = f"{base}/v1/chat/completions"
        async with client.stream("POST", url, json={**CHAT, "stream": True, "max_tokens": 15}) as s:
            lines = [line async for line in s.aiter_lines() if line]
        held = (await client.get(f"{base}/admin/state")).json()["instances"][0]["in_flight"]
        # one token: waits in the queue for the grace to end, then well within the deadline
        after = await client.post(url, json={**CHAT, "max_tokens": 1})
        stats = fleet.stats()
    assert json.loads(lines[-1][6:])["error"]["code"] == "request_timeout"
    assert held == 1
    assert after.status_code == 200
    assert stats[0]["max_running_seen"] == 1


async def test_an_engine_that_counts_its_cached_tokens_teaches_the_prefix_index() -> None:
    """The simulator reports `usage.prompt_tokens_details.cached_tokens`, as vLLM does: once an
    answer carried it, the instance's cache is learned from those counts (`/admin/state`)."""
    async with gateway(instances=1) as (base, client, _):
        before = (await client.get(f"{base}/admin/state")).json()["instances"][0]
        stream = {**CHAT, "stream": True}
        async with client.stream("POST", f"{base}/v1/chat/completions", json=stream) as s:
            assert [line async for line in s.aiter_lines() if line][-1] == "data: [DONE]"
        unasked = (await client.get(f"{base}/admin/state")).json()["instances"][0]
        assert (await client.post(f"{base}/v1/chat/completions", json=CHAT)).status_code == 200
        after = (await client.get(f"{base}/admin/state")).json()["instances"][0]
    assert before["prefix_cache"] == {"blocks": None, "learned_from": "latency"}
    # a stream whose client did not ask for usage carries no count
    assert unasked["prefix_cache"]["learned_from"] == "latency"
    assert after["prefix_cache"]["learned_from"] == "engine"
