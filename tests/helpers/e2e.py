"""Helpers of the end-to-end tests: the CLI as a subprocess, a gateway over the simulator,
a gateway watching a control plane, and waiting on async conditions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gpuplane.config import parse_settings
from gpuplane.control.client import TOKEN_ENV
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.settings import ServeSettings
from tests.helpers.common import free_port, gateway_settings


def watching(url: str) -> tuple[Gateway, ServeSettings]:
    """A gateway that takes its models from the control plane at `url` (as the service's local
    admin, whose token `control` set; health probes every 0.2 s), and its settings for
    `serving`."""
    settings = parse_settings(gateway_settings([], health={"probe_interval_s": 0.2}))
    return Gateway(settings, control=url, control_token=os.environ[TOKEN_ENV]), settings


@contextmanager
def gateway_over_sim(
    tmp_path: Path, config: str = ""
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`gpuplane gateway` over one simulated engine (model smollm2, 2 slots), both as
    subprocesses; `config` is YAML put beside the `models:` section. Yields the gateway's URL and
    process; stops both with SIGINT (killed if they do not end within 30 s)."""
    sim_port, gw_port = free_port(), free_port()
    sim = subprocess.Popen(
        [*GPUPLANE, "engine", "sim", "--base-port", str(sim_port), "--instances", "1",
         "--max-num-seqs", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    path = tmp_path / "gateway.yaml"
    path.write_text(
        config + "models:\n  - name: smollm2\n    engine: sim\n    instances:\n"
        f'      - {{url: "http://127.0.0.1:{sim_port}", max_concurrency: 2}}\n'
    )
    gw = subprocess.Popen(
        [*GPUPLANE, "gateway", "--config", str(path), "--port", str(gw_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health", sim)
        wait_http(f"http://127.0.0.1:{gw_port}/readyz", gw)
        yield f"http://127.0.0.1:{gw_port}", gw
    finally:
        for p in (gw, sim):
            p.send_signal(signal.SIGINT)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)


async def wait_for(what: str, check: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s")
        await asyncio.sleep(0.1)


GPUPLANE = [sys.executable, "-m", "gpuplane.cli.main"]


def wait_http(url: str, proc: subprocess.Popen[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"{proc.args!r} exited early: {proc.stdout.read() if proc.stdout else ''}"
            )
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")
