"""Hand-made inventories and one-decision shorthands for the scheduler-core tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from gpuplane.control.scheduler import (
    Decision,
    DeviceInfo,
    NodeInfo,
    Policy,
    ReasonCode,
    Request,
    Snapshot,
    make_policy,
    schedule,
)
from gpuplane.resources import LABEL_GPU_MODEL, LABEL_GPU_SPEED, LABEL_REGION, LABEL_VGPU

GIB = 1024
SPEEDS = {"A100": 1.0, "L40S": 0.8, "A10": 0.5}


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


def with_speed(info: NodeInfo, speed: str) -> NodeInfo:
    return replace(info, labels={**info.labels, LABEL_GPU_SPEED: speed})


def mixed(**speeds: float) -> Snapshot:
    """slow (A10) first in snapshot order, then mid (L40S), then fast (A100); all empty."""
    return Snapshot(
        [
            node("slow", card_gib=24, model="A10"),
            node("mid", card_gib=48, model="L40S"),
            node("fast", card_gib=80, model="A100"),
        ],
        gpu_speeds=speeds or SPEEDS,
    )


def decide(
    snap: Snapshot, req: Request, policy: Policy | str, seed: int = 0, **options: Any
) -> Decision:
    """One decision with a fresh RNG; a policy given by name is made with `options`."""
    pol = make_policy(policy, **options) if isinstance(policy, str) else policy
    return schedule(snap, req, pol, np.random.default_rng(seed))


def node_of(
    snap: Snapshot, req: Request, policy: Policy | str, seed: int = 0, **options: Any
) -> str:
    """The node `decide` places `req` on (it must fit)."""
    placement = decide(snap, req, policy, seed, **options).placement
    assert placement is not None
    return placement.node


def place(snap: Snapshot, req: Request, policy: str = "frag") -> Decision:
    """`decide`, then commit the placement when there is one."""
    decision = decide(snap, req, policy)
    if decision.placement is not None:
        snap.commit(decision.placement)
    return decision


def codes(decision: Decision) -> dict[str, ReasonCode]:
    """Each cluster's reason code."""
    return {r.cluster: r.code for r in decision.reasons}
