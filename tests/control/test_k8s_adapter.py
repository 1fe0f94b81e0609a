"""The kubernetes adapter against a fake API server (`tests/control/k8s_fake`: no Kubernetes API
server can run on this machine; the fake speaks the real wire format, and its kubelet runs each
Pod's command here as a process). The contract part also runs against a real cluster with HAMi
when GPUPLANE_TEST_KUBECONFIG names its kubeconfig (GPUPLANE_TEST_KUBE_IMAGE: an image with
`sh`; default busybox)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuplane.control.adapters import (
    AdapterError,
    DiscoveredNode,
    InventoryChange,
    Workload,
    WorkloadState,
    WorkloadStatus,
)
from gpuplane.control.adapters.kubernetes import KubernetesAdapter
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION, LABEL_VGPU
from tests.control.k8s_fake import FakeKubeApi, hami_card
from tests.control.k8s_fake.clusters import KubeCluster as Cluster
from tests.control.k8s_fake.clusters import kube_cluster
from tests.helpers.control import ended, wait_for

T = TypeVar("T")


@pytest.fixture(params=["fake", "real"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    with kube_cluster(request.param, tmp_path) as kube:
        yield kube


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[FakeKubeApi, Cluster]]:
    with kube_cluster("fake", tmp_path) as kube:
        assert kube.fake is not None
        yield kube.fake, kube


def gpu_node(adapter: KubernetesAdapter) -> tuple[str, int]:
    """A node with a card, and the card's index (the first the inventory lists)."""
    node = next(n for n in adapter.inventory().nodes if n.devices)
    return node.name, node.devices[0].index


def workload(
    adapter: KubernetesAdapter, job_id: str, script: str, *, fractional: bool = True
) -> Workload:
    node, index = gpu_node(adapter)
    grant = DeviceGrant(index, 8192, 250) if fractional else DeviceGrant(index, 81920, 1000)
    return Workload(
        job_id=job_id,
        name=job_id,
        command=("sh", "-c", script),
        node=node,
        devices=(grant,),
        fractional=fractional,
        cpu_millis=100,
        memory_mib=64,
        team="ml",
    )


def pods_of(fake: FakeKubeApi, job_id: str) -> list[dict[str, Any]]:
    items, _ = fake.state.select("pods", None, f"gpuplane.io/job-id={job_id}")
    return items


def uids_of(cluster: Cluster, job_id: str) -> list[str]:
    """The uids of the job's Pods (read through the adapter's own client on a real cluster)."""
    if cluster.fake is not None:
        return [p["metadata"]["uid"] for p in pods_of(cluster.fake, job_id)]
    adapter = cluster.made[0]
    api = adapter.kube.connect()
    pods = api.core.list_pod_for_all_namespaces(label_selector=f"gpuplane.io/job-id={job_id}")
    return sorted(p.metadata.uid for p in pods.items)


# -- the contract: the same on the fake and on a real cluster -----------------------------------


def test_a_bound_job_runs_and_reports_its_exit_code_and_output(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    w = workload(adapter, "exit-three", "echo hello from k8s; exit 3")
    adapter.bind(w)
    assert "exit-three" in adapter.workloads()
    status = ended(adapter, "exit-three")
    assert (status.state, status.exit_code) == (WorkloadState.FAILED, 3)
    assert "exited with code 3" in status.message
    out = wait_for(lambda: b"".join(adapter.logs("exit-three")), "its log")
    assert out == b"hello from k8s\n"
    assert b"".join(adapter.logs("exit-three", since=6)) == b"from k8s\n"


def test_a_job_that_succeeds_is_succeeded_and_release_forgets_it(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    adapter.bind(workload(adapter, "ok-job", "exit 0"))
    assert ended(adapter, "ok-job") == WorkloadStatus(WorkloadState.SUCCEEDED, 0)
    adapter.release("ok-job")
    adapter.release("ok-job")  # idempotent
    assert "ok-job" not in adapter.workloads()  # at once, whatever the watch shows yet
    wait_for(
        lambda: adapter.status(["ok-job"])["ok-job"].state == WorkloadState.LOST or None,
        "the Pod to go",
    )
    assert b"".join(adapter.logs("ok-job")) == b""  # it printed nothing: nothing kept


def test_a_second_bind_of_the_same_job_makes_no_second_pod(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    w = workload(adapter, "twice", "sleep 30")
    adapter.bind(w)
    uids = uids_of(cluster, "twice")
    adapter.bind(w)
    assert adapter.workloads().count("twice") == 1
    assert uids_of(cluster, "twice") == uids  # the same Pod, not a new one in its place
    adapter.release("twice")


def test_a_restarted_service_takes_its_running_jobs_back(cluster: Cluster) -> None:
    first = cluster.adapter()
    w = workload(first, "survivor", "sleep 30")
    first.bind(w)
    wait_for(lambda: "survivor" in first.workloads() or None, "the watch to see it")
    uids = uids_of(cluster, "survivor")
    again = cluster.adapter()  # the same instance, after a restart: no records of its own
    wait_for(lambda: "survivor" in again.workloads() or None, "the new adapter to see it")
    assert again.status(["survivor"])["survivor"].state == WorkloadState.RUNNING
    again.bind(w)  # taken back, not started twice
    other = cluster.adapter(service_id="someone-else:8080")
    assert "survivor" not in other.workloads()
    assert uids_of(cluster, "survivor") == uids  # still the one Pod: nothing ran twice
    again.release("survivor")
    wait_for(lambda: "survivor" not in again.workloads() or None, "the Pod to go")


def test_release_of_an_unknown_job_does_nothing(cluster: Cluster) -> None:
    adapter = cluster.adapter()
    adapter.release("never-bound")
    assert "never-bound" not in adapter.workloads()


# -- the fake only: what a test cannot make a real cluster do -----------------------------------


def test_inventory_has_the_nodes_healthy_hami_cards_in_gpuplanes_labels(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    api.add_node("cordoned", cards=[hami_card("GPU-c0", index=0)])
    api.state.update("nodes", "", "cordoned", lambda o: o["spec"].update(unschedulable=True))
    inv = cluster.adapter().inventory()
    nodes = {n.name: n for n in inv.nodes}
    assert sorted(nodes) == ["gpu-a", "gpu-b"]  # the cordoned node takes no placements
    a, b = nodes["gpu-a"], nodes["gpu-b"]
    assert [(d.index, d.uuid, d.mem_mib, d.model) for d in a.devices] == [
        (0, "GPU-a0", 81920, "A100-SXM4-80GB"),
        (1, "GPU-a1", 81920, "A100-SXM4-80GB"),
    ]
    assert a.labels[LABEL_REGION] == "eu-west-4"
    assert a.labels[LABEL_GPU_MODEL] == "A100-SXM4-80GB"
    assert a.labels[LABEL_VGPU] == "true"
    assert (a.cpu_millis, a.memory_mib) == (64_000, 512 * 1024)
    # the older annotation form; its unhealthy card is left out; count 1: not splittable
    assert [(d.index, d.uuid) for d in b.devices] == [(0, "GPU-b0")]
    assert b.labels[LABEL_GPU_MODEL] == "L4"
    assert b.labels[LABEL_VGPU] == "false"
    assert LABEL_REGION not in b.labels  # the cluster's region applies (sync_cluster)
    assert "Kubernetes v1.29.3" in inv.source
    assert "1 unhealthy left out" in inv.source


def test_the_watch_keeps_the_inventory_current(fake: tuple[FakeKubeApi, Cluster]) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    adapter.inventory()
    changed = threading.Event()
    adapter.on_change(changed.set)
    api.add_node("gpu-c", cards=[hami_card("GPU-c0", index=0)])
    assert changed.wait(10), "the watch did not say the inventory changed"
    api.set_cards(
        "gpu-a", [hami_card("GPU-a0", index=0, health=False), hami_card("GPU-a1", index=1)]
    )

    def current() -> dict[str, list[int]] | None:
        nodes = {n.name: [d.index for d in n.devices] for n in adapter.inventory().nodes}
        return nodes if nodes.get("gpu-c") == [0] and nodes["gpu-a"] == [1] else None

    wait_for(current, "the new node and the unhealthy card")
    api.remove_node("gpu-c")
    wait_for(
        lambda: all(n.name != "gpu-c" for n in adapter.inventory().nodes) or None,
        "the removed node to go",
    )


def test_the_watch_names_the_nodes_it_changed_and_asks_for_everything_after_a_relist(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    assert adapter.changes() is None  # the first sync writes everything
    assert adapter.changes() == InventoryChange()
    api.add_node("gpu-c", cards=[hami_card("GPU-c0", index=0)])
    api.state.update("nodes", "", "gpu-a", lambda o: o["spec"].update(unschedulable=True))
    nodes: dict[str, DiscoveredNode] = {}
    gone: set[str] = set()

    def both() -> bool | None:
        change = adapter.changes()
        assert change is not None
        nodes.update((n.name, n) for n in change.nodes)
        gone.update(change.gone)
        return ("gpu-c" in nodes and "gpu-a" in gone) or None

    wait_for(both, "the new node and the cordoned one")
    assert [d.uuid for d in nodes["gpu-c"].devices] == ["GPU-c0"]
    assert "gpu-b" not in {*nodes, *gone}  # untouched
    assert adapter.kube.nodes is not None
    api.unreachable = True  # the watch ends, and while it is down ...
    api.end_watches()
    wait_for(lambda: adapter.kube.nodes.error if adapter.kube.nodes else None, "the watch to fail")
    api.add_node("after-compaction", cards=[hami_card("GPU-x", index=0)])
    api.compact()  # ... the server compacts past it: 410 Gone, a relist
    api.unreachable = False
    wait_for(lambda: adapter.changes() is None or None, "a relist to ask for everything")
    assert adapter.kube.nodes.relists == 1


def test_a_watch_from_a_compacted_resource_version_lists_again(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    adapter.inventory()
    assert adapter.kube.nodes is not None
    api.unreachable = True  # the server restarts: the watch ends and cannot reopen ...
    api.end_watches()
    wait_for(lambda: adapter.kube.nodes.error if adapter.kube.nodes else None, "the watch to fail")
    api.add_node("after-compaction", cards=[hami_card("GPU-x", index=0)])
    api.compact()  # ... and compacts past the watch's resourceVersion: 410 Gone when it does
    api.unreachable = False
    wait_for(
        lambda: any(n.name == "after-compaction" for n in adapter.inventory().nodes) or None,
        "the relisted node",
    )
    assert adapter.kube.nodes.relists >= 1
    assert ("GET", "/api/v1/nodes") in api.requests[api.requests.index(("GET", "/version")) + 1 :]


def test_bookmarks_move_a_quiet_watch_on(fake: tuple[FakeKubeApi, Cluster]) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    adapter.inventory()
    nodes = adapter.kube.nodes
    assert nodes is not None
    before = int(nodes.resource_version or 0)
    api.create_namespace("unrelated")  # moves the server's resourceVersion, not a node
    wait_for(
        lambda: int(nodes.resource_version or 0) > before or None,
        "a bookmark",
    )


def test_an_unsupported_version_is_refused_with_the_supported_range(tmp_path: Path) -> None:
    for minor in (24, 36):
        with FakeKubeApi(minor=minor) as api:
            cluster = Cluster(api.kubeconfig(tmp_path / "kc"), api, tmp_path)
            with pytest.raises(AdapterError) as err:
                cluster.adapter().inventory()
            assert f"Kubernetes v1.{minor}.3" in str(err.value)
            assert "supports 1.25 to 1.35" in str(err.value)


def test_a_missing_kubeconfig_is_refused_saying_what_to_check(tmp_path: Path) -> None:
    cluster = Cluster(str(tmp_path / "nowhere"), None, tmp_path)
    with pytest.raises(AdapterError, match=r"cannot load the kubeconfig.*get-contexts"):
        cluster.adapter(image="x").inventory()


def test_the_pod_is_pinned_to_its_node_and_card_in_the_teams_namespace(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    w = workload(adapter, "pinned", "sleep 30")
    w = replace(w, devices=(DeviceGrant(1, 8192, 250),))
    adapter.bind(w)
    (pod,) = pods_of(api, "pinned")
    assert pod["metadata"]["namespace"] == "gpuplane-ml"  # created on first use
    assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == "GPU-a1"
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a"}
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert limits["nvidia.com/gpumem"] == "8192"
    assert limits["nvidia.com/gpucores"] == "25"
    adapter.release("pinned")
    deletes = [r for r in api.requests if r[0] == "DELETE"]
    assert deletes == [("DELETE", "/api/v1/namespaces/gpuplane-ml/pods/gp-pinned")]


def test_a_bind_retried_after_a_timeout_takes_the_created_pod_back(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter(sync_interval_s=1.0)  # its calls time out after 1 s
    w = workload(adapter, "slow-answer", "sleep 30")
    api.slow_creates, api.slow_create_s = 1, 2.0  # created, but the answer comes too late
    adapter.bind(w)
    posts = [r for r in api.requests if r == ("POST", "/api/v1/namespaces/gpuplane-ml/pods")]
    assert len(posts) >= 2  # it was asked again ...
    assert api.kubelet.started == ["gpuplane-ml/gp-slow-answer"]  # ... and it started once
    adapter.release("slow-answer")


def test_a_pod_of_that_name_that_is_not_the_jobs_is_refused(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    api.create_namespace("gpuplane-ml")
    api.state.create(
        "pods",
        "gpuplane-ml",
        {
            "metadata": {"name": "gp-squatted"},
            "spec": {"containers": [{"name": "x", "image": "y"}]},
        },
    )
    adapter = cluster.adapter()
    with pytest.raises(AdapterError, match="already exists and is not job squatted's"):
        adapter.bind(workload(adapter, "squatted", "true"))


def test_a_bind_that_fails_half_way_leaves_nothing_behind(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    """The namespace is created, then the Pod is refused (no image): the job fails with the
    server's reason and no workload is left; a corrected cluster binds it."""
    api, cluster = fake
    adapter = cluster.adapter(image="")
    with pytest.raises(AdapterError, match=r"422.*image: Required value"):
        adapter.bind(workload(adapter, "half", "true"))
    assert adapter.workloads() == []
    assert pods_of(api, "half") == []
    fixed = cluster.adapter(image="busybox")
    fixed.bind(workload(fixed, "half", "exit 0"))
    assert ended(fixed, "half").state == WorkloadState.SUCCEEDED


def test_a_card_the_node_no_longer_has_is_refused_before_any_create(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    w = workload(adapter, "stale", "true")
    w = replace(w, devices=(DeviceGrant(7, 1, 0),))
    with pytest.raises(AdapterError, match="no healthy HAMi card with index 7"):
        adapter.bind(w)
    assert not any(method == "POST" for method, _ in api.requests)


def test_oomkilled_evicted_and_deadline_are_named(fake: tuple[FakeKubeApi, Cluster]) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    for job_id in ("oom", "evicted", "deadline"):
        adapter.bind(workload(adapter, job_id, "sleep 30"))

    def running(job_id: str) -> bool:
        return bool(pods_of(api, job_id)[0]["status"]["phase"] == "Running")

    for job_id in ("oom", "evicted", "deadline"):
        wait_for(partial(running, job_id), f"{job_id} to run")
    api.oom_kill("gpuplane-ml", "gp-oom")
    api.evict("gpuplane-ml", "gp-evicted")
    api.deadline_exceeded("gpuplane-ml", "gp-deadline")
    oom, evicted, deadline = (ended(adapter, j) for j in ("oom", "evicted", "deadline"))
    assert (oom.state, oom.exit_code) == (WorkloadState.FAILED, 137)
    assert oom.message.startswith("OOMKilled")
    assert "memory_mib" in oom.message
    assert evicted.state == WorkloadState.FAILED
    assert "evicted by Kubernetes" in evicted.message
    assert "low on resource" in evicted.message
    assert deadline.state == WorkloadState.TIMED_OUT


@pytest.mark.parametrize(("minor", "survives"), [(25, False), (29, True)])
def test_a_job_survives_an_eviction_where_pod_failure_policy_is_served(
    tmp_path: Path, minor: int, survives: bool
) -> None:
    with kube_cluster("fake", tmp_path, minor) as cluster:
        api = cluster.fake
        assert api is not None
        adapter = cluster.adapter(bind_kind="job")
        adapter.bind(workload(adapter, "resilient", "sleep 30"))
        first = wait_for(lambda: pods_of(api, "resilient"), "the Job's Pod")[0]
        wait_for(
            lambda: adapter.status(["resilient"])["resilient"].state == WorkloadState.RUNNING,
            "running",
        )
        api.evict("gpuplane-ml", first["metadata"]["name"])
        if survives:  # podFailurePolicy Ignore: the Job controller starts a new Pod
            wait_for(lambda: len(pods_of(api, "resilient")) == 2 or None, "a replacement Pod")
            assert adapter.status(["resilient"])["resilient"].state == WorkloadState.RUNNING
        else:
            status = ended(adapter, "resilient")
            assert status.state == WorkloadState.FAILED
            assert "evicted" in status.message
        adapter.release("resilient")
        wait_for(lambda: pods_of(api, "resilient") == [] or None, "the Job's Pods to go")


def test_release_never_raises_when_the_api_server_is_down(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    """A release whose delete fails keeps the job bound, so the next release deletes it, even
    when the watch has not shown its Pod yet."""
    api, cluster = fake
    adapter = cluster.adapter()
    w = workload(adapter, "stranded", "sleep 30")
    api.watch_lag_s = 1.0
    adapter.bind(w)
    api.unreachable = True
    adapter.release("stranded")  # logged, not raised: the reconciler deletes it again
    assert "stranded" in adapter.workloads()  # it still runs: the reconciler sees a stray
    api.unreachable = False
    adapter.release("stranded")
    assert "stranded" not in adapter.workloads()
    wait_for(lambda: pods_of(api, "stranded") == [] or None, "the Pod to go")


def test_a_job_bound_again_is_not_reported_with_its_earlier_pods_end_while_the_watch_lags(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    """The second Pod has the first one's name: until the watch shows it, the watch still shows
    the first (ended) Pod, which must not pass for the second."""
    api, cluster = fake
    adapter = cluster.adapter()
    adapter.bind(workload(adapter, "again", "echo first; exit 5"))
    assert ended(adapter, "again").exit_code == 5
    api.watch_lag_s = 1.0
    adapter.release("again")
    adapter.bind(workload(adapter, "again", "echo second; sleep 30"))
    assert adapter.status(["again"])["again"].state == WorkloadState.RUNNING
    wait_for(lambda: b"".join(adapter.logs("again")) or None, "the second Pod's output")
    assert b"".join(adapter.logs("again")) == b"second\n"  # not the first Pod's


def test_the_log_of_a_released_job_is_kept_while_the_watch_lags(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    adapter.bind(workload(adapter, "kept", "echo done"))
    assert ended(adapter, "kept").state == WorkloadState.SUCCEEDED
    api.watch_lag_s = 1.0
    adapter.release("kept")  # the watch still shows the deleted Pod for a second
    assert b"".join(adapter.logs("kept")) == b"done\n"
    assert adapter.status(["kept"])["kept"].state == WorkloadState.LOST


def test_an_api_server_silent_for_a_sync_interval_is_unreachable_until_it_answers(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter(sync_interval_s=1.0)
    assert adapter.reachable() == (False, "not connected yet")
    adapter.inventory()
    assert adapter.reachable() == (True, "")
    api.unreachable = True
    api.end_watches()

    def why_down() -> str | None:
        up, why = adapter.reachable()
        return None if up else why

    why = wait_for(why_down, "the adapter to call it unreachable")
    assert "answered 503" in why
    api.add_node("while-down", cards=[hami_card("GPU-d", index=0)])
    api.unreachable = False
    wait_for(lambda: adapter.reachable()[0] or None, "the server to answer again")
    wait_for(
        lambda: any(n.name == "while-down" for n in adapter.inventory().nodes) or None,
        "the change made while it was down",
    )
    assert adapter.kube.nodes is not None
    assert adapter.kube.nodes.relists == 0  # the watch resumed from its resourceVersion


@pytest.mark.parametrize("kind", ["pod", "job"])
def test_a_workload_past_its_time_limit_is_timed_out(
    fake: tuple[FakeKubeApi, Cluster], kind: str
) -> None:
    """The limit is activeDeadlineSeconds (on the Pod, or on the Job); Kubernetes stops it."""
    _, cluster = fake
    adapter = cluster.adapter(bind_kind=kind)
    adapter.bind(replace(workload(adapter, f"limited-{kind}", "sleep 30"), time_limit_s=0.5))
    status = ended(adapter, f"limited-{kind}")
    assert status.state == WorkloadState.TIMED_OUT
    assert "activeDeadlineSeconds" in status.message


def test_a_released_job_leaves_workloads_at_once_even_when_the_watch_lags(
    fake: tuple[FakeKubeApi, Cluster],
) -> None:
    api, cluster = fake
    adapter = cluster.adapter()
    adapter.bind(workload(adapter, "lagging", "sleep 30"))
    wait_for(lambda: "lagging" in adapter.workloads() or None, "the watch to show it")
    api.watch_lag_s = 1.0
    adapter.release("lagging")
    assert "lagging" not in adapter.workloads()
    api.watch_lag_s = 0.0
    wait_for(lambda: pods_of(api, "lagging") == [] or None, "the Pod to go")
