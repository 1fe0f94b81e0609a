"""Deployments in the control plane: apply refuses what can never be served, each instance is a
job of the scheduler (same reasons when it cannot be placed), scale and delete drain, and a
crashed instance is replaced after a back-off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.models import Job
from gpuplane.control.service import ControlService
from tests.control.svc_helpers import api_client, config

SPEC: dict[str, Any] = {
    "name": "chat",
    "model": "sim",
    "engine": "sim",
    "team": "research",
    "slice": {"gpus": 1},
}


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[ControlService, TestClient]]:
    """A service that places jobs but does not start them (`bind_on_submit` off, no ticks):
    instances stay admitted or pending, and no engine runs."""
    service = ControlService(config(str(tmp_path)), bind_on_submit=False)
    service.start()
    with api_client(service) as c:
        yield service, c
    service.close()


def test_apply_refuses_what_can_never_be_served(client: TestClient) -> None:
    cases = [
        ({**SPEC, "team": "nobody"}, 404, "unknown team 'nobody'"),
        ({**SPEC, "slice": {"gpus": 4}}, 422, "can never run here"),
        ({**SPEC, "placement": {"cluster": "locl"}}, 422, "did you mean 'local'"),
        ({**SPEC, "replcas": 2}, 422, "did you mean 'replicas'"),
        ({**SPEC, "scaling": {"min": 0, "max": 3}}, 422, "scale to zero) is not implemented"),
    ]
    for spec, status, message in cases:
        response = client.post("/deployments", json=spec)
        assert response.status_code == status, spec
        assert message in response.json()["detail"]
    assert client.get("/deployments").json() == []


def test_a_dry_run_places_one_instance_and_changes_nothing(client: TestClient) -> None:
    out = client.post("/deployments", json=SPEC, params={"dry_run": "true"})
    assert out.status_code == 200
    body = out.json()
    assert body["action"] == "created"
    assert body["dry_run"]
    assert body["placement"]["fits"]
    assert body["placement"]["cluster"] == "local"
    assert client.get("/deployments").json() == []


def test_each_instance_is_a_job_and_waits_with_the_schedulers_reason(
    held: tuple[ControlService, TestClient],
) -> None:
    service, client = held
    # two cards: two instances of one card each are placed, the third waits
    assert client.post("/deployments", json={**SPEC, "replicas": 3}).status_code == 201
    described = client.get("/deployments/chat").json()
    states = sorted(i["state"] for i in described["instances"])
    assert states == ["admitted", "admitted", "pending"]
    pending = next(i for i in described["instances"] if i["state"] == "pending")
    assert "GPU" in pending["reason"] or "card" in pending["reason"], pending
    with service.store.session() as session:
        jobs = list(session.query(Job))
    assert {j.name for j in jobs} == {"chat-v1"}
    assert all(j.spec["command"][3:5] == ["engine", "sim"] for j in jobs)
    # nothing runs yet: the gateway is shown no instance
    assert client.get("/deployments/watch", params={"timeout_s": 0}).json()["models"] == [
        {"name": "chat", "engine": "sim", "upstream_model": "sim", "instances": []}
    ]


def test_scale_down_stops_instances_that_never_ran_at_once(
    held: tuple[ControlService, TestClient],
) -> None:
    _, client = held
    client.post("/deployments", json={**SPEC, "replicas": 3})
    scaled = client.post("/deployments/chat/scale", json={"replicas": 1}).json()
    assert scaled["replicas"] == 1
    live = [i for i in scaled["instances"] if i["state"] not in ("cancelled", "draining")]
    assert len(live) == 1
    assert any("draining" in e["message"] for e in scaled["events"])


def test_an_autoscaled_deployment_is_not_scaled_by_hand(
    held: tuple[ControlService, TestClient],
) -> None:
    _, client = held
    client.post("/deployments", json={**SPEC, "scaling": {"min": 1, "max": 2}})
    refused = client.post("/deployments/chat/scale", json={"replicas": 2})
    assert refused.status_code == 409
    assert "is autoscaled" in refused.json()["detail"]
    assert client.get("/deployments/chat").json()["replicas"] == 1


def test_delete_removes_the_deployment_once_its_instances_stopped(
    held: tuple[ControlService, TestClient],
) -> None:
    service, client = held
    client.post("/deployments", json={**SPEC, "replicas": 2})
    assert client.delete("/deployments/chat").json() == {"name": "chat", "deleting": True}
    again = client.post("/deployments", json=SPEC)
    assert again.status_code == 409
    assert "being deleted" in again.json()["detail"]
    service.deployments.reconcile()  # the stopped instances are forgotten, then the deployment
    assert client.get("/deployments").json() == []
    missing = client.get("/deployments/chat")
    assert missing.status_code == 404
    assert "unknown deployment 'chat'" in missing.json()["detail"]


@pytest.mark.slow
def test_a_crashed_instance_is_replaced_after_a_back_off(
    service: ControlService, client: TestClient
) -> None:
    # the engine refuses its arguments and exits at once: every start is a quick crash
    spec = {**SPEC, "engine_args": ["--no-such-flag"]}
    assert client.post("/deployments", json=spec).status_code == 201
    deadline = time.monotonic() + 120
    while True:
        service.tick()
        events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
        crashes = [m for m in events if "ended unasked" in m]
        if len(crashes) >= 2:
            break
        assert time.monotonic() < deadline, events
        time.sleep(0.1)
    assert "a replacement starts in 1 s" in crashes[0]
    assert "a replacement starts in 2 s" in crashes[1]  # the pause doubles
    started = [m for m in events if m.startswith("started ")]
    assert len(started) >= 2
    client.delete("/deployments/chat")
    service.tick()
    service.tick()
