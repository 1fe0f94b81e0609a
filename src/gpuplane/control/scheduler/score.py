"""Score: the policy's scores, plus the weighted GPU-speed term, and the pick of the best candidate.

The speed term follows the Kubernetes scheduler framework: each candidate scores
`MAX_NODE_SCORE * speed / fastest candidate's speed` (DefaultNormalizeScore), and it is added,
times the policy's `speed_weight` and rescaled to the policy's own 0..`max_score` range, to the
policy's score. When every candidate has the same speed (one GPU model allowed, or no speed
data), or the weight is 0 (the default: measured, a greedy preference for fast cards cost
placements and throughput, see `base.DEFAULT_SPEED_WEIGHT`), the term is left out entirely, so
policies decide exactly as without it. Where a node's speed comes from: `nodeinfo.py`.

A request with a `spread` group (a deployment's version) is placed on the candidate whose
cluster holds the fewest of its group, then whose node does (Kubernetes'
topologySpreadConstraints with `whenUnsatisfiable: ScheduleAnyway`, applied lexicographically:
clusters, then nodes); the policy decides among those. Only candidates are compared, so the
preference never leaves a request unplaced: a full cluster simply is not one. Losing one failure
domain then leaves the group's other instances serving.
"""

from __future__ import annotations

import numpy as np

from gpuplane.control.scheduler.base import Candidates, Policy, Scores
from gpuplane.control.scheduler.decision import FloatArray

MAX_NODE_SCORE = 100.0  # Kubernetes' framework.MaxNodeScore


def pick(cands: Candidates, policy: Policy, rng: np.random.Generator) -> tuple[int, Scores, float]:
    """Score every candidate (>= 1) and pick the best: the candidate's position in `cands`,
    the policy's scores (its card choice) and the winner's total score. Ties go to a random
    candidate drawn with `rng`, or the earliest for policies with `ties = "first"`."""
    cands.rng = rng
    scores = policy.score(cands)
    total = _spread(_with_speed(scores.nodes, cands, policy), cands)
    best = np.flatnonzero(total == total.max())
    if len(best) > 1 and policy.ties == "random":
        chosen = int(best[rng.integers(len(best))])
    else:
        chosen = int(best[0])
    return chosen, scores, float(total[chosen])


def _with_speed(nodes: FloatArray, cands: Candidates, policy: Policy) -> FloatArray:
    """The policy's scores plus its weighted GPU-speed term; unchanged when the term is off,
    the request takes no GPU, or every candidate is equally fast."""
    if not policy.speed_weight or not cands.request.is_gpu:
        return nodes
    term = speed_score(cands.snapshot.gpu_speed[cands.nodes])
    if term is None:
        return nodes
    out: FloatArray = nodes + term * (policy.speed_weight * policy.max_score / MAX_NODE_SCORE)
    return out


def _spread(total: FloatArray, cands: Candidates) -> FloatArray:
    """`total` where a candidate's cluster, then node, holds the fewest of the request's spread
    group; -inf elsewhere. Unchanged without a group."""
    group = cands.request.spread
    if group is None:
        return total
    snap = cands.snapshot
    on_cluster, on_node = snap.spread_counts(group)
    key = on_cluster[snap.node_cluster[cands.nodes]] * (int(on_node.max()) + 1)
    key += on_node[cands.nodes]
    out: FloatArray = np.where(key == key.min(), total, -np.inf)
    return out


def speed_score(speeds: FloatArray) -> FloatArray | None:
    """0..MAX_NODE_SCORE per candidate (speed over the fastest candidate's), or None when all
    candidates are equally fast (the term would not change any decision)."""
    if len(speeds) == 0:
        return None
    top = float(speeds.max())
    if float(speeds.min()) == top:
        return None
    score: FloatArray = speeds * (MAX_NODE_SCORE / top)
    return score
