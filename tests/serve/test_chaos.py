"""Chaos: thousands of requests through the gateway while clients and engines misbehave.

Clients leave while queued, before the first byte and mid-stream; simulated engines are killed
and restarted, hang, answer 500, hang single requests and drop connections mid-stream. Afterwards
no slot is held, no engine ever ran more generations than the gateway's capacity for it, every
client that stayed got a complete answer or a clear error, and the reaper reclaimed nothing.

The simulator's own limit (`max_num_seqs`) is set far above the gateway's capacities, so its
`max_running_seen` measures the gateway's admission, not the simulator's.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.config import parse_settings
from gpuplane.engines.sim import SimFleet, start_sim
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.server import serving
from tests.helpers.serve import assert_released

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.timeout(240),
    pytest.mark.usefixtures("leftovers"),
]

REQUESTS = 5000
CLIENTS = 48
CAPACITIES = [2, 3, 4, 2, 3, 4]
SYSTEMS = [f"System prompt of tenant {t}. " * 12 for t in range(4)]


@dataclass(frozen=True, slots=True)
class Plan:
    """What one client does: the request, and whether and when it walks away."""

    stream: bool
    system: str
    max_tokens: int
    leave: str  # "stay" | "early" (queued or before the first byte) | "mid_stream"
    leave_after_s: float


def plan(rng: random.Random, i: int) -> Plan:
    stream = rng.random() < 0.7
    roll = rng.random()
    if roll < 0.08:
        leave = "early"
    elif roll < 0.16 and stream:
        leave = "mid_stream"
    else:
        leave = "stay"
    return Plan(stream, rng.choice(SYSTEMS), rng.randint(2, 8), leave, rng.uniform(0, 0.05))


def body(p: Plan, i: int) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [
            {"role": "system", "content": p.system},
            {"role": "user", "content": f"question {i}"},
        ],
        "max_tokens": p.max_tokens,
        "stream": p.stream,
    }


def is_clear_error(data: bytes) -> bool:
    try:
        err = json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and bool(err.get("message"))


async def one(client: httpx.AsyncClient, url: str, p: Plan, i: int) -> str:
    """Run one client; the outcome is 'complete', 'error', 'left' or a description of a defect."""
    if p.leave == "early":
        task = asyncio.create_task(client.post(url, json=body(p, i)))
        await asyncio.sleep(p.leave_after_s)
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return "left"
        resp = task.result()
        return (
            "complete" if resp.status_code == 200 else check_error(resp.status_code, resp.content)
        )
    if not p.stream:
        resp = await client.post(url, json=body(p, i))
        if resp.status_code == 200:
            return "complete" if resp.json().get("choices") else f"200 without choices: {resp.text}"
        return check_error(resp.status_code, resp.content)
    async with client.stream("POST", url, json=body(p, i)) as resp:
        if resp.status_code != 200:
            return check_error(resp.status_code, await resp.aread())
        events = []
        async for line in resp.aiter_lines():
            if not line:
                continue
            events.append(line)
            if p.leave == "mid_stream" and len(events) == 2:
                return "left"  # leaving the block closes the connection mid-stream
    if events and events[-1] == "data: [DONE]":
        return "complete"
    if events and is_clear_error(events[-1].removeprefix("data: ").encode()):
        return "error"
    return f"stream ended without [DONE] or an error event: {events[-2:]}"


def check_error(status: int, data: bytes) -> str:
    if status >= 400 and is_clear_error(data):
        return "error"
    return f"status {status} without an OpenAI error body: {data[:200]!r}"


async def chaos_monkey(fleet: SimFleet, rng: random.Random, stop: asyncio.Event) -> Counter[str]:
    """Kill and restart, or hang and release, one instance at a time."""
    done: Counter[str] = Counter()
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.2, 0.5))
        i = rng.randrange(len(fleet.instances))
        action = rng.choice(["kill", "hang", "none"])
        if action == "kill":
            fleet.kill(i)
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            await fleet.restart(i)
        elif action == "hang":
            fleet.hang(i)
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            fleet.hang(i, False)
        done[action] += 1
    return done


async def max_queued(client: httpx.AsyncClient, gateway_url: str, stop: asyncio.Event) -> int:
    """The deepest the gateway's queue got (so that clients did leave while queued)."""
    most = 0
    while not stop.is_set():
        state = (await client.get(gateway_url + "/admin/state")).json()
        most = max(most, *(m["queued"] for m in state["models"]))
        await asyncio.sleep(0.1)
    return most


def reaped_total(metrics_text: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "gpuplane_leases_reaped_total":
                total += sample.value
    return total


async def test_no_slot_leaks_and_no_over_admission_under_chaos() -> None:
    rng = random.Random(20261130)
    async with start_sim(
        instances=len(CAPACITIES),
        max_num_seqs=100,  # far above the gateway's capacities: the gateway is what is measured
        seed=7,
        itl_ms=2.0,
        prefill_tokens_per_s=200_000.0,
        error_rate=0.02,
        hang_rate=0.003,
        drop_rate=0.02,
        drop_at_token=2,
    ) as fleet:
        settings = parse_settings(
            {
                "gateway": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "request_timeout_s": 20.0,
                    "lease_ttl_s": 30.0,
                    "idle_timeout_s": 1.0,
                    "connect_timeout_s": 1.0,
                    "reaper_interval_s": 1.0,
                    "queue": {"max_size": 1000, "timeout_s": 10.0},
                    "health": {
                        "probe_interval_s": 0.2,
                        "probe_timeout_s": 0.3,
                        "failure_threshold": 2,
                    },
                },
                "models": [
                    {
                        "name": "sim",
                        "engine": "sim",
                        "instances": [
                            {"url": url, "max_concurrency": cap}
                            for url, cap in zip(fleet.urls, CAPACITIES, strict=True)
                        ],
                    }
                ],
            }
        )
        gateway = Gateway(settings)
        async with serving(settings, gateway) as gateway_url:
            # idle connections expire on the client before uvicorn's 5 s keep-alive closes them,
            # or a request sent just as the server closes fails (a client race, not the gateway's)
            limits = httpx.Limits(max_connections=CLIENTS * 2, keepalive_expiry=2.0)
            async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
                url = gateway_url + "/v1/chat/completions"
                plans = [plan(rng, i) for i in range(REQUESTS)]
                queue = iter(range(REQUESTS))
                outcomes: list[str] = []

                async def worker() -> None:
                    for i in queue:
                        outcomes.append(await one(client, url, plans[i], i))

                stop = asyncio.Event()
                monkey = asyncio.create_task(chaos_monkey(fleet, random.Random(5), stop))
                queued = asyncio.create_task(max_queued(client, gateway_url, stop))
                await asyncio.gather(*(worker() for _ in range(CLIENTS)))
                stop.set()
                actions = await monkey
                most_queued = await queued

                # every lease released and the queue empty, while the gateway still serves
                await assert_released(gateway.routers.values(), timeout_s=30)
                metrics = (await client.get(gateway_url + "/metrics")).text
        stats = fleet.stats()

    counts = Counter(o if o in ("complete", "error", "left") else "defect" for o in outcomes)
    print(f"outcomes {dict(counts)}; chaos {dict(actions)}; queue depth up to {most_queued}")
    defects = [o for o in outcomes if o not in ("complete", "error", "left")]
    assert len(outcomes) == REQUESTS
    assert not defects, (
        f"{len(defects)} clients got neither an answer nor a clear error: {defects[:5]}"
    )
    assert counts["complete"] > REQUESTS * 0.6, counts
    assert counts["left"] > 0, counts
    assert most_queued > 0  # the early leavers include clients that were waiting in the queue
    assert counts["error"] > 0, counts
    assert actions["kill"] > 0, actions
    assert actions["hang"] > 0, actions
    for cap, s in zip(CAPACITIES, stats, strict=True):
        assert s["max_running_seen"] <= cap, f"instance {s['instance']} over-admitted: {s}"
        assert s["running"] == 0
    assert sum(s["injected_drops"] for s in stats) > 0
    assert sum(s["kills"] for s in stats) == actions["kill"]
    assert reaped_total(metrics) == 0
