"""Workload mixes derived from a trace: they have the shares they claim, and keep the rest."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpuplane.control.lab.mixes import (
    MIXES,
    MixSpec,
    ModelStock,
    derive,
    gpu_models,
    kind_of,
    measure,
    mix_named,
)
from gpuplane.control.lab.simulate import load_nodes, load_pods
from gpuplane.control.scheduler import Request
from gpuplane.errors import ConfigError
from gpuplane.resources import Selector
from tests.control.scheduler.sched_helpers import node

OPENB = Path(__file__).resolve().parents[4] / "shared" / "data" / "openb"
MODELS = {"A100": ModelStock(64, 8), "T4": ModelStock(16, 2)}


def trace(n: int = 1000) -> list[Request]:
    """A synthetic trace: 20 % CPU-only, 40 % fractions, 35 % one card, 5 % four cards."""
    out = []
    for i in range(n):
        k = i % 20
        if k < 4:
            out.append(Request(f"p{i}", cpu_millis=2000 + i, memory_mib=1024))
        elif k < 12:
            out.append(Request(f"p{i}", gpu_milli=100 + 50 * (i % 9), cpu_millis=4000))
        elif k < 19:
            out.append(Request(f"p{i}", gpus=1, cpu_millis=8000, memory_mib=4096))
        else:
            out.append(Request(f"p{i}", gpus=4, cpu_millis=32_000))
    return out


def test_the_trace_is_measured_by_kind() -> None:
    shares = measure(trace())
    assert shares.cpu_only == pytest.approx(0.20)
    assert shares.fractional == pytest.approx(0.40 / 0.80)
    assert shares.multi_gpu == pytest.approx(0.05 / 0.80)
    assert shares.constrained == 0.0


@pytest.mark.parametrize("spec", MIXES, ids=lambda m: m.name)
def test_each_built_in_mix_has_the_shares_it_names(spec: MixSpec) -> None:
    pods = trace()
    before = measure(pods)
    out = derive(pods, spec, MODELS, np.random.default_rng(7))
    got = measure(out)
    assert len(out) == len(pods)
    one_pod = 1.0 / (len(pods) * (1 - max(got.cpu_only, before.cpu_only)))
    for axis in ("cpu_only", "fractional", "multi_gpu", "constrained"):
        claimed = getattr(spec, axis)
        if claimed is not None:
            assert getattr(got, axis) == pytest.approx(claimed, abs=one_pod), axis
    if spec.cpu_only is None:  # an axis left alone keeps the trace's share
        assert got.cpu_only == pytest.approx(before.cpu_only, abs=1 / len(pods))
    if spec.fractional is None and spec.multi_gpu is None:
        assert got.fractional == pytest.approx(before.fractional, abs=one_pod)
        assert got.multi_gpu == pytest.approx(before.multi_gpu, abs=one_pod)


def test_the_other_gpu_kinds_split_the_rest_in_the_traces_proportions() -> None:
    out = derive(trace(), MixSpec("m", fractional=0.8), MODELS, np.random.default_rng(1))
    kinds = Counter(kind_of(p) for p in out)
    # whole : multi in the trace is 7 : 1, so the 20 % left is 17.5 % + 2.5 %
    assert kinds["whole"] / (kinds["whole"] + kinds["multi"]) == pytest.approx(7 / 8, abs=0.01)
    assert measure(out).fractional == pytest.approx(0.8, abs=1e-3)


def test_pods_are_drawn_from_their_own_kind_without_repeats_while_there_are_enough() -> None:
    pods = trace()
    by_id = {p.job_id: p for p in pods}
    out = derive(pods, MixSpec("m", cpu_only=0.1), MODELS, np.random.default_rng(3))
    origins = [p.job_id.rsplit("-m-", 1)[0] for p in out]
    assert len(set(p.job_id for p in out)) == len(out)  # ids stay unique
    cpu = [o for o, p in zip(origins, out, strict=True) if kind_of(p) == "cpu"]
    assert len(cpu) == len(set(cpu)) == 100  # 100 of the 200 CPU pods, none twice
    for o, p in zip(origins, out, strict=True):  # every pod is a copy of one of its kind
        src = by_id[o]
        assert (kind_of(src), src.cpu_millis, src.gpu_milli) == (
            kind_of(p),
            p.cpu_millis,
            p.gpu_milli,
        )


def test_the_same_seed_derives_the_same_mix_and_another_seed_another() -> None:
    spec = mix_named("share60")
    a = derive(trace(), spec, MODELS, np.random.default_rng(5))
    b = derive(trace(), spec, MODELS, np.random.default_rng(5))
    c = derive(trace(), spec, MODELS, np.random.default_rng(6))
    assert a == b
    assert a != c


def test_constrained_pods_get_one_model_that_has_a_node_big_enough() -> None:
    out = derive(trace(), MixSpec("m", constrained=0.5), MODELS, np.random.default_rng(2))
    pinned = [p for p in out if p.selector.gpu_models]
    assert all(kind_of(p) != "cpu" for p in pinned)
    assert all(len(p.selector.gpu_models) == 1 for p in pinned)
    # four-card pods only fit the A100 nodes (8 cards); T4 nodes have 2
    assert all(p.selector.gpu_models == {"A100"} for p in pinned if p.gpus == 4)
    models = Counter(next(iter(p.selector.gpu_models)) for p in pinned if p.gpus <= 1)
    assert models["A100"] > models["T4"] > 0  # drawn by card count, 64 : 16


def test_a_mix_without_the_constraint_axis_keeps_the_traces_selectors() -> None:
    pods = [Request("a", gpus=1, selector=Selector(gpu_models=frozenset({"T4"})))] * 10
    assert measure(derive(pods, MixSpec("m"), MODELS, np.random.default_rng(0))).constrained == 1
    out = derive(pods, MixSpec("m", constrained=0.3), MODELS, np.random.default_rng(0))
    assert measure(out).constrained == pytest.approx(0.3)


def test_impossible_mixes_are_refused_with_what_to_change() -> None:
    with pytest.raises(ConfigError, match="fractional \\+ multi_gpu must be <= 1"):
        MixSpec("bad", fractional=0.7, multi_gpu=0.5)
    with pytest.raises(ConfigError, match="share in \\[0, 1\\]"):
        MixSpec("bad", cpu_only=1.5)
    with pytest.raises(ConfigError, match="leaves no GPU pods"):
        MixSpec("bad", cpu_only=1.0)
    only_shares = [Request(f"s{i}", gpu_milli=500) for i in range(10)]
    with pytest.raises(ConfigError, match="has no whole/multi pods"):
        derive(only_shares, MixSpec("m", fractional=0.5), MODELS, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="did you mean 'share60'"):
        mix_named("share6")
    big = [Request("b", gpus=8)]
    with pytest.raises(ConfigError, match="no GPU model has a node with 8 cards"):
        derive(
            big, MixSpec("m", constrained=1.0), {"T4": ModelStock(4, 2)}, np.random.default_rng(0)
        )


def test_the_estates_models_are_counted_by_card() -> None:
    nodes = [node("a", cards=8), node("b", cards=2, model="T4"), node("c", cards=4, model="T4")]
    assert gpu_models(nodes) == {"A100": ModelStock(8, 8), "T4": ModelStock(6, 4)}


@pytest.mark.skipif(not OPENB.is_dir(), reason="the openb trace is not next to the checkout")
def test_the_openb_mixes_span_the_four_axes() -> None:
    nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    pods = load_pods(OPENB / "openb_pod_list_default.csv")
    models = gpu_models(nodes)
    got = {m.name: measure(derive(pods, m, models, np.random.default_rng(0))) for m in MIXES}
    assert len(MIXES) >= 12
    default = got["default"]
    for axis in ("cpu_only", "fractional", "multi_gpu", "constrained"):
        values = sorted(getattr(s, axis) for s in got.values())
        assert values[-1] - values[0] >= 0.2, axis  # each axis is moved well away from the trace
        assert getattr(default, axis) in values
