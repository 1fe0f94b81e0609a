"""The policy interface: score the candidate nodes of one request (and, optionally, pick its card).

A policy is a long-lived object registered by name (`registry.py`); per-attempt scratch state
lives in `Candidates`, which the filter builds (`filter.py`) and the cycle throws away after the
decision. Policies read the snapshot's arrays and never mutate them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from gpuplane.control.scheduler.decision import BoolArray, FloatArray, IntArray, Request
from gpuplane.control.scheduler.snapshot import Snapshot
from gpuplane.errors import ConfigError

# Weight of the GPU-speed term relative to the policy's own score (both on 0..100, as Kubernetes
# weighs score plugins). Off by default, because measured (benchmarks/README.md) every weight
# tried placed fewer jobs with `frag` at 10,000-GPU scale (0.001, 0.1, 1: flexible jobs take the
# fast cards that jobs pinned to those models then lack) and lowered the unified pool's mean
# throughput over 5 job streams (0.001 to 4). Turn it on with `make_policy(name, speed_weight=w)`.
DEFAULT_SPEED_WEIGHT = 0.0


@dataclass(slots=True)
class Candidates:
    """Scratch state of one scheduling attempt: the nodes that passed the filter.

    `nodes` are snapshot rows. For a fractional request, `card_fit[i, d]` says whether card `d` of
    candidate `i` can host it and `card_mem[i, d]` is the GPU memory it would take there.
    """

    snapshot: Snapshot
    request: Request
    nodes: IntArray
    card_fit: BoolArray | None = None
    card_mem: IntArray | None = None
    rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    # Shared views policies use often (each computed on demand, never stored in the snapshot).

    def cpu_left(self) -> IntArray:
        """Free CPU on each candidate after placing the request."""
        return self.snapshot.cpu_free[self.nodes] - self.request.cpu_millis

    def gpu_left(self) -> IntArray:
        """Free GPU milli on each candidate node after placing the request."""
        return self.snapshot.gpu_milli_free[self.nodes] - self.request.gpu_demand_milli

    def best_fit_left(self) -> FloatArray:
        """What each candidate keeps free after placing, as Best-Fit weighs it: half CPU, half
        GPU, each over the largest node's (0 = full, lower fits better)."""
        snap = self.snapshot
        cpu = self.cpu_left() / snap.max_node_cpu * 0.5
        left: FloatArray = cpu + self.gpu_left() / snap.max_node_gpu_milli * 0.5
        return left

    def best_fit_cards(self) -> IntArray:
        """Per candidate, the fitting card with the least free milli (then memory, then index)."""
        assert self.card_fit is not None
        snap = self.snapshot
        milli = snap.dev_milli_free[self.nodes].astype(np.float64)
        mem_frac = snap.dev_mem_free[self.nodes] / np.maximum(snap.dev_mem_cap[self.nodes], 1)
        key = np.where(self.card_fit, milli + mem_frac, np.inf)
        cards: IntArray = np.argmin(key, axis=1).astype(np.int64)
        return cards


@dataclass(frozen=True, slots=True)
class Scores:
    """A policy's answer: higher is better; `cards` = chosen card per candidate (fractional)."""

    nodes: FloatArray
    cards: IntArray | None = None


class Policy(ABC):
    """Scores candidate nodes. Subclasses set `name` and implement `score`.

    Besides the policy's own score, the cycle adds the GPU-speed term (`score.py`): candidates'
    relative speed on 0..100, times `speed_weight` (per instance: `make_policy(name,
    speed_weight=w)`; 0, the default, leaves it out), rescaled to the policy's range
    0..`max_score`.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    max_score: ClassVar[float] = 100.0  # the policy's score range is 0..max_score
    default_speed_weight: ClassVar[float] = DEFAULT_SPEED_WEIGHT
    # how the score phase breaks ties between equal best scores: "random" (Kubernetes' default),
    # or "first" (the earliest node in snapshot order, as the published simulator does by name)
    ties: ClassVar[str] = "random"

    def __init__(self, *, speed_weight: float | None = None) -> None:
        weight = self.default_speed_weight if speed_weight is None else speed_weight
        if not weight >= 0:
            raise ConfigError(f"speed_weight must be >= 0 (0 turns the term off), got {weight}")
        self.speed_weight = float(weight)

    @abstractmethod
    def score(self, cands: Candidates) -> Scores:
        """Score every candidate; called once per attempt, after the filter, with >= 1 candidate."""

    def observe(self, request: Request) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called by `schedule` with every request before scoring (policies that learn the mix)."""

    @classmethod
    def for_mix(cls, requests: Sequence[Request]) -> Policy:
        """A policy tuned to the known workload mix of `requests` (simulators); the default
        ignores it."""
        return cls()
