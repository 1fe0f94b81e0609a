"""Placing one request on one model's instances: the candidates, the policy's choice, the slot.

`Placer.place` filters the free instances (of the request's rollout version, not the ones it
avoids, not much slower than the fleet: `speed.py`), lets the placement policy choose among them
(`placement.py`, with the prompt's prefix affinity from the index: `prefix.py`), then commits:
it takes the chosen instance's slot and records the prompt's blocks there. The result is an
`Admission`, which the router's `finish` releases once.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.serve.placement import Choice, PlacementPolicy
from gpuplane.serve.prefix import PrefixIndex, block_hashes, is_hit, prompt_text
from gpuplane.serve.rollout import Rollout
from gpuplane.serve.slots import InstanceSlots, Lease, SlotTable
from gpuplane.serve.speed import InstanceSpeeds


@dataclass(slots=True)
class Admission:
    """A granted slot and how it was placed; `finish` it once."""

    lease: Lease
    url: str
    choice: Choice
    blocks: Sequence[int] = ()
    finished: bool = False
    version: str | None = None  # the rollout's version it was placed on (None: no rollout)
    # placed as cached: the blocks the instance served since it last served this prefix
    distance: int | None = None

    @property
    def cached(self) -> bool:
        """Placed where most of its prompt's prefix is (as far as the index knows)."""
        return is_hit(self.choice.matched_blocks, self.blocks)


class Placer:
    """Places requests on a model's instances; the router owns the parts it reads and writes
    (slot table, prefix index, speeds, rollout) and calls it on one event loop."""

    def __init__(
        self,
        slots: SlotTable,
        index: PrefixIndex,
        speeds: InstanceSpeeds,
        rollout: Rollout,
        policy: PlacementPolicy,
        *,
        block_chars: int,
        rng: random.Random,
        clock: Callable[[], float],
        placed: Callable[[Choice], None],
    ) -> None:
        self._slots = slots
        self._index = index
        self._speeds = speeds
        self._rollout = rollout
        self._policy = policy
        self.by_prefix = policy.uses_prefix  # else prompts are not hashed: no affinity
        self._block_chars = block_chars
        self._rng = rng
        self._clock = clock
        self._placed = placed  # told each choice (the router's `RouterEvents.placed`)

    def blocks(self, body: Mapping[str, Any]) -> Sequence[int]:
        """The prompt's chained block hashes, for a policy that places by prefix (else none)."""
        if not self.by_prefix:
            return ()
        return block_hashes(prompt_text(body), self._block_chars)

    def affinity(self, blocks: Sequence[int]) -> dict[str, int]:
        """Matched leading blocks per instance, best first; empty without blocks."""
        return self._index.match(blocks) if blocks else {}

    def hits_on(self, instance_id: str, blocks: Sequence[int]) -> bool:
        """Does the instance hold enough of the prompt's prefix for a hit?"""
        return is_hit(self._index.depth_on(blocks, instance_id), blocks)

    def available(self, version: str | None) -> Sequence[InstanceSlots]:
        """Instances with a free slot (of `version` only, when given)."""
        return self._rollout.of(self._slots.available(), version)

    def place(
        self,
        blocks: Sequence[int],
        affinity: dict[str, int],
        avoid: frozenset[str] = frozenset(),
        version: str | None = None,
    ) -> Admission | None:
        """A slot on the policy's choice among the free instances (of `version`, not in
        `avoid`), taken; None when the policy finds none."""
        candidates = self.available(version)
        if avoid:
            candidates = [c for c in candidates if c.id not in avoid]
        candidates = self._speeds.quick_enough(candidates, blocks, affinity)
        choice = self._policy.choose(candidates, affinity, self._rng)
        if choice is None:
            return None
        lease = self._slots.acquire(choice.instance_id, self._clock())
        distance = None
        if blocks:
            if is_hit(choice.matched_blocks, blocks):
                matched = blocks[: choice.matched_blocks]
                distance = self._index.reuse_distance(matched, choice.instance_id)
            self._index.record(blocks, choice.instance_id)
        self._placed(choice)
        url = self._slots.get(choice.instance_id).url
        return Admission(lease, url, choice, blocks, distance=distance, version=version)
