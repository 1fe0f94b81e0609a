"""Binpack: the node that is most allocated after placing (Kubernetes' MostAllocated), GPU first.

Utilisation after placing, weighted GPU 2 : CPU 1 : memory 1; the best-fitting shared card.
"""

from __future__ import annotations

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.decision import MILLI_PER_GPU, FloatArray
from gpuplane.control.scheduler.registry import register

WEIGHTS = (2.0, 1.0, 1.0)  # GPU, CPU, memory


def utilisation_after(cands: Candidates) -> FloatArray:
    """Weighted share of each candidate node in use once the request is placed, in [0, 1]."""
    snap, r, rows = cands.snapshot, cands.request, cands.nodes
    wg, wc, wm = WEIGHTS
    gpu_cap = snap.n_devices[rows] * MILLI_PER_GPU
    gpu = 1.0 - cands.gpu_left() / (gpu_cap + (gpu_cap == 0))
    gpu = gpu * (gpu_cap > 0)
    cpu = 1.0 - cands.cpu_left() / (snap.cpu_cap[rows] + (snap.cpu_cap[rows] == 0))
    mem_left = snap.mem_free[rows] - r.memory_mib
    mem = 1.0 - mem_left / (snap.mem_cap[rows] + (snap.mem_cap[rows] == 0))
    out: FloatArray = (wg * gpu + wc * cpu + wm * mem) / (wg + wc + wm)
    return out


@register
class BinpackPolicy(Policy):
    name = "binpack"
    description = "most allocated node after placing (GPU-weighted); best-fitting card"
    max_score = 1.0  # utilisation in [0, 1]

    def score(self, cands: Candidates) -> Scores:
        return Scores(utilisation_after(cands))
