"""The CLI against a real `gpuplane control serve` subprocess: the minimal job end to end."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli.main import app
from tests.helpers.common import taken_port

MINIMAL = """\
name: hello
team: research
command: ["python", "-c", "print(42)"]
resources: {gpu_mem_mib: 10240, gpu_cores_pct: 25}
"""

runner = CliRunner()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`gpuplane control serve` on embedded defaults (run from an empty directory)."""
    workdir = tmp_path_factory.mktemp("serve")
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "gpuplane.cli.main", "control", "serve", "--port", str(port)]
    if os.geteuid() == 0:  # the one setting changed: jobs as nobody cannot reach this interpreter
        (workdir / "root.yaml").write_text("control: {allow_root_jobs: true}\n")
        cmd += ["--config", str(workdir / "root.yaml")]
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        # the admin token it wrote: what the CLI run from its directory reads by itself
        _tokens[url] = (workdir / ".gpuplane" / "admin.token").read_text()
        # a job must name a declared team
        code, out = cli(url, "quota", "set", "research", "--weight", "1")
        assert code == 0, out
        yield url
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        assert (workdir / ".gpuplane" / "control.db").exists()
        assert "declared 2 x A100-80GB" in out or "nvidia-smi found" in out, out


_tokens: dict[str, str] = {}


def cli(server: str, *args: str) -> tuple[int, str]:
    env = {"GPUPLANE_SERVER": server, "GPUPLANE_TOKEN": _tokens.get(server, "")}
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.output


@pytest.mark.slow
def test_minimal_job_end_to_end(server: str, tmp_path: Path) -> None:
    spec = tmp_path / "hello.yaml"
    spec.write_text(MINIMAL)
    code, out = cli(server, "job", "submit", str(spec), "-o", "json")
    assert code == 0, out
    job_id = json.loads(out)["id"]
    state = ""
    for _ in range(1200):
        code, out = cli(server, "job", "describe", job_id, "-o", "json")
        state = json.loads(out)["state"]
        if state in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    assert state == "succeeded"
    code, out = cli(server, "job", "logs", job_id)
    assert (code, out) == (0, "42\n")
    code, out = cli(server, "job", "list")
    assert code == 0
    assert job_id in out
    assert "succeeded" in out
    code, out = cli(server, "job", "describe", job_id, "-o", "yaml")
    assert yaml.safe_load(out)["exit_code"] == 0


@pytest.mark.slow
def test_impossible_request_exits_non_zero_with_the_reason(server: str, tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text(MINIMAL.replace("gpu_mem_mib: 10240", "gpu_mem_mib: 204800"))
    code, out = cli(server, "job", "submit", str(spec))
    assert code == 1
    assert "HTTP 422" in out
    assert "204800 MiB" in out
    assert "ExceedsCapacity" in out
    unknown = tmp_path / "h100.yaml"
    unknown.write_text(MINIMAL + "selector: {gpu_models: [H100]}\n")
    code, out = cli(server, "job", "submit", str(unknown), "--dry-run")
    assert code == 1
    assert "H100" in out


@pytest.mark.slow
def test_dry_run_cluster_and_quota_commands(server: str, tmp_path: Path) -> None:
    spec = tmp_path / "hello.yaml"
    spec.write_text(MINIMAL)
    code, out = cli(server, "job", "submit", str(spec), "--dry-run")
    assert code == 0
    assert "would run on local/" in out
    code, out = cli(server, "cluster", "list", "-o", "json")
    (cluster,) = json.loads(out)
    assert cluster["name"] == "local"
    assert cluster["gpus"] >= 1
    code, out = cli(server, "cluster", "describe", "local")
    assert code == 0
    assert "MEM FREE" in out
    code, out = cli(
        server,
        "quota",
        "set",
        "vision",
        "--gpu-model",
        "A100-80GB",
        "--gpus",
        "1.5",
        "--cohort",
        "ml",
        "--lending-limit-gpus",
        "1",
    )
    assert code == 0, out
    code, out = cli(server, "quota", "show", "vision", "-o", "json")
    team = json.loads(out)
    assert team["cohort"] == "ml"
    assert team["quotas"][0]["lending_limit_gpus"] == 1.0
    assert team["quotas"][0]["gpus"] == 1.5
    code, out = cli(server, "quota", "show")
    assert code == 0
    assert "vision" in out
    code, out = cli(server, "job", "cancel", "no-such-job")
    assert code == 1
    assert "no job 'no-such-job'" in out


def test_an_unreachable_server_says_how_to_fix_it() -> None:
    code, out = cli(f"http://127.0.0.1:{free_port()}", "job", "list")
    assert code == 1
    assert "cannot reach the control plane" in out
    assert "GPUPLANE_SERVER" in out


def test_a_missing_spec_file_is_an_error(tmp_path: Path) -> None:
    code, out = cli("http://127.0.0.1:9", "job", "submit", str(tmp_path / "none.yaml"))
    assert code == 1
    assert "does not exist" in out


def test_serve_refuses_a_bad_config_with_the_nearest_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("control:\n  clusterz: []\n")
    result = runner.invoke(app, ["control", "serve", "--config", str(bad)])
    assert result.exit_code == 1
    assert "did you mean 'clusters'" in result.output


def test_serve_on_a_taken_port_names_the_setting_before_it_opens_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with taken_port() as port:
        result = runner.invoke(app, ["control", "serve", "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert f"could not listen on 127.0.0.1:{port}" in result.output
    assert "choose another (control.port, --port)" in result.output
    assert not (tmp_path / ".gpuplane" / "control.db").exists()  # refused before it opened


def test_the_example_config_and_job_are_valid() -> None:
    from gpuplane.config import load_settings
    from gpuplane.control.spec import parse_spec

    root = Path(__file__).resolve().parents[2] / "examples" / "control"
    control = load_settings(root / "gpuplane.yaml").control
    assert [c.name for c in control.clusters] == ["lab-eu", "lab-us"]
    assert parse_spec(yaml.safe_load((root / "hello.yaml").read_text())).name == "hello"


@pytest.mark.slow
def test_cancel_a_running_job_and_follow_logs(server: str, tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.yaml"
    sleeper.write_text(
        "name: sleeper\nteam: research\ncommand: [sleep, '60']\nresources: {gpus: 1}\n"
    )
    code, out = cli(server, "job", "submit", str(sleeper), "-o", "json")
    assert code == 0, out
    job_id = json.loads(out)["id"]
    code, out = cli(server, "job", "cancel", job_id)
    assert (code, out.strip()) == (0, f"job {job_id} cancelled")
    chatty = tmp_path / "chatty.yaml"
    chatty.write_text(
        "name: chatty\nteam: research\nresources: {gpu_mem_mib: 1024}\n"
        "command: [python, -c, 'import time; print(1, flush=True); time.sleep(1); print(2)']\n"
    )
    code, out = cli(server, "job", "submit", str(chatty), "-o", "json")
    job_id = json.loads(out)["id"]
    code, out = cli(server, "job", "logs", job_id, "--follow")
    assert (code, out) == (0, "1\n2\n")
    code, out = cli(server, "job", "describe", job_id, "-o", "json")
    assert json.loads(out)["state"] == "succeeded"


@pytest.mark.slow
def test_describe_shows_the_time_limit_and_why_a_job_was_stopped(
    server: str, tmp_path: Path
) -> None:
    spec = tmp_path / "late.yaml"
    spec.write_text(
        "name: late\nteam: research\nresources: {gpu_mem_mib: 1024}\n"
        "command: [sleep, '30']\ntime_limit: 1s\n"
    )
    code, out = cli(server, "job", "submit", str(spec), "-o", "json")
    assert code == 0, out
    job_id = json.loads(out)["id"]
    job: dict[str, object] = {}
    for _ in range(1200):
        code, out = cli(server, "job", "describe", job_id, "-o", "json")
        job = json.loads(out)
        if job["state"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    assert job["state"] == "failed"
    assert job["time_limit_s"] == 1.0
    code, out = cli(server, "job", "describe", job_id)
    assert code == 0
    assert "time limit  1s (on a card of speed 1.0)" in out
    assert "exceeded its time limit" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "time_limit: soon\n")
    code, out = cli(server, "job", "submit", str(bad))
    assert code == 1
    assert "time_limit: must be a positive duration" in out


def test_serve_prints_a_one_time_console_login_link(tmp_path: Path) -> None:
    """`control serve` prints, as Jupyter does, a URL that logs a browser in once."""
    port = free_port()
    cmd = [sys.executable, "-m", "gpuplane.cli.main", "control", "serve", "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: list(map(lines.put, proc.stdout or ())))
    reader.start()
    try:
        line = ""
        while not line.startswith("web console"):  # bounded: a server that never says it
            line = lines.get(timeout=120)  # fails here instead of hanging
        link = line.split(": ", 1)[1].strip()
        assert link.startswith(f"http://127.0.0.1:{port}/ui/login?code="), lines
        first = httpx.get(link)
        assert first.status_code == 303
        assert first.headers["location"] == "/ui"
        assert "gpuplane_console=" in first.headers["set-cookie"]
        assert httpx.get(link).status_code == 401  # used: void
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=30)
