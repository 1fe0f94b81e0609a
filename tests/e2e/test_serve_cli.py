"""The serving commands as a user runs them: separate processes, real sockets, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

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


@pytest.fixture
def sim_gateway(tmp_path: Path) -> Iterator[str]:
    with gateway_over_sim(tmp_path) as (url, gw):
        yield url
    assert gw.returncode == 0


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUPLANE, *args], capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_chat_streams_an_answer_through_the_gateway(sim_gateway: str) -> None:
    done = run_cli("chat", "hello there", "--server", sim_gateway, "--max-tokens", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_chat_reports_gateway_errors(sim_gateway: str) -> None:
    done = run_cli("chat", "hi", "--server", sim_gateway, "--model", "nope")
    assert done.returncode == 1
    assert "does not exist" in done.stderr
    unreachable = run_cli("chat", "hi", "--server", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 1
    assert "cannot reach the gateway" in unreachable.stderr


def test_gateway_refuses_a_bad_config(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "models:\n  - name: m\n    instances: [{url: 'http://x', max_concurency: 1}]\n"
    )
    done = run_cli("gateway", "--config", str(config))
    assert done.returncode == 1
    assert "did you mean 'max_concurrency'" in done.stderr


@pytest.mark.slow
def test_up_serves_real_answers_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    port, engine_port = free_port(), free_port()
    config = tmp_path / "gpuplane.yaml"
    config.write_text(f"engine: {{base_port: {engine_port}, instances: 2}}\n")
    up = subprocess.Popen(
        [*GPUPLANE, "up", "--config", str(config), "--port", str(port),
         "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", up)
        answer = run_cli("chat", "What is 2 + 2?", "--server", f"http://127.0.0.1:{port}",
                         "--max-tokens", "20")  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip()
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert f"http://127.0.0.1:{port}/v1" in out
    assert "stopped" in out
    for p in (engine_port, engine_port + 1):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{p}/docs", timeout=1)
