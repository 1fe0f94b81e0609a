"""Cluster adapters: one module per cluster kind behind the interface in `base`."""

from gpuplane.control.adapters.base import (
    AdapterError,
    ClusterAdapter,
    DiscoveredDevice,
    DiscoveredNode,
    Inventory,
    InventoryChange,
    Workload,
    WorkloadState,
    WorkloadStatus,
    create_adapter,
    register,
)

__all__ = [
    "AdapterError",
    "ClusterAdapter",
    "DiscoveredDevice",
    "DiscoveredNode",
    "Inventory",
    "InventoryChange",
    "Workload",
    "WorkloadState",
    "WorkloadStatus",
    "create_adapter",
    "register",
]
