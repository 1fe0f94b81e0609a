"""The control-plane service over a Kubernetes cluster (the fake API server, see
`tests/control/k8s_fake`): the inventory it registers, a job placed on a HAMi card and run as a
Pod in its team's namespace, its exit code, and its log after the Pod is gone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ClusterConfig
from gpuplane.control.store import queries
from tests.control.k8s_fake import hami_card
from tests.control.k8s_fake.clusters import KubeCluster, kube_cluster
from tests.control.svc_helpers import config, job, make_service, wait_state


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[KubeCluster, ControlService]]:
    with kube_cluster("fake", tmp_path) as cluster:
        kube = ClusterConfig(
            name="kube",
            adapter="kubernetes",
            kubeconfig=cluster.kubeconfig,
            region="eu-west-4",
            grace_period_s=1,
            sync_interval_s=2.0,
        )
        service = make_service(config(str(tmp_path / "svc"), clusters=[kube]))
        try:
            yield cluster, service
        finally:
            service.close()


def test_a_job_runs_as_a_pod_on_the_card_it_was_placed_on(
    kube: tuple[KubeCluster, ControlService],
) -> None:
    cluster, service = kube
    assert cluster.fake is not None
    sources = queries.get_cluster(service, "kube").inventory
    assert "2 Ready node(s), 3 HAMi card(s)" in sources
    spec = job("hello", command=["sh", "-c", "echo from a pod; exit 4"], gpu_mem_mib=8192)
    job_id = service.submit(spec)["id"]
    row = wait_state(service, job_id, "failed", "succeeded")
    assert (row.state, row.exit_code) == ("failed", 4)
    # the Pod is deleted once its end is recorded: read it from the watch history
    (pod,) = [
        e.obj for e in cluster.fake.state.events if e.resource == "pods" and e.type == "ADDED"
    ]
    assert pod["metadata"]["namespace"] == "gpuplane-research"
    placed = pod["spec"]["nodeSelector"]["kubernetes.io/hostname"]
    uuid = pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"]
    assert (placed, uuid[:5]) in {("gpu-a", "GPU-a"), ("gpu-b", "GPU-b")}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] == "8192"
    assert cluster.fake.logs[pod["metadata"]["uid"]] == b"from a pod\n"
    assert cluster.fake.state.select("pods", None)[0] == []  # released: deleted ...
    adapter = service.binder.adapters["kube"]
    assert b"".join(adapter.logs(job_id)) == b"from a pod\n"  # ... its log kept
    assert b"".join(adapter.logs(job_id, since=5)) == b"a pod\n"


def test_a_node_the_watch_sees_join_is_in_the_store_before_the_next_full_sync(
    tmp_path: Path,
) -> None:
    """The service writes what the adapter's watch changed at its next tick (`changes()`,
    `sync_nodes`), not once a sync interval with the whole inventory."""
    with kube_cluster("fake", tmp_path) as cluster:
        assert cluster.fake is not None
        kube = ClusterConfig(
            name="kube", adapter="kubernetes", kubeconfig=cluster.kubeconfig, sync_interval_s=3600
        )
        service = make_service(config(str(tmp_path / "svc"), clusters=[kube]))
        try:
            service.tick()  # the first changes() after the full sync at start
            cluster.fake.add_node("gpu-c", cards=[hami_card("GPU-c0", index=0)])
            deadline = time.monotonic() + 30
            while "gpu-c" not in {n.name for n in queries.list_nodes(service)}:
                assert time.monotonic() < deadline, "the new node never reached the store"
                service.tick()
                time.sleep(0.05)
            (node,) = [n for n in queries.list_nodes(service) if n.name == "gpu-c"]
            assert [d.uuid for d in node.devices] == ["GPU-c0"]
            cluster.fake.remove_node("gpu-c")
            while "gpu-c" in {n.name for n in queries.list_nodes(service)}:
                assert time.monotonic() < deadline, "the removed node stayed in the store"
                service.tick()
                time.sleep(0.05)
        finally:
            service.close()
