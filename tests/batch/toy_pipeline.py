"""A small pipeline for the batch tests, loadable by path in worker processes and Ray actors.

Stage A sums the clip's bytes (sleeping `TOY_SLEEP_S` first, so a test can kill a run midway);
three stage-B modules read A's output. Every call appends one line to `$TOY_LOG` when set, so
tests can count real executions across processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from gpuplane.batch import Pipeline, Stage
from gpuplane.resources import Slice


def _log(stage: str, detail: str) -> None:
    path = os.environ.get("TOY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{stage} {detail} {os.getpid()}\n")


def perception(data: bytes, scale: int = 1) -> dict[str, int]:
    time.sleep(float(os.environ.get("TOY_SLEEP_S", "0")))
    if data.startswith(b"FAIL"):
        raise ValueError("this clip is broken on purpose")
    _log("perception", str(len(data)))
    return {"sum": sum(data) * scale, "n": len(data)}


def size_check(a: Mapping[str, int]) -> int:
    _log("size_check", str(a["n"]))
    return a["n"]


def sum_check(a: Mapping[str, int]) -> int:
    _log("sum_check", str(a["n"]))
    return a["sum"] % 97


class ParityCheck:
    def __init__(self, mod: int = 2) -> None:
        self.mod = mod

    def __call__(self, a: Mapping[str, int]) -> int:
        _log("parity_check", str(a["n"]))
        return a["sum"] % self.mod


def reduce(clip_id: str, out: Mapping[str, Any]) -> dict[str, Any]:
    return {k: out[k] for k in ("size_check", "sum_check", "parity_check")}


def aggregate(acc: dict[str, Any], out: Mapping[str, Any]) -> dict[str, Any]:
    return {"clips": acc.get("clips", 0) + 1, "bytes": acc.get("bytes", 0) + out["size_check"]}


def build_pipeline() -> Pipeline:
    a = Slice(gpus=1, gpu_mem_mib=20_000, gpu_cores_pct=40)
    return Pipeline(
        name="toy",
        stages=(
            Stage("perception", "1", perception, slice=a, params={"scale": 1}),
            Stage("size_check", "1", size_check, inputs=("perception",),
                  slice=Slice(gpus=1, gpu_mem_mib=2_000, gpu_cores_pct=10)),
            Stage("sum_check", "1", sum_check, inputs=("perception",),
                  slice=Slice(gpus=1, gpu_mem_mib=4_000, gpu_cores_pct=20)),
            Stage("parity_check", "1", ParityCheck, inputs=("perception",), params={"mod": 3}),
        ),
        reduce=reduce,
        aggregate=aggregate,
    )  # fmt: skip
