"""The self-healing drills end to end (`drills.run_drill`, what `gpuplane drill` runs): a control
plane serving its API and ticking, a gateway that watches it, simulated engines started as jobs
of the local adapter, streaming load through the gateway, and one fault. Each test asserts that
every recovery step happened and what the clients saw, and prints how long each step took (the
figures, not thresholds: this machine is shared and loaded).

A lost node or cluster is the local adapter's drill fault (`LocalAdapter.lose`): nothing here
can unplug this machine; everything else is real."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuplane.cli.main import app
from gpuplane.control.client import TOKEN_ENV
from gpuplane.control.lab.drills import DrillResult, run_drill
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import (
    ClusterConfig,
    ControlConfig,
    QuotaConfig,
    TeamConfig,
)
from gpuplane.control.store.models import Job
from gpuplane.serve.gateway import Gateway
from gpuplane.serve.server import serving
from gpuplane.serve.settings import ServeSettings
from tests.control.api_server import serving_with_loop
from tests.control.svc_helpers import A100, admin_token, config, local_cluster, make_service
from tests.helpers.e2e import wait_for, watching

pytestmark = [pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(600)]

SPEC: dict[str, Any] = {
    "name": "chat",
    "model": "sim",
    "engine": "sim",
    "replicas": 2,
    "team": "research",
    "slice": {"gpus": 1},
    "drain_timeout_s": 5,
    "engine_args": ["--itl-ms", "50"],  # 20 tokens stream for 1 s: streams are in flight
}


def _cluster(name: str) -> ClusterConfig:
    return local_cluster(name, gpus=2, sync_interval_s=1)


def _serve(cfg: ControlConfig, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    service = make_service(cfg)
    monkeypatch.setenv(TOKEN_ENV, admin_token(service))
    try:
        with serving_with_loop(service) as url:
            yield service, url
    finally:
        service.close()


@pytest.fixture
def one_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ControlService, str]]:
    yield from _serve(config(str(tmp_path / "state")), monkeypatch)


@pytest.fixture
def two_clusters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ControlService, str]]:
    """Clusters east and west of two cards each; the team's quota is two cards: the lost
    instances' quota must be freed for their replacements to be admitted."""
    team = TeamConfig(name="research", quotas=[QuotaConfig(flavor=A100, gpus=2)])
    clusters = [_cluster("east"), _cluster("west")]
    yield from _serve(config(str(tmp_path / "state"), clusters=clusters, teams=[team]), monkeypatch)


def _report(result: DrillResult) -> None:
    print(json.dumps(result.to_json(), indent=1))  # the figures, in the test's output


def _running(service: ControlService) -> dict[str, str | None]:
    with service.store.session() as session:
        return {j.id: j.cluster_name for j in session.query(Job).filter(Job.state == "running")}


def _deployed(service: ControlService, url: str) -> tuple[Gateway, ServeSettings]:
    service.deployments.apply(SPEC)
    return watching(url)


async def test_crash_drill_the_killed_engine_leaves_rotation_and_is_replaced(
    one_cluster: tuple[ControlService, str],
) -> None:
    service, url = one_cluster
    gateway, settings = _deployed(service, url)
    async with serving(settings, gateway) as gw_url:
        await wait_for(
            "two ready instances",
            lambda: "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count == 2,
        )
        result = await run_drill(
            "crash", "chat", control=url, gateway=gw_url, clients=4, max_tokens=20, settle_s=1.0
        )
        _report(result)
        assert result.recovered, result
        assert result.out_of_rotation_s is not None
        assert result.replaced_s is not None
        assert result.requests > 0
        # requests keep succeeding: the ones that had not begun ran again on the other
        # instance; only streams cut mid-answer by the kill end with an error event
        assert result.failed == 0, result.errors
        assert result.cut <= 4  # at most the streams in flight on the victim
        running = _running(service)
        assert result.instance not in running
        assert len(running) == 2
        # the replacement serves: both ready instances in the gateway are running jobs
        ready = {i.id for i in gateway.routers["chat"].instances if i.healthy}
        assert ready == set(running)


async def test_cluster_then_node_drill_move_the_instances_and_back(
    two_clusters: tuple[ControlService, str],
) -> None:
    service, url = two_clusters
    gateway, settings = _deployed(service, url)
    async with serving(settings, gateway) as gw_url:
        await wait_for(
            "two ready instances",
            lambda: "chat" in gateway.routers and gateway.routers["chat"].slots.healthy_count == 2,
        )
        before = _running(service)
        # spread: one instance on each cluster, so losing one leaves the other serving
        assert sorted(before.values()) == ["east", "west"]  # type: ignore[type-var]
        # the CLI, as an operator runs it: the cluster of the oldest instance is lost for 5 s
        cli = await _cli("cluster", url, gw_url)
        assert cli["recovered"], cli
        lost = cli["cluster"]
        after = _running(service)
        survivor = next(i for i, c in before.items() if c != lost)
        assert set(before) & set(after) == {survivor}  # the lost instance was replaced...
        assert set(after.values()) == {before[survivor]}  # ...on the surviving cluster
        assert cli["switched_s"] is not None
        assert cli["replaced_s"] is not None
        # no request failed: the survivor took them while the replacement started; only
        # streams cut mid-answer on the lost engine end with an error event
        assert cli["failed"] == 0, cli["errors"]
        assert cli["cut"] <= 4
        ready = {i.id for i in gateway.routers["chat"].instances if i.healthy}
        assert ready == set(after)
        # once the lost cluster answers again, lose the survivor's node, which now holds both
        # instances: the gateway holds requests while they move back, and none fails
        await wait_for("the lost cluster back", lambda: lost not in service.clusters.down)
        result = await run_drill(
            "node",
            "chat",
            control=url,
            gateway=gw_url,
            clients=4,
            max_tokens=20,
            lost_for_s=5.0,
            settle_s=1.0,
        )
        _report(result)
        assert result.recovered, result
        assert result.cluster != lost
        assert result.replaced_after_detection_s is not None
        assert set(_running(service).values()) == {lost}
        assert result.failed == 0, result.errors
        assert result.cut <= 4


async def _cli(fault: str, url: str, gw_url: str) -> dict[str, Any]:
    """`gpuplane drill FAULT chat -o json`, in a thread (it runs its own event loop)."""
    args = ["drill", fault, "chat", "--server", url, "--gateway", gw_url, "--max-tokens", "20"]
    args += ["--lost-for-s", "5", "-o", "json"]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    print(json.dumps(out, indent=1))
    return out
