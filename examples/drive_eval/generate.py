"""Seeded generator of synthetic driving clips (camera frames, lidar sweeps, ego poses).

Real clips are ~5 minutes of sensor data; these keep the shapes and ratios at a size that fits
this machine: 6 camera frames of 120x200 RGB, 6 lidar sweeps of 16,000 points (x, y, z,
intensity), 300 ego poses (t, x, y, z, yaw, v, steer). One uncompressed .npz per clip, ~2 MB.

    python examples/drive_eval/generate.py /tmp/clips --clips 20 --seed 0
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np

FRAMES, H, W, POINTS, POSES = 6, 120, 200, 16_000, 300


def make_clip(seed: int, index: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, index])
    t = np.linspace(0, 300, POSES, dtype=np.float32)
    speed = 8 + 4 * rng.random()
    curve = rng.normal(0, 0.002)
    yaw = curve * t + 0.05 * np.sin(t / 20 + rng.random())
    x = np.cumsum(np.cos(yaw)) * speed
    y = np.cumsum(np.sin(yaw)) * speed + rng.normal(0, 0.3, POSES)
    poses = np.stack(
        [t, x, y, np.zeros_like(t), yaw, np.full_like(t, speed), np.gradient(yaw)], axis=1
    ).astype(np.float32)
    frames = rng.integers(0, 255, (FRAMES, H, W, 3), dtype=np.uint8)
    frames[:, H // 2 :, :, :] //= 2  # road darker than sky
    n_obj = int(rng.integers(3, 12))
    objs = rng.uniform([-40, -20], [60, 20], (n_obj, 2)).astype(np.float32)
    pts = rng.normal(0, 25, (FRAMES, POINTS, 4)).astype(np.float32)
    for f in range(FRAMES):
        k = POINTS // 4
        centers = objs[rng.integers(0, n_obj, k)]
        pts[f, :k, :2] = centers + rng.normal(0, 0.8, (k, 2))
        pts[f, :, 2] = np.abs(pts[f, :, 2]) * 0.05
        pts[f, :, 3] = rng.random(POINTS)
    return {"frames": frames, "points": pts, "poses": poses, "objects": objs}


def encode(clip: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **clip)
    return buf.getvalue()


def decode(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data)) as z:
        return {k: z[k] for k in z.files}


def generate(out: Path, clips: int, seed: int = 0) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(clips):
        path = out / f"clip-{seed:03d}-{i:06d}.npz"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(encode(make_clip(seed, i)))
            tmp.replace(path)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--clips", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    paths = generate(args.out, args.clips, args.seed)
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} clips, {size / 1e6:.1f} MB in {args.out}")


if __name__ == "__main__":
    main()
