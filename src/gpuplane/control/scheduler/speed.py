"""GPU model speed: where a node's relative throughput comes from, and the score term using it.

A node's speed is the relative throughput of its GPU model (any unit; only ratios matter): its
`gpuplane.io/gpu-speed` label when set, else the snapshot's per-model table (`gpu_speeds`), else
1.0. With no speed data anywhere every node is 1.0 and the term below is exactly neutral.

The score term follows the Kubernetes scheduler framework: each candidate scores
`MAX_NODE_SCORE * speed / fastest candidate's speed` (DefaultNormalizeScore), and the core adds
it, times the policy's `speed_weight` and rescaled to the policy's own 0..`max_score` range, to
the policy's score. When every candidate has the same speed (one GPU model allowed, or no speed
data), or the weight is 0 (the default: measured, a greedy preference for fast cards cost
placements and throughput, see `base.DEFAULT_SPEED_WEIGHT`), the term is left out entirely, so
policies decide exactly as without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gpuplane.errors import ResourceError
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_GPU_SPEED

if TYPE_CHECKING:
    from gpuplane.control.scheduler.snapshot import NodeInfo

FloatArray = npt.NDArray[np.float64]

MAX_NODE_SCORE = 100.0  # Kubernetes' framework.MaxNodeScore
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


def speed_score(speeds: FloatArray) -> FloatArray | None:
    """0..MAX_NODE_SCORE per candidate (speed over the fastest candidate's), or None when all
    candidates are equally fast (the term would not change any decision)."""
    if len(speeds) == 0:
        return None
    top = float(speeds.max())
    if float(speeds.min()) == top:
        return None
    score: FloatArray = speeds * (MAX_NODE_SCORE / top)
    return score
