"""Stage B: five evaluation modules over the perception output, each with its own cost profile.

They read only stage A's output (detections, lane map, BEV descriptors, ego poses), so a release
that changes only these modules re-uses every cached perception result and never re-downloads a
clip.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def lane_rules(perc: dict[str, Any], tolerance_m: float = 1.5) -> dict[str, float]:
    """Lane keeping: how often the ego drifts from the lane centre seen in the lane map."""
    lanes = perc["lanes"].astype(np.float32)
    centre = lanes.argmax(axis=2).mean(axis=1) - lanes.shape[2] / 2  # per frame, in cells
    poses = perc["poses"]
    lateral = poses[:, 2] - np.convolve(poses[:, 2], np.ones(15) / 15, mode="same")
    offsets = np.abs(lateral[:: max(1, len(lateral) // len(centre))][: len(centre)] + centre * 0.1)
    return {"departures": int((offsets > tolerance_m).sum()), "max_offset_m": float(offsets.max())}


def obstacle_rules(perc: dict[str, Any], min_gap_m: float = 4.0) -> dict[str, float]:
    """Time to collision with each detection, per frame."""
    d = perc["detections"]
    speed = float(perc["poses"][:, 5].mean())
    ahead = (d[..., 0] > 0) & (np.abs(d[..., 1]) < 2.5) & (d[..., 5] > 0.5)
    gaps = np.where(ahead, d[..., 0] - d[..., 2] / 2, np.inf)
    ttc = gaps.min(axis=1) / max(speed, 0.1)
    pair = np.linalg.norm(d[:, :, None, :2] - d[:, None, :, :2], axis=-1)
    return {"min_ttc_s": float(ttc.min()), "close_pairs": int((pair < min_gap_m).sum())}


def planning_check(
    perc: dict[str, Any], candidates: int = 512, horizon: int = 40
) -> dict[str, Any]:
    """Roll out candidate trajectories and score them against obstacles and lanes."""
    rng = np.random.default_rng(0)
    curv = rng.normal(0, 0.02, (candidates, 1))
    t = np.arange(horizon, dtype=np.float32)[None, :] * 0.5
    speed = float(perc["poses"][:, 5].mean())
    x = speed * t * np.cos(curv * t)
    y = speed * t * np.sin(curv * t)
    cost = np.zeros(candidates, np.float32)
    for f in range(perc["detections"].shape[0]):
        obj = perc["detections"][f][:, :2]
        dist = np.hypot(x[..., None] - obj[:, 0], y[..., None] - obj[:, 1]).min(axis=(1, 2))
        cost += np.exp(-dist)
    cost += np.abs(curv[:, 0]) * 10
    best = int(cost.argmin())
    return {"plan_ok": bool(cost[best] < 1.0), "best_cost": float(cost[best])}


class LanePrediction:
    """A small MLP predicting lane curvature from BEV descriptors (weights built once)."""

    def __init__(self, seed: int = 1, hidden: int = 256) -> None:
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((64, hidden)).astype(np.float32) / 8
        self.w2 = rng.standard_normal((hidden, hidden)).astype(np.float32) / 16
        self.w3 = rng.standard_normal((hidden, 3)).astype(np.float32) / 16

    def __call__(self, perc: dict[str, Any]) -> dict[str, float]:
        h = np.tanh(perc["descriptors"] @ self.w1)
        for _ in range(8):
            h = np.tanh(h @ self.w2)
        pred = h @ self.w3
        truth = np.gradient(perc["poses"][:, 4])[: len(pred)]
        return {"curvature_err": float(np.abs(pred[:, 0] * 1e-3 - truth).mean())}


def localization_check(perc: dict[str, Any]) -> dict[str, float]:
    """Drift between ego poses and descriptor-matched odometry (CPU-only: no device share)."""
    desc = perc["descriptors"]
    sim = desc @ desc.T / (np.linalg.norm(desc, axis=1)[:, None] ** 2 + 1e-6)
    poses = perc["poses"]
    steps = np.diff(poses[:, 1:3], axis=0)
    odo = np.cumsum(steps * (1 + 0.001 * np.tanh(sim.mean())), axis=0)
    drift = np.linalg.norm(odo[-1] - (poses[-1, 1:3] - poses[0, 1:3]))
    return {"drift_m": float(drift)}
