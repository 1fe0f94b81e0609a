"""Placement policies: which instance with a free slot gets a request.

Pure. A policy sees only candidates that have a free slot and are healthy (the slot table
guarantees that), plus, per instance, how many leading prompt blocks it holds. What else a policy
relies on it declares as data (`uses_prefix`, `uses_speed`), which the router reads once when it
is made. Policies register by name; the config's `gateway.placement.policy` picks one.
"""

from __future__ import annotations

import difflib
import operator
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from gpuplane.errors import ConfigError
from gpuplane.serve.slots import InstanceSlots


@dataclass(frozen=True, slots=True)
class Choice:
    instance_id: str
    reason: str  # "prefix" | "least_loaded" | the policy's name
    matched_blocks: int = 0


class PlacementPolicy(Protocol):
    # places by prefix: the router hashes prompts, keeps the prefix index and passes `affinity`
    # (empty otherwise), and hands a freed slot to a waiter whose prefix it holds
    uses_prefix: ClassVar[bool]
    # the router leaves out candidates much slower to a first token, and a request may wait for
    # a busy instance much quicker for it (`speed.py`, `delay.py`)
    uses_speed: ClassVar[bool]

    def choose(
        self,
        candidates: Sequence[InstanceSlots],
        affinity: Mapping[str, int],
        rng: random.Random,
    ) -> Choice | None: ...


def lowest(
    candidates: Sequence[InstanceSlots],
    key: Callable[[InstanceSlots], float],
    rng: random.Random,
) -> InstanceSlots:
    """The candidate with the lowest `key`; ties broken at random. It runs on every placement:
    with an `operator.attrgetter` key the scans run in C."""
    keys = list(map(key, candidates))
    low = min(keys)
    if keys.count(low) == 1:
        return candidates[keys.index(low)]
    ties = [c for c, k in zip(candidates, keys, strict=True) if k == low]
    return ties[int(rng.random() * len(ties))]  # rng.choice, without its Python-level draw


def least_utilised(candidates: Sequence[InstanceSlots], rng: random.Random) -> InstanceSlots:
    """The candidate with the lowest in_flight/capacity; ties broken at random."""
    return lowest(candidates, operator.attrgetter("utilisation"), rng)


class SlotsPolicy:
    """gpuplane's policy (`slots_prefix`): prefix affinity unless that instance is much busier,
    else least utilised; among candidates the router found quick enough to a first token."""

    uses_prefix: ClassVar[bool] = True
    uses_speed: ClassVar[bool] = True

    def __init__(self, max_imbalance: float = 0.5) -> None:
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
        if affinity:
            best_blocks = max((affinity.get(c.id, 0) for c in candidates), default=0)
            if best_blocks > 0:
                holders = [c for c in candidates if affinity.get(c.id, 0) == best_blocks]
                order = list(affinity)  # most recent holder first among equals
                low = min(c.utilisation for c in holders)
                best = min(
                    (c for c in holders if c.utilisation == low), key=lambda c: order.index(c.id)
                )
                if best.utilisation - least.utilisation <= self.max_imbalance:
                    return Choice(best.id, "prefix", best_blocks)
        return Choice(least.id, "least_loaded", affinity.get(least.id, 0))


class SlotsWithoutPrefixPolicy(SlotsPolicy):
    """`slots`: gpuplane's policy without prefix affinity. It uses no prefixes, so the router
    hands it no affinity and it places on the least utilised candidate."""

    uses_prefix: ClassVar[bool] = False


class RoundRobinPolicy:
    """The next instance after the last one chosen, in configuration order (peer routers' default).

    Only instances with a free slot are candidates, so unlike a plain round robin it never
    sends a request to a full instance; it just ignores load and prefixes.
    """

    uses_prefix: ClassVar[bool] = False
    uses_speed: ClassVar[bool] = False

    def __init__(self) -> None:
        self._last: str | None = None

    def choose(
        self,
        candidates: Sequence[InstanceSlots],
        affinity: Mapping[str, int],
        rng: random.Random,
    ) -> Choice | None:
        if not candidates:
            return None
        ids = sorted(c.id for c in candidates)
        after = [i for i in ids if self._last is None or i > self._last]
        self._last = (after or ids)[0]
        return Choice(self._last, "round_robin")


class LeastConnectionsPolicy:
    """The candidate with the fewest requests in flight (not relative to capacity)."""

    uses_prefix: ClassVar[bool] = False
    uses_speed: ClassVar[bool] = False

    def choose(
        self,
        candidates: Sequence[InstanceSlots],
        affinity: Mapping[str, int],
        rng: random.Random,
    ) -> Choice | None:
        if not candidates:
            return None
        in_flight = operator.attrgetter("in_flight")
        return Choice(lowest(candidates, in_flight, rng).id, "least_connections")


class PowerOfTwoPolicy:
    """Two candidates drawn at random; the one with fewer requests in flight wins."""

    uses_prefix: ClassVar[bool] = False
    uses_speed: ClassVar[bool] = False

    def choose(
        self,
        candidates: Sequence[InstanceSlots],
        affinity: Mapping[str, int],
        rng: random.Random,
    ) -> Choice | None:
        if not candidates:
            return None
        if len(candidates) == 1:
            return Choice(candidates[0].id, "power_of_two")
        a, b = rng.sample(list(candidates), 2)
        return Choice((b if b.in_flight < a.in_flight else a).id, "power_of_two")


PolicyFactory = Callable[[float], PlacementPolicy]

POLICIES: dict[str, PolicyFactory] = {
    "slots_prefix": SlotsPolicy,
    "slots": SlotsWithoutPrefixPolicy,
    "round_robin": lambda imbalance: RoundRobinPolicy(),
    "least_connections": lambda imbalance: LeastConnectionsPolicy(),
    "power_of_two": lambda imbalance: PowerOfTwoPolicy(),
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
