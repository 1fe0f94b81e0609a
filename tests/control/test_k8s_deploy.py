"""Deployments on a Kubernetes cluster (the fake API server with its stand-in for KServe's
controller, see `tests/control/k8s_fake`): each instance is a KServe InferenceService pinned to
the node and cards the scheduler chose, valid against KServe's schema; the gateway reaches it at
the address KServe reports once it is Ready; a predictor KServe gives up on is a crash, replaced
after the back-off; a cluster without KServe is refused with the fix."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpuplane.control.adapters import AdapterError, Workload, WorkloadState, WorkloadStatus, kserve
from gpuplane.control.client import TOKEN_ENV
from gpuplane.control.deployments.spec import parse_deployment
from gpuplane.control.scheduler import DeviceGrant
from gpuplane.control.service.service import ControlService
from gpuplane.control.settings import ClusterConfig
from gpuplane.serve.server import serving
from tests.control.api_server import serving_with_loop
from tests.control.k8s_fake import FakeKubeApi
from tests.control.k8s_fake.clusters import kube_cluster
from tests.control.k8s_fake.kserve import cluster_url
from tests.control.k8s_fake.state import Obj
from tests.control.svc_helpers import admin_token, api_client, config, local_cluster, make_service
from tests.helpers.common import free_port
from tests.helpers.control import check, needs_kserve
from tests.helpers.e2e import watching

pytestmark = needs_kserve

SPEC: dict[str, Any] = {
    "name": "chat",
    "model": "sim",
    "engine": "sim",
    "team": "research",
    "slice": {"gpu_mem_mib": 8192, "gpu_cores_pct": 25},
    "max_concurrency": 4,
    "placement": {"cluster": "kube"},
    "drain_timeout_s": 0,
}
NAMESPACE = "gpuplane-research"


class Predictors:
    """Plays each predictor's Pod for the fake's KServe: runs its container's command here (the
    image's `gpuplane` as this interpreter's), on a free loopback port instead of KServe's
    8080, and gives KServe that address as the InferenceService's."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, isvc: Obj) -> str:
        argv = list(isvc["spec"]["predictor"]["containers"][0]["command"])
        port = free_port()
        argv = [
            str(port) if a == str(kserve.PORT) else "127.0.0.1" if a == "0.0.0.0" else a
            for a in argv
        ]
        if argv[0] == "gpuplane":
            argv = [sys.executable, "-m", "gpuplane.cli.main", *argv[1:]]
        self.procs.append(
            subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def kserve_plane(
    tmp_path: Path, serve: Callable[[Obj], str | None] = cluster_url, kserve_on: bool = True
) -> Iterator[tuple[FakeKubeApi, ControlService]]:
    """A control plane over the fake cluster `kube` (with KServe, whose InferenceServices
    answer at `serve(isvc)`, unless `kserve_on` is False) and a local cluster `local`."""
    with kube_cluster("fake", tmp_path, kserve=kserve_on, serve=serve) as cluster:
        assert cluster.fake is not None
        kube = ClusterConfig(
            name="kube",
            adapter="kubernetes",
            kubeconfig=cluster.kubeconfig,
            grace_period_s=1,
            sync_interval_s=2.0,
        )
        clusters = [kube, local_cluster("local")]
        service = make_service(config(str(tmp_path / "svc"), clusters=clusters))
        try:
            yield cluster.fake, service
        finally:
            service.close()


def services(fake: FakeKubeApi) -> list[Obj]:
    return fake.state.select("inferenceservices", None)[0]


def wait_until(what: str, service: ControlService, done: Callable[[], Any]) -> Any:
    """Tick the service until `done()` is truthy (2 min at most, for a loaded machine)."""
    deadline = time.monotonic() + 120
    while not (result := done()):
        assert time.monotonic() < deadline, f"{what}: not within 120 s"
        service.tick()
        time.sleep(0.05)
    return result


def served(client: TestClient) -> list[dict[str, Any]]:
    """The instances the gateway would see now."""
    models = client.get("/deployments/watch", params={"timeout_s": 0}).json()["models"]
    return [i for m in models for i in m["instances"]]


def assert_pinned(isvc: Obj, instance: dict[str, Any]) -> None:
    """The InferenceService is valid against KServe's schema, in raw mode with one replica, and
    its predictor is pinned where the scheduler placed the instance, with HAMi's resources."""
    sent = {k: isvc[k] for k in ("apiVersion", "kind", "spec")}
    sent["metadata"] = {k: isvc["metadata"][k] for k in ("name", "namespace", "labels")}
    sent["metadata"]["annotations"] = isvc["metadata"]["annotations"]
    check(sent, "V1beta1InferenceService", isvc["metadata"]["name"])  # as the adapter sent it
    meta, predictor = isvc["metadata"], isvc["spec"]["predictor"]
    assert meta["namespace"] == NAMESPACE
    assert meta["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert meta["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
    assert meta["annotations"]["gpuplane.io/job-id"] == instance["id"]
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "gpuplane"
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 1)
    assert predictor["nodeSelector"] == {"kubernetes.io/hostname": instance["node"]}
    assert predictor["schedulerName"] == "hami-scheduler"
    (card,) = instance["devices"]
    uuid_prefix = "GPU-a" if instance["node"] == "gpu-a" else "GPU-b"
    assert predictor["annotations"]["nvidia.com/use-gpuuuid"] == f"{uuid_prefix}{card}"
    (container,) = predictor["containers"]
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "8192",
        "nvidia.com/gpucores": "25",
    }
    argv = container["command"]
    assert argv[argv.index("--base-port") + 1] == str(kserve.PORT)  # KServe's, not a local one


def test_each_instance_is_an_inference_service_pinned_where_it_was_placed(
    tmp_path: Path,
) -> None:
    with kserve_plane(tmp_path) as (fake, service), api_client(service) as client:
        assert client.post("/deployments", json=SPEC).status_code == 201
        (isvc,) = wait_until("one InferenceService", service, lambda: services(fake))
        (instance,) = client.get("/deployments/chat").json()["instances"]
        assert instance["cluster"] == "kube"
        assert_pinned(isvc, instance)
        # the gateway sees it once KServe reports it Ready, at the address KServe gave
        (seen,) = wait_until("the instance served", service, lambda: served(client))
        assert seen["url"] == cluster_url(isvc)

        assert client.post("/deployments/chat/scale", json={"replicas": 2}).status_code == 200
        both = wait_until("two InferenceServices", service, lambda: len(services(fake)) == 2)
        assert both
        described = client.get("/deployments/chat").json()["instances"]
        by_id = {i["metadata"]["annotations"]["gpuplane.io/job-id"]: i for i in services(fake)}
        assert set(by_id) == {i["id"] for i in described}
        for instance in described:
            assert_pinned(by_id[instance["id"]], instance)

        assert client.delete("/deployments/chat").status_code in (200, 202, 204)
        wait_until(
            "every InferenceService deleted and the deployment gone",
            service,
            lambda: not services(fake) and client.get("/deployments").json() == [],
        )


def test_a_predictor_kserve_gave_up_on_is_a_crash_and_is_replaced(tmp_path: Path) -> None:
    with kserve_plane(tmp_path) as (fake, service), api_client(service) as client:
        assert client.post("/deployments", json=SPEC).status_code == 201
        (first,) = wait_until("one InferenceService", service, lambda: services(fake))
        name = first["metadata"]["name"]
        wait_until("the instance served", service, lambda: served(client))
        assert fake.kserve is not None
        fake.kserve.fail(NAMESPACE, name, "ModelLoadFailed", "CUDA error: out of memory")

        def replaced() -> list[Obj]:
            return [s for s in services(fake) if s["metadata"]["name"] != name]

        (second,) = wait_until("a replacement InferenceService", service, replaced)
        wait_until(
            "the failed one deleted",
            service,
            lambda: name not in {s["metadata"]["name"] for s in services(fake)},
        )
        events = [e["message"] for e in client.get("/deployments/chat").json()["events"]]
        crash = [m for m in events if "ended unasked" in m]
        assert len(crash) == 1, events
        assert (
            f"KServe could not serve InferenceService {NAMESPACE}/{name}: ModelLoadFailed: "
            "CUDA error: out of memory" in crash[0]
        )
        assert "a replacement starts in 1 s" in crash[0]  # the controller's back-off
        (instance,) = client.get("/deployments/chat").json()["instances"]
        assert instance["id"] == second["metadata"]["annotations"]["gpuplane.io/job-id"]


def test_a_cluster_without_kserve_is_refused_with_the_fix(tmp_path: Path) -> None:
    with kserve_plane(tmp_path, kserve_on=False) as (fake, service), api_client(service) as c:
        refused = c.post("/deployments", json=SPEC)
        assert refused.status_code == 422
        detail = refused.json()["detail"]
        assert "does not serve serving.kserve.io/v1beta1" in detail
        assert "install KServe on cluster kube or place the deployment on another cluster" in detail
        # unplaced, it could land there too: the clusters that can run it are named
        anywhere = {k: v for k, v in SPEC.items() if k != "placement"}
        detail = c.post("/deployments", json=anywhere).json()["detail"]
        assert "set placement.cluster to one of: local" in detail
        assert c.get("/deployments").json() == []
        # never a silent Pod: the adapter refuses an instance bound there all the same
        adapter = service.binder.adapters["kube"]
        workload = Workload(
            job_id="j1",
            name="chat-v1",
            command=("sleep", "1"),
            node="gpu-a",
            team="research",
            serve=parse_deployment(SPEC).serving(kserve.PORT),
        )
        with pytest.raises(AdapterError, match="install KServe on cluster kube"):
            adapter.bind(workload)
        assert fake.state.select("pods", None)[0] == []


def test_the_adapter_binds_an_instance_once_adopts_it_and_releases_it_idempotently(
    tmp_path: Path,
) -> None:
    with kube_cluster("fake", tmp_path, kserve=True, serve=lambda isvc: None) as cluster:
        assert cluster.fake is not None
        assert cluster.fake.kserve is not None
        adapter = cluster.adapter()
        instance = Workload(
            job_id="chat-v1-1",
            name="chat-v1",
            command=("gpuplane", "engine", "sim"),
            node="gpu-a",
            devices=(DeviceGrant(1, 8192, 250),),
            fractional=True,
            team="research",
            serve=parse_deployment(SPEC).serving(kserve.PORT),
        )
        adapter.bind(instance)
        adapter.bind(instance)  # a retry: the 409 finds this job's, on the same card
        (isvc,) = services(cluster.fake)
        assert isvc["spec"]["predictor"]["annotations"] == {"nvidia.com/use-gpuuuid": "GPU-a1"}
        assert cluster.fake.state.select("pods", None)[0] == []  # no Pod of its own
        # starting (KServe not Ready yet): running, no address
        assert adapter.status(["chat-v1-1"])["chat-v1-1"] == WorkloadStatus(WorkloadState.RUNNING)
        name = isvc["metadata"]["name"]
        cluster.fake.kserve.ready(NAMESPACE, name, "http://chat.test:8080")
        again = cluster.adapter()  # a restarted service: the watch is the state
        deadline = time.monotonic() + 60
        while again.instance_url("chat-v1-1", 1) != "http://chat.test:8080":
            assert time.monotonic() < deadline, "the restarted adapter never saw it Ready"
            time.sleep(0.05)
        assert again.workloads() == ["chat-v1-1"]
        again.release("chat-v1-1")
        again.release("chat-v1-1")
        assert services(cluster.fake) == []
        assert again.status(["chat-v1-1"])["chat-v1-1"].state == WorkloadState.LOST


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_gateway_answers_through_the_inference_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    predictors = Predictors()
    spec = {k: v for k, v in SPEC.items() if k != "max_concurrency"}  # slots from the engine
    try:
        with kserve_plane(tmp_path, serve=predictors) as (fake, service):
            token = admin_token(service)
            monkeypatch.setenv(TOKEN_ENV, token)
            with serving_with_loop(service) as url:
                gateway, settings = watching(url)
                async with (
                    serving(settings, gateway) as gw_url,
                    httpx.AsyncClient(timeout=60) as client,
                ):
                    headers = {"authorization": f"Bearer {token}"}
                    applied = await client.post(f"{url}/deployments", json=spec, headers=headers)
                    assert applied.status_code == 201, applied.text
                    deadline = time.monotonic() + 120
                    while not (
                        "chat" in gateway.routers
                        and gateway.routers["chat"].slots.healthy_count == 1
                    ):
                        assert time.monotonic() < deadline, "the gateway never admitted to it"
                        await asyncio.sleep(0.1)
                    (isvc,) = services(fake)
                    (instance,) = gateway.routers["chat"].instances
                    assert instance.url == isvc["status"]["address"]["url"]
                    body = {
                        "model": "chat",
                        "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 8,
                    }
                    answer = await client.post(f"{gw_url}/v1/chat/completions", json=body)
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["choices"][0]["message"]["content"]
    finally:
        predictors.stop()
