"""The gateway's limits against misbehaving clients: deadlines for a request's head and body, a
cap on each client address's connections, the open-file limit, and metrics labels that client
input cannot multiply."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.config import parse_settings
from gpuplane.serve.server import serving
from tests.helpers.common import gateway_settings
from tests.helpers.serve import CHAT, gateway

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]

ROOT = Path(__file__).resolve().parents[2]
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(base: str) -> Stream:
    host, port = base.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def get(stream: Stream, path: str) -> tuple[bytes, bytes]:
    """One GET on a raw connection: the response's head and body."""
    reader, writer = stream
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


def samples(page: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == name
    }


def series(page: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(page))


def refused(page: str) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for labels, value in samples(page, "gpuplane_connections_refused_total").items()
    }


def events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def error_in(answer: bytes) -> dict[str, Any]:
    return dict(json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"])


# -- head and body deadlines --------------------------------------------------------------------


async def test_a_head_not_sent_in_time_gets_408_and_the_connection_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A connection that sent part of a head gets 408 and is closed; one that sent nothing is
    closed without an answer; a kept-alive connection idle past the head's deadline is the
    keep-alive timeout's to close, not this one's."""
    async with gateway(instances=1, header_timeout_s=0.5, client_keepalive_s=10) as (
        base,
        client,
        _,
    ):
        kept = await connect(base)
        first, _ = await get(kept, "/healthz")
        silent = await connect(base)
        partial = await connect(base)
        partial[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A")
        answer = await asyncio.wait_for(partial[0].read(), 10)
        nothing = await asyncio.wait_for(silent[0].read(), 10)
        again, _ = await get(kept, "/healthz")  # idle for the 0.5 s the others took
        page = (await client.get(f"{base}/metrics")).text
        for _, writer in (kept, silent, partial):
            writer.close()
    assert first.startswith(b"HTTP/1.1 200")
    assert answer.startswith(b"HTTP/1.1 408")
    error = error_in(answer)
    assert error["code"] == "header_timeout"
    assert "gateway.header_timeout_s" in error["message"]
    assert nothing == b""
    assert again.startswith(b"HTTP/1.1 200")
    assert refused(page) == {"header_timeout": 2}
    logged = events(caplog, "connection_refused")
    assert logged  # rate-limited: the second within the window is left out
    assert "gateway.header_timeout_s" in logged[0].getMessage()


def post(body: bytes) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


async def test_a_body_not_sent_in_time_gets_408_and_frees_what_it_held() -> None:
    """A body is owed from its head, or, for a request pipelined behind one in progress (the
    gateway does not read it meanwhile), from the moment its turn comes."""
    async with gateway(instances=1, sim={"itl_ms": 100.0}, body_timeout_s=1.0) as (
        base,
        client,
        _,
    ):
        reader, writer = await connect(base)
        writer.write(post(json.dumps(CHAT).encode())[:-10])
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        reader, writer = await connect(base)
        second = post(json.dumps(CHAT).encode())
        # the first takes about 0.9 s; the end of the second's body comes 1.2 s after its head
        writer.write(post(json.dumps({**CHAT, "max_tokens": 10}).encode()) + second[:-10])
        await asyncio.sleep(1.2)
        writer.write(second[-10:])
        pipelined = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 10):  # b"": closed
            pipelined += chunk
            if pipelined.count(b"HTTP/1.1 ") == 2 and pipelined.endswith(b"}"):
                break
        writer.close()
        page = (await client.get(f"{base}/metrics")).text
    assert answer.startswith(b"HTTP/1.1 408")
    error = error_in(answer)
    assert error["code"] == "body_timeout"
    assert "gateway.body_timeout_s" in error["message"]
    assert pipelined.count(b"HTTP/1.1 200 OK") == 2
    assert refused(page) == {"body_timeout": 1}


# -- connections per client -------------------------------------------------------------------


async def test_a_connection_over_the_per_client_cap_is_closed_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with gateway(instances=1, max_connections_per_client=3) as (base, client, _):
        held = [await connect(base) for _ in range(3)]
        over_reader, over_writer = await connect(base)
        over = await asyncio.wait_for(over_reader.read(), 10)
        over_writer.close()
        with pytest.raises(httpx.TransportError):
            await client.get(f"{base}/healthz")
        for _, writer in held[:2]:  # room again, for the test's own client
            writer.close()
            await writer.wait_closed()
        for _ in range(100):
            try:
                healthy = await client.get(f"{base}/healthz")
                break
            except httpx.TransportError:  # the gateway has not seen the close yet
                await asyncio.sleep(0.05)
        page = (await client.get(f"{base}/metrics")).text
        held[2][1].close()
    assert over == b""
    assert healthy.status_code == 200
    assert refused(page)["per_client_limit"] >= 2
    logged = events(caplog, "connection_refused")
    assert "gateway.max_connections_per_client" in logged[0].getMessage()


# -- the open-file limit ----------------------------------------------------------------------


async def test_the_gateway_raises_its_soft_open_file_limit_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    if hard == resource.RLIM_INFINITY or hard // 2 < in_use + 256:
        pytest.skip(f"the hard open-file limit ({hard}) leaves no room to lower the soft one")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard // 2, hard))
    try:
        async with serving(parse_settings(gateway_settings([]))):
            raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raised == hard


# -- metrics labels ---------------------------------------------------------------------------


async def test_unknown_model_names_share_one_metrics_label() -> None:
    """200 distinct 10,000-character model names cost /metrics no series and no bytes beyond
    the first one's (the count's digits aside)."""
    async with gateway(instances=1) as (base, client, _):
        url = f"{base}/v1/chat/completions"

        async def unknown(i: int) -> int:
            body = {**CHAT, "model": f"made-up-{i}-" + "x" * 10_000}
            return (await client.post(url, json=body)).status_code

        first = await unknown(0)
        page_after_one = (await client.get(f"{base}/metrics")).text
        statuses = [await unknown(i) for i in range(1, 200)]
        page = (await client.get(f"{base}/metrics")).text
    assert {first, *statuses} == {404}
    rejected = samples(page, "gpuplane_rejections_total")
    assert rejected == {(("model", "unknown"), ("reason", "unknown_model")): 200}
    assert series(page) == series(page_after_one)
    assert len(page) - len(page_after_one) < 10_000
    assert "made-up" not in page


# -- slow clients at scale --------------------------------------------------------------------

SLOW_CLIENTS = 2000
# descriptors the gateway keeps beside the swarm's: engines, the test's clients, the loop
HEADROOM = 512


def swarm_size() -> int:
    """2,000 slow connections, or as many as the hard open-file limit leaves room for beside the
    gateway's own descriptors (the gateway raises its soft limit to the hard one; the swarm runs
    in a child process whose sockets count against its own limit)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return SLOW_CLIENTS if hard == resource.RLIM_INFINITY else min(SLOW_CLIENTS, hard - HEADROOM)


async def slow_swarm(
    base: str, count: int, mode: str, every_s: float
) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """Run `count` slow clients in a child process; meanwhile send normal requests, one new
    connection each, until the gateway has closed every slow one (or the child gave up after
    30 s). The child's two reports and the normal requests' statuses."""
    host, port = base.removeprefix("http://").split(":")
    argv = [sys.executable, "-m", "tests.serve.slow_clients", host, port, str(count), mode]
    proc = await asyncio.create_subprocess_exec(
        *argv, str(every_s), "30", stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout is not None
    statuses: list[int] = []
    try:
        opened = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
        last = asyncio.ensure_future(proc.stdout.readline())
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=30, limits=fresh) as client:
            while not last.done():
                r = await client.post(f"{base}/v1/chat/completions", json=CHAT)
                statuses.append(r.status_code)
                await asyncio.wait([last], timeout=0.1)
        summary = json.loads(await last)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    return opened, summary, statuses


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_slowloris_is_closed_at_the_header_timeout_while_requests_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    count = swarm_size()
    async with gateway(
        instances=1, capacity=4, header_timeout_s=3.0, max_connections_per_client=count + 100
    ) as (base, client, _):
        opened, summary, statuses = await slow_swarm(base, count, "head", every_s=1.0)
        page = (await client.get(f"{base}/metrics")).text
    assert opened == {"opened": count, "failed": 0}
    assert summary["closed"] == count
    assert summary["answered_408"] == count
    assert "gateway.header_timeout_s" in summary["first_answer"]
    assert statuses
    assert set(statuses) == {200}
    assert refused(page) == {"header_timeout": count}
    assert len(events(caplog, "connection_refused")) < 10  # not one line per connection


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_trickled_bodies_are_closed_at_the_body_timeout_while_requests_answer() -> None:
    count = min(500, swarm_size())
    async with gateway(
        instances=1, capacity=4, body_timeout_s=3.0, max_connections_per_client=count + 100
    ) as (base, client, _):
        opened, summary, statuses = await slow_swarm(base, count, "body", every_s=1.0)
        page = (await client.get(f"{base}/metrics")).text
    assert opened == {"opened": count, "failed": 0}
    assert summary["closed"] == count
    assert summary["answered_408"] == count
    assert "gateway.body_timeout_s" in summary["first_answer"]
    assert statuses
    assert set(statuses) == {200}
    assert refused(page) == {"body_timeout": count}
