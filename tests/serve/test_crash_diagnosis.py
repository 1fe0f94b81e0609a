"""What an engine's exit means to the user: `gpuplane engine smoke`, and the diagnoses
`gpuplane up` and `gpuplane chat` print (the classifier is tests/engines/test_diagnose.py's)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.cli.main import app
from tests.helpers.common import free_port
from tests.helpers.serve import NO_ENGINE

GPUPLANE = [sys.executable, "-m", "gpuplane.cli.main"]
SEGFAULT = (
    "import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
    "print('loading model'); os.kill(os.getpid(), signal.SIGSEGV)"
)


# -- gpuplane engine smoke ------------------------------------------------------------------


def test_smoke_exits_1_with_the_rebuild_hint_when_the_child_segfaults(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    done = CliRunner().invoke(
        app, ["engine", "smoke", "--model-path", str(model), "--child-code", SEGFAULT]
    )
    assert done.exit_code == 1
    assert "the engine's smoke inference was killed by SIGSEGV" in done.stderr
    assert "rebuild it portably with `make engine-rebuild`" in done.stderr


def test_smoke_quotes_the_child_output_when_it_exits_with_an_error(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    code = "import sys; print('gguf_init: bad magic', file=sys.stderr); sys.exit(3)"
    done = CliRunner().invoke(
        app, ["engine", "smoke", "--model-path", str(model), "--child-code", code]
    )
    assert done.exit_code == 1
    assert "exited with code 3: its log ends with: gguf_init: bad magic" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason=NO_ENGINE)
def test_smoke_generates_a_token_with_the_real_engine() -> None:
    done = subprocess.run(
        [*GPUPLANE, "engine", "smoke"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "smoke inference ok: SmolLM2-135M-Instruct.Q4_1.gguf generated" in done.stdout


# -- gpuplane up and gpuplane chat ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason=NO_ENGINE)
def test_up_prints_why_an_engine_failed_to_start(tmp_path: Path) -> None:
    model = tmp_path / "not-a-model.gguf"
    model.write_bytes(b"this is no GGUF file")
    config = tmp_path / "gpuplane.yaml"
    config.write_text(f"engine: {{instances: 1, model_path: '{model}'}}\n")
    done = subprocess.run(
        [*GPUPLANE, "up", "--config", str(config), "--port", str(free_port()),
         "--control-port", "0"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "1000"},
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert "exited with code 1 while starting: its log ends with:" in done.stderr
    assert str(tmp_path / ".gpuplane" / "clusters" / "local" / "logs") in done.stderr


class _CrashLoopingGateway(BaseHTTPRequestHandler):
    """Answers every request as the gateway does when every instance crash-loops."""

    MESSAGE = (
        "model 'smollm2' cannot be served: llamacpp-8101 is crash-looping: ... its log ends "
        "with: [/INST] [bold]load_tensors[/bold]"
    )

    def do_POST(self) -> None:
        body = json.dumps({"error": {"message": self.MESSAGE, "type": "no_healthy_instance"}})
        self.send_response(503)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def crash_looping_gateway() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _CrashLoopingGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_chat_prints_the_gateways_diagnosis_as_it_is(crash_looping_gateway: str) -> None:
    done = CliRunner().invoke(
        app, ["chat", "hi", "--server", crash_looping_gateway], env={"COLUMNS": "1000"}
    )
    assert done.exit_code == 1
    assert f"gateway answered 503: {_CrashLoopingGateway.MESSAGE}" in done.stderr
