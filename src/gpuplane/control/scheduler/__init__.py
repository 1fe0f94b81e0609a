"""The pure scheduler core: snapshot types, filter -> score -> commit, policies registered by name.

decision = schedule(snapshot, Request.from_resources(job_id, resources, selector),
                    make_policy("frag"), rng)
if decision.placement: snapshot.commit(decision.placement)   # checks again, never double-books
...
snapshot.release(job_id)                                       # idempotent

GPU speed: `Snapshot(nodes, gpu_speeds={"A100": 1.0, "A10": 0.5})` or a node label
`gpuplane.io/gpu-speed`; the core then prefers faster cards (`speed.py`, `speed_weight`).
"""

from gpuplane.control.scheduler.base import (
    DEFAULT_SPEED_WEIGHT,
    Candidates,
    FloatArray,
    Policy,
    Scores,
)
from gpuplane.control.scheduler.core import (
    feasible,
    filter_nodes,
    filter_when_empty,
    reservation_node,
    schedule,
)
from gpuplane.control.scheduler.fragmentation import Workload
from gpuplane.control.scheduler.hold import Hold, blocking, expected_start
from gpuplane.control.scheduler.registry import (
    DEFAULT_POLICY,
    UnknownPolicyError,
    make_policy,
    policy_class,
    policy_names,
    register,
)
from gpuplane.control.scheduler.snapshot import (
    MILLI_PER_GPU,
    ClusterReason,
    Decision,
    DeviceGrant,
    DeviceInfo,
    IntArray,
    NodeInfo,
    Placement,
    ReasonCode,
    Request,
    SchedulingConflict,
    Snapshot,
)
from gpuplane.control.scheduler.speed import wall_seconds

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_SPEED_WEIGHT",
    "MILLI_PER_GPU",
    "Candidates",
    "ClusterReason",
    "Decision",
    "DeviceGrant",
    "DeviceInfo",
    "FloatArray",
    "Hold",
    "IntArray",
    "NodeInfo",
    "Placement",
    "Policy",
    "ReasonCode",
    "Request",
    "SchedulingConflict",
    "Scores",
    "Snapshot",
    "UnknownPolicyError",
    "Workload",
    "blocking",
    "expected_start",
    "feasible",
    "filter_nodes",
    "filter_when_empty",
    "make_policy",
    "policy_class",
    "policy_names",
    "register",
    "reservation_node",
    "schedule",
    "wall_seconds",
]
