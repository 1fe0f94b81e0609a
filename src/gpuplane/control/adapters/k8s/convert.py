"""What the adapter reads from the objects it watches, as gpuplane's data: a Node (labels,
allocatable, HAMi's healthy cards) as a `DiscoveredNode` in gpuplane's selector labels, and a
Pod or Job as a `WorkloadStatus` (phase and container exit code; OOMKilled, evictions and
deadlines named as reasons), and a KServe InferenceService as one with its URL. Pure functions
of the JSON the API server sent."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.control.adapters.base import (
    DiscoveredDevice,
    DiscoveredNode,
    WorkloadState,
    WorkloadStatus,
)
from gpuplane.control.adapters.k8s.hami import (
    REGISTER_ANNOTATION,
    USE_UUID_ANNOTATION,
    parse_register,
)
from gpuplane.control.adapters.k8s.manifests import ANNOTATION_JOB, CONTAINER
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION, LABEL_VGPU

log = logging.getLogger("gpuplane.control.kubernetes")

Obj = dict[str, Any]
REGION_LABEL = "topology.kubernetes.io/region"
MIB = 1024 * 1024


def _quantity(text: str | None) -> float:
    """A resource quantity (`64`, `63500m`, `512Gi`) as a number of its base unit."""
    if not text:
        return 0.0
    from kubernetes.utils.quantity import parse_quantity

    return float(parse_quantity(text))  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class KubeNodeView:
    """A node as the inventory reports it, its cards' UUIDs by index (to pin a Pod to them),
    and what was wrong with its HAMi registration, if anything."""

    node: DiscoveredNode
    uuids: dict[int, str]
    unhealthy: int = 0
    problem: str | None = None


def node_view(obj: Obj) -> KubeNodeView | None:
    """The node, or None when nothing may be placed there (cordoned, or not Ready)."""
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status", {})
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    if spec.get("unschedulable") or not ready:
        return None
    labels: dict[str, str] = dict(meta.get("labels") or {})
    problem = None
    try:
        cards = parse_register((meta.get("annotations") or {}).get(REGISTER_ANNOTATION, ""))
    except ValueError as exc:
        cards, problem = [], f"node {meta['name']}: {REGISTER_ANNOTATION} unreadable: {exc}"
    healthy = [c for c in cards if c.health]
    if REGION_LABEL in labels:
        labels.setdefault(LABEL_REGION, labels[REGION_LABEL])
    if healthy:
        labels.setdefault(LABEL_GPU_MODEL, healthy[0].model)
    labels.setdefault(LABEL_VGPU, "true" if any(c.splittable for c in healthy) else "false")
    allocatable = status.get("allocatable", {})
    node = DiscoveredNode(
        name=meta["name"],
        cpu_millis=int(_quantity(allocatable.get("cpu")) * 1000),
        memory_mib=int(_quantity(allocatable.get("memory")) // MIB),
        labels=labels,
        devices=tuple(DiscoveredDevice(c.index, c.model, c.mem_mib, c.uuid) for c in healthy),
    )
    return KubeNodeView(
        node, {c.index: c.uuid for c in healthy}, len(cards) - len(healthy), problem
    )


@dataclass(frozen=True, slots=True)
class ObjectView:
    """One Pod, Job or InferenceService the adapter bound: whose it is, which object it is (its
    uid; a Job's Pod also names its Job's, `owner`), where it runs, how it is doing."""

    job_id: str
    kind: str  # "Pod" | "Job" | "InferenceService"
    namespace: str
    name: str
    uid: str
    owner: str | None
    node: str
    uuids: tuple[str, ...]
    terminating: bool
    created: str
    status: WorkloadStatus  # a Job's is worked out with its Pods (`job_status`)
    raw: Obj


def object_view(obj: Obj) -> ObjectView | None:
    meta = obj["metadata"]
    job_id = (meta.get("annotations") or {}).get(ANNOTATION_JOB)
    if job_id is None:
        return None
    kind = obj.get("kind") or ("Job" if "template" in obj.get("spec", {}) else "Pod")
    if kind == "InferenceService":  # the predictor holds its Pods' annotations and spec
        pod_meta = pod_spec = obj["spec"].get("predictor", {})
    else:
        template = obj["spec"].get("template", obj)
        pod_meta = template.get("metadata", meta)
        pod_spec = template.get("spec", {})
    uuids = (pod_meta.get("annotations") or {}).get(USE_UUID_ANNOTATION, "")
    owner = next(
        (o.get("uid") for o in meta.get("ownerReferences") or [] if o.get("controller")), None
    )
    return ObjectView(
        job_id=job_id,
        kind=kind,
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        uid=meta.get("uid", ""),
        owner=owner,
        node=pod_spec.get("nodeSelector", {}).get("kubernetes.io/hostname", ""),
        uuids=tuple(u for u in uuids.split(",") if u),
        terminating=bool(meta.get("deletionTimestamp")),
        created=meta.get("creationTimestamp", ""),
        status=pod_status(obj)
        if kind == "Pod"
        else inference_status(obj)
        if kind == "InferenceService"
        else WorkloadStatus(WorkloadState.RUNNING),
        raw=obj,
    )


# KServe's modelStatus.transitionStatus once it gave up: the predictor cannot load or run
_GAVE_UP = ("BlockedByFailedLoad", "InvalidSpec")


def inference_status(isvc: Obj) -> WorkloadStatus:
    """An InferenceService runs while KServe starts or serves it, with its URL once its Ready
    condition is True (`status.address.url`, the cluster-internal one, else `status.url`); it
    failed once KServe gave up on its predictor (`modelStatus.transitionStatus`), with KServe's
    reason and message (`lastFailureInfo`, else the Ready condition's)."""
    status = isvc.get("status") or {}
    conditions: list[Obj] = status.get("conditions", [])
    ready: Obj = next((c for c in conditions if c.get("type") == "Ready"), {})
    model = status.get("modelStatus") or {}
    if model.get("transitionStatus") in _GAVE_UP:
        failure = model.get("lastFailureInfo") or {}
        reason = failure.get("reason") or ready.get("reason") or model["transitionStatus"]
        message = failure.get("message") or ready.get("message") or "no message"
        meta = isvc["metadata"]
        return WorkloadStatus(
            WorkloadState.FAILED,
            failure.get("exitCode"),
            f"KServe could not serve InferenceService {meta.get('namespace')}/{meta['name']}: "
            f"{reason}: {message}",
        )
    if ready.get("status") != "True":
        return WorkloadStatus(WorkloadState.RUNNING)
    url = (status.get("address") or {}).get("url") or status.get("url")
    return WorkloadStatus(WorkloadState.RUNNING, url=url or None)


def _terminated(pod: Obj) -> Obj | None:
    for cs in pod.get("status", {}).get("containerStatuses", []):
        if cs.get("name") == CONTAINER and "terminated" in cs.get("state", {}):
            terminated: Obj = cs["state"]["terminated"]
            return terminated
    return None


def pod_status(pod: Obj) -> WorkloadStatus:
    """Pending and Running are RUNNING (the job holds its cards); Succeeded and Failed end it,
    with the container's exit code and Kubernetes' reason."""
    status = pod.get("status", {})
    phase = status.get("phase", "Pending")
    where = f"Pod {pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
    if phase == "Succeeded":
        return WorkloadStatus(WorkloadState.SUCCEEDED, 0)
    if phase != "Failed":
        return WorkloadStatus(WorkloadState.RUNNING)
    ended = _terminated(pod) or {}
    code = ended.get("exitCode")
    reason = status.get("reason")
    if reason == "Evicted":
        why = status.get("message") or "no message"
        return WorkloadStatus(
            WorkloadState.FAILED, code, f"evicted by Kubernetes ({where}): {why}; submit it again"
        )
    if reason == "DeadlineExceeded":
        return WorkloadStatus(
            WorkloadState.TIMED_OUT,
            code,
            f"exceeded its time limit: Kubernetes stopped {where} at activeDeadlineSeconds",
        )
    if ended.get("reason") == "OOMKilled":
        return WorkloadStatus(
            WorkloadState.FAILED,
            code,
            f"OOMKilled: {where} used more than its memory limit; raise memory_mib in the spec",
        )
    detail = f" ({ended['reason']})" if ended.get("reason") not in (None, "Error") else ""
    if code is None:
        return WorkloadStatus(
            WorkloadState.FAILED, None, f"{where} failed: {reason or 'no exit code recorded'}"
        )
    return WorkloadStatus(WorkloadState.FAILED, code, f"exited with code {code}{detail}")


def job_status(job: Obj, pods: Sequence[ObjectView]) -> WorkloadStatus:
    """A Job's state from its conditions, the reason from its latest Pod."""
    conditions = {
        c["type"]: c
        for c in job.get("status", {}).get("conditions", [])
        if c.get("status") == "True"
    }
    latest = max(pods, key=lambda p: p.created, default=None)
    if "Complete" in conditions:
        return WorkloadStatus(WorkloadState.SUCCEEDED, 0)
    if "Failed" not in conditions:
        return WorkloadStatus(WorkloadState.RUNNING)
    failed = conditions["Failed"]
    if failed.get("reason") == "DeadlineExceeded":
        return WorkloadStatus(
            WorkloadState.TIMED_OUT,
            None,
            f"exceeded its time limit: Kubernetes stopped Job {job['metadata']['name']} at "
            "activeDeadlineSeconds",
        )
    if latest is not None:
        if latest.status.state == WorkloadState.RUNNING:
            # the Job's watch is ahead of its Pods' watch: the Pod's own end (evicted,
            # OOMKilled, its exit code) says why, and its event is on the way
            return WorkloadStatus(WorkloadState.RUNNING)
        return latest.status
    return WorkloadStatus(
        WorkloadState.FAILED,
        None,
        f"Job {job['metadata']['name']} failed: {failed.get('reason')}: {failed.get('message')}",
    )
