"""No `gpuplane` option takes a secret as a value on the command line (where every process on
the host reads it in /proc/PID/cmdline): a token or key comes from its environment variable or
from a file (`--token @FILE`), and a typed value is refused with those two ways."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpuplane.cli.main import app

SECRET = re.compile(r"^--([\w-]+-)?(token|key|secret|password)$")
NOT_SECRETS = {"--drop-at-token"}  # the simulator's fault injection: a token count


def _secret_options(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """(command path..., flag) of every option whose name says it takes a secret."""
    for param in getattr(command, "params", []):
        for flag in getattr(param, "opts", []):
            if SECRET.match(flag) and flag not in NOT_SECRETS:
                yield (*path, flag)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _secret_options(sub, (*path, name))


OPTIONS = list(_secret_options(typer.main.get_command(app)))


def _said(output: str) -> str:
    """The output as one line, without the error panel's frame."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


def test_the_cli_has_secret_options_to_check() -> None:
    flags = {option[-1] for option in OPTIONS}
    assert {"--token", "--admin-key", "--control-token", "--api-key"} <= flags
    assert len(OPTIONS) > 30


@pytest.mark.parametrize("option", OPTIONS, ids=" ".join)
def test_every_secret_option_refuses_a_value_on_the_command_line(option: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*option, "s3cret"])
    said = _said(result.output)
    assert result.exit_code == 2, said
    assert "readable by every process on this host" in said
    assert re.search(rf"pass it in \$GPUPLANE_\w+, or in a file: {option[-1]} @FILE", said), said


def test_a_secret_comes_from_a_file_named_after_an_at_or_from_the_environment(
    tmp_path: Path,
) -> None:
    from gpuplane.cli._secrets import secret_option

    probe = typer.Typer()

    @probe.command()
    def show(token: str | None = secret_option("--token", "PROBE_TOKEN", "a token")) -> None:
        typer.echo(f"token={token}")

    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    runner = CliRunner()
    assert runner.invoke(probe, ["--token", f"@{secret}"]).output == "token=s3cret\n"
    assert runner.invoke(probe, [], env={"PROBE_TOKEN": "from-env"}).output == "token=from-env\n"
    missing = runner.invoke(probe, ["--token", f"@{tmp_path / 'missing'}"])
    assert missing.exit_code == 2
    assert "cannot be read" in _said(missing.output)
    secret.write_text("")
    empty = runner.invoke(probe, ["--token", f"@{secret}"])
    assert empty.exit_code == 2
    assert "is empty" in _said(empty.output)


def test_gateway_serve_refuses_a_control_token_in_its_arguments() -> None:
    result = CliRunner().invoke(
        app, ["gateway", "serve", "--control", "http://127.0.0.1:9", "--control-token", "s3cret"]
    )
    assert result.exit_code == 2
    assert "--control-token @FILE" in _said(result.output)
