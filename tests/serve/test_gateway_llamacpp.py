"""The gateway in front of real llama.cpp engines (each serves one generation at a time)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuplane.config import parse_settings
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.server import serving
from gpuplane.serve.supervisor import Supervisor
from tests.helpers.common import gateway_settings
from tests.helpers.serve import assert_released
from tests.serve.llama_harness import chat_body, llama_instances, stream_chat

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]

SYSTEM = "You are the help desk of a GPU cloud. " + " ".join(
    f"Policy {i}: explain quota rule {i} calmly and briefly." for i in range(40)
)


@pytest.fixture(scope="module")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Supervisor]:
    async with llama_instances(2, tmp_path_factory.mktemp("engine-logs")) as supervisor:
        yield supervisor


@asynccontextmanager
async def gateway_over(
    supervisor: Supervisor, **config: Any
) -> AsyncIterator[tuple[str, httpx.AsyncClient, Gateway]]:
    """A gateway served in front of the supervisor's engines: its URL, a client, and itself
    (whose routers `assert_released` waits on: a real engine may take a while to stop)."""
    instances = [{"url": p.url, "max_concurrency": 1} for p in supervisor.processes]
    models = [{"name": "smollm2", "engine": "llamacpp", "instances": instances}]
    settings = parse_settings(gateway_settings(models, **config))
    gw = Gateway(settings)
    async with serving(settings, gw) as base, httpx.AsyncClient(timeout=300) as client:
        yield base, client, gw


async def wait_busy(client: httpx.AsyncClient, base: str) -> None:
    """Return once some request holds a slot (fails after 60 s)."""
    for _ in range(600):
        state = (await client.get(f"{base}/admin/state")).json()
        if any(i["in_flight"] for i in state["instances"]):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no request took a slot within 60 s")


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def test_gateway_serves_8_concurrent_streams_that_one_instance_cannot(
    engines: Supervisor,
) -> None:
    questions = [f"Name one use of a GPU, example {i}." for i in range(8)]
    async with gateway_over(engines) as (base, client, gw):
        through_gateway = await asyncio.gather(
            *(stream_chat(client, f"{base}/v1/chat/completions", chat_body(q)) for q in questions)
        )
        direct = engines.processes[0].url + "/v1/chat/completions"
        straight = await asyncio.gather(
            *(stream_chat(client, direct, chat_body(q)) for q in questions)
        )
        await assert_released(gw.routers.values(), timeout_s=60)
    assert all(r.complete for r in through_gateway), [r for r in through_gateway if not r.complete]
    assert all(r.text for r in through_gateway)
    # llama.cpp's server runs one generation at a time: concurrent requests cut each other off
    assert sum(r.complete for r in straight) < len(questions)


async def test_client_disconnects_mid_stream_free_every_slot(engines: Supervisor) -> None:
    async with gateway_over(engines) as (base, client, gw):

        async def read_first_chunk_then_leave(i: int) -> None:
            body = chat_body(f"Write a long story about GPU number {i}.", max_tokens=400)
            async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        return  # leaving the block closes the connection mid-stream

        # 4 clients on 2 slots: two leave mid-stream, two leave while queued or right after
        await asyncio.gather(*(read_first_chunk_then_leave(i) for i in range(4)))
        await assert_released(gw.routers.values(), timeout_s=60)
        after = await stream_chat(client, f"{base}/v1/chat/completions", chat_body("Say hi."))
        metrics = (await client.get(f"{base}/metrics")).text
    assert after.complete
    assert metric(metrics, "gpuplane_leases_reaped_total") == 0
    assert metric(metrics, 'gpuplane_requests_total{model="smollm2",status="499"}') >= 2


async def test_engine_killed_mid_stream_ends_with_error_event_and_is_replaced(
    engines: Supervisor,
) -> None:
    async with gateway_over(engines, health={"probe_interval_s": 0.2}) as (base, client, gw):
        body = chat_body("Write a very long story about a data centre.", max_tokens=600)
        killed: dict[str, Any] = {}
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            instance = r.headers["x-gpuplane-instance"]
            proc = next(p for p in engines.processes if p.url == instance)
            killed.update(pid=proc.pid, restarts=proc.restarts)
            lines: list[str] = []
            async for line in r.aiter_lines():
                if line.startswith("data: {") and len(lines) == 2:
                    os.kill(proc.pid or 0, signal.SIGKILL)
                lines.append(line)
        await assert_released(gw.routers.values(), timeout_s=60)
        for _ in range(100):  # the supervisor sees the exit (until then `ready` is the old one's)
            if proc.restarts > killed["restarts"]:
                break
            await asyncio.sleep(0.1)
        await asyncio.wait_for(proc.ready.wait(), 120)
        for _ in range(100):  # the prober sees the new process
            state = (await client.get(f"{base}/admin/state")).json()
            if all(i["state"] == "ready" for i in state["instances"]):
                break
            await asyncio.sleep(0.1)
        after = await asyncio.gather(
            *(stream_chat(client, f"{base}/v1/chat/completions", chat_body("Hi")) for _ in range(2))
        )
    assert any('"error"' in line for line in lines), lines[-3:]
    assert "data: [DONE]" not in lines
    assert proc.restarts == killed["restarts"] + 1
    assert proc.pid != killed["pid"]
    assert all(i["state"] == "ready" for i in state["instances"])
    assert all(r.complete for r in after), [r.error for r in after]


async def test_shared_system_prompt_sticks_to_its_instance_unless_it_is_busy(
    engines: Supervisor, tmp_path: Path
) -> None:
    # a request waits at most 0.5 s for the busy instance holding its prefix, far less than
    # the 300-token generation that keeps it busy below
    async with gateway_over(engines, placement={"locality_wait_s": 0.5}) as (base, client, _):
        url = f"{base}/v1/chat/completions"
        first = await stream_chat(client, url, chat_body("Hello?", SYSTEM, max_tokens=4))
        again = [
            await stream_chat(client, url, chat_body(f"Question {i}?", SYSTEM, max_tokens=4))
            for i in range(3)
        ]
        # keep the affinity instance busy; the next request with that prefix goes elsewhere
        busy = asyncio.create_task(
            stream_chat(client, url, chat_body("Tell a long story.", SYSTEM, max_tokens=300))
        )
        await wait_busy(client, base)
        elsewhere = await stream_chat(client, url, chat_body("Quick one?", SYSTEM, max_tokens=4))
        held = await busy
        metrics = (await client.get(f"{base}/metrics")).text
    assert first.complete
    assert all(r.complete for r in again)
    assert {r.instance for r in again} == {first.instance}
    assert held.instance == first.instance
    assert elsewhere.complete
    assert elsewhere.instance != first.instance
    assert metric(metrics, "gpuplane_prefix_affinity_hits_total") >= 4


async def test_llamacpp_streams_carry_no_usage_and_the_gateway_says_it_estimates(
    engines: Supervisor,
) -> None:
    """The claim is the engine's truth: llama-cpp-python's server ignores
    `stream_options.include_usage`, so the adapter declares `stream_usage = False`, the gateway's
    state says such streams are estimated, and their tokens are counted as estimated."""
    body = chat_body("Say hi.", max_tokens=8, stream_options={"include_usage": True})
    async with gateway_over(engines) as (base, client, gw):
        async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
            events = [line async for line in response.aiter_lines() if line.startswith("data: {")]
        await assert_released(gw.routers.values(), timeout_s=60)
        state = (await client.get(f"{base}/admin/state")).json()
        usage = (await client.get(f"{base}/admin/usage")).json()
    assert response.status_code == 200
    assert events
    assert not any(json.loads(e[6:]).get("usage") for e in events)
    assert [m["stream_usage"] for m in state["models"]] == ["estimated"]
    (tenant,) = usage["tenants"]
    assert tenant["completion_tokens"] == tenant["estimated_completion_tokens"] > 0
