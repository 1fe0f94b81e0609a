"""The commands the CLI prints work as printed from the user's shell, whether or not the venv's
`bin/` is on PATH (`cli/_invocation.py`, the banner of `gpuplane up`); `gpuplane --version`."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane import __version__
from gpuplane.cli import serve
from gpuplane.cli._invocation import invocation, invocation_of
from gpuplane.cli.main import app
from gpuplane.config import Settings
from gpuplane.plane import Plane

SCRIPTS = Path(sysconfig.get_path("scripts"))  # the venv's bin/ the tests run from
SCRIPT = SCRIPTS / "gpuplane"
needs_script = pytest.mark.skipif(not SCRIPT.is_file(), reason="gpuplane is not installed")


def test_version_flag_and_command() -> None:
    for args in (["--version"], ["version"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert result.output.strip() == __version__


def test_the_bare_name_only_when_path_finds_this_script(tmp_path: Path) -> None:
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "gpuplane").write_text("#!/bin/sh\n")
    (venv / "activate").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    (other / "gpuplane").write_text("#!/bin/sh\n")
    script = venv / "gpuplane"
    assert invocation_of(script, script, tmp_path).command == "gpuplane"
    assert invocation_of(script, script, tmp_path).hint is None
    inside = invocation_of(script, None, tmp_path)
    assert inside.command == ".venv/bin/gpuplane"
    assert inside.hint == "`source .venv/bin/activate` puts `gpuplane` on your PATH"
    elsewhere = invocation_of(script, other / "gpuplane", other)  # PATH finds another gpuplane
    assert elsewhere.command == str(script)
    assert elsewhere.hint == f"`source {venv}/activate` puts `gpuplane` on your PATH"
    assert invocation_of(script, None, venv).command == "./gpuplane"
    (venv / "activate").unlink()
    no_activate = invocation_of(script, None, tmp_path)
    assert no_activate.hint == f"add {venv} to your PATH to type `gpuplane`"
    assert invocation_of(None, None, tmp_path).command.endswith(" -m gpuplane.cli.main")


def _banner(capsys: pytest.CaptureFixture[str]) -> str:
    plane = Plane(
        gateway_url=serve.DEFAULT_GATEWAY,
        control_url="http://127.0.0.1:8080",
        token_file=Path(".gpuplane/admin.token"),
        model="smollm2",
        replicas=1,
    )
    serve._print_usage(plane, Settings())
    return capsys.readouterr().err


def _printed_commands(banner: str) -> list[str]:
    """The banner's `gpuplane ...` lines (the curl line aside)."""
    lines = banner.split("try:\n", 1)[1].splitlines()
    return [line.strip() for line in lines if re.match(r"\s+\S*gpuplane\S* ", line)]


@needs_script
@pytest.mark.parametrize("on_path", [True, False], ids=["venv on PATH", "venv not on PATH"])
def test_the_banner_prints_commands_that_run_as_printed(
    on_path: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = os.pathsep.join([str(SCRIPTS)] * on_path + ["/usr/bin", "/bin"])
    monkeypatch.setenv("PATH", path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "up"])
    banner = _banner(capsys)
    commands = _printed_commands(banner)
    assert [shlex.split(c)[1:3] for c in commands] == [
        ["chat", "What is a GPU?"],
        ["deploy", "list"],
        ["gateway", "status"],
    ]
    if on_path:
        assert all(c.startswith("gpuplane ") for c in commands)
        assert "activate" not in banner
    else:
        assert all(c.startswith(f"{SCRIPT} ") for c in commands)
        assert f"source {SCRIPTS}/activate" in banner
    # the command runs from this shell as printed (`chat --help`: no gateway needed)
    argv = [*shlex.split(commands[0])[:2], "--help"]
    env = {**os.environ, "PATH": path}
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "what to ask" in done.stdout


@needs_script
def test_a_relative_venv_script_is_printed_relative(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run` runs `.venv/bin/gpuplane up` in the checkout, without the venv on PATH."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(SCRIPTS.parent.parent)
    monkeypatch.setattr(sys, "argv", [f"{SCRIPTS.parent.name}/bin/gpuplane", "up"])
    assert invocation().command == f"{SCRIPTS.parent.name}/bin/gpuplane"
    banner = _banner(capsys)
    assert f"  {SCRIPTS.parent.name}/bin/gpuplane chat " in banner
    assert f"`source {SCRIPTS.parent.name}/bin/activate`" in banner
