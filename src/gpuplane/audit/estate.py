"""The audited estate as the scheduler core sees it: nodes, cards and each workload's placement.

Samples name cards by their collector's name (an index, a UUID); the scheduler numbers a node's
cards 0..n-1. `AuditEstate` keeps both directions, so findings and the plan speak the samples' names
while the core (`control.scheduler`) computes on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuplane.audit.stats import SampledCard
from gpuplane.control.scheduler import (
    MILLI_PER_GPU,
    DeviceGrant,
    DeviceInfo,
    NodeInfo,
    Placement,
    Request,
    Snapshot,
)
from gpuplane.resources import LABEL_GPU_MODEL, Selector


@dataclass(frozen=True, slots=True)
class Held:
    """A slice one workload holds (or would hold) on one card."""

    workload: str
    cluster: str
    node: str
    card: str
    mem_mib: int
    gpu_milli: int
    gpu_model: str = ""


def _card_order(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


@dataclass(frozen=True, slots=True)
class AuditEstate:
    """Nodes and cards of the audit, with the mapping between sample card names and indices."""

    nodes: tuple[NodeInfo, ...]
    card_index: dict[tuple[str, str], int]  # (node, card name) -> index on the node
    card_name: dict[tuple[str, int], str]  # (node, index) -> card name
    card_mem: dict[tuple[str, str], int]

    @classmethod
    def of(cls, cards: Iterable[SampledCard]) -> AuditEstate:
        by_node: dict[tuple[str, str], list[SampledCard]] = {}
        for c in cards:
            by_node.setdefault((c.cluster, c.node), []).append(c)
        nodes, index, name, mem = [], {}, {}, {}
        for (cluster, node), cs in sorted(by_node.items()):
            cs.sort(key=lambda c: _card_order(c.card))
            for i, c in enumerate(cs):
                index[(node, c.card)], name[(node, i)] = i, c.card
                mem[(node, c.card)] = c.card_mem_mib
            nodes.append(
                NodeInfo(
                    name=node,
                    cluster=cluster,
                    cpu_millis=0,  # samples carry no host resources: only GPUs are packed
                    memory_mib=0,
                    devices=tuple(DeviceInfo(i, c.card_mem_mib) for i, c in enumerate(cs)),
                    labels={LABEL_GPU_MODEL: cs[0].gpu_model},
                )
            )
        return cls(tuple(nodes), index, name, mem)

    def placement(self, h: Held) -> Placement:
        i = self.card_index[(h.node, h.card)]
        return Placement(
            h.workload, h.cluster, h.node, (DeviceGrant(i, h.mem_mib, h.gpu_milli),), 0, 0
        )

    def snapshot(self, held: Iterable[Held]) -> Snapshot:
        """A snapshot of the nodes with `held` committed (each checked: no card over-booked)."""
        return Snapshot(self.nodes, [self.placement(h) for h in held])

    def held_of(self, p: Placement) -> Held:
        g = p.devices[0]
        return Held(p.job_id, p.cluster, p.node, self.card_name[(p.node, g.index)], g.mem_mib,
                    g.gpu_milli)  # fmt: skip


def request(h: Held, card_mem_mib: int) -> Request:
    """The scheduler request of a slice: a whole card, or memory + compute of one card of the
    same GPU model."""
    selector = Selector(gpu_models=frozenset({h.gpu_model})) if h.gpu_model else Selector()
    if h.mem_mib >= card_mem_mib and h.gpu_milli >= MILLI_PER_GPU:
        return Request(h.workload, gpus=1, selector=selector)
    return Request(h.workload, gpu_milli=h.gpu_milli, gpu_mem_mib=h.mem_mib, selector=selector)
