"""The per-node terms of a workload mix's fragmentation (`fragmentation.py`), as arrays by row.

`Levels` and `NodeTerms` are what `WorkloadMix` computes for a set of nodes and what
`DeltaCache` keeps between decisions; `take` and `put` move rows in and out, so a cache can
recompute only the rows that changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuplane.control.scheduler.decision import BoolArray, FloatArray, IntArray

TERMS_DTYPE = np.int32  # a group's free milli on one node: at most 1000 per card


@dataclass(slots=True)
class Levels:
    """Where each row stands in a mix's tables: its CPU and memory levels (`WorkloadMix.levels`)
    and its groups' terms [cnt_g >= k_g] U_g (`WorkloadMix.terms`). They do not depend on the
    classes' weights, so V = `WorkloadMix.weigh` of them can be recomputed for new weights."""

    lc: IntArray  # (n,)
    lm: IntArray  # (n,)
    terms: IntArray  # (n, G), or (n, D, G) after a fractional placement on each card

    @classmethod
    def empty(cls, nodes: int, *groups: int) -> Levels:
        lc, lm = np.zeros(nodes, dtype=np.int64), np.zeros(nodes, dtype=np.int64)
        return cls(lc, lm, np.zeros((nodes, *groups), dtype=TERMS_DTYPE))

    def take(self, rows: IntArray) -> Levels:
        return Levels(self.lc[rows], self.lm[rows], self.terms[rows])

    def put(self, rows: IntArray, other: Levels) -> None:
        self.lc[rows], self.lm[rows], self.terms[rows] = other.lc, other.lm, other.terms


@dataclass(slots=True)
class NodeTerms:
    """A node's terms under a mix before a placement, per row: effective free milli per card
    (n, D), whether each card reaches each threshold (n, D, M), the count and free milli of
    those cards (n, M), its `Levels`, and V (n,)."""

    free: IntArray
    ge: BoolArray
    cnt: IntArray
    usable: IntArray
    levels: Levels
    value: FloatArray

    @classmethod
    def empty(cls, nodes: int, devices: int, thresholds: int, groups: int) -> NodeTerms:
        return cls(
            np.zeros((nodes, devices), dtype=np.int64),
            np.zeros((nodes, devices, thresholds), dtype=bool),
            np.zeros((nodes, thresholds), dtype=np.int64),
            np.zeros((nodes, thresholds), dtype=np.int64),
            Levels.empty(nodes, groups),
            np.zeros(nodes),
        )

    def take(self, rows: IntArray) -> NodeTerms:
        return NodeTerms(
            self.free[rows],
            self.ge[rows],
            self.cnt[rows],
            self.usable[rows],
            self.levels.take(rows),
            self.value[rows],
        )

    def put(self, rows: IntArray, terms: NodeTerms) -> None:
        self.free[rows] = terms.free
        self.ge[rows] = terms.ge
        self.cnt[rows] = terms.cnt
        self.usable[rows] = terms.usable
        self.levels.put(rows, terms.levels)
        self.value[rows] = terms.value
