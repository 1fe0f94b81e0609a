"""The HTTP API in-process (FastAPI's TestClient over the real service and SQLite)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from gpuplane.control.service.service import ControlService
from tests.control.svc_helpers import A100, job, wait_state

HELLO = {
    "name": "hello",
    "team": "research",
    "command": ["python", "-c", "print(42)"],
    "resources": {"gpu_mem_mib": 10240, "gpu_cores_pct": 25},
}


def test_openapi_lists_the_resources(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/clusters",
        "/clusters/{name}",
        "/nodes",
        "/jobs",
        "/jobs/{ref}",
        "/jobs/{ref}/cancel",
        "/jobs/{ref}/logs",
        "/teams",
        "/quotas",
        "/teams/{name}/quotas/{flavor}",
    ):
        assert path in paths
    assert client.get("/docs").status_code == 200
    assert client.get("/healthz").json() == {"status": "ok", "store": "sqlite"}


def test_submit_describe_list_and_cancel(client: TestClient) -> None:
    created = client.post("/jobs", json=job("sleeper", gpus=1))
    assert created.status_code == 201
    body = created.json()
    assert body["state"] == "running"
    assert body["cluster"] == "local"
    assert body["flavor"] == A100
    assert client.get(f"/jobs/{body['id']}").json()["devices"] == body["devices"]
    assert client.get("/jobs/sleeper").json()["id"] == body["id"]  # by name: the newest
    assert [j["id"] for j in client.get("/jobs", params={"team": "research"}).json()] == [
        body["id"]
    ]
    assert client.get("/jobs", params={"state": "pending"}).json() == []
    cancelled = client.post(f"/jobs/{body['id']}/cancel")
    assert cancelled.json()["state"] == "cancelled"
    again = client.post(f"/jobs/{body['id']}/cancel")
    assert again.status_code == 409
    assert "already ended" in again.json()["detail"]
    assert client.get("/jobs/nope").status_code == 404


def test_impossible_requests_get_422_with_reasons(client: TestClient) -> None:
    r = client.post("/jobs", json=job("big", gpu_mem_mib=200 * 1024))
    assert r.status_code == 422
    assert "can never run" in r.json()["detail"]
    assert r.json()["reasons"][0]["code"] == "ExceedsCapacity"
    r = client.post("/jobs", json={**job("x", gpus=1), "selector": {"gpu_models": ["B200"]}})
    assert r.status_code == 422
    assert "B200" in r.json()["detail"]
    r = client.post("/jobs", json={"name": "x", "team": "t"})
    assert r.status_code == 422
    assert "command" in r.json()["detail"]


def test_dry_run_changes_nothing(client: TestClient) -> None:
    r = client.post("/jobs", json=HELLO, params={"dry_run": "true"})
    assert r.status_code == 200
    body = r.json()
    assert body["fits"] is True
    assert body["cluster"] == "local"
    assert len(body["devices"]) == 1
    assert client.get("/jobs").json() == []


def test_clusters_nodes_and_usage(client: TestClient) -> None:
    client.post("/jobs", json=job("slice", gpu_mem_mib=20480, gpu_cores_pct=50))
    (cluster,) = client.get("/clusters").json()
    assert cluster["gpus"] == 2
    assert cluster["gpus_free"] == 1
    assert cluster["running_jobs"] == 1
    detail = client.get("/clusters/local").json()
    devices = detail["node_list"][0]["devices"]
    assert sorted(d["gpu_milli_free"] for d in devices) == [500, 1000]
    assert len(client.get("/nodes").json()) == 1
    assert client.get("/clusters/nowhere").status_code == 404


def test_quota_set_and_show(client: TestClient) -> None:
    r = client.put(
        f"/teams/research/quotas/{A100}",
        json={"gpus": 1, "borrowing_limit_gpus": 0.5, "lending_limit_gpus": 0.25},
    )
    assert r.status_code == 200
    assert r.json()["quotas"][0]["gpus"] == 1.0
    assert r.json()["quotas"][0]["lending_limit_gpus"] == 0.25
    client.put("/teams/research", json={"cohort": "ml", "weight": 2})
    client.post("/jobs", json=job("one", gpus=1))
    pending = client.post("/jobs", json=job("two", gpus=1)).json()
    assert pending["state"] == "pending"
    assert pending["reasons"][0]["code"] == "Quota"
    (team,) = client.get("/quotas").json()
    assert team["cohort"] == "ml"
    assert team["weight"] == 2.0
    assert team["used_gpus"] == 1.0
    assert team["quotas"][0]["borrowing_limit_gpus"] == 0.5
    bad = client.put(f"/teams/research/quotas/{A100}", json={"gpus": -1})
    assert bad.status_code == 422
    bad = client.put("/teams/research/quotas/H100", json={"gpus": 1})
    assert bad.status_code == 422
    assert "no GPU model 'H100'" in bad.json()["detail"]
    assert A100 in bad.json()["detail"]
    bad = client.put(f"/teams/Bad Team/quotas/{A100}", json={"gpus": 1})
    assert bad.status_code == 422
    assert "team name 'Bad Team' must be" in bad.json()["detail"]


def test_logs_of_a_finished_job(client: TestClient, service: ControlService) -> None:
    jid = client.post("/jobs", json=HELLO).json()["id"]
    wait_state(service, jid, "succeeded", timeout_s=120)
    assert client.get(f"/jobs/{jid}").json()["state"] == "succeeded"
    assert client.get(f"/jobs/{jid}/logs").text == "42\n"


def test_batch_submit_is_all_or_nothing(client: TestClient) -> None:
    ok = client.post("/jobs/batch", json=[job("a", gpus=1), job("b", gpu_mem_mib=1024)])
    assert ok.status_code == 201
    assert len(ok.json()["ids"]) == 2
    bad = client.post("/jobs/batch", json=[job("c", gpus=1), job("d", gpu_mem_mib=10**6)])
    assert bad.status_code == 422
    assert "job d can never run" in bad.json()["detail"]
    bad = client.post("/jobs/batch", json=[job("e", gpus=1), {"name": "f"}])
    assert bad.status_code == 422
    assert bad.json()["detail"].startswith("item 1: invalid job spec")
    assert sorted(j["name"] for j in client.get("/jobs").json()) == ["a", "b"]
    empty = client.post("/jobs/batch", json=[])  # was a 500 (an INSERT of no rows)
    assert (empty.status_code, empty.json()) == (201, {"ids": []})


def test_metrics_say_how_full_each_cluster_is_and_why_jobs_wait(client: TestClient) -> None:
    client.post("/jobs", json=job("all", gpus=2))
    client.post("/jobs", json=job("waits", gpus=1))
    text = client.get("/metrics").text
    assert 'gpuplane_control_jobs{state="running"} 1.0' in text
    assert 'gpuplane_control_jobs{state="pending"} 1.0' in text
    assert 'gpuplane_control_gpu_allocated_ratio{cluster="local"} 1.0' in text
    assert f'gpuplane_control_gpus_allocated{{cluster="local",gpu_model="{A100}"}} 2.0' in text
    assert (
        'gpuplane_control_pending_reasons_jobs{cluster="local",reason="InsufficientGpus"} 1.0'
        in text
    )
    assert "gpuplane_control_admitted_jobs_total 1.0" in text
    assert "gpuplane_control_admission_pass_seconds_count" in text
    # nothing completed yet: no work learned, limits taken at their word
    assert "gpuplane_control_completed_job_work_seconds 0.0" in text
    assert "gpuplane_control_time_limit_used_ratio 1.0" in text


def test_validation_errors_read_without_pydantics_prefix(client: TestClient) -> None:
    """A validator's ValueError reaches the user as its message, not as `Value error, ...`."""
    bad = client.post("/clusters", json={"name": "x", "adapter": "nope"})
    assert bad.status_code == 422
    (error,) = bad.json()["detail"]
    assert error["msg"].startswith("unknown cluster adapter 'nope'")
    assert "Value error" not in bad.text
