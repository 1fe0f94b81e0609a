"""`POST /jobs/{ref}/move`: re-placing a job on a named node keeps its id; what cannot be moved
is refused saying why and what to do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import Event
from gpuplane.resources import LABEL_NODE
from tests.control.svc_helpers import api_client, config, job, make_service, state, wait_state


def _node(svc: ControlService, job_id: str) -> str:
    _, ids = svc.estate()
    return {v: k for k, v in ids.nodes.items()}[state(svc, job_id).node_id or 0]


def _moved_events(svc: ControlService, job_id: str) -> int:
    with svc.store.session() as session:
        return session.query(Event).filter(Event.job_id == job_id, Event.kind == "moved").count()


def test_an_unknown_node_is_refused_with_the_nearest_name(
    service: ControlService, client: TestClient
) -> None:
    job_id = client.post("/jobs", json=job("a", gpus=1)).json()["id"]
    r = client.post(f"/jobs/{job_id}/move", json={"cluster": "local", "node": "n9"})
    assert r.status_code == 404
    assert "'n9'" in r.json()["detail"]
    assert "n0" in r.json()["detail"]
    r = client.post(f"/jobs/{job_id}/move", json={"cluster": "lokal", "node": "n0"})
    assert r.status_code == 404
    assert "did you mean 'local'" in r.json()["detail"]
    assert state(service, job_id).attempts == 0


def test_a_job_that_ended_cannot_be_moved(service: ControlService, client: TestClient) -> None:
    job_id = client.post("/jobs", json=job("a", command=["true"], gpus=1)).json()["id"]
    wait_state(service, job_id, "succeeded")
    r = client.post(f"/jobs/{job_id}/move", json={"cluster": "local", "node": "n0"})
    assert r.status_code == 409
    assert "only a pending, admitted or running job can be moved" in r.json()["detail"]


def test_a_job_already_on_the_node_is_left_alone(
    service: ControlService, client: TestClient
) -> None:
    job_id = client.post("/jobs", json=job("a", gpus=1)).json()["id"]
    wait_state(service, job_id, "running")
    r = client.post(f"/jobs/{job_id}/move", json={"cluster": "local", "node": "n0"})
    assert r.status_code == 200
    assert (r.json()["state"], r.json()["attempts"]) == ("running", 0)
    assert _moved_events(service, job_id) == 0


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[ControlService, TestClient]]:
    svc = make_service(config(str(tmp_path), nodes=2, gpus=1))
    with api_client(svc) as c:
        yield svc, c
    svc.close()


def test_a_pending_job_moved_waits_for_its_target_node(
    two_nodes: tuple[ControlService, TestClient],
) -> None:
    svc, client = two_nodes
    held = [client.post("/jobs", json=job(f"h{i}", gpus=1)).json()["id"] for i in range(2)]
    for h in held:
        wait_state(svc, h, "running")
    waiting = client.post("/jobs", json=job("w", gpus=1)).json()["id"]
    r = client.post(
        f"/jobs/{waiting}/move", json={"cluster": "local", "node": "n1", "reason": "by test"}
    )
    assert r.status_code == 200
    body = r.json()
    assert (body["id"], body["state"], body["attempts"]) == (waiting, "pending", 0)
    assert body["selector"]["match_labels"] == {LABEL_NODE: "n1"}
    on_n0 = next(h for h in held if _node(svc, h) == "local/n0")
    client.post(f"/jobs/{on_n0}/cancel")  # n0 frees up: the pinned job still waits for n1
    svc.tick()
    assert state(svc, waiting).state == "pending"
    on_n1 = next(h for h in held if h != on_n0)
    client.post(f"/jobs/{on_n1}/cancel")
    wait_state(svc, waiting, "running")
    assert _node(svc, waiting) == "local/n1"
