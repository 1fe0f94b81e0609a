"""The calls the adapter makes on a cluster's objects, through the official client, reading and
writing the JSON itself (`_preload_content=False`): the client's models are slow to build and
nothing here needs them. Client errors are left to the adapter, which maps them once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpuplane.control.adapters.k8s.manifests import CONTAINER, Binding
from gpuplane.control.adapters.k8s.reflector import read_json

if TYPE_CHECKING:
    from kubernetes.client import ApiException

LOG_BLOCK = 64 * 1024
Obj = dict[str, Any]
# KServe's InferenceService: a custom resource (group, version, plural)
KSERVE_GROUP, KSERVE_VERSION = "serving.kserve.io", "v1beta1"
INFERENCE_SERVICES = (KSERVE_GROUP, KSERVE_VERSION, "inferenceservices")


def raw(timeout_s: float | None = None) -> dict[str, Any]:
    """Keyword arguments for a call whose JSON is read here."""
    kw: dict[str, Any] = {"_preload_content": False}
    if timeout_s is not None:
        kw["_request_timeout"] = timeout_s
    return kw


class KubeApi:
    """The client's pieces one cluster uses, made from its kubeconfig; each call times out
    after `timeout_s`."""

    def __init__(self, client: Any, api_client: Any, timeout_s: float) -> None:
        from urllib3.exceptions import HTTPError

        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.version = client.VersionApi(api_client)
        self.core_group = client.CoreApi(api_client)
        self.apis = client.ApisApi(api_client)
        self.exception: type[ApiException] = client.ApiException
        self.transport_errors: tuple[type[Exception], ...] = (OSError, HTTPError)
        self.timeout_s = timeout_s

    def documents(self) -> tuple[Obj, Obj, Obj]:
        """`/version`, `/api` and `/apis`."""
        t = raw(self.timeout_s)
        return (
            read_json(self.version.get_code(**t)),
            read_json(self.core_group.get_api_versions(**t)),
            read_json(self.apis.get_api_versions(**t)),
        )

    def list_inference_services(self, **kw: Any) -> Any:
        """List (or watch) InferenceServices in every namespace, as the reflector asks."""
        return self.custom.list_cluster_custom_object(*INFERENCE_SERVICES, **kw)

    def create(self, binding: Binding, body: Obj) -> Obj:
        """Create `body` (a Pod, Job or InferenceService) in its namespace, which is created
        first if missing; the object as the server stored it (its uid)."""
        kind = body["kind"]

        def create(namespace: str, body: Obj, **kw: Any) -> Any:
            if kind == "InferenceService":
                group, version, plural = INFERENCE_SERVICES
                return self.custom.create_namespaced_custom_object(
                    group, version, namespace, plural, body, **kw
                )
            if kind == "Job":
                return self.batch.create_namespaced_job(namespace, body, **kw)
            return self.core.create_namespaced_pod(namespace, body, **kw)

        try:
            return read_json(create(binding.namespace, body, **raw(self.timeout_s)))
        except self.exception as exc:
            if exc.status != 404:
                raise
            # the team's namespace does not exist yet: create it (409: someone just did)
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": binding.namespace}}
            try:
                read_json(self.core.create_namespace(ns, **raw(self.timeout_s)))
            except self.exception as again:
                if again.status != 409:
                    raise
            return read_json(create(binding.namespace, body, **raw(self.timeout_s)))

    def read(self, binding: Binding, kind: str) -> Obj:
        t = raw(self.timeout_s)
        if kind == "InferenceService":
            group, version, plural = INFERENCE_SERVICES
            return read_json(
                self.custom.get_namespaced_custom_object(
                    group, version, binding.namespace, plural, binding.name, **t
                )
            )
        read = self.batch.read_namespaced_job if kind == "Job" else self.core.read_namespaced_pod
        return read_json(read(binding.name, binding.namespace, **t))

    def delete(self, binding: Binding, kind: str, grace: int) -> None:
        """Delete, its Pods with it (a Job's or an InferenceService's, in the background); gone
        already is fine."""
        body = {"gracePeriodSeconds": grace, "propagationPolicy": "Background"}
        t = raw(self.timeout_s)
        try:
            if kind == "InferenceService":
                group, version, plural = INFERENCE_SERVICES
                read_json(
                    self.custom.delete_namespaced_custom_object(
                        group, version, binding.namespace, plural, binding.name, body=body, **t
                    )
                )
                return
            delete = (
                self.batch.delete_namespaced_job
                if kind == "Job"
                else self.core.delete_namespaced_pod
            )
            read_json(delete(binding.name, binding.namespace, body=body, **t))
        except self.exception as exc:
            if exc.status != 404:
                raise

    def pod_log(self, namespace: str, name: str, tail: int | None, since: int) -> Iterator[bytes]:
        """The main container's output from byte `since` (or its last `tail` lines), in blocks;
        none while it has not started or once the Pod is gone."""
        kw: dict[str, Any] = {"container": CONTAINER, **raw(self.timeout_s)}
        if tail is not None:
            kw["tail_lines"] = tail
        try:
            resp = self.core.read_namespaced_pod_log(name, namespace, **kw)
        except self.exception as exc:
            if exc.status in (400, 404):
                return
            raise
        skip = since
        try:
            for block in resp.stream(LOG_BLOCK):
                if skip >= len(block):
                    skip -= len(block)
                    continue
                yield block[skip:]
                skip = 0
        finally:
            resp.release_conn()
