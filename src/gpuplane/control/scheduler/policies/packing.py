"""GPU-Packing: fill shared cards first, then free cards of used nodes, then empty nodes.

The published baseline ("GPU Packing"), integer scores in three bands:
  1. the pod fits on partly used cards: 100 - (free % of the card it takes)/10, at least 50;
  2. it needs wholly free cards of a node already in use: 50 - cards taken, at least 33;
  3. the node is entirely free: 33 - its free cards, at least that count.
CPU-only pods score 0 everywhere (random among fitting nodes).
"""

from __future__ import annotations

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.decision import MILLI_PER_GPU
from gpuplane.control.scheduler.registry import register


@register
class PackingPolicy(Policy):
    name = "packing"
    ties = "first"
    description = "prefer partly used cards, then used nodes, then empty nodes (baseline)"

    def score(self, cands: Candidates) -> Scores:
        snap, r, rows = cands.snapshot, cands.request, cands.nodes
        if not r.is_gpu:
            return Scores(np.zeros(len(rows)))
        full = snap.full_free[rows]
        empty = full == snap.n_devices[rows]
        band3 = np.maximum(100 // 3 - full, full)
        if r.is_fractional:
            cards = cands.best_fit_cards()
            left = snap.dev_milli_free[rows, cards]
            band1 = np.maximum(100 - (left * 100 // MILLI_PER_GPU) // 10, 50)
            used = np.where(left == MILLI_PER_GPU, max(50 - 1, 100 // 3), band1)
            return Scores(np.where(empty, band3, used).astype(np.float64), cards)
        band2 = max(50 - r.gpus, 100 // 3)
        return Scores(np.where(empty, band3, band2).astype(np.float64))
