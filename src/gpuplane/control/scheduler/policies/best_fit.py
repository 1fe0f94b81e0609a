"""Best-Fit: the node with the least CPU and GPU left after placing (the published baseline).

Score = int(100 * (1 - [0.5 (free CPU - request) / max CPU + 0.5 (free GPU - request) / max GPU]))
with max CPU / max GPU the largest node of the estate (128 cores / 8 GPUs on openb, the published
constants); integer scores, random ties, the shared card with the least free milli that fits.
"""

from __future__ import annotations

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.registry import register


@register
class BestFitPolicy(Policy):
    name = "best-fit"
    ties = "first"
    description = "least CPU + GPU left on the node after placing; integer scores (baseline)"

    def score(self, cands: Candidates) -> Scores:
        return Scores(np.trunc((1.0 - cands.best_fit_left()) * 100.0))
