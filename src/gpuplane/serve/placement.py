"""Placement policies: which instance with a free slot gets a request.

Pure. A policy sees only candidates that have a free slot and are healthy (the slot table
guarantees that), plus, per instance, how many leading prompt blocks it holds. Policies register
by name; the config's `gateway.placement.policy` picks one.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuplane.errors import ConfigError
from gpuplane.serve.slots import InstanceSlots


@dataclass(frozen=True, slots=True)
class Choice:
    instance_id: str
    reason: str  # "prefix" | "least_loaded" | the policy's name
    matched_blocks: int = 0


class PlacementPolicy(Protocol):
    uses_prefix: bool

    def choose(
        self,
        candidates: Sequence[InstanceSlots],
        affinity: Mapping[str, int],
        rng: random.Random,
    ) -> Choice | None: ...


def least_utilised(candidates: Sequence[InstanceSlots], rng: random.Random) -> InstanceSlots:
    """The candidate with the lowest in_flight/capacity; ties broken at random."""
    low = min(c.utilisation for c in candidates)
    tied = [c for c in candidates if c.utilisation == low]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


class SlotsPolicy:
    """gpuplane's policy: prefix affinity unless that instance is much busier, else least
    utilised."""

    def __init__(self, use_prefix: bool = True, max_imbalance: float = 0.5) -> None:
        self.uses_prefix = use_prefix
        self.max_imbalance = max_imbalance

    def choose(
        self,
        candidates: Sequence[InstanceSlots],
        affinity: Mapping[str, int],
        rng: random.Random,
    ) -> Choice | None:
        if not candidates:
            return None
        least = least_utilised(candidates, rng)
        if self.uses_prefix and affinity:
            best_blocks = max((affinity.get(c.id, 0) for c in candidates), default=0)
            if best_blocks > 0:
                holders = [c for c in candidates if affinity.get(c.id, 0) == best_blocks]
                best = least_utilised(holders, rng)
                if best.utilisation - least.utilisation <= self.max_imbalance:
                    return Choice(best.id, "prefix", best_blocks)
        return Choice(least.id, "least_loaded", affinity.get(least.id, 0))


PolicyFactory = Callable[[float], PlacementPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "slots_prefix": lambda imbalance: SlotsPolicy(True, imbalance),
    "slots": lambda imbalance: SlotsPolicy(False, imbalance),
}


def make_policy(name: str, max_imbalance: float) -> PlacementPolicy:
    """The policy registered as `name`; an unknown name fails with the valid ones."""
    factory = POLICIES.get(name)
    if factory is None:
        close = difflib.get_close_matches(name, list(POLICIES), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(
            f"unknown placement policy '{name}'{hint}; known: {', '.join(sorted(POLICIES))}"
        )
    return factory(max_imbalance)
