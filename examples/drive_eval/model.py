"""Stage A: a small NumPy perception network over camera frames and lidar points.

Camera branch: 8x8 patches → 2-layer MLP → one self-attention layer (a ViT block, no training:
seeded weights). Lidar branch: a PointNet-style per-point MLP, max-pooled into a 32x32 bird's-eye
grid. Fused heads give per-frame detections, a lane map and a BEV descriptor. It is real compute
(matrix products over every point and patch) and dominates the pipeline's time, as perception
does in production.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GRID = 32
EXTENT = 64.0  # metres each side of the ego vehicle


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


class Perception:
    """Built once per worker (weights "load" here), then called once per clip."""

    def __init__(self, seed: int = 0, width: int = 128, top_k: int = 32) -> None:
        rng = np.random.default_rng(seed)
        w = width

        def lin(i: int, o: int) -> np.ndarray:
            return (rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32)

        self.p1, self.p2 = lin(8 * 8 * 3, w), lin(w, w)
        self.q, self.k, self.v = lin(w, w), lin(w, w), lin(w, w)
        self.l1, self.l2, self.l3 = lin(4, 64), lin(64, w), lin(w, w)
        self.det = lin(2 * w, 6)
        self.lane = lin(2 * w, 1)
        self.desc = lin(2 * w, 64)
        self.top_k = top_k

    def camera(self, frame: np.ndarray) -> np.ndarray:
        h, w, _ = frame.shape
        x = frame[: h // 8 * 8, : w // 8 * 8].astype(np.float32) / 255.0
        patches = x.reshape(h // 8, 8, w // 8, 8, 3).transpose(0, 2, 1, 3, 4).reshape(-1, 192)
        tok = _relu(_relu(patches @ self.p1) @ self.p2)
        q, k, v = tok @ self.q, tok @ self.k, tok @ self.v
        att = q @ k.T / np.sqrt(q.shape[1])
        att = np.exp(att - att.max(axis=1, keepdims=True))
        att /= att.sum(axis=1, keepdims=True)
        return (att @ v).mean(axis=0)

    def lidar(self, pts: np.ndarray) -> np.ndarray:
        feat = _relu(_relu(_relu(pts @ self.l1) @ self.l2) @ self.l3)
        ij = np.clip(((pts[:, :2] + EXTENT) / (2 * EXTENT) * GRID).astype(np.int64), 0, GRID - 1)
        cell = ij[:, 0] * GRID + ij[:, 1]
        order = np.argsort(cell, kind="stable")
        cell, feat = cell[order], feat[order]
        starts = np.flatnonzero(np.r_[True, cell[1:] != cell[:-1]])
        bev = np.zeros((GRID * GRID, feat.shape[1]), np.float32)
        bev[cell[starts]] = np.maximum.reduceat(feat, starts, axis=0)
        return bev

    def __call__(self, clip: dict[str, np.ndarray]) -> dict[str, Any]:
        dets, lanes, descs = [], [], []
        for f in range(clip["frames"].shape[0]):
            cam = self.camera(clip["frames"][f])
            bev = self.lidar(clip["points"][f])
            fused = np.concatenate([bev, np.broadcast_to(cam, bev.shape)], axis=1)
            raw = fused @ self.det
            score = 1 / (1 + np.exp(-raw[:, 0]))
            score[~bev.any(axis=1)] = 0.0
            top = np.argsort(-score)[: self.top_k]
            xy = (np.stack([top // GRID, top % GRID], 1) + 0.5) / GRID * 2 * EXTENT - EXTENT
            dets.append(np.column_stack([xy, np.abs(raw[top, 1:3]) + 1, raw[top, 3], score[top]]))
            lanes.append((fused @ self.lane).reshape(GRID, GRID).astype(np.float16))
            descs.append((fused.max(axis=0) @ self.desc).astype(np.float32))
        return {
            "detections": np.stack(dets).astype(np.float32),
            "lanes": np.stack(lanes),
            "descriptors": np.stack(descs),
            "poses": clip["poses"],
        }
