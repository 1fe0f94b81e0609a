"""The serving commands as a user runs them: separate processes, real sockets, Ctrl-C."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.serve.test_crash_diagnosis import NO_ENGINE

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


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason=NO_ENGINE)
def test_up_runs_the_whole_plane_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    """`gpuplane up` in a fresh directory: a control plane, its default deployment of the
    embedded llama.cpp and the gateway; a chat answers through the gateway, the deployment is
    listed through the control API with the token whose file `up` printed (and by the CLI,
    which finds that token by itself), and Ctrl-C leaves no process behind."""
    port, control_port = free_port(), free_port()
    (tmp_path / "gpuplane.yaml").write_text(
        f"engine: {{instances: 1}}\ngateway: {{port: {port}}}\ncontrol: {{port: {control_port}}}\n"
    )
    up = subprocess.Popen(
        [*GPUPLANE, "up", "--config", "gpuplane.yaml"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert up.stdout is not None
        for line in up.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    gateway, control = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}"
    try:
        deadline = time.monotonic() + 300
        while not any("Ctrl-C stops everything." in line for line in lines):
            assert up.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        out = "".join(lines)
        assert f"{gateway}/v1" in out
        assert f"{control}/ui" in out
        token_file = Path(re.findall(r"admin token +(\S+)", out)[0])
        assert token_file == tmp_path / ".gpuplane" / "admin.token"

        answer = run_cli("chat", "Say hi.", "--server", gateway, "--max-tokens", "10")
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip()
        token = token_file.read_text().strip()
        listed = httpx.get(
            control + "/deployments", headers={"authorization": f"Bearer {token}"}, timeout=30
        )
        assert listed.status_code == 200, listed.text
        assert [(d["name"], d["engine"], d["running"]) for d in listed.json()] == [
            ("smollm2", "llamacpp", 1)
        ]
        assert httpx.get(control + "/deployments", timeout=30).status_code == 401
        by_cli = subprocess.run(
            [*GPUPLANE, "deploy", "list", "--server", control, "-o", "json"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert by_cli.returncode == 0, by_cli.stderr
        assert json.loads(by_cli.stdout)[0]["name"] == "smollm2"
        status = run_cli("gateway", "status", "--gateway", gateway, "-o", "json")
        assert status.returncode == 0, status.stderr
        assert [i["state"] for i in json.loads(status.stdout)["instances"]] == ["ready"]
        children = descendants(up.pid)
        assert children  # the engine and its wrapper
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(120)
        reader.join(30)
    assert up.returncode == 0, "".join(lines)
    assert "stopped: gateway, control plane and engines are down" in "".join(lines)
    assert not [p for p in children if alive(p)]


def test_sigterm_ends_a_stream_with_an_error_event_within_the_drain(tmp_path: Path) -> None:
    """A stream still running when the drain ends gets an OpenAI-shaped error event, then its
    end (not a cut connection the client could take for a whole answer); the gateway exits 0."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100_000, "stream": True}  # fmt: skip
    with gateway_over_sim(tmp_path) as (url, gw):
        events: list[str] = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 1:
                        gw.send_signal(signal.SIGTERM)
        assert gw.wait(30) == 0
    last = json.loads(events[-1])
    assert last["error"]["code"] == "gateway_shutdown"
    assert last["error"]["type"] == "service_unavailable"
    assert all("error" not in json.loads(e) for e in events[:-1] if e != "[DONE]")
