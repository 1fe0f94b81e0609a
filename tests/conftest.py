"""Shared fixtures: the anyio backend, free ports, settings for a gateway, and logging that no
test leaves configured for the next; the tests that share a heavy per-session backend are pinned
to one pytest-xdist worker."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest

# Fixtures that start a backend too heavy to run twice at once on a small machine -> the
# pytest-xdist group whose one worker runs every test that asks for it (`--dist loadgroup`, as
# `make test` runs). Servers that are cheap to start (PostgreSQL, Redis, etcd) are started per
# worker instead: each on a free port with its files in a temp dir.
ONE_WORKER = {
    "ray_address": "ray",  # a local Ray cluster of two nodes (tests/control/adapters)
    "ray_cluster": "ray",  # Ray's own test cluster (tests/batch/test_ray.py)
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in sorted(set(getattr(item, "fixturenames", ())) & ONE_WORKER.keys()):
            item.add_marker(pytest.mark.xdist_group(ONE_WORKER[fixture]))


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
