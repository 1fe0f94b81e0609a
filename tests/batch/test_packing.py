"""The packing planner: heavy modules alone, light ones packed, replicas at matching rates."""

from __future__ import annotations

import pytest

from gpuplane.batch.packing import CPU, BatchDevice, ModuleProfile, plan_packing
from gpuplane.errors import ResourceError
from gpuplane.resources import Slice


def frac(mem: int, pct: int) -> Slice:
    return Slice(gpus=1, gpu_mem_mib=mem, gpu_cores_pct=pct)


DEVS = (BatchDevice("gpu0", 80_000), BatchDevice("gpu1", 80_000), BatchDevice("gpu2", 80_000))


def test_heavy_module_alone_light_ones_packed_together() -> None:
    mods = [
        ModuleProfile("perception", Slice(gpus=1), 1.0),
        ModuleProfile("lanes", frac(4_000, 10), 0.05),
        ModuleProfile("obstacles", frac(8_000, 20), 0.05),
        ModuleProfile("planning", frac(8_000, 25), 0.05),
    ]
    plan = plan_packing(mods, DEVS)
    heavy = {p.device for p in plan.replicas_of("perception")}
    light = {p.device for m in ("lanes", "obstacles", "planning") for p in plan.replicas_of(m)}
    assert heavy.isdisjoint(light)
    assert len(light) == 1  # three light modules share one card
    assert plan.replica_counts["perception"] == 2  # the two cards the light ones left free
    assert plan.bottleneck == "perception"
    assert all(v <= 1.0 + 1e-9 for v in plan.device_load.values())


def test_replicas_match_rates_by_water_filling() -> None:
    mods = [
        ModuleProfile("a", frac(10_000, 20), 0.4),
        ModuleProfile("b", frac(5_000, 10), 0.1),
    ]
    plan = plan_packing(mods, (BatchDevice("gpu0", 80_000),))
    # a is 4x slower than b: 4 replicas of a and 1 of b run at the same rate (0.9 of the card;
    # a fifth a would not fit)
    assert plan.replica_counts == {"a": 4, "b": 1}
    assert plan.rates["a"] == pytest.approx(10.0)
    assert plan.rates["b"] == pytest.approx(10.0)
    assert plan.device_load["gpu0"] == pytest.approx(0.9)
    assert plan.throughput == pytest.approx(10.0)


def test_memory_share_counts_and_cpu_modules_need_no_card() -> None:
    mods = [
        ModuleProfile("big_mem", frac(60_000, 10), 0.02),  # 75 % of the memory: heavy
        ModuleProfile("small", frac(20_000, 5), 0.1),
        ModuleProfile("cpu_only", Slice(), 0.05),
    ]
    plan = plan_packing(mods, DEVS[:2], max_cpu_replicas=3)
    assert plan.share_of("big_mem") == pytest.approx(1.0)  # alone on its card
    assert plan.share_of("small") == pytest.approx(0.25)  # memory share, not 5 % cores
    assert plan.replica_counts["small"] == 4  # the other card: 4 x 20 GB
    big = {p.device for p in plan.replicas_of("big_mem")}
    assert big.isdisjoint({p.device for p in plan.replicas_of("small")})
    assert {p.device for p in plan.replicas_of("cpu_only")} == {CPU}
    assert plan.replica_counts["cpu_only"] == 2  # 40 clips/s, as fast as the 4 small ones


def test_refuses_with_reasons() -> None:
    with pytest.raises(ResourceError, match="does not fit"):
        plan_packing([ModuleProfile("x", Slice(gpus=1), 1.0)] * 1, ())
    with pytest.raises(ResourceError, match="one card per replica"):
        plan_packing([ModuleProfile("x", Slice(gpus=2), 1.0)], DEVS)
    with pytest.raises(ResourceError, match="nothing to plan"):
        plan_packing([], DEVS)


def test_fast_modules_get_no_replicas_past_the_useful_rate() -> None:
    mods = [
        ModuleProfile("cached_a", frac(30_000, 45), 0.0),  # served from cache: free
        ModuleProfile("tiny", frac(2_000, 10), 0.0002),  # 5,000 clips/s on one replica
        ModuleProfile("slow", frac(8_000, 10), 0.05),
    ]
    plan = plan_packing(mods, DEVS[:2], enough_rate=100.0)
    assert plan.replica_counts["tiny"] == 1
    assert plan.replica_counts["cached_a"] == 1
    assert plan.replica_counts["slow"] == 5  # 100 clips/s reached at 5 x 20
    assert plan.notes == ("every module runs at >= 100 clips/s",)
