"""The pool end to end over every kind of cluster: one control plane over a `local` cluster, two
Kubernetes clusters on different minor versions (the fake API server, `tests/control/k8s_fake`,
started twice: no API server can run here) and a real local Ray cluster (the session's, from
`conftest.py`). The Kubernetes and Ray clusters join at run time, as `gpuplane cluster add` does.

Jobs land where their selectors say; when one cluster is full, work spills to another that
matches; a job that fits nowhere waits with a reason from each cluster; when a cluster's API
stops answering (the fake answers 503 to everything and ends its watches), new placements avoid
it, its unbound job is re-placed elsewhere and its running job shows `unknown`; when it answers
again the job is reconciled, and nothing has run twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuplane.control.adapters import AdapterError
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ClusterConfig, DeclaredGpus, DeclaredNode
from gpuplane.control.store import queries
from tests.control.k8s_fake import FakeKubeApi
from tests.control.k8s_fake.clusters import fake_cluster
from tests.control.svc_helpers import A100, config, job, state

pytestmark = pytest.mark.slow

T = TypeVar("T")
K8S_A100 = "A100-SXM4-80GB"  # HAMi registers NVIDIA-A100-SXM4-80GB on the fakes' gpu-a
SLEEP = ["sleep", "60"]


def until(service: ControlService, probe: Callable[[], T | None], what: str) -> T:
    """Tick the service until `probe` answers (a minute at most, for a loaded machine)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        service.tick()
        got = probe()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def pool(
    tmp_path: Path, ray_address: str
) -> Iterator[tuple[ControlService, dict[str, FakeKubeApi]]]:
    fakes = {"kube-old": fake_cluster(26), "kube-new": fake_cluster(31)}
    onprem = ClusterConfig(
        name="local",
        discover_gpus=False,
        labels={"site": "onprem"},
        nodes=[DeclaredNode(name="box", gpus=[DeclaredGpus(model=A100, count=1)])],
    )
    service = ControlService(config(str(tmp_path / "svc"), clusters=[onprem]), bind_on_submit=False)
    try:
        service.start()
        for name, fake in fakes.items():
            service.add_cluster(
                ClusterConfig(
                    name=name,
                    adapter="kubernetes",
                    kubeconfig=fake.kubeconfig(tmp_path / f"{name}.kubeconfig"),
                    labels={"site": "eu"},
                    grace_period_s=1,
                    sync_interval_s=1.0,
                )
            )
        service.add_cluster(
            ClusterConfig(name="ray", adapter="ray", address=ray_address, labels={"site": "us"})
        )
        yield service, fakes
    finally:
        service.close()
        for fake in fakes.values():
            fake.stop()


def eu(name: str, model: str, gpus: int) -> dict[str, Any]:
    spec = job(name, command=SLEEP, gpus=gpus)
    spec["selector"] = {"match_labels": {"site": "eu"}, "gpu_models": [model]}
    return spec


def pods(fake: FakeKubeApi, job_id: str) -> int:
    return len(fake.state.select("pods", None, f"gpuplane.io/job-id={job_id}")[0])


def test_one_pool_over_local_two_kubernetes_versions_and_ray(
    pool: tuple[ControlService, dict[str, FakeKubeApi]], tmp_path: Path
) -> None:
    service, fakes = pool
    views = {c.name: c for c in queries.list_clusters(service)}
    assert views["kube-old"].version == "v1.26.3"
    assert views["kube-new"].version == "v1.31.3"
    assert views["ray"].version.startswith("Ray ")
    assert views["ray"].gpus == 4
    too_old = FakeKubeApi(minor=24).start()  # `cluster add` refuses it with the range
    try:
        kubeconfig = too_old.kubeconfig(tmp_path / "old.kubeconfig")
        with pytest.raises(AdapterError, match=r"supports 1\.25 to 1\.35"):
            service.add_cluster(
                ClusterConfig(name="too-old", adapter="kubernetes", kubeconfig=kubeconfig)
            )
    finally:
        too_old.stop()

    # selectors: an L4 in the us site is Ray's worker; one card of the onprem site is local's
    us = {"match_labels": {"site": "us"}, "gpu_models": ["L4"]}
    on_ray = service.submit({**job("on-ray", command=SLEEP, gpus=1), "selector": us})["id"]
    onprem = {"match_labels": {"site": "onprem"}}
    on_local = service.submit({**job("on-local", command=SLEEP, gpus=1), "selector": onprem})["id"]
    # two A100 nodes match in the eu site, one per Kubernetes cluster: the second spills over
    first, second = (service.submit(eu(n, K8S_A100, 2))["id"] for n in ("first", "second"))
    placed = {j: state(service, j).cluster_name for j in (on_ray, on_local, first, second)}
    assert placed[on_ray] == "ray"
    assert placed[on_local] == "local"
    assert {placed[first], placed[second]} == {"kube-old", "kube-new"}
    # a third fits nowhere now: it waits, with a reason from each cluster
    third = service.submit(eu("third", K8S_A100, 2))["id"]
    reasons = {r.cluster: r.code for r in queries.get_job(service, third).reasons}
    assert reasons == {
        "kube-new": "InsufficientGpus",
        "kube-old": "InsufficientGpus",
        "local": "NoMatchingNode",
        "ray": "NoMatchingNode",
    }
    on_new = first if placed[first] == "kube-new" else second
    until(service, lambda: state(service, on_ray).state == "running", "the binds")
    assert state(service, on_new).state == "running"
    # an L4 job is placed on kube-new (kube-old is cordoned meanwhile) and waits to be bound
    service.cordon("kube-old")
    unbound = service.submit(eu("unbound", "L4", 1))["id"]
    service.cordon("kube-old", cordoned=False)
    assert (state(service, unbound).state, state(service, unbound).cluster_name) == (
        "admitted",
        "kube-new",
    )

    # kube-new's API stops answering; the next tick comes after its watch fell silent
    fakes["kube-new"].unreachable = True
    fakes["kube-new"].end_watches()
    deadline = time.monotonic() + 60
    while service.adapters["kube-new"].reachable()[0]:
        assert time.monotonic() < deadline, "the adapter never noticed"
        time.sleep(0.05)
    until(
        service,
        lambda: queries.get_cluster(service, "kube-new").health == "unreachable",
        "kube-new to be marked unreachable",
    )
    until(
        service,
        lambda: state(service, unbound).state == "running",
        "the unbound job to be re-placed and bound",
    )
    moved = state(service, unbound)
    assert (moved.cluster_name, moved.attempts) == ("kube-old", 1)
    view = queries.get_job(service, on_new)
    assert view.state == "unknown"
    assert "cluster kube-new does not answer" in str(view.message)
    reasons = {r.cluster: r.code for r in queries.get_job(service, third).reasons}
    assert reasons["kube-new"] == "NoNodes"
    assert state(service, third).state == "pending"

    # it answers again: the job is reconciled, still running, once
    fakes["kube-new"].unreachable = False
    until(
        service,
        lambda: queries.get_cluster(service, "kube-new").health == "ok",
        "kube-new to answer again",
    )
    service.tick()
    assert queries.get_job(service, on_new).state == "running"
    assert pods(fakes["kube-new"], on_new) == 1
    assert pods(fakes["kube-new"], unbound) == 0
    assert pods(fakes["kube-old"], unbound) == 1
    for job_id in (on_ray, on_local, first, second, third, unbound):
        service.cancel(job_id)
