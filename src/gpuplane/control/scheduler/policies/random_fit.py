"""Random: any node that fits, any card that fits (the published baseline "Random")."""

from __future__ import annotations

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.registry import register


@register
class RandomPolicy(Policy):
    name = "random"
    description = "uniformly random fitting node and card (baseline)"

    def score(self, cands: Candidates) -> Scores:
        rng = cands.rng or np.random.default_rng()
        nodes = np.zeros(len(cands))
        if cands.card_fit is None:
            return Scores(nodes)
        key = np.where(cands.card_fit, rng.random(cands.card_fit.shape), -1.0)
        return Scores(nodes, np.argmax(key, axis=1).astype(np.int64))
