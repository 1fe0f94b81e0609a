"""Throwaway lease servers for the HA tests: Redis, etcd and PostgreSQL from the Debian
binaries, each on a free loopback port with its files in a temp dir, stopped in teardown.

A missing binary skips its tests with the reason, except under CI (CI=true), where it fails.
The servers are per session (each test uses its own lease key); `redis_server` and
`free_port` are also what the shared-mode tests use.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from gpuplane.serve.ha.shared_layout import load_scripts
from tests.control.pg_server import postgres_server
from tests.helpers.services import REDIS, require
from tests.serve.ha.shared_helpers import (
    INC,
    prefix,
)

ETCD = "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    """Block until something accepts on 127.0.0.1:port; fail with the server's output if it
    exits or does not listen in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{out[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:g} s")


@contextmanager
def _process(argv: list[str], port: int, what: str, tmp: str) -> Iterator[None]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        wait_listening(port, proc, what, 30.0)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def redis_process() -> Iterator[str]:
    """A Redis server without persistence; yields its redis:// URL."""
    require(REDIS, "redis-server")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="gpuplane-redis-")
    argv = [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with _process([*argv, "--dir", tmp], port, "redis-server", tmp):
        yield f"redis://127.0.0.1:{port}/0"


@contextmanager
def etcd_process() -> Iterator[str]:
    """A one-member etcd cluster; yields its client URL (the v3 JSON gateway is under /v3/)."""
    require(ETCD, "etcd-server")
    port, peer = free_port(), free_port()
    tmp = tempfile.mkdtemp(prefix="gpuplane-etcd-")
    client = f"http://127.0.0.1:{port}"
    argv = [
        ETCD,
        "--data-dir", os.path.join(tmp, "data"),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"default=http://127.0.0.1:{peer}",
        "--log-level", "error",
    ]  # fmt: skip
    with _process(argv, port, "etcd", tmp):
        yield client


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    with redis_process() as url:
        yield url


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[str]:
    with etcd_process() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server's libpq URL (postgresql://...)."""
    with postgres_server() as url:
        yield url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture
async def scripts(redis_server: str) -> AsyncIterator[tuple[dict[str, AsyncScript], str]]:
    """The scripts on one client, and a key prefix whose incarnation is INC."""
    client = aioredis.from_url(redis_server)
    key = prefix()
    await client.set(f"{key}:inc", INC)
    try:
        yield {n: client.register_script(s) for n, s in load_scripts().items()}, key
    finally:
        await client.aclose()
