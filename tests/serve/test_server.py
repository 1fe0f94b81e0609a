"""The gateway's HTTP server wiring: uvicorn's writes of one loop turn leave as one, and idle
client connections are kept as long as configured."""

from __future__ import annotations

import asyncio

import pytest

from gpuplane.config import parse_settings
from gpuplane.serve.server import CorkedTransport, serving
from tests.conftest import gateway_settings

pytestmark = pytest.mark.anyio


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 7


async def test_writes_of_one_loop_turn_leave_in_one_write() -> None:
    real = RecordingTransport()
    corked = CorkedTransport(real)
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.write(b"body")
    assert real.writes == []
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    corked.write(b"next")
    await asyncio.sleep(0)
    assert real.writes[1:] == [b"next"]


async def test_close_sends_what_is_pending_first_and_nothing_after() -> None:
    real = RecordingTransport()
    corked = CorkedTransport(real)
    corked.write(b"last words")
    corked.close()
    assert real.writes == [b"last words"]
    assert real.closed
    corked.write(b"too late")
    await asyncio.sleep(0)
    assert real.writes == [b"last words"]


async def test_everything_else_is_the_real_transport() -> None:
    real = RecordingTransport()
    corked = CorkedTransport(real)
    assert corked.get_write_buffer_size() == 7
    real.closed = True
    assert corked.is_closing()


async def test_idle_client_connections_close_after_the_keepalive_setting() -> None:
    settings = parse_settings(gateway_settings([], client_keepalive_s=1))
    async with serving(settings) as base:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        # idle now: the gateway closes it at 1 s, before uvicorn's own default of 5 s (the 3.5 s
        # bound tells the two apart; it is not a speed claim)
        assert await asyncio.wait_for(reader.read(), 3.5) == b""
        writer.close()
