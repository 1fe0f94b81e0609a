"""The pure scheduler core: snapshot types, filter → score → commit, policies registered by name."""

from gpuplane.control.scheduler.snapshot import (
    ClusterReason,
    Decision,
    DeviceGrant,
    DeviceInfo,
    NodeInfo,
    Placement,
    ReasonCode,
    Request,
    SchedulingConflict,
    Snapshot,
)

__all__ = [
    "ClusterReason",
    "Decision",
    "DeviceGrant",
    "DeviceInfo",
    "NodeInfo",
    "Placement",
    "ReasonCode",
    "Request",
    "SchedulingConflict",
    "Snapshot",
]
