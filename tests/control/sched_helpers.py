"""Hand-made inventories for the scheduler-core tests."""

from __future__ import annotations

from gpuplane.control.scheduler import DeviceInfo, NodeInfo
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_REGION, LABEL_VGPU

GIB = 1024


def node(
    name: str,
    cards: int = 8,
    card_gib: int = 80,
    cluster: str = "c1",
    model: str = "A100",
    cpu: int = 64_000,
    mem_gib: int = 512,
    region: str = "eu",
    splittable: bool = True,
    **labels: str,
) -> NodeInfo:
    return NodeInfo(
        name=name,
        cluster=cluster,
        cpu_millis=cpu,
        memory_mib=mem_gib * GIB,
        devices=tuple(DeviceInfo(i, card_gib * GIB) for i in range(cards)),
        labels={
            LABEL_GPU_MODEL: model,
            LABEL_REGION: region,
            LABEL_VGPU: "true" if splittable else "false",
            **labels,
        },
    )
