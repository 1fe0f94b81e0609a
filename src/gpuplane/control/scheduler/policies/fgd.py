"""FGD as published (Weng et al., ATC'23): minimise the expected growth of GPU fragmentation.

Score = int(100 * sigmoid((F_before - F_after) / 1000)) per node, where F is the node's
fragmentation under the workload mix's task distribution (`fragmentation.py`); a shared task goes
to the node's first card with the best score; integer scores, ties to the earliest node (the
published simulator's host selection takes the smallest node name). The mix is the paper's
"typical pods": classes by CPU, GPU share, card count and GPU model (host memory does not tell
them apart), the most popular covering 95 % of the pods, weights renormalised over those.
Kept as the reference that gpuplane's own `frag` policy is measured against.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.decision import FloatArray, Request
from gpuplane.control.scheduler.delta_cache import DeltaCache
from gpuplane.control.scheduler.fragmentation import OnlineWorkloadMix, WorkloadMix
from gpuplane.control.scheduler.registry import register


class FragmentationPolicy(Policy):
    """Shared base: a fixed workload mix (simulations), or one learned from the requests seen."""

    def __init__(
        self, mix: WorkloadMix | None = None, *, speed_weight: float | None = None
    ) -> None:
        super().__init__(speed_weight=speed_weight)
        self._fixed = mix
        self._online = None if mix is not None else OnlineWorkloadMix(use_memory=self.use_memory)
        self._cache = DeltaCache()

    def delta(self, cands: Candidates) -> FloatArray:
        """dV of placing the request on each candidate (and card), cached per node version."""
        return self._cache.delta(self.mix, cands)

    popularity = 1.0  # share of the requests the mix's classes cover
    use_memory = False  # whether a class needs the node's host memory too (FGD: CPU only)

    @classmethod
    def for_mix(cls, requests: Sequence[Request]) -> Policy:
        return cls(WorkloadMix.from_requests(requests, cls.popularity, cls.use_memory))

    @property
    def mix(self) -> WorkloadMix:
        if self._fixed is not None:
            return self._fixed
        assert self._online is not None
        return self._online.mix

    def observe(self, request: Request) -> None:
        if self._online is not None:
            self._online.observe(request)


@register
class FGDPolicy(FragmentationPolicy):
    name = "fgd"
    ties = "first"
    description = "fragmentation gradient descent as published: sigmoid, integer scores"
    popularity = 0.95  # the published simulator keeps the classes covering 95 % of the tasks

    def score(self, cands: Candidates) -> Scores:
        w = self.mix
        gain = w.total_weight * cands.request.gpu_demand_milli + self.delta(cands)
        with np.errstate(over="ignore"):
            score = np.trunc(100.0 / (1.0 + np.exp(-gain / 1000.0)))
        if score.ndim == 1:
            return Scores(score)
        score = np.where(np.isfinite(gain), score, -1.0)
        cards = np.argmax(score, axis=1).astype(np.int64)
        return Scores(score[np.arange(len(cards)), cards], cards)
