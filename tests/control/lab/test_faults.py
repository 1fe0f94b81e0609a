"""Drill faults on a deployment (`lab/faults.py`) and what the control plane does about
them: a crashed engine is replaced after its back-off; an instance whose cluster stops answering
is lost, its quota freed, and its replacement placed on the other cluster at once; once the lost
cluster answers again, what was left there is stopped and nothing runs twice.

Two local clusters of one card each stand for two machines; a lost one is the local adapter's
drill fault (`LocalAdapter.lose`), since nothing here can unplug this machine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.lab import faults
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import (
    ClusterConfig,
    QuotaConfig,
    TeamConfig,
)
from gpuplane.control.store.models import Job
from tests.control.svc_helpers import A100, api_client, config, local_cluster, make_service

SPEC: dict[str, Any] = {
    "name": "chat",
    "model": "sim",
    "engine": "sim",
    "team": "research",
    "replicas": 1,
    "slice": {"gpus": 1},
}


def _cluster(name: str) -> ClusterConfig:
    return local_cluster(name, gpus=1, sync_interval_s=1)


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[ControlService, TestClient]]:
    """Clusters east and west, one card each; the team's quota is one card, so a replacement
    fits only once the lost instance's quota is freed."""
    team = TeamConfig(name="research", quotas=[QuotaConfig(flavor=A100, gpus=1)])
    cfg = config(str(tmp_path), clusters=[_cluster("east"), _cluster("west")], teams=[team])
    service = make_service(cfg)
    with api_client(service) as client:
        yield service, client
        client.delete("/deployments/chat")
        until(service, "the deployment deleted", lambda: not client.get("/deployments").json())
    service.close()


def until(service: ControlService, what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + 120
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} within 120 s"
        service.tick()
        time.sleep(0.05)
    return found


def jobs(service: ControlService) -> dict[str, tuple[str, str | None, str | None]]:
    with service.store.session() as session:
        return {j.id: (j.state, j.cluster_name, j.message) for j in session.query(Job)}


def running(service: ControlService) -> list[str]:
    return [i for i, (state, _, _) in jobs(service).items() if state == "running"]


def test_a_fault_names_its_victim_and_refuses_what_it_cannot_do(
    two: tuple[ControlService, TestClient],
) -> None:
    service, client = two
    none = client.post("/deployments/chat/faults", json={"fault": "crash"})
    assert none.status_code == 404
    assert "unknown deployment 'chat'" in none.json()["detail"]
    assert client.post("/deployments", json=SPEC).status_code == 201
    (victim,) = until(service, "a running instance", lambda: running(service))
    typo = client.post("/deployments/chat/faults", json={"fault": "crsh"})
    assert typo.status_code == 422
    assert "unknown fault 'crsh' (did you mean 'crash'?)" in typo.json()["detail"]
    wrong = client.post("/deployments/chat/faults", json={"fault": "crash", "instance": "x"})
    assert wrong.status_code == 404
    assert f"valid: {victim}" in wrong.json()["detail"]
    dry = client.post("/deployments/chat/faults?dry_run=true", json={"fault": "cluster"})
    assert dry.status_code == 200
    body = dry.json()
    assert (body["instance"], body["killed"], body["dry_run"]) == (victim, [], True)
    assert body["cluster"] in ("east", "west")
    assert body["node"] == f"{body['cluster']}-n0"
    assert running(service) == [victim]  # a dry run changes nothing


@pytest.mark.slow
def test_a_crashed_engine_is_replaced_after_its_back_off(
    two: tuple[ControlService, TestClient],
) -> None:
    service, client = two
    assert client.post("/deployments", json=SPEC).status_code == 201
    (victim,) = until(service, "a running instance", lambda: running(service))
    hit = faults.inject(service, "chat", "crash")
    assert (hit.instance, hit.killed) == (victim, [victim])
    (replacement,) = until(
        service, "a replacement running", lambda: [j for j in running(service) if j != victim]
    )
    state, _, message = jobs(service)[victim]
    assert state == "failed"
    assert "was killed" in str(message)
    events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
    assert any(f"instance {victim} (v1) ended unasked" in m for m in events), events
    assert any(m.startswith(f"started {replacement}") for m in events)


@pytest.mark.slow
def test_a_lost_cluster_s_instance_is_replaced_on_the_other_within_quota(
    two: tuple[ControlService, TestClient],
) -> None:
    service, client = two
    assert client.post("/deployments", json=SPEC).status_code == 201
    (victim,) = until(service, "a running instance", lambda: running(service))
    lost = jobs(service)[victim][1]
    other = {"east": "west", "west": "east"}[str(lost)]
    hit = faults.inject(service, "chat", "cluster", lost_for_s=3.0)
    assert (hit.cluster, hit.killed) == (lost, [victim])
    (replacement,) = until(
        service, "a replacement running", lambda: [j for j in running(service) if j != victim]
    )
    assert jobs(service)[replacement][1] == other
    state, _, message = jobs(service)[victim]
    assert state == "failed"
    assert f"lost: cluster {lost} stopped answering (lost by a drill" in str(message)
    events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
    assert any(f"instance {victim} (v1) lost: cluster {lost}" in m for m in events), events
    assert not any("ended unasked" in m for m in events)  # lost is not a crash: no back-off
    # the lost cluster answers again: the deployment keeps its one instance, on `other`
    until(service, f"cluster {lost} back", lambda: lost not in service.clusters.down)
    for _ in range(5):
        service.tick()
    assert running(service) == [replacement]
    assert service.adapters[str(lost)].workloads() == []  # what was left there is stopped
