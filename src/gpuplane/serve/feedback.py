"""What each answer teaches a model's router: the instances' speeds, and what each engine's
prefix cache keeps.

An engine that counts the prompt tokens its cache served (`usage.cached`) says itself whether a
placement hit; for the others the time to a streamed answer's first byte says it (`speed.py`):
a prefix placed as cached that came back at uncached speed was evicted, one placed as uncached
that came back at cached speed was held. Either way the prefix index learns how much each
engine's cache keeps (`PrefixIndex.held` / `evicted`).
"""

from __future__ import annotations

from typing import Any

from gpuplane.serve.limits import Usage
from gpuplane.serve.placer import Admission
from gpuplane.serve.prefix import LOCALITY_MIN_SHARE, PrefixIndex
from gpuplane.serve.speed import Answer, InstanceSpeeds


class Feedback:
    """Feeds answers to the router's speeds and prefix index; keeps which instances' engines
    count their cached tokens (from their first such count on, only the counts teach)."""

    def __init__(self, index: PrefixIndex, speeds: InstanceSpeeds) -> None:
        self._index = index
        self._speeds = speeds
        # instances whose engine counts the prompt tokens its cache served (`usage`)
        self._counts_cached: set[str] = set()

    def first_byte(self, admission: Admission, seconds: float) -> None:
        """A streamed answer's first byte came `seconds` after it was sent: learn the speeds
        from it, and what the engine's cache keeps unless the engine counts its cached tokens."""
        iid = admission.lease.instance_id
        answer = self._speeds.observe(iid, admission.cached, seconds)
        if answer is not Answer.LEARNED and iid not in self._counts_cached:
            self._learn_cache(admission, held=answer is Answer.HELD)

    def usage(self, admission: Admission, usage: Usage) -> None:
        """The engine said what the request used; where it counts the prompt tokens its cache
        served, that count decides whether the placement hit."""
        if usage.cached is None or usage.prompt <= 0:
            return
        iid = admission.lease.instance_id
        self._counts_cached.add(iid)
        hit = usage.cached >= LOCALITY_MIN_SHARE * usage.prompt
        if hit != admission.cached:
            self._learn_cache(admission, held=hit)

    def cache_state(self, instance_id: str) -> dict[str, Any]:
        """What the index assumes of the instance's prefix cache: the blocks it keeps warm
        (None: no bound learned) and whether that was learned from the engine's counts of
        cached tokens or from times to first token."""
        learned_from = "engine" if instance_id in self._counts_cached else "latency"
        return {"blocks": self._index.capacity(instance_id), "learned_from": learned_from}

    def forget(self, instance_id: str) -> None:
        """The instance left the router (idempotent)."""
        self._counts_cached.discard(instance_id)

    def _learn_cache(self, admission: Admission, *, held: bool) -> None:
        """The engine's cache differed from the index: it `held` a prefix placed as uncached
        (the instance keeps more than the index thought: `PrefixIndex.held`), or evicted one
        placed as cached (it keeps fewer blocks than it served since that prefix:
        `PrefixIndex.evicted`; without that distance the prefix, and what it used less
        recently, are forgotten)."""
        iid = admission.lease.instance_id
        if held:
            self._index.held(admission.blocks, iid)
        elif admission.distance is not None:
            self._index.evicted(iid, admission.distance)
        else:
            self._index.forget_prefix(admission.blocks[: admission.choice.matched_blocks], iid)
