"""gpuplane's fragmentation-aware policy: FGD's gradient at full precision, best fit on ties.

Like FGD it places each task where the expected fragmentation of the estate grows least
(`fragmentation.py`), but (1) it ranks nodes and cards by the exact change instead of an integer
0-100 sigmoid that turns most of the ranking into coin flips, and (2) it breaks remaining ties by
best fit: the card with the least free share, then the node with the least GPU and CPU left.
Without a given workload it learns the task distribution from the requests it is asked to place.
"""

from __future__ import annotations

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Scores
from gpuplane.control.scheduler.fragmentation import effective_free
from gpuplane.control.scheduler.policies.fgd import FragmentationPolicy
from gpuplane.control.scheduler.registry import register
from gpuplane.control.scheduler.snapshot import MILLI_PER_GPU

_RESOLUTION = 1e-6  # dV is a sum of weights x milli; differences below this are ties
_TIE = 1e-8  # scale of the best-fit tie-break, well below _RESOLUTION


@register
class FragPolicy(FragmentationPolicy):
    name = "frag"
    description = "fragmentation-aware (FGD at full precision, best-fit ties); the default"

    def score(self, cands: Candidates) -> Scores:
        snap = cands.snapshot
        gain = np.round(self.delta(cands) / _RESOLUTION) * _RESOLUTION
        max_cpu = max(int(snap.cpu_cap.max()), 1)
        max_gpu = max(int(snap.n_devices.max()) * MILLI_PER_GPU, 1)
        left = 0.5 * cands.cpu_left() / max_cpu + 0.5 * cands.gpu_left() / max_gpu
        if gain.ndim == 1:
            return Scores(gain - _TIE * left)
        free = effective_free(snap, cands.nodes) / MILLI_PER_GPU
        card_score = np.where(np.isfinite(gain), gain - _TIE * free, -np.inf)
        cards = np.argmax(card_score, axis=1).astype(np.int64)
        best = gain[np.arange(len(cards)), cards]
        return Scores(best - _TIE * left, cards)
