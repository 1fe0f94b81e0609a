"""One Kubernetes cluster's connection and watches, for the `kubernetes` adapter.

`KubeWatches.connect` loads the kubeconfig, checks the server's version and API groups
(`versions.py`) and starts the reflectors (`reflector.py`): the nodes, and this service
service's Pods, Jobs (`bind_kind: job`) and InferenceServices (with KServe). It connects once;
every client or transport error is mapped into an AdapterError saying what to do (`call`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from gpuplane.control.adapters.base import AdapterError
from gpuplane.control.adapters.k8s import manifests
from gpuplane.control.adapters.k8s.api import KSERVE_GROUP, KSERVE_VERSION, KubeApi
from gpuplane.control.adapters.k8s.convert import KubeNodeView, ObjectView, node_view, object_view
from gpuplane.control.adapters.k8s.reflector import Reflector, describe_error
from gpuplane.control.adapters.k8s.versions import ApiProfile, api_profile
from gpuplane.control.settings import ClusterConfig

T = TypeVar("T")
KSERVE = f"{KSERVE_GROUP}/{KSERVE_VERSION}"


class KubeWatches:
    """The API client of `cluster` and the watches of the objects labelled with `service_id`.

    `on_nodes` hears each node key the watch changed (None after a list), on its thread."""

    def __init__(
        self,
        cluster: ClusterConfig,
        service_id: str,
        where: str,
        on_nodes: Callable[[tuple[str, str] | None], None],
    ) -> None:
        self.cluster = cluster
        self.service_id = service_id
        self.where = where
        self.timeout_s = min(10.0, cluster.sync_interval_s)
        self._on_nodes = on_nodes
        self.api: KubeApi | None = None
        self.profile: ApiProfile | None = None
        self.nodes: Reflector[KubeNodeView] | None = None
        self.pods: Reflector[ObjectView] | None = None
        self.jobs: Reflector[ObjectView] | None = None
        self.services: Reflector[ObjectView] | None = None  # InferenceServices, with KServe
        self._lock = threading.Lock()

    def connect(self) -> KubeApi:
        """Load the kubeconfig, check the server's version and groups, start the watches.
        Once; raises AdapterError saying what is wrong."""
        with self._lock:
            if self.api is not None:
                return self.api
            try:
                from kubernetes import client, config
            except ImportError:
                raise AdapterError(
                    f"{self.where}: the kubernetes adapter needs the official client: "
                    "pip install 'gpuplane[kubernetes]'"
                ) from None
            try:
                api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=self.cluster.kubeconfig,
                    context=self.cluster.context,
                    persist_config=False,
                )
            except Exception as exc:  # ConfigException, a missing or malformed file
                raise AdapterError(
                    f"{self.where}: cannot load the kubeconfig: {exc}; check the path and the "
                    "context (`kubectl config get-contexts`)"
                ) from None
            api = KubeApi(client, api_client, self.timeout_s)
            documents = self.call("read its version and discovery documents", api.documents)
            self.profile = api_profile(*documents, manifests.needs(self.cluster), self.where)
            self._start(api, self.profile)
            self.api = api
            return api

    def _start(self, api: KubeApi, profile: ApiProfile) -> None:
        """Start the watches: the nodes, and this service's objects of each kind it binds."""
        name, interval = self.cluster.name, self.cluster.sync_interval_s
        self.nodes = Reflector(
            api.core.list_node,
            node_view,
            what=f"{name} nodes",
            interval_s=interval,
            on_change=self._on_nodes,
        ).start()
        mine = manifests.selector(self.service_id)

        def watch(list_fn: Callable[..., object], what: str) -> Reflector[ObjectView]:
            """A started watch of this service's objects that `list_fn` lists."""
            return Reflector(
                list_fn,
                object_view,
                what=f"{name} {what}",
                interval_s=interval,
                label_selector=mine,
            ).start()

        self.pods = watch(api.core.list_pod_for_all_namespaces, "pods")
        if self.cluster.bind_kind == "job":
            self.jobs = watch(api.batch.list_job_for_all_namespaces, "jobs")
        if KSERVE in profile.groups:
            self.services = watch(api.list_inference_services, "inferenceservices")

    def synced(self, reflector: Reflector[T] | None) -> Reflector[T]:
        """`reflector` once it has listed, or AdapterError with why it has not."""
        assert reflector is not None
        if not reflector.synced.wait(self.cluster.sync_interval_s):
            why = reflector.error or "no answer"
            raise AdapterError(
                f"{self.where}: could not list {reflector.what} within "
                f"{self.cluster.sync_interval_s:g}s ({why}); check that the API server is reachable"
            )
        return reflector

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()`, its client and transport errors mapped into AdapterError once, here."""
        try:
            return fn()
        except AdapterError:
            raise
        except Exception as exc:
            raise AdapterError(f"{self.where}: could not {what}: {describe_error(exc)}") from exc

    def reachable(self) -> tuple[bool, str]:
        """Whether the API server answered (a watch event or bookmark, a list) within the last
        sync interval, and if not, why: what placement on this cluster waits on."""
        quiet = None if self.nodes is None else self.nodes.quiet_for()
        if quiet is None:
            return False, "not connected yet"
        if quiet > self.cluster.sync_interval_s:
            assert self.nodes is not None
            return False, self.nodes.error or f"no answer for {quiet:.0f}s"
        return True, ""

    def views(self) -> tuple[dict[str, ObjectView], dict[str, list[ObjectView]]]:
        """This service's workloads by job id, and the Pods of each (of a Job, those of the
        Job object the watch shows, not of an earlier one of the same name). A deployment
        instance's workload is its InferenceService (KServe gives its Pods our labels too)."""
        self.connect()
        pods: dict[str, list[ObjectView]] = {}
        for view in self.synced(self.pods).snapshot():
            pods.setdefault(view.job_id, []).append(view)
        services = {}
        if self.services is not None:
            services = {v.job_id: v for v in self.synced(self.services).snapshot()}
        if self.jobs is None:
            bare = {j: max(ps, key=lambda p: p.created) for j, ps in pods.items()}
            return bare | services, pods
        jobs = {v.job_id: v for v in self.synced(self.jobs).snapshot()}
        return jobs | services, {
            j: [p for p in ps if p.owner == jobs[j].uid] for j, ps in pods.items() if j in jobs
        }

    def stop(self) -> None:
        """Stop every watch; idempotent."""
        for reflector in (self.nodes, self.pods, self.jobs, self.services):
            if reflector is not None:
                reflector.stop()
