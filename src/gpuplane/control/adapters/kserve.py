"""A deployment rendered as KServe `InferenceService`s (serving.kserve.io/v1beta1), for clusters
where KServe runs the engines. Pure: the same spec and options always give the same manifests.

One InferenceService per version (`<name>-<version>`): KServe's raw deployment mode (annotation
`serving.kserve.io/deploymentMode: RawDeployment`, a plain Deployment and Service, no Knative)
has no traffic split of its own, so during a rollout each version is its own service and the
gpuplane gateway applies the weights, per request (each carries its weight as the annotation
`gpuplane.io/weight`). Replicas stay gpuplane's: `autoscalerClass: external` keeps KServe from
creating an HPA, `minReplicas`/`maxReplicas` are `replicas` (or `scaling`'s bounds, which
gpuplane's autoscaler moves within from the gateway's exact slot use). The predictor is one
custom container (`kserve-container`) running the engine adapter's launch command with
`engine_args` on port 8080, its health path as readiness probe, and the slice in HAMi's resource
names: `nvidia.com/gpu` (+ `nvidia.com/gpumem`, `nvidia.com/gpucores` for a vGPU slice).
`max_concurrency`, when given, is also `containerConcurrency`. Placement's `match_labels` become
a nodeSelector and `gpu_models` a required node affinity; `cluster` and `region` choose the
cluster to apply the manifests to, so they are no field of them.

The Kubernetes adapter builds each instance a control plane places on a `kubernetes` cluster
from the same predictor (`predictor`, `inference_service`), from the instance's typed `Serving`
(never its deployment spec): one replica, pinned to the node and cards the scheduler chose
(`adapters/k8s/manifests.py`).
"""

from __future__ import annotations

import sys
from typing import Any

from gpuplane.control.adapters.base import Serving
from gpuplane.control.deployments.spec import EMBEDDED_MODELS, DeploymentSpec
from gpuplane.control.spec import SpecError
from gpuplane.engines.base import adapter_class
from gpuplane.resources import LABEL_GPU_MODEL

API_VERSION = "serving.kserve.io/v1beta1"
PORT = 8080  # KServe's default container port
CONTAINER = "kserve-container"  # the predictor container's name KServe expects
RAW_DEPLOYMENT = {
    "serving.kserve.io/deploymentMode": "RawDeployment",
    "serving.kserve.io/autoscalerClass": "external",  # replicas are gpuplane's to set
}
LABEL_DEPLOYMENT = "gpuplane.io/deployment"
LABEL_VERSION = "gpuplane.io/version"
LABEL_TEAM = "gpuplane.io/team"
ANNOTATION_WEIGHT = "gpuplane.io/weight"
# the device plugin (HAMi) sets the cards a container sees; the local launch's choice is dropped
_NODE_ENV = {"CUDA_VISIBLE_DEVICES"}


def render(
    spec: DeploymentSpec, *, image: str, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The InferenceServices of `spec`: one per version (the main one first, then the canaries),
    whose predictor runs `image`."""
    check(spec.serving(PORT), image)
    if spec.name[0].isdigit():
        raise SpecError(
            f"KServe names start with a letter; rename deployment '{spec.name}' (e.g. "
            f"m-{spec.name})"
        )
    weights = spec.weights()
    replicas = spec.replicas_by_version(spec.desired)
    return [
        _service(spec.of_version(v), image, namespace, n, weights.get(v))
        for v, n in replicas.items()
    ]


def check(serving: Serving, image: str) -> None:
    """Refuse, saying what to change, an instance whose predictor cannot run `image` on KServe."""
    if not image:
        raise SpecError(
            "give the container image that holds the engine (e.g. vllm/vllm-openai for vllm)"
        )
    if serving.engine == "llamacpp" and serving.model in EMBEDDED_MODELS:
        raise SpecError(
            f"model '{serving.model}' names the GGUF embedded on this machine; for KServe give "
            "the model's path inside the image (or on a volume)"
        )


def inference_service(metadata: dict[str, Any], predictor: dict[str, Any]) -> dict[str, Any]:
    """An InferenceService in raw deployment mode with replicas set by gpuplane: `metadata`
    (its annotations joined to the mode's) and `predictor` (`predictor()`'s, perhaps pinned)."""
    annotations = dict(RAW_DEPLOYMENT) | metadata.get("annotations", {})
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "metadata": {**metadata, "annotations": annotations},
        "spec": {"predictor": predictor},
    }


def predictor(serving: Serving, image: str, low: int, high: int) -> dict[str, Any]:
    """The predictor of one version: `low` to `high` replicas of the engine's container, its
    slots as `containerConcurrency`, the spec's placement as node selector and affinity."""
    out: dict[str, Any] = {
        "minReplicas": low,
        "maxReplicas": high,
        "containers": [_container(serving, image)],
    }
    if serving.max_concurrency is not None:
        out["containerConcurrency"] = serving.max_concurrency
    out.update(_placement(serving))
    return out


def _service(
    spec: DeploymentSpec, image: str, namespace: str | None, replicas: int, weight: float | None
) -> dict[str, Any]:
    low, high = (spec.scaling.min, spec.scaling.max) if spec.scaling else (replicas, replicas)
    metadata: dict[str, Any] = {
        "name": f"{spec.name}-{spec.version.replace('.', '-')}",
        **({"namespace": namespace} if namespace else {}),
        "labels": {
            "app.kubernetes.io/managed-by": "gpuplane",
            LABEL_DEPLOYMENT: spec.name,
            LABEL_VERSION: spec.version,
            LABEL_TEAM: spec.team,
        },
        "annotations": {} if weight is None else {ANNOTATION_WEIGHT: f"{weight:g}"},
    }
    return inference_service(metadata, predictor(spec.serving(PORT), image, low, high))


def _container(serving: Serving, image: str) -> dict[str, Any]:
    launch, port = serving.launch, serving.port
    argv = list(launch.argv)
    if argv[:1] == [sys.executable]:  # an engine run by this interpreter: the image's python
        argv[0] = "python3"
    env = [{"name": k, "value": v} for k, v in launch.env.items() if k not in _NODE_ENV]
    health = adapter_class(serving.engine)().health_path
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": argv,
        "ports": [{"containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": health, "port": port}},
        "resources": {"limits": dict(serving.limits)},
    }
    if env:
        container["env"] = env
    return container


def _placement(serving: Serving) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if serving.match_labels:
        out["nodeSelector"] = dict(serving.match_labels)
    if serving.gpu_models:
        term = {"key": LABEL_GPU_MODEL, "operator": "In", "values": list(serving.gpu_models)}
        out["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    return out
