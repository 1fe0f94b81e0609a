"""The pure scheduler core, in kube-scheduler's phases; policies registered by name.

decision = schedule(snapshot, Request.from_resources(job_id, resources, selector),
                    make_policy("frag"), rng)
if decision.placement: snapshot.commit(decision.placement)   # checks again, never double-books
...
snapshot.release(job_id)                                       # idempotent

One cycle (`cycle.py`): filter (`filter.py`: the nodes and cards that could host the request)
-> score (`score.py`: the policy's scores plus the GPU-speed term, the best candidate) -> the
node's cards; when nothing fits, post-filter (`explain.py`: one typed reason per cluster). The
reserve of the devices is the caller's `snapshot.commit` (`snapshot.py`: all or nothing);
binding is the cluster adapter's. Nominated nodes (`nomination.py`) hold what a job that waited
too long needs. Inventory and GPU speed: `nodeinfo.py` (`Snapshot(nodes, gpu_speeds={"A100":
1.0, "A10": 0.5})` or a node label `gpuplane.io/gpu-speed`; the score then prefers faster cards
when a policy has a `speed_weight`).

Import every name from here, never from the submodules.
"""

from gpuplane.control.scheduler.base import DEFAULT_SPEED_WEIGHT, Candidates, Policy, Scores
from gpuplane.control.scheduler.cycle import feasible, schedule
from gpuplane.control.scheduler.decision import (
    MILLI_PER_GPU,
    BoolArray,
    ClusterReason,
    Decision,
    DeviceGrant,
    FloatArray,
    IntArray,
    Placement,
    ReasonCode,
    Request,
)
from gpuplane.control.scheduler.explain import explain
from gpuplane.control.scheduler.filter import filter_nodes, filter_when_empty
from gpuplane.control.scheduler.fragmentation import OnlineWorkloadMix, TaskClass, WorkloadMix
from gpuplane.control.scheduler.nodeinfo import DeviceInfo, NodeInfo, wall_seconds
from gpuplane.control.scheduler.nomination import (
    Nomination,
    blocking,
    expected_start,
    nomination_node,
)
from gpuplane.control.scheduler.registry import (
    DEFAULT_POLICY,
    UnknownPolicyError,
    make_policy,
    policy_class,
    policy_names,
    register,
)
from gpuplane.control.scheduler.score import MAX_NODE_SCORE, speed_score
from gpuplane.control.scheduler.snapshot import SchedulingConflict, Snapshot

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_SPEED_WEIGHT",
    "MAX_NODE_SCORE",
    "MILLI_PER_GPU",
    "BoolArray",
    "Candidates",
    "ClusterReason",
    "Decision",
    "DeviceGrant",
    "DeviceInfo",
    "FloatArray",
    "IntArray",
    "NodeInfo",
    "Nomination",
    "OnlineWorkloadMix",
    "Placement",
    "Policy",
    "ReasonCode",
    "Request",
    "SchedulingConflict",
    "Scores",
    "Snapshot",
    "TaskClass",
    "UnknownPolicyError",
    "WorkloadMix",
    "blocking",
    "expected_start",
    "explain",
    "feasible",
    "filter_nodes",
    "filter_when_empty",
    "make_policy",
    "nomination_node",
    "policy_class",
    "policy_names",
    "register",
    "schedule",
    "speed_score",
    "wall_seconds",
]
