"""`job list` and `job describe` name the same reason a pending job waits: the cluster where it
came closest to fitting, not the first cluster asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ClusterConfig, DeclaredGpus, DeclaredNode
from tests.control.api_server import cli, serving
from tests.control.svc_helpers import A100, api_client, config, job, state


def node(name: str, model: str, mem_mib: int) -> DeclaredNode:
    return DeclaredNode(
        name=name, labels={"slot": name}, gpus=[DeclaredGpus(model=model, mem_mib=mem_mib, count=2)]
    )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControlService]:
    """Cluster `a`: one node of L4 cards; cluster `b`: two nodes of two A100s, one card of each
    taken, so two A100s are free but never two on one node. Admitted jobs are never bound (no
    process runs)."""
    clusters = [
        ClusterConfig(name="a", discover_gpus=False, nodes=[node("a1", "L4", 24576)]),
        ClusterConfig(
            name="b", discover_gpus=False, nodes=[node("b1", A100, 81920), node("b2", A100, 81920)]
        ),
    ]
    svc = ControlService(config(str(tmp_path), clusters=clusters), bind_on_submit=False)
    svc.start()
    for slot in ("b1", "b2"):
        taken = svc.submit(
            {**job(f"on-{slot}", gpus=1), "selector": {"match_labels": {"slot": slot}}}
        )
        assert state(svc, taken["id"]).state == "admitted"
    yield svc
    svc.close()


def pending_a100_pair(service: ControlService) -> str:
    out = service.submit({**job("pair", gpus=2), "selector": {"gpu_models": [A100]}})
    return str(out["id"])


def test_list_and_describe_show_the_closest_clusters_reason(service: ControlService) -> None:
    job_id = pending_a100_pair(service)
    with api_client(service) as client:
        described = client.get(f"/jobs/{job_id}").json()
        (listed,) = [j for j in client.get("/jobs").json() if j["id"] == job_id]
    assert described["state"] == "pending"
    assert [(r["cluster"], r["code"]) for r in described["reasons"]] == [
        ("a", "NoMatchingNode"),
        ("b", "Fragmented"),
    ]
    assert described["reason"]["cluster"] == "b"
    assert described["reason"]["code"] == "Fragmented"
    assert listed["reason"] == described["reason"]


def test_the_cli_list_and_describe_name_the_same_reason(service: ControlService) -> None:
    job_id = pending_a100_pair(service)
    with serving(service) as url:
        code, listed = cli(url, "job", "list")
        assert code == 0
        code, described = cli(url, "job", "describe", job_id)
        assert code == 0
    (row,) = [line for line in listed.splitlines() if line.startswith(job_id)]
    assert row.split()[-1] == "Fragmented"
    assert "NoMatchingNode" not in row
    assert "waiting  Fragmented on b:" in described
    assert "a: NoMatchingNode" in described  # the per-cluster list keeps every cluster


def test_a_cancelled_pending_job_gives_its_cancel_as_the_reason(service: ControlService) -> None:
    job_id = pending_a100_pair(service)
    service.cancel(job_id)
    with api_client(service) as client:
        described = client.get(f"/jobs/{job_id}").json()
    assert described["state"] == "cancelled"
    assert described["reason"] is None
    assert described["reasons"] == []
    assert described["message"] == "cancelled by a user"
    with serving(service) as url:
        code, listed = cli(url, "job", "list")
    assert code == 0
    (row,) = [line for line in listed.splitlines() if line.startswith(job_id)]
    assert row.endswith("cancelled by a user")
    assert "Fragmented" not in row
