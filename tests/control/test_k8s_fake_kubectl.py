"""The fake API server is faithful enough for the real `kubectl` (Debian's kubernetes-client):
it discovers the server, lists nodes and Pods (paged, as kubectl asks), reads a Pod's log and
follows it. What the adapter bound is what kubectl shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplane.control.adapters import Workload, WorkloadState, create_adapter
from gpuplane.control.adapters.kubernetes import KubernetesAdapter
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.settings import ClusterConfig, ControlConfig
from tests.control.k8s_fake import FakeKubeApi, hami_card
from tests.helpers.control import ended, wait_for

KUBECTL = shutil.which("kubectl")


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[tuple[FakeKubeApi, list[str]]]:
    if KUBECTL is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("kubectl is missing (apt-get install kubernetes-client)")
        pytest.skip("kubectl is not installed (Debian: kubernetes-client)")
    with FakeKubeApi(minor=30, run_commands=True) as api:
        api.add_node("gpu-a", cards=[hami_card("GPU-a0", index=0)])
        config = api.kubeconfig(tmp_path / "kubeconfig")
        yield api, [KUBECTL, "--kubeconfig", config, "--request-timeout", "20s"]


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_sees_the_node_and_the_pod_the_adapter_bound_and_reads_its_log(
    kubectl: tuple[FakeKubeApi, list[str]], tmp_path: Path
) -> None:
    api, base = kubectl
    cluster = ClusterConfig(
        name="kube", adapter="kubernetes", kubeconfig=base[2], sync_interval_s=2.0
    )
    adapter = create_adapter(cluster, ControlConfig(state_dir=str(tmp_path), service_id="h:1"))
    assert isinstance(adapter, KubernetesAdapter)
    try:
        adapter.inventory()
        adapter.bind(
            Workload(
                job_id="hello",
                name="hello",
                command=("sh", "-c", "echo one; echo two"),
                node="gpu-a",
                devices=(DeviceGrant(0, 4096, 100),),
                fractional=True,
                team="ml",
            )
        )
        assert ended(adapter, "hello").state == WorkloadState.SUCCEEDED
        listed = json.loads(run([*base, "get", "nodes,pods", "--all-namespaces", "-o", "json"]))
        found = {(i["kind"], i["metadata"]["name"]): i for i in listed["items"]}
        assert set(found) == {("Node", "gpu-a"), ("Pod", "gp-hello")}
        pod = found[("Pod", "gp-hello")]
        assert pod["metadata"]["labels"]["gpuplane.io/job-id"] == "hello"
        assert pod["status"]["phase"] == "Succeeded"
        node = found[("Node", "gpu-a")]
        assert "hami.io/node-nvidia-register" in node["metadata"]["annotations"]
        assert run([*base, "logs", "-n", "gpuplane-ml", "gp-hello"]) == "one\ntwo\n"
        assert run([*base, "logs", "-n", "gpuplane-ml", "gp-hello", "--tail", "1"]) == "two\n"
        assert run([*base, "logs", "-f", "-n", "gpuplane-ml", "gp-hello"]) == "one\ntwo\n"
        selected = run([*base, "get", "pods", "-A", "-l", "gpuplane.io/job-id=nope", "-o", "json"])
        assert json.loads(selected)["items"] == []
    finally:
        adapter.close()
    wait_for(lambda: api.state.select("pods", None)[0] == [] or None, "the Pod to go")


def test_kubectl_gets_a_missing_pod_as_not_found(kubectl: tuple[FakeKubeApi, list[str]]) -> None:
    _, base = kubectl
    done = subprocess.run(
        [*base, "get", "pod", "-n", "default", "absent"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert 'pods "absent" not found' in done.stderr
