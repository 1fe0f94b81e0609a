"""The manifests a workload becomes: a Pod, or a batch/v1 Job whose template is that Pod (or, for a
deployment instance, a KServe InferenceService whose predictor is pinned the same way), pinned
to its node (nodeSelector on `kubernetes.io/hostname`, for HAMi's scheduler to bind) and to its
cards by UUID, with HAMi's resource limits, in its team's namespace, and labelled so the adapter
finds its own workloads again after a restart. Pure: the same workload, settings and profile
always give the same manifest, which is what makes a retried create idempotent by name."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.control.adapters.base import Workload
from gpuplane.control.adapters.k8s.hami import USE_UUID_ANNOTATION
from gpuplane.control.adapters.k8s.versions import ApiProfile
from gpuplane.control.settings import ClusterConfig
from gpuplane.resources import Slice

Manifest = dict[str, Any]

MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = "gpuplane.io/job-id"
LABEL_SERVICE_ID = "gpuplane.io/instance"
LABEL_TEAM = "gpuplane.io/team"
# label values are limited to 63 of [A-Za-z0-9._-]: the exact ids also go in annotations
ANNOTATION_JOB = "gpuplane.io/job-id"
ANNOTATION_SERVICE_ID = "gpuplane.io/instance"
CONTAINER = "main"
# KServe names a raw deployment's Service `<name>-predictor`, which must be a DNS label too
ISVC_NAME_MAX = 63 - len("-predictor")
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def object_name(job_id: str, max_len: int = 63) -> str:
    """The Pod's (or Job's, or InferenceService's) name: `gp-<job id>` as a DNS label (63 at
    most, as a Job's name must be; `ISVC_NAME_MAX` for an InferenceService); a job id that had
    to be changed to fit gets a digest of itself appended, so two ids never share a name."""
    clean = _NOT_NAME.sub("-", job_id.lower()).strip("-")
    name = f"gp-{clean}"
    if clean != job_id or len(name) > max_len:
        name = f"{name[: max_len - 9].rstrip('-')}-{_digest(job_id)}"
    return name


def label_value(text: str) -> str:
    """`text` as a label value (63 of [A-Za-z0-9._-], alphanumeric at both ends)."""
    clean = _NOT_LABEL.sub("-", text).strip("-._")
    if clean == text and len(clean) <= 63:
        return clean
    return f"{clean[:54].rstrip('-._')}-{_digest(text)}".lstrip("-")


def selector(service_id: str) -> str:
    """The label selector of the workloads one control-plane process (`service_id`) bound."""
    return f"{MANAGED_BY}=gpuplane,{LABEL_SERVICE_ID}={label_value(service_id)}"


def namespace_of(cluster: ClusterConfig, team: str | None) -> str:
    return cluster.namespace.format(team=label_value(team or "default").lower())


@dataclass(frozen=True, slots=True)
class Binding:
    """Where the manifest goes and what pins it: the namespace, the object's name, the cards,
    and the object's kind (Pod, Job or InferenceService)."""

    namespace: str
    name: str
    uuids: tuple[str, ...]
    kind: str = "Pod"


def _slice(workload: Workload) -> Slice:
    if workload.fractional and workload.devices:
        grant = workload.devices[0]
        cores = round(grant.cores_pct) if grant.gpu_milli else None
        return Slice(gpus=1, gpu_mem_mib=grant.mem_mib, gpu_cores_pct=cores or None)
    return Slice(gpus=len(workload.devices))


def pod_template(
    workload: Workload, binding: Binding, cluster: ClusterConfig, service_id: str
) -> Manifest:
    """The Pod's metadata and spec (a bare Pod's body, or a Job's template)."""
    limits: dict[str, Any] = {k: str(v) for k, v in _slice(workload).hami_resources().items()}
    requests: dict[str, Any] = {}
    if workload.cpu_millis:
        requests["cpu"] = f"{workload.cpu_millis}m"
    if workload.memory_mib:
        requests["memory"] = f"{workload.memory_mib}Mi"
    limits.update(requests)
    container: Manifest = {
        "name": CONTAINER,
        "image": cluster.image,
        "command": list(workload.command),
        "env": [
            {"name": k, "value": v}
            for k, v in {
                **workload.env,
                "GPUPLANE_JOB_ID": workload.job_id,
                "GPUPLANE_JOB_NAME": workload.name,
            }.items()
        ],
        "resources": {"limits": limits, **({"requests": requests} if requests else {})},
    }
    if workload.workdir:
        container["workingDir"] = workload.workdir
    metadata = _metadata(workload, binding, service_id)
    metadata["annotations"].update(_card_annotations(binding))
    spec: Manifest = {"restartPolicy": "Never", **_pinning(workload, cluster)}
    return {"metadata": metadata, "spec": {**spec, "containers": [container]}}


def _metadata(workload: Workload, binding: Binding, service_id: str) -> Manifest:
    """Name, namespace, and the labels and annotations that say whose the object is."""
    return {
        "name": binding.name,
        "namespace": binding.namespace,
        "labels": {
            MANAGED_BY: "gpuplane",
            LABEL_JOB: label_value(workload.job_id),
            LABEL_SERVICE_ID: label_value(service_id),
            LABEL_TEAM: label_value(workload.team or "default"),
        },
        "annotations": {ANNOTATION_JOB: workload.job_id, ANNOTATION_SERVICE_ID: service_id},
    }


def _pinning(workload: Workload, cluster: ClusterConfig) -> Manifest:
    """The Pod spec's fields that hand it to HAMi's scheduler for its node."""
    return {
        "schedulerName": cluster.scheduler_name,
        "nodeSelector": {"kubernetes.io/hostname": workload.node},
        "terminationGracePeriodSeconds": cluster.grace_period_s,
    }


def _card_annotations(binding: Binding) -> dict[str, str]:
    """The Pod annotation that pins it to its cards (HAMi's device plugin reads it)."""
    return {USE_UUID_ANNOTATION: ",".join(binding.uuids)} if binding.uuids else {}


def _deadline(workload: Workload) -> dict[str, int]:
    if workload.time_limit_s is None:
        return {}
    return {"activeDeadlineSeconds": max(1, math.ceil(workload.time_limit_s))}


def pod_manifest(
    workload: Workload, binding: Binding, cluster: ClusterConfig, service_id: str
) -> Manifest:
    pod = pod_template(workload, binding, cluster, service_id)
    pod["spec"].update(_deadline(workload))
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def job_manifest(
    workload: Workload,
    binding: Binding,
    cluster: ClusterConfig,
    service_id: str,
    profile: ApiProfile,
) -> Manifest:
    """A Job that runs the Pod once: no retries of a failing command (gpuplane decides what
    reruns); where the version serves it, an eviction is not the Job's failure and the
    replacement starts only once the evicted Pod has let go of its card."""
    template = pod_template(workload, binding, cluster, service_id)
    job_meta = {k: v for k, v in template["metadata"].items() if k != "name"}
    template["metadata"] = {k: v for k, v in job_meta.items() if k != "namespace"}
    spec: Manifest = {"backoffLimit": 0, "template": template, **_deadline(workload)}
    if profile.pod_failure_policy:
        spec["podFailurePolicy"] = {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
            ]
        }
    if profile.pod_replacement_policy:
        spec["podReplacementPolicy"] = "Failed"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": binding.name, **job_meta},
        "spec": spec,
    }


def inference_service(
    workload: Workload, binding: Binding, cluster: ClusterConfig, service_id: str
) -> Manifest:
    """A deployment instance (`workload.serve`) as a KServe InferenceService of one replica
    (KServe's own predictor, `adapters/kserve.py`), whose Pod is pinned as a bare Pod would
    be: node selector, HAMi's scheduler and card annotation, HAMi's resource limits. Its engine
    listens on KServe's port, not the local one in the workload's command. Raises SpecError
    when the spec cannot run on KServe (e.g. the embedded GGUF)."""
    from gpuplane.control.adapters import kserve  # the control plane's, imported at bind

    assert workload.serve is not None
    kserve.check(workload.serve, cluster.image)
    predictor = kserve.predictor(workload.serve, cluster.image, 1, 1)
    pinning = _pinning(workload, cluster)
    selector = {**predictor.get("nodeSelector", {}), **pinning["nodeSelector"]}
    predictor.update(pinning, nodeSelector=selector)
    if binding.uuids:
        predictor["annotations"] = _card_annotations(binding)
    return kserve.inference_service(_metadata(workload, binding, service_id), predictor)


def needs(cluster: ClusterConfig) -> Sequence[str]:
    """The group/versions a cluster's settings make the adapter use."""
    return ("v1", "batch/v1") if cluster.bind_kind == "job" else ("v1",)
