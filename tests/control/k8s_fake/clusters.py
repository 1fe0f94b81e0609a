"""A Kubernetes cluster under test, for any suite that runs over adapters (the contract suite
plugs in `kube_cluster`): the fake API server with two HAMi nodes whose kubelet runs Pods'
commands here, or a real cluster with HAMi when GPUPLANE_TEST_KUBECONFIG names its kubeconfig
(GPUPLANE_TEST_KUBE_IMAGE: an image with `sh`, default busybox).

    with kube_cluster("fake", tmp_path) as cluster:
        adapter = cluster.adapter()          # KubernetesAdapter of service_id SERVICE_ID
        again = cluster.adapter()            # the same service_id after a restart
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuplane.control.adapters import create_adapter
from gpuplane.control.adapters.kubernetes import KubernetesAdapter
from gpuplane.control.settings import ClusterConfig, ControlConfig
from tests.control.k8s_fake import FakeKubeApi, hami_card

REAL_ENV = "GPUPLANE_TEST_KUBECONFIG"
SERVICE_ID = "test-host:8080"


@dataclass
class KubeCluster:
    """One cluster under test: a fake one (with its handle) or a real one (`fake` None)."""

    kubeconfig: str
    fake: FakeKubeApi | None
    tmp: Path
    made: list[KubernetesAdapter] = field(default_factory=list)

    def adapter(self, service_id: str = SERVICE_ID, **settings: Any) -> KubernetesAdapter:
        """A new adapter on this cluster (closed with the cluster): short grace period and
        sync interval, so tests do not wait."""
        settings.setdefault("grace_period_s", 1)
        settings.setdefault("sync_interval_s", 2.0)
        if self.fake is None:
            settings.setdefault("image", os.environ.get("GPUPLANE_TEST_KUBE_IMAGE", "busybox"))
        cluster = ClusterConfig(
            name="kube", adapter="kubernetes", kubeconfig=self.kubeconfig, **settings
        )
        control = ControlConfig(state_dir=str(self.tmp), service_id=service_id)
        adapter = create_adapter(cluster, control)
        assert isinstance(adapter, KubernetesAdapter)
        self.made.append(adapter)
        return adapter

    def close(self) -> None:
        """Stop what every adapter still runs, then the fake; idempotent."""
        for adapter in self.made:
            adapter.close()
        self.made.clear()
        if self.fake is not None:
            self.fake.stop()
            assert self.fake.kubelet.procs == {}, "a Pod's process outlived the test"


def fake_cluster(minor: int = 29, **options: Any) -> FakeKubeApi:
    """A started fake: node gpu-a (two A100s, region eu-west-4, HAMi's JSON registration) and
    gpu-b (two L4s, one unhealthy, the older registration form); `options`: FakeKubeApi's
    (e.g. `kserve=True`)."""
    fake = FakeKubeApi(minor=minor, run_commands=True, bookmark_interval_s=0.2, **options).start()
    fake.add_node(
        "gpu-a",
        labels={"topology.kubernetes.io/region": "eu-west-4"},
        cards=[hami_card("GPU-a0", index=0), hami_card("GPU-a1", index=1)],
    )
    fake.add_node(
        "gpu-b",
        cards=[
            hami_card("GPU-b0", index=0, model="NVIDIA-L4", mem_mib=23034, count=1),
            hami_card("GPU-b1", index=1, model="NVIDIA-L4", mem_mib=23034, health=False),
        ],
        legacy_register=True,
    )
    return fake


@contextmanager
def kube_cluster(kind: str, tmp: Path, minor: int = 29, **options: Any) -> Iterator[KubeCluster]:
    """`kind` "fake" or "real" (skipped, with the reason, unless GPUPLANE_TEST_KUBECONFIG);
    `options`: the fake's."""
    if kind == "real":
        real = os.environ.get(REAL_ENV)
        if not real:
            pytest.skip(f"{REAL_ENV} is not set: no real cluster to run against")
        cluster = KubeCluster(real, None, tmp)
    else:
        fake = fake_cluster(minor, **options)
        cluster = KubeCluster(fake.kubeconfig(tmp / "kubeconfig"), fake, tmp)
    try:
        yield cluster
    finally:
        cluster.close()
