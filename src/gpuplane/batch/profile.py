"""What the planner knows about each stage's cost: measured, remembered, or declared.

Seconds per clip come, in order, from the caller, from the profiles earlier runs left in the
stage cache, from timing one clip through the chain (`calibrate`), or from the declared slice
share as a stand-in. `expected_hits` probes the cache for a few clips, so a stage that will be
served from the cache is planned as nearly free (`plan_stages`) and its devices go to the stages
that will run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuplane.batch.cache import StageCache
from gpuplane.batch.clips import ClipRef
from gpuplane.batch.packing import BatchDevice, ModuleProfile, PackingPlan, plan_packing
from gpuplane.batch.pipeline import BoundStage, Pipeline, cache_keys

UNKNOWN_CPU_STAGE_S = 0.01


def calibrate(pipeline: Pipeline, data: Any) -> dict[str, float]:
    """Seconds per clip of each stage, measured by running the chain once in this process."""
    values: dict[str, Any] = {}
    out: dict[str, float] = {}
    for s in pipeline.stages:
        args = s.inputs_from(data, values)
        bound = BoundStage(s)
        t = time.perf_counter()
        values[s.name] = bound(*args)
        out[s.name] = time.perf_counter() - t
    return out


def resolve_profile(
    pipeline: Pipeline,
    given: Mapping[str, float] | None,
    cache: StageCache | None,
    card_mem_mib: int,
    sample: Callable[[], Any] | None,
) -> tuple[dict[str, float], str]:
    """(seconds per clip per stage, where they came from). `sample` returns a decoded clip."""
    if given:
        profile, source = dict(given), "given"
    elif cache is not None and (stored := cache.load_profile()):
        profile, source = stored, "measured by earlier runs"
    else:
        profile, source = {}, "declared shares"
    missing = [s for s in pipeline.stages if s.name not in profile]
    if missing and sample is not None:
        return calibrate(pipeline, sample()), "timed on one clip"
    for s in missing:
        profile[s.name] = s.slice.share(card_mem_mib) if s.slice.is_gpu else UNKNOWN_CPU_STAGE_S
    return profile, source


def expected_hits(
    pipeline: Pipeline, cache: StageCache | None, probe: Sequence[ClipRef]
) -> dict[str, float]:
    """Share of the probe clips whose entry each stage already has in the cache."""
    if cache is None or not probe:
        return {}
    hits = dict.fromkeys((s.name for s in pipeline.stages), 0)
    for ref in probe:
        keys = cache_keys(pipeline, ref.fingerprint)
        for s in pipeline.looked_up():
            if cache.contains(s.name, s.version, keys[s.name]):
                hits[s.name] += 1
    return {name: n / len(probe) for name, n in hits.items()}


def plan_stages(
    pipeline: Pipeline,
    profile: Mapping[str, float],
    hits: Mapping[str, float],
    devices: Sequence[BatchDevice],
    *,
    heavy_share: float,
    max_replicas: int,
) -> PackingPlan:
    """The packing plan of the stages, each at its seconds per clip less its expected hits."""
    mods = [
        ModuleProfile(s.name, s.slice, profile.get(s.name, 0.0) * (1 - hits.get(s.name, 0)))
        for s in pipeline.stages
    ]
    return plan_packing(
        mods,
        devices,
        heavy_share=heavy_share,
        max_replicas=max_replicas,
        max_cpu_replicas=min(4, max_replicas),
    )
