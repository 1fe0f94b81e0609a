"""Spread: the least allocated node after placing (Kubernetes' LeastAllocated), the freest card.

For latency-sensitive work that should not share a card or node with others when it can avoid it.
"""

from __future__ import annotations

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.decision import MILLI_PER_GPU
from gpuplane.control.scheduler.policies.binpack import utilisation_after
from gpuplane.control.scheduler.registry import register


@register
class SpreadPolicy(Policy):
    name = "spread"
    description = "least allocated node after placing; the card with the most free"
    max_score = 1.0  # utilisation in [0, 1]

    def score(self, cands: Candidates) -> Scores:
        nodes = 1.0 - utilisation_after(cands)
        if cands.card_fit is None:
            return Scores(nodes)
        snap = cands.snapshot
        free = snap.dev_milli_free[cands.nodes] * (MILLI_PER_GPU + 1) + snap.dev_mem_free[
            cands.nodes
        ] * MILLI_PER_GPU // np.maximum(snap.dev_mem_cap[cands.nodes], 1)
        key = np.where(cands.card_fit, free, -1)
        return Scores(nodes, np.argmax(key, axis=1).astype(np.int64))
