"""A control plane over a local cluster and a real local Ray cluster (`conftest.ray_address`):
a job's selector decides which cluster runs it, a job bound to Ray runs there and ends with its
exit code, and its logs come back through the service. Slow: it shares the session's Ray
cluster with the contract suite."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ClusterConfig, DeclaredGpus, DeclaredNode
from gpuplane.control.store import queries
from tests.control.svc_helpers import config, job, make_service, wait_state

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path: Path, ray_address: str) -> Iterator[ControlService]:
    local = ClusterConfig(
        name="local",
        discover_gpus=False,
        nodes=[DeclaredNode(name="n0", gpus=[DeclaredGpus(model="A100-80GB", count=2)])],
    )
    ray = ClusterConfig(name="ray", adapter="ray", address=ray_address, region="ray-lab")
    svc = make_service(config(str(tmp_path), clusters=[local, ray]))
    yield svc
    svc.close()  # stops what it still runs, on both clusters


def test_jobs_land_on_the_cluster_their_selector_names_and_run_there(
    service: ControlService,
) -> None:
    l4 = job(
        "on-ray",
        command=["sh", "-c", "echo ran on $GPUPLANE_JOB_NAME; exit 5"],
        gpu_mem_mib=8192,
        gpu_cores_pct=50,
    )
    l4["selector"] = {"gpu_models": ["L4"]}  # only the Ray worker has L4s
    on_ray = service.submit(l4)["id"]
    local = job("on-local", command=[sys.executable, "-c", "print('local')"], gpus=1)
    local["selector"] = {"region": "local"}
    on_local = service.submit(local)["id"]
    ended = wait_state(service, on_ray, "succeeded", "failed")
    assert (ended.cluster_name, ended.state, ended.exit_code) == ("ray", "failed", 5)
    assert b"".join(queries.job_logs(service, on_ray)) == b"ran on on-ray\n"
    assert queries.get_job(service, on_ray).node == "w1"
    done = wait_state(service, on_local, "succeeded", "failed")
    assert (done.cluster_name, done.state) == ("local", "succeeded")
    clusters = {c.name: c for c in queries.list_clusters(service)}
    assert clusters["ray"].gpus == 4
    assert clusters["ray"].labels["gpuplane.io/region"] == "ray-lab"
    assert service.adapters["ray"].workloads() == []  # released once its end was recorded
