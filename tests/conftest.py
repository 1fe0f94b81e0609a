"""Shared fixtures: the anyio backend, free ports, settings for a gateway, and logging that no
test leaves configured for the next."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Commands run through Typer's runner call `logs.configure()`, which points the root logger
    at the runner's stderr; once that is closed, a later test's log lines would become logging
    errors in its output. Put the root logger back after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_settings(models: list[dict[str, Any]], **gateway: Any) -> dict[str, Any]:
    """A settings dict for a gateway on a free loopback port."""
    return {"gateway": {"host": "127.0.0.1", "port": 0, **gateway}, "models": models}
