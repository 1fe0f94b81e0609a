"""Learned instance speed: how long prompts take to their first byte, cached and uncached, over
the fleet, and how many times slower than that each instance is.

Pure: the router hands it each streamed answer's time to first byte (`observe`) and asks it for
expected times (`first_byte_s`, `cost`) and which candidates are quick enough for a prompt
(`quick_enough`); delay scheduling (`delay.py`) asks it the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from gpuplane.averages import RunningMean
from gpuplane.serve.prefix import is_hit
from gpuplane.serve.slots import InstanceSlots

# Times to first token measured on an instance before its speed counts (one slow answer on a
# busy machine must not mark it slow: placement would then send it too little to learn better).
MIN_SPEED_SAMPLES = 2
# An instance is much quicker for a prompt when it is expected to reach the first token in at
# most this share of the time another would: worth waiting for, and the other is left out of
# placement while a quicker one has room (between instances of one speed, only a cached prefix
# makes that difference).
MUCH_QUICKER = 0.5


class Answer(StrEnum):
    """What one answer's time to first byte taught (`InstanceSpeeds.observe`)."""

    LEARNED = "learned"  # it counts toward the fleet's time and its instance's speed
    EVICTED = "evicted"  # placed as cached, it came at uncached speed: the engine evicted it
    HELD = "held"  # placed as uncached, it came at cached speed: the engine held it unindexed


class InstanceSpeeds:
    """The fleet's time to first byte by whether the prompt was placed as cached, and each
    instance's ratio to it (3.0: a card three times slower).

    `locality_wait_s` is the engine's expected uncached time before anything was measured (its
    adapter's). `compare`: placement leaves out much slower candidates (the policy's
    `uses_speed`); without it `differ` stays False and every candidate is quick enough.
    """

    def __init__(self, instance_ids: Iterable[str], locality_wait_s: float, compare: bool) -> None:
        self.locality_wait_s = locality_wait_s
        self._compare = compare
        self._first_byte = {True: RunningMean(0.2), False: RunningMean(0.2)}
        self._speed = {i: RunningMean(0.1) for i in instance_ids}
        self.differ = False  # some instance is much quicker than another

    def add(self, instance_id: str) -> None:
        """A new instance: nothing measured yet."""
        self._speed[instance_id] = RunningMean(0.1)

    def remove(self, instance_id: str) -> None:
        self._speed.pop(instance_id, None)
        self.differ = self._compare and self._much_quicker_exists()

    def observe(self, instance_id: str, cached: bool, seconds: float) -> Answer:
        """Learn from one answer placed as `cached` (or not) on the instance. An answer that
        came at the other kind's speed teaches neither: the engine evicted a prefix the index
        thought it held (the caller forgets it there), or held one the index did not know."""
        cold, warm = self._first_byte[False], self._first_byte[True]
        if cold.samples:  # (before a cached answer was measured, the midpoint is half of cold)
            looks_cached = seconds / self.speed(instance_id) < (cold.value + warm.value) / 2
            if cached and not looks_cached:
                return Answer.EVICTED
            if looks_cached and not cached:
                return Answer.HELD
        fleet = self._first_byte[cached]
        if fleet.samples and fleet.value > 0:
            self._speed[instance_id].add(seconds / fleet.value)
            self.differ = self._compare and self._much_quicker_exists()
        fleet.add(seconds)
        return Answer.LEARNED

    def speed(self, instance_id: str) -> float:
        """How many times longer the instance takes to a first token than the fleet's mean
        (1.0 until `MIN_SPEED_SAMPLES` were measured)."""
        mean = self._speed[instance_id]
        return mean.value if mean.samples >= MIN_SPEED_SAMPLES else 1.0

    def first_byte_s(self, instance_id: str, hit: bool) -> float:
        """Expected time to first token on the instance for a prompt whose prefix it holds
        (`hit`) or not: the fleet's measured time times the instance's `speed`. Before anything
        was measured: `locality_wait_s` for an uncached prompt, and 0 for a cached one."""
        mean = self._first_byte[hit]
        unmeasured = 0.0 if hit else self.locality_wait_s
        return (mean.value if mean.samples else unmeasured) * self.speed(instance_id)

    def cost(self, instance_id: str, blocks: Sequence[int], affinity: Mapping[str, int]) -> float:
        """Expected time to this prompt's first token on the instance (`affinity`: matched
        leading blocks per instance)."""
        return self.first_byte_s(instance_id, is_hit(affinity.get(instance_id, 0), blocks))

    def quick_enough(
        self,
        candidates: Sequence[InstanceSlots],
        blocks: Sequence[int],
        affinity: Mapping[str, int],
    ) -> Sequence[InstanceSlots]:
        """The candidates not much slower to this prompt's first token than an uncached prefill
        on the quickest of them (all, while every instance runs at about one speed)."""
        if not self.differ or len(candidates) < 2:
            return candidates
        cold = min(self.first_byte_s(c.id, False) for c in candidates)
        kept = [c for c in candidates if MUCH_QUICKER * self.cost(c.id, blocks, affinity) <= cold]
        return kept or candidates

    def _much_quicker_exists(self) -> bool:
        speeds = [m.value for m in self._speed.values() if m.samples >= MIN_SPEED_SAMPLES]
        return bool(speeds) and min(speeds) < MUCH_QUICKER * max(speeds)
