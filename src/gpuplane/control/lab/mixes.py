"""Workload mixes derived from one trace by seeded resampling along four axes (FGD paper, §6).

The FGD paper's authors derived their trace variants from the default openb trace by changing
the share of CPU-only pods, of pods that take a fraction of one card, of multi-GPU pods and of
pods constrained to one GPU model. `derive` does the same to any list of requests: it keeps the
trace's pod count, draws each kind of pod from that kind's pods in the trace (without
replacement while there are enough, so the sizes, CPU and memory within a kind keep their
distribution), and, for the model axis, pins a share of the GPU pods to one GPU model drawn by
the estate's card count. A share left as None keeps the trace's; when some GPU kinds are set,
the others split what is left in the trace's proportions (100 % fractional leaves no whole or
multi-GPU pods). Counts are rounded by largest remainder, so a derived mix has exactly the share
it names, to one pod (`measure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpuplane.control.scheduler import NodeInfo, Request
from gpuplane.errors import ConfigError, unknown_name
from gpuplane.resources import LABEL_GPU_MODEL, Selector

CPU, SHARE, WHOLE, MULTI = "cpu", "share", "whole", "multi"
GPU_KINDS = (SHARE, WHOLE, MULTI)


def kind_of(r: Request) -> str:
    """CPU-only, a fraction of one card, one whole card, or several whole cards."""
    if r.is_fractional:
        return SHARE
    return CPU if r.gpus == 0 else WHOLE if r.gpus == 1 else MULTI


@dataclass(frozen=True, slots=True)
class MixShares:
    """What a workload is made of: CPU-only pods over all pods; the rest over the GPU pods."""

    cpu_only: float
    fractional: float
    multi_gpu: float
    constrained: float


@dataclass(frozen=True, slots=True)
class MixSpec:
    """A mix to derive; None keeps the trace's share on that axis."""

    name: str
    cpu_only: float | None = None  # of all pods
    fractional: float | None = None  # of the GPU pods
    multi_gpu: float | None = None  # of the GPU pods
    constrained: float | None = None  # of the GPU pods: limited to one GPU model

    def __post_init__(self) -> None:
        for axis in ("cpu_only", "fractional", "multi_gpu", "constrained"):
            v = getattr(self, axis)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"mix {self.name}: {axis} must be a share in [0, 1], got {v}")
        if self.cpu_only == 1.0:
            raise ConfigError(f"mix {self.name}: cpu_only 1 leaves no GPU pods; use < 1")
        if (self.fractional or 0.0) + (self.multi_gpu or 0.0) > 1.0:
            raise ConfigError(
                f"mix {self.name}: fractional + multi_gpu must be <= 1 (shares of the GPU pods)"
            )


# The default trace's shares: 13.3 % CPU-only; of the GPU pods 43.6 % fractional, 1.1 %
# multi-GPU, none constrained. Each axis is moved on its own, to both sides where it can go.
MIXES: tuple[MixSpec, ...] = (
    MixSpec("default"),
    MixSpec("cpu05", cpu_only=0.05),
    MixSpec("cpu25", cpu_only=0.25),
    MixSpec("cpu35", cpu_only=0.35),
    MixSpec("share25", fractional=0.25),
    MixSpec("share60", fractional=0.60),
    MixSpec("share80", fractional=0.80),
    MixSpec("share100", fractional=1.0),
    MixSpec("multi05", multi_gpu=0.05),
    MixSpec("multi10", multi_gpu=0.10),
    MixSpec("multi20", multi_gpu=0.20),
    MixSpec("spec10", constrained=0.10),
    MixSpec("spec33", constrained=0.33),
    MixSpec("spec50", constrained=0.50),
)


def mix_named(name: str) -> MixSpec:
    for m in MIXES:
        if m.name == name:
            return m
    raise ConfigError(unknown_name("workload mix", name, [m.name for m in MIXES]))


def measure(pods: Sequence[Request]) -> MixShares:
    """The four shares of `pods` (the generator's claims are checked against this)."""
    kinds = [kind_of(p) for p in pods]
    gpu = [p for p, k in zip(pods, kinds, strict=True) if k != CPU]
    n_gpu = max(len(gpu), 1)
    return MixShares(
        cpu_only=kinds.count(CPU) / max(len(pods), 1),
        fractional=kinds.count(SHARE) / n_gpu,
        multi_gpu=kinds.count(MULTI) / n_gpu,
        constrained=sum(1 for p in gpu if p.selector.gpu_models) / n_gpu,
    )


@dataclass(frozen=True, slots=True)
class ModelStock:
    """How many cards of one GPU model the estate has, and the most on one node."""

    cards: int
    most_on_a_node: int


def gpu_models(nodes: Sequence[NodeInfo]) -> dict[str, ModelStock]:
    """The estate's GPU models (by the GPU-model label), for pinning pods to one of them."""
    cards: dict[str, int] = {}
    most: dict[str, int] = {}
    for n in nodes:
        model = n.labels.get(LABEL_GPU_MODEL)
        if model and n.devices:
            cards[model] = cards.get(model, 0) + len(n.devices)
            most[model] = max(most.get(model, 0), len(n.devices))
    return {m: ModelStock(cards[m], most[m]) for m in sorted(cards)}


def derive(
    pods: Sequence[Request],
    spec: MixSpec,
    models: Mapping[str, ModelStock],
    rng: np.random.Generator,
) -> list[Request]:
    """`len(pods)` requests with the shares `spec` names, drawn from `pods` with `rng`."""
    pools: dict[str, list[Request]] = {k: [] for k in (CPU, *GPU_KINDS)}
    for p in pods:
        pools[kind_of(p)].append(p)
    n = len(pods)
    cpu_share = len(pools[CPU]) / n if spec.cpu_only is None else spec.cpu_only
    n_cpu, n_gpu = _apportion(n, [cpu_share, 1.0 - cpu_share])
    fixed = {SHARE: spec.fractional, MULTI: spec.multi_gpu}
    free = [k for k in GPU_KINDS if fixed.get(k) is None]
    rest = 1.0 - sum(v for v in fixed.values() if v is not None)
    free_total = sum(len(pools[k]) for k in free)
    if rest > 0 and free_total == 0:
        raise ConfigError(
            f"mix {spec.name}: the trace has no {'/'.join(free)} pods to fill the other "
            f"{rest:.0%} of the GPU pods; set their shares too"
        )
    shares = [
        v if (v := fixed.get(k)) is not None else rest * len(pools[k]) / max(free_total, 1)
        for k in GPU_KINDS
    ]
    counts = dict(zip((CPU, *GPU_KINDS), [n_cpu, *_apportion(n_gpu, shares)], strict=True))
    out: list[Request] = []
    for kind, count in counts.items():
        if count and not pools[kind]:
            raise ConfigError(f"mix {spec.name}: needs {count} {kind} pods, the trace has none")
        out.extend(_draw(pools[kind], count, rng))
    if spec.constrained is not None:
        out = _constrain(out, spec.constrained, models, rng, spec.name)
    return [replace(p, job_id=f"{p.job_id}-{spec.name}-{i}") for i, p in enumerate(out)]


def _apportion(n: int, shares: Sequence[float]) -> list[int]:
    """`n` split by `shares` (summing to 1) into integers, by largest remainder."""
    raw = np.asarray(shares, dtype=np.float64) * n
    counts = np.floor(raw).astype(np.int64)
    left = n - int(counts.sum())
    for i in np.argsort(-(raw - counts), kind="stable")[:left]:
        counts[i] += 1
    return [int(c) for c in counts]


def _draw(pool: Sequence[Request], k: int, rng: np.random.Generator) -> list[Request]:
    """`k` of `pool`: distinct ones while the pool has enough, then repeats drawn at random."""
    first = rng.permutation(len(pool))[: min(k, len(pool))]
    extra = rng.integers(len(pool), size=max(k - len(pool), 0))
    return [pool[int(i)] for i in np.concatenate([first, extra])]


def _constrain(
    pods: list[Request],
    share: float,
    models: Mapping[str, ModelStock],
    rng: np.random.Generator,
    name: str,
) -> list[Request]:
    """Pin `share` of the GPU pods to one GPU model (drawn by card count among the models with
    a node big enough for the pod); every other pod may use any model."""
    gpu = [i for i, p in enumerate(pods) if kind_of(p) != CPU]
    k = round(share * len(gpu))
    chosen = set(rng.permutation(gpu)[:k].tolist())
    out = []
    for i, p in enumerate(pods):
        if i not in chosen:
            out.append(replace(p, selector=Selector()) if p.selector.gpu_models else p)
            continue
        fits = [m for m, s in models.items() if s.most_on_a_node >= max(p.gpus, 1)]
        if not fits:
            raise ConfigError(f"mix {name}: no GPU model has a node with {p.gpus} cards")
        weight = np.array([models[m].cards for m in fits], dtype=np.float64)
        model = fits[int(rng.choice(len(fits), p=weight / weight.sum()))]
        out.append(replace(p, selector=Selector(gpu_models=frozenset({model}))))
    return out
