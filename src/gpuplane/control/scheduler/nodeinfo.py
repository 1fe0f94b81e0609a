"""The inventory the scheduler sees: nodes and their cards (`NodeInfo`, `DeviceInfo`); GPU speed.

A node's speed is the relative throughput of its GPU model (any unit; only ratios matter): its
`gpuplane.io/gpu-speed` label when set, else the snapshot's per-model table (`gpu_speeds`), else
1.0. With no speed data anywhere every node is 1.0 and the score's speed term (`score.py`) is
exactly neutral. Time limits are given on a card of speed 1.0 (`wall_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuplane.control.scheduler.decision import FloatArray
from gpuplane.errors import ResourceError
from gpuplane.resources import (
    LABEL_CLUSTER,
    LABEL_GPU_MODEL,
    LABEL_GPU_SPEED,
    LABEL_VGPU,
    Labels,
)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU card of a node: its index on the node (CUDA ordinal) and its memory."""

    index: int
    mem_mib: int


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as the adapter reports it. `labels` carry cluster, region, GPU model, vGPU flag.

    The GPU model of every card is the node's `gpuplane.io/gpu-model` label; a node is
    vGPU-splittable unless its `gpuplane.io/vgpu-splittable` label is "false"; its cards' relative
    speed is its `gpuplane.io/gpu-speed` label, else the snapshot's table (`node_speeds`).
    """

    name: str
    cluster: str
    cpu_millis: int
    memory_mib: int
    devices: tuple[DeviceInfo, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    schedulable: bool = True

    @property
    def gpu_model(self) -> str:
        return self.labels.get(LABEL_GPU_MODEL, "")

    @property
    def splittable(self) -> bool:
        return self.labels.get(LABEL_VGPU, "true").lower() != "false"

    def all_labels(self) -> Labels:
        """Node labels with the cluster label filled in, as selectors see them."""
        if self.labels.get(LABEL_CLUSTER) == self.cluster:
            return self.labels
        return {**self.labels, LABEL_CLUSTER: self.cluster}


# ---------------------------------------------------------------------------------------------
# GPU speed


DEFAULT_SPEED = 1.0


def parse_speed(value: object, where: str) -> float:
    """A speed as a positive finite float; `where` names its source in the error."""
    try:
        speed = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        speed = math.nan
    if not math.isfinite(speed) or speed <= 0:
        raise ResourceError(
            f"{where}: GPU speed must be a positive number (relative throughput, e.g. 1.0 for "
            f"the reference model, 0.5 for one half as fast), got {value!r}"
        )
    return speed


def check_table(table: Mapping[str, float] | None) -> Mapping[str, float]:
    """Validate a per-model speed table (GPU model -> relative speed); None means empty."""
    if not table:
        return {}
    return {model: parse_speed(s, f"gpu_speeds[{model!r}]") for model, s in table.items()}


def node_speeds(nodes: Sequence[NodeInfo], table: Mapping[str, float]) -> FloatArray:
    """Each node's speed: its `gpuplane.io/gpu-speed` label, else `table[model]`, else 1.0."""
    out = np.full(len(nodes), DEFAULT_SPEED, dtype=np.float64)
    for i, node in enumerate(nodes):
        label = node.labels.get(LABEL_GPU_SPEED)
        if label is not None:
            out[i] = parse_speed(label, f"node {node.name} label {LABEL_GPU_SPEED}")
        else:
            out[i] = table.get(node.labels.get(LABEL_GPU_MODEL, ""), DEFAULT_SPEED)
    out.setflags(write=False)
    return out


def wall_seconds(limit_s: float, speed: float) -> float:
    """A time limit given on a card of speed 1.0, in wall-clock seconds on a card of `speed`
    (a card half as fast gets twice as long; with no speed data every card is 1.0)."""
    return limit_s / speed
