"""The edge's parts: writes corked per loop turn, and the count of connections per client
address (the limits they enforce are tested through a served gateway in test_limits.py)."""

from __future__ import annotations

import asyncio

import pytest

from gpuplane.serve.edge import ClientConnections, CorkedTransport


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


@pytest.mark.anyio
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


@pytest.mark.anyio
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


@pytest.mark.anyio
async def test_everything_else_is_the_real_transport() -> None:
    real = RecordingTransport()
    corked = CorkedTransport(real)
    assert corked.get_write_buffer_size() == 7
    real.closed = True
    assert corked.is_closing()


def test_the_per_client_count_refuses_past_the_limit_and_forgets_closed_clients() -> None:
    clients = ClientConnections(limit=2)
    for _ in range(2):
        assert clients.can_open("10.0.0.1")
        clients.opened("10.0.0.1")
    assert not clients.can_open("10.0.0.1")
    assert clients.can_open("10.0.0.2")
    clients.closed("10.0.0.1")
    assert clients.can_open("10.0.0.1")
    clients.closed("10.0.0.1")
    assert clients.open == {}
