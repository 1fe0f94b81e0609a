"""`gpuplane gateway status` (a table or /admin/state's JSON), `gpuplane gateway [serve]` and
`gpuplane gateway key create`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gpuplane.cli.main import app
from gpuplane.config import parse_settings
from gpuplane.engines.sim import start_sim
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.server import serving
from gpuplane.serve.settings import key_digest
from tests.helpers.common import gateway_settings
from tests.helpers.serve import SEGV, one_of_each_state


async def status(*args: str) -> Result:
    """`gpuplane gateway status` against a real gateway on loopback (its prober running) over
    three simulated instances: 0 and 2 down, 2 crash-looping."""
    async with start_sim(3, 2, seed=1) as fleet:
        models = [{"name": "m", "engine": "sim", "instances": [{"url": u} for u in fleet.urls]}]
        settings = parse_settings(gateway_settings(models))
        gw = Gateway(settings)
        fleet.kill(0)
        fleet.kill(2)
        one_of_each_state(gw)
        async with serving(settings, gw) as base:
            cli = ["gateway", "status", "--gateway", base, *args]
            return await asyncio.to_thread(CliRunner().invoke, app, cli)


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_gateway_status_shows_a_table_of_instances_and_queues() -> None:
    result = await status()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == [
        "MODEL",
        "INSTANCE",
        "STATE",
        "IN",
        "FLIGHT",
        "CAPACITY",
        "PREFIX",
        "CACHE",
        "LAST",
        "ERROR",
    ]
    states = [line.split()[2] for line in lines[1:4]]
    assert states == ["unhealthy", "ready", "crash_looping"]
    # nothing answered yet: no cache bound learned, from times to first token by default
    assert all("unbounded (by latency)" in line for line in lines[1:4])
    assert SEGV in lines[3]
    assert lines[4].split() == ["MODEL", "QUEUED", "QUEUED", "BY", "TENANT", "STREAM", "USAGE"]
    assert lines[5].split() == ["m", "0", "-", "engine"]  # its engine sends usage in streams


@pytest.mark.anyio
@pytest.mark.usefixtures("leftovers")
async def test_gateway_status_json_is_admin_state() -> None:
    result = await status("-o", "json")
    assert result.exit_code == 0, result.output
    state: dict[str, Any] = json.loads(result.output)
    assert [i["state"] for i in state["instances"]] == ["unhealthy", "ready", "crash_looping"]
    assert state["models"][0]["queued"] == 0


def test_gateway_status_without_a_gateway_says_how_to_point_at_one() -> None:
    result = CliRunner().invoke(app, ["gateway", "status", "--gateway", "http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach the gateway at http://127.0.0.1:9" in result.output
    assert "--gateway" in result.output


def test_the_old_gateway_invocation_still_serves_and_options_go_after_a_command() -> None:
    runner = CliRunner()
    old = runner.invoke(app, ["gateway", "--config", "/nonexistent.yaml"])
    new = runner.invoke(app, ["gateway", "serve", "--config", "/nonexistent.yaml"])
    assert old.exit_code == new.exit_code == 1
    assert "/nonexistent.yaml does not exist" in old.output
    assert old.output == new.output
    misplaced = runner.invoke(app, ["gateway", "--config", "x.yaml", "status"])
    assert misplaced.exit_code == 1
    assert "go after the command" in misplaced.output


def test_key_create_prints_a_new_key_once_and_the_digest_to_paste() -> None:
    result = CliRunner().invoke(app, ["gateway", "key", "create", "team-a"])
    assert result.exit_code == 0, result.output
    key = result.stdout.splitlines()[0]
    assert key.startswith("gpk-")
    assert len(key) > 40
    assert f"key_sha256: [{key_digest(key)}]" in result.stderr
    assert "name: team-a" in result.stderr
    admin = CliRunner().invoke(app, ["gateway", "key", "create", "ops", "--admin"])
    assert "admin:\n    key_sha256: [" in admin.stderr
    assert admin.stdout.splitlines()[0] != key
