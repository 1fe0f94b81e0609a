"""The gateway's HTTP server wiring: idle client connections are kept as long as configured (the
edge's own parts are tested in test_edge.py, its limits in test_limits.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gpuplane.config import parse_settings
from gpuplane.errors import ConfigError
from gpuplane.serve.server import serving
from tests.helpers.common import gateway_settings

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("leftovers")]


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


async def test_a_taken_port_is_a_clear_error_not_an_exit() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = parse_settings(gateway_settings([], port=port))
        with pytest.raises(ConfigError) as caught:
            async with serving(settings):
                pass
    assert f"the gateway could not listen on 127.0.0.1:{port}" in str(caught.value)
    assert "choose another (gateway.port, --port)" in str(caught.value)
