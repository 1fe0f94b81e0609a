"""Shared fixtures: the anyio backend, free ports, and a gateway served on a real socket."""

from __future__ import annotations

import socket
from typing import Any

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_settings(models: list[dict[str, Any]], **gateway: Any) -> dict[str, Any]:
    """A settings dict for a gateway on a free loopback port."""
    return {"gateway": {"host": "127.0.0.1", "port": 0, **gateway}, "models": models}
