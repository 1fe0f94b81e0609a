"""The reference pipeline: clip → perception (stage A) → five checks (stage B) → per-clip record.

    python examples/drive_eval/generate.py /tmp/clips --clips 20
    gpuplane batch run examples/drive_eval --clips slowfile:///tmp/clips --gpus 2

Slices are declared for 80 GiB cards: perception takes 45 % of a card; the checks take 10-30 %
and localization runs on CPU only. Bump a check's version (`--stage-version lane_rules=2`) and
the next run serves perception from the stage cache.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from drive_eval import generate, modules, storage
from drive_eval.model import Perception
from gpuplane.batch import Pipeline, Stage
from gpuplane.resources import Slice

storage.register()
A = "perception"
B = ("lane_rules", "obstacle_rules", "planning_check", "lane_prediction", "localization_check")


def reduce(clip_id: str, out: Mapping[str, Any]) -> dict[str, Any]:
    return {name: out[name] for name in B}


def aggregate(acc: dict[str, Any], out: Mapping[str, Any]) -> dict[str, Any]:
    """Release metrics over all clips, folded one clip record at a time."""
    n = acc.get("clips", 0) + 1

    def mean(key: str, value: float) -> float:
        return float(acc.get(key, 0.0) + (value - acc.get(key, 0.0)) / n)

    return {
        "clips": n,
        "lane_departures": acc.get("lane_departures", 0) + out["lane_rules"]["departures"],
        "min_ttc_s": min(acc.get("min_ttc_s", float("inf")), out["obstacle_rules"]["min_ttc_s"]),
        "plan_ok_rate": mean("plan_ok_rate", float(out["planning_check"]["plan_ok"])),
        "curvature_err": mean("curvature_err", out["lane_prediction"]["curvature_err"]),
        "max_drift_m": max(acc.get("max_drift_m", 0.0), out["localization_check"]["drift_m"]),
    }


def build_pipeline() -> Pipeline:
    def sl(mem_gib: int, cores: int) -> Slice:
        return Slice(gpus=1, gpu_mem_mib=mem_gib * 1024, gpu_cores_pct=cores)

    return Pipeline(
        name="drive_eval",
        stages=(
            Stage(A, "1", Perception, inputs=("clip",), slice=sl(30, 45), params={"seed": 0}),
            Stage("lane_rules", "1", modules.lane_rules, inputs=(A,), slice=sl(2, 10)),
            Stage("obstacle_rules", "1", modules.obstacle_rules, inputs=(A,), slice=sl(4, 15)),
            Stage("planning_check", "1", modules.planning_check, inputs=(A,), slice=sl(8, 25)),
            Stage("lane_prediction", "1", modules.LanePrediction, inputs=(A,), slice=sl(12, 30)),
            Stage("localization_check", "1", modules.localization_check, inputs=(A,)),
        ),
        decode=generate.decode,
        reduce=reduce,
        aggregate=aggregate,
    )
