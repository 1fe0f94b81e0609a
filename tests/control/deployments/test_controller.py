"""Deployments in the control plane: apply refuses what can never be served, each instance is a
job of the scheduler (same reasons when it cannot be placed), scale and delete drain, and a
crashed instance is replaced after a back-off."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuplane.control.deployments.instances import read_capacity
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.deployments.watch import endpoints
from gpuplane.control.service.service import ControlService
from gpuplane.control.store.models import Job
from tests.control.svc_helpers import api_client, config, local_cluster, make_service

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
    ]
    for spec, status, message in cases:
        response = client.post("/deployments", json=spec)
        assert response.status_code == status, spec
        assert message in response.json()["detail"]
    assert client.get("/deployments").json() == []


def test_a_canary_that_cannot_be_honoured_is_refused_with_the_rule(client: TestClient) -> None:
    cases = [
        ([{"version": "v1", "weight": 10}], "versions must differ from each other and from"),
        (
            [{"version": "v2", "weight": 10}, {"version": "v2", "weight": 5}],
            "versions must differ",
        ),
        (
            [{"version": "v2", "weight": 60}, {"version": "v3", "weight": 50}],
            "the weights add up to 110 %; they must add up to at most 100 (version v1 takes "
            "the rest)",
        ),
        ([{"version": "v2", "weight": 101}], "canary.0.weight"),
        ([{"version": "v2", "weight": -1}], "canary.0.weight"),
        ([{"version": "V 2", "weight": 1}], "must be 1-20 lowercase letters"),
        ([{"version": "v2", "wieght": 1}], "did you mean 'weight'"),
    ]
    for canary, message in cases:
        response = client.post("/deployments", json={**SPEC, "canary": canary})
        assert response.status_code == 422, canary
        assert message in response.json()["detail"], response.json()
    scaled = {
        **SPEC,
        "scaling": {"min": 1, "max": 2},
        "canary": [{"version": "v2", "weight": 5, "replicas": 1}],
    }
    refused = client.post("/deployments", json=scaled)
    assert refused.status_code == 422
    assert "the autoscaler sizes every version by its weight" in refused.json()["detail"]
    assert client.get("/deployments").json() == []


def test_a_canary_runs_its_own_instances_then_is_promoted_or_rolled_back(
    held: tuple[ControlService, TestClient],
) -> None:
    service, client = held
    canary = [{"version": "v2", "weight": 10, "engine_args": ["--itl-ms", "5"]}]
    assert client.post("/deployments", json={**SPEC, "canary": canary}).status_code == 201
    status = client.get("/deployments/chat/rollout").json()
    assert [(v["version"], v["weight"], v["replicas"]) for v in status["versions"]] == [
        ("v1", 90.0, 1),
        ("v2", 10.0, 1),
    ]
    with service.store.session() as session:
        jobs = {j.name: j.spec["command"] for j in session.query(Job)}
    assert set(jobs) == {"chat-v1", "chat-v2"}
    assert jobs["chat-v2"][-2:] == ["--itl-ms", "5"]  # the canary's own engine arguments
    watch = client.get("/deployments/watch", params={"timeout_s": 0}).json()
    assert watch["models"][0]["weights"] == {"v1": 90.0, "v2": 10.0}
    rolled = client.post("/deployments/chat/rollback").json()
    assert [(v["version"], v["weight"], v["replicas"]) for v in rolled["versions"]] == [
        ("v1", 100.0, 1),
        ("v2", 0.0, 0),
    ]
    # the canary never ran: it stopped at once instead of draining
    assert rolled["versions"][1]["running"] == 0
    again = client.post("/deployments/chat/rollback")
    assert again.status_code == 409
    assert "has no canary to roll back" in again.json()["detail"]
    client.post("/deployments", json={**SPEC, "canary": canary})
    promoted = client.post("/deployments/chat/promote", json={}).json()
    assert promoted["version"] == "v2"
    assert promoted["versions"][0] == {
        "version": "v2",
        "weight": 100.0,
        "replicas": 1,
        "running": 0,
        "ready": None,
        "draining": 0,
    }
    spec = client.get("/deployments/chat").json()["spec"]
    assert spec["engine_args"] == ["--itl-ms", "5"]
    assert "canary" not in spec or spec["canary"] == []
    events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
    assert any(m.startswith("promoted (was v1 90 %, v2 10 %)") for m in events), events
    missing = client.post("/deployments/chat/promote", json={"version": "v9"})
    assert missing.status_code == 409
    assert "has no canary to promote" in missing.json()["detail"]


def test_without_surge_a_new_version_takes_the_old_ones_cards_in_place(
    held: tuple[ControlService, TestClient],
) -> None:
    service, client = held
    # two cards, two instances of one card each: no spare slice for v2 beside v1
    client.post("/deployments", json={**SPEC, "replicas": 2})

    def states() -> list[tuple[str, str]]:
        insts = client.get("/deployments/chat").json()["instances"]
        return sorted((i["version"], i["state"]) for i in insts)

    in_place = {**SPEC, "replicas": 2, "version": "v2", "surge": False}
    client.post("/deployments", json=in_place)
    assert states() == [("v1", "admitted"), ("v1", "draining")]  # it gives its card up
    service.deployments.reconcile()  # the stopped v1 is forgotten: its card takes a v2
    assert states() == [("v1", "admitted"), ("v2", "admitted")]
    service.deployments.reconcile()  # the last v1 waits until that v2 serves
    assert states() == [("v1", "admitted"), ("v2", "admitted")]


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
        {
            "name": "chat",
            "engine": "sim",
            "upstream_model": "sim",
            "weights": {},
            "hold": True,  # held while no instance is ready...
            "hold_s": None,  # ...for the gateway's queue timeout: not autoscaled
            "instances": [],
        }
    ]


# a job that takes both cards of cluster west
FILL_WEST: dict[str, Any] = {
    "name": "fill",
    "team": "research",
    "command": ["sleep", "600"],
    "resources": {"gpus": 2},
    "selector": {"cluster": "west"},
}


def _held_on(tmp_path: Path, clusters: list[str]) -> ControlService:
    """A service over local `clusters` of one two-card node each that places jobs but starts
    none (as `held`)."""
    declared = [local_cluster(name, gpus=2) for name in clusters]
    service = ControlService(config(str(tmp_path), clusters=declared), bind_on_submit=False)
    service.start()
    return service


def test_replicas_are_spread_over_clusters_and_still_placed_when_one_is_full(
    tmp_path: Path,
) -> None:
    service = _held_on(tmp_path / "spread", ["east", "west"])
    try:
        with api_client(service) as client:
            assert client.post("/deployments", json={**SPEC, "replicas": 2}).status_code == 201
            insts = client.get("/deployments/chat").json()["instances"]
            # a packing scheduler would put both on one cluster's two cards
            assert sorted(i["cluster"] for i in insts) == ["east", "west"]
            assert {i["state"] for i in insts} == {"admitted"}
    finally:
        service.close()
    service = _held_on(tmp_path / "full", ["east", "west"])
    try:
        with api_client(service) as client:
            assert client.post("/jobs", json=FILL_WEST).status_code == 201
            assert client.post("/deployments", json={**SPEC, "replicas": 2}).status_code == 201
            insts = client.get("/deployments/chat").json()["instances"]
            # the preference never keeps one pending: both go where there is room
            assert [(i["cluster"], i["state"]) for i in insts] == [("east", "admitted")] * 2
    finally:
        service.close()


@pytest.mark.slow
def test_instances_move_back_make_before_break_once_a_full_cluster_has_room(
    tmp_path: Path,
) -> None:
    """West is full, so both instances start on east. Once west has room again, one instance
    moves there: a third starts on west and one of east's drains only once it serves, so two
    run at every step, and it ends one per cluster, with the reason in the events."""
    clusters = [local_cluster("east", gpus=2), local_cluster("west", gpus=2)]
    service = make_service(config(str(tmp_path), clusters=clusters))
    try:
        with api_client(service) as client:
            fill_id = client.post("/jobs", json=FILL_WEST).json()["id"]
            assert client.post("/deployments", json={**SPEC, "replicas": 2}).status_code == 201

            def running() -> list[str]:
                insts = client.get("/deployments/chat").json()["instances"]
                return sorted(i["cluster"] for i in insts if i["state"] == "running")

            deadline = time.monotonic() + 120
            while running() != ["east", "east"]:
                service.tick()
                assert time.monotonic() < deadline, running()
                time.sleep(0.1)
            service.tick()
            assert running() == ["east", "east"]  # nowhere better to go yet
            client.post(f"/jobs/{fill_id}/cancel")
            seen: list[list[str]] = []
            while running() != ["east", "west"] or len(seen) < 3 or seen[-3] != seen[-1]:
                service.tick()
                seen.append(running())
                assert time.monotonic() < deadline + 120, seen
                time.sleep(0.1)
            assert all(len(r) >= 2 for r in seen), seen  # never fewer than the replicas
            assert ["east", "east", "west"] in seen  # made before the break
            events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
            assert any(
                "on cluster west" in m and "to restore the spread: cluster east holds 2 of 2" in m
                for m in events
            ), events
            client.delete("/deployments/chat")
            service.tick()
            service.tick()
    finally:
        service.close()


def test_a_job_whose_serve_names_no_valid_deployment_is_refused_at_submit(
    held: tuple[ControlService, TestClient],
) -> None:
    """`serve` marks a deployment instance; its version's spec is checked like an applied one,
    so an adapter never builds an InferenceService from a bad one."""
    _, client = held
    job = parse_deployment(SPEC).to_job("127.0.0.1", 9001)
    job["serve"] = {**job["serve"], "deployment": {**job["serve"]["deployment"], "engine": "simm"}}
    answer = client.post("/jobs", json=job)
    assert answer.status_code == 422, answer.text
    assert "invalid job spec: serve.deployment: engine:" in answer.json()["detail"]
    assert client.get("/jobs").json() == []


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


def test_delete_while_an_instance_moves_back_drains_it_with_the_rest(
    held: tuple[ControlService, TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment deleted while one of its instances is moving (`Spread`: placed to restore
    the spread, not serving yet) is deleted like any other: the move keeps no instance (the
    reconcile of it failed with KeyError on its version, every tick, before)."""
    service, client = held
    client.post("/deployments", json={**SPEC, "replicas": 2})
    moving = client.get("/deployments/chat").json()["instances"][-1]
    assert moving["state"] == "admitted"
    service.deployments.spread.started("chat", moving["id"])  # as a move would commit it
    client.delete("/deployments/chat")
    service.deployments.reconcile()  # the stopped instances are forgotten, then the deployment
    assert client.get("/deployments").json() == []
    assert not [r for r in caplog.records if "reconciling deployment" in r.getMessage()]


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


@pytest.mark.slow
def test_an_instance_without_max_concurrency_serves_the_slots_its_engine_reports(
    service: ControlService, client: TestClient
) -> None:
    # the engine's own limit (7) differs from the simulator's default (4), and it loads for
    # a second: the gateway must not see the instance before its slots are known
    spec = {**SPEC, "engine_args": ["--max-num-seqs", "7", "--start-delay-s", "1"]}
    assert client.post("/deployments", json=spec).status_code == 201
    listed = client.get("/deployments/watch", params={"timeout_s": 0}).json()["models"]
    assert listed[0]["instances"] == []  # running, but its slots are not known yet
    deadline = time.monotonic() + 120
    while not (instances := endpoints(service.store)["models"][0]["instances"]):
        assert time.monotonic() < deadline, client.get("/deployments/chat").json()["events"]
        service.tick()
        time.sleep(0.1)
    assert instances[0]["capacity"] == 7
    described = client.get("/deployments/chat").json()
    assert described["instances"][0]["capacity"] == 7
    events = [e["message"] for e in described["events"]]
    assert any("runs 7 slot(s): reported by its engine at /server_info" in m for m in events)
    client.delete("/deployments/chat")
    while client.get("/deployments").json():
        assert time.monotonic() < deadline
        service.tick()
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, {"total_slots": 3}, (3, "reported by its engine at /props")),  # llama-server
        (404, {"detail": "Not Found"}, (1, "the llamacpp default (its server reports none)")),
        (400, {}, (1, "the llamacpp default (/props answered 400 without them")),
        (503, {}, None),  # loading its model: ask again next tick
    ],
)
def test_read_capacity_asks_the_engine_over_http(
    status: int, body: dict[str, Any], expected: tuple[int, str] | None
) -> None:
    class Props(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(body).encode() if self.path == "/props" else b"{}"
            self.send_response(status if self.path == "/props" else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Props)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        found = read_capacity(f"http://127.0.0.1:{server.server_port}", "llamacpp")
    finally:
        server.shutdown()
        server.server_close()
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found[0] == expected[0]
        assert found[1].startswith(expected[1]), found
    assert read_capacity(f"http://127.0.0.1:{server.server_port}", "llamacpp") is None  # gone


def test_an_instance_stopped_with_the_last_control_plane_is_replaced_at_once(
    tmp_path: Path,
) -> None:
    """`up` and `control serve --stop-jobs` stop the instances when they shut down: the next
    start replaces them without a crash back-off."""
    first = make_service(config(str(tmp_path)))
    try:
        with api_client(first) as client:
            assert client.post("/deployments", json=SPEC).status_code == 201
        wait_until_running(first)
    finally:
        first.close(stop_jobs=True)
    again = make_service(config(str(tmp_path)))
    try:
        again.tick()  # the stopped instance is counted
        again.tick()  # its replacement starts
        with api_client(again) as client:
            events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
            assert "ended before this control plane started" in events[-2], events
            assert "a replacement starts now" in events[-2]
            assert events[-1].startswith("started "), events
            assert not [m for m in events if "ended unasked" in m]
            client.delete("/deployments/chat")
        again.tick()
        again.tick()
    finally:
        again.close()


def wait_until_running(service: ControlService) -> None:
    deadline = time.monotonic() + 120
    while True:
        service.tick()
        with service.store.session() as session:
            if [j.state for j in session.query(Job)] == ["running"]:
                return
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_an_autoscaled_rollout_shares_the_replicas_by_weight(
    held: tuple[ControlService, TestClient],
) -> None:
    _, client = held
    spec = {
        **SPEC,
        "slice": {"gpu_mem_mib": 1024},
        "scaling": {"min": 2, "max": 4},
        "canary": [{"version": "v2", "weight": 10}],
    }
    assert client.post("/deployments", json=spec).status_code == 201
    rollout = client.get("/deployments/chat/rollout").json()
    assert [(v["version"], v["weight"], v["replicas"]) for v in rollout["versions"]] == [
        ("v1", 90.0, 1),
        ("v2", 10.0, 1),
    ]
    instances = client.get("/deployments/chat").json()["instances"]
    assert sorted(i["version"] for i in instances) == ["v1", "v2"]
    rolled = client.post("/deployments/chat/rollback").json()
    assert [(v["version"], v["replicas"]) for v in rolled["versions"]] == [("v1", 2), ("v2", 0)]
