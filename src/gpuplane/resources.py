"""The shared vocabulary of the three tiers: GPU slices, CPU/memory, labels and selectors.

A `Slice` is either whole GPUs (`gpus >= 1`) or a fraction of one GPU (`gpu_mem_mib` plus
`gpu_cores_pct`, as HAMi splits a card). It maps to HAMi resource names on Kubernetes and to a
fractional `num_gpus` plus custom resources on Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuplane.errors import ResourceError

# Well-known label keys; free-form labels live beside them.
LABEL_CLUSTER = "gpuplane.io/cluster"
LABEL_REGION = "gpuplane.io/region"
LABEL_GPU_MODEL = "gpuplane.io/gpu-model"
LABEL_VGPU = "gpuplane.io/vgpu-splittable"
# relative throughput of the node's GPU model (e.g. "1.0" for an A100, "0.5" for an A10)
LABEL_GPU_SPEED = "gpuplane.io/gpu-speed"
# the node's name within its cluster, set on every node of the estate (pins a job to a node)
LABEL_NODE = "gpuplane.io/node"

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Slice:
    """GPU share of one workload: whole cards, or memory + compute share of one card."""

    gpus: int = 0
    gpu_mem_mib: int | None = None
    gpu_cores_pct: int | None = None

    def __post_init__(self) -> None:
        fractional = self.gpu_mem_mib is not None or self.gpu_cores_pct is not None
        if self.gpus < 0:
            raise ResourceError(f"gpus must be >= 0, got {self.gpus}")
        if fractional and self.gpus > 1:
            raise ResourceError(
                "a fractional slice (gpu_mem_mib / gpu_cores_pct) lives on one card: "
                f"set gpus to 0 or 1, got {self.gpus}"
            )
        if self.gpu_mem_mib is not None and self.gpu_mem_mib <= 0:
            raise ResourceError(f"gpu_mem_mib must be > 0, got {self.gpu_mem_mib}")
        if self.gpu_cores_pct is not None and not 0 < self.gpu_cores_pct <= 100:
            raise ResourceError(f"gpu_cores_pct must be in 1..100, got {self.gpu_cores_pct}")

    @property
    def is_fractional(self) -> bool:
        return self.gpu_mem_mib is not None or self.gpu_cores_pct is not None

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0 or self.is_fractional

    def share(self, card_mem_mib: int) -> float:
        """Fraction of cards this slice occupies: max of its memory and compute shares."""
        if not self.is_fractional:
            return float(self.gpus)
        mem = (self.gpu_mem_mib or 0) / card_mem_mib
        cores = (self.gpu_cores_pct or 0) / 100
        return min(1.0, max(mem, cores))

    def hami_resources(self) -> dict[str, int]:
        """Kubernetes resource limits in HAMi's names."""
        if not self.is_gpu:
            return {}
        out = {"nvidia.com/gpu": max(self.gpus, 1)}
        if self.gpu_mem_mib is not None:
            out["nvidia.com/gpumem"] = self.gpu_mem_mib
        if self.gpu_cores_pct is not None:
            out["nvidia.com/gpucores"] = self.gpu_cores_pct
        return out


@dataclass(frozen=True, slots=True)
class Resources:
    """Everything one workload asks for."""

    slice: Slice = field(default_factory=Slice)
    cpu_millis: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Selector:
    """Where a workload may run: exact label matches, and a set of allowed GPU models."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    gpu_models: frozenset[str] = frozenset()

    def matches(self, labels: Labels) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return not self.gpu_models or labels.get(LABEL_GPU_MODEL, "") in self.gpu_models
