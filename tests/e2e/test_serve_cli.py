"""The serving commands as a user runs them: separate processes, real sockets, Ctrl-C."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from gpuplane.control.statedir import exclusive
from gpuplane.control.store.models import Deployment, Job
from gpuplane.control.store.store import Store
from tests.helpers.common import alive, free_port, taken_port
from tests.helpers.e2e import GPUPLANE, gateway_over_sim
from tests.helpers.serve import NO_ENGINE


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


BANNER_END = "Ctrl-C stops everything."
needs_engine = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason=NO_ENGINE)


class Up:
    """`gpuplane up` started in `workdir` (its own ports, one instance), as a user runs it with
    its output piped; `lines` collects stdout and stderr together as they come."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir = workdir
        port, control_port = free_port(), free_port()
        self.gateway = f"http://127.0.0.1:{port}"
        self.control = f"http://127.0.0.1:{control_port}"
        (workdir / "gpuplane.yaml").write_text(
            f"engine: {{instances: 1}}\ngateway: {{port: {port}}}\n"
            f"control: {{port: {control_port}}}\n"
        )
        self.proc = subprocess.Popen(
            [*GPUPLANE, "up", "--config", "gpuplane.yaml", *args],
            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "COLUMNS": "1000"},
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_serving(self) -> None:
        """Until it printed its summary (it serves); fails if it exits first."""
        deadline = time.monotonic() + 300
        while not any(BANNER_END in line for line in self.lines):
            assert self.proc.poll() is None, self.out
            assert time.monotonic() < deadline, self.out
            time.sleep(0.2)

    def stop(self) -> int:
        """Ctrl-C, as a user stops it; its exit code."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
            self.reader.join(30)
        return self.proc.returncode


@pytest.mark.slow
@needs_engine
def test_up_runs_the_whole_plane_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    """`gpuplane up` in a fresh directory: a control plane, its default deployment of the
    embedded llama.cpp and the gateway; a chat answers through the gateway, the deployment is
    listed through the control API with the token whose file `up` printed (and by the CLI,
    which finds that token by itself), and Ctrl-C leaves no process behind."""
    up = Up(tmp_path)
    gateway, control = up.gateway, up.control
    try:
        up.wait_serving()
        out = up.out
        assert f"{gateway}/v1" in out
        assert f"{control}/ui" in out
        (link,) = re.findall(r"web console +(\S+)", out)  # one-time: logs a browser in once
        assert link.startswith(f"{control}/ui/login?code=")
        assert httpx.get(link).status_code == 303
        assert httpx.get(link).status_code == 401
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
        children = descendants(up.proc.pid)
        assert children  # the engine and its wrapper
    finally:
        code = up.stop()
    assert code == 0, up.out
    assert "stopped: gateway, control plane and engines are down" in up.out
    assert not [p for p in children if alive(p)]


def stored(workdir: Path) -> tuple[dict[str, str], list[str]]:
    """The state of each job (by name) and the deployments in `up`'s store in `workdir`."""
    store = Store.open(f"sqlite:///{workdir}/.gpuplane/control.db")
    try:
        with store.session() as session:
            jobs = {job.name: job.state for job in session.scalars(select(Job))}
            return jobs, list(session.scalars(select(Deployment.name)))
    finally:
        store.close()


@pytest.mark.slow
@needs_engine
def test_a_second_up_in_the_same_dir_is_refused_and_a_clean_stop_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A second `up` in the same directory is refused before it touches anything, naming the
    first; the first keeps serving. It starts quietly (no log line before its summary) and
    Ctrl-C is a clean stop: its engines' jobs end cancelled, not failed, its default deployment
    is gone (the next control plane in the dir has none to start again) and so is its lock."""
    first = Up(tmp_path)
    try:
        first.wait_serving()
        before = first.out.split("gpuplane is serving")[0].splitlines()
        assert [line for line in before if line.strip()] == [
            line for line in before if line.startswith(("note: ", "starting "))
        ], first.out
        second = subprocess.run(
            [*GPUPLANE, "up", "--config", "gpuplane.yaml"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        said = " ".join(second.stderr.split())
        assert f"pid {first.proc.pid}:" in said, said
        assert "main.py up --config gpuplane.yaml)" in said, said
        assert "in use by another gpuplane process" in said, said
        assert stored(tmp_path) == ({"smollm2-v1": "running"}, ["smollm2"])  # untouched
        answer = run_cli("chat", "Say hi.", "--server", first.gateway, "--max-tokens", "5")
        assert answer.returncode == 0, answer.stderr  # its engine still answers
    finally:
        code = first.stop()
    assert code == 0, first.out
    assert stored(tmp_path) == ({"smollm2-v1": "cancelled"}, [])
    with exclusive(str(tmp_path / ".gpuplane")):
        pass  # free again


@needs_engine
def test_up_on_a_taken_gateway_port_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gpuplane.cli.main import app

    monkeypatch.chdir(tmp_path)
    with taken_port() as port:
        result = CliRunner().invoke(app, ["up", "--port", str(port), "--control-port", "0"])
    assert result.exit_code == 1, result.output
    assert "choose another (gateway.port, --port)" in " ".join(result.output.split())
    assert not (tmp_path / ".gpuplane" / "control.db").exists()  # no control plane, no engine


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
