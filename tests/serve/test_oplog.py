"""The gateway's operator log: instance health changes every time, refusals rate-limited with a
count of the lines left out."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gpuplane.serve.errors import Rejection
from gpuplane.serve.oplog import GatewayLog, RateLimit
from tests.helpers.serve import CHAT, gateway


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def fields(record: logging.LogRecord, *names: str) -> tuple[Any, ...]:
    """The event's fields (`extra`), which the JSON formatter writes as fields of their own."""
    return tuple(vars(record)[name] for name in names)


def test_one_event_per_key_and_window_with_the_count_left_out() -> None:
    clock = Clock()
    limit = RateLimit(10.0, clock)
    assert limit.admit("a") == 0
    assert [limit.admit("a") for _ in range(3)] == [None] * 3
    assert limit.admit("b") == 0  # keys are limited apart
    clock.now += 9.9
    assert limit.admit("a") is None
    clock.now += 0.1
    assert limit.admit("a") == 4
    clock.now += 10.0
    assert limit.admit("a") == 0


def test_rejections_are_logged_once_per_model_reason_and_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    oplog = GatewayLog(every_s=10.0, clock=clock)
    for _ in range(5):
        oplog.rejected("m", Rejection.QUEUE_FULL, 429)
    oplog.rejected("m", Rejection.QUEUE_TIMEOUT, 503)
    oplog.rejected("other", Rejection.QUEUE_FULL, 429)
    clock.now += 10.0
    oplog.rejected("m", Rejection.QUEUE_FULL, 429)
    lines = events(caplog, "request_rejected")
    assert [fields(r, "model", "reason", "status", "left_out") for r in lines] == [
        ("m", "queue_full", 429, 0),
        ("m", "queue_timeout", 503, 0),
        ("other", "queue_full", 429, 0),
        ("m", "queue_full", 429, 4),
    ]
    assert all(r.levelno == logging.WARNING for r in lines)
    assert "gateway.queue.max_size" in lines[0].getMessage()
    assert "gateway.queue.timeout_s" in lines[1].getMessage()
    assert "4 more like it" in lines[3].getMessage()


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_an_instance_going_down_and_recovering_is_logged_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gpuplane.gateway")
    async with gateway(instances=2, health={"probe_interval_s": 0.05}) as (_, _, fleet):
        fleet.kill(0)
        for _ in range(200):
            if events(caplog, "instance_unhealthy"):
                break
            await asyncio.sleep(0.02)
        await fleet.restart(0)
        for _ in range(200):
            if events(caplog, "instance_recovered"):
                break
            await asyncio.sleep(0.02)
    down = events(caplog, "instance_unhealthy")
    up = events(caplog, "instance_recovered")
    assert len(down) == 1
    assert len(up) == 1
    assert fields(down[0], "model", "instance") == ("m", fleet.urls[0])
    assert down[0].levelno == logging.WARNING
    assert "cannot connect" in down[0].getMessage()
    assert "health probe" in fields(down[0], "reason")[0]
    assert fields(up[0], "instance") == (fleet.urls[0],)
    assert "healthy again" in up[0].getMessage()


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_requests_refused_for_capacity_are_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with gateway(instances=1, sim={"itl_ms": 100.0}, queue={"max_size": 0}) as (
        base,
        client,
        _,
    ):
        url = f"{base}/v1/chat/completions"
        holder = asyncio.create_task(client.post(url, json={**CHAT, "max_tokens": 10}))
        await asyncio.sleep(0.2)
        refused = [await client.post(url, json=CHAT) for _ in range(5)]
        assert (await holder).status_code == 200
    assert [r.status_code for r in refused] == [429] * 5
    lines = events(caplog, "request_rejected")
    assert len(lines) == 1
    assert fields(lines[0], "model", "status") == ("m", 429)
    assert "gateway.queue.max_size" in lines[0].getMessage()
