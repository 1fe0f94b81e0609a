"""A model's rollout in the gateway: each instance's version, the versions' weights, and the
version each request is placed on.

Discovery tells the router which version each new instance runs and the weights in percent
(the control plane's `canary` weights); `pick` then chooses a request's version by weight among
the versions with a ready instance (`versions.py`'s `VersionPicker`, the pure core), and
placement, the queue and a retry consider only that version's instances. With fewer than two
weighted versions there is no rollout: every instance serves any request.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gpuplane.serve.slots import InstanceSlots, SlotTable
from gpuplane.serve.versions import VersionPicker


class Rollout:
    """The versions of one model's instances and their weights; reads the router's slot table
    for which instances are ready, changes nothing in it."""

    def __init__(self, slots: SlotTable, rng: random.Random) -> None:
        self._slots = slots
        self.versions: dict[str, str] = {}  # instance id → the version it runs
        self.weights: dict[str, float] = {}  # version → weight in percent
        self._picker = VersionPicker(rng)

    def add(self, instance_id: str, version: str | None) -> None:
        """A new instance runs `version` (None: the model has no versions)."""
        if version is not None:
            self.versions[instance_id] = version

    def remove(self, instance_id: str) -> None:
        """The instance left (idempotent)."""
        self.versions.pop(instance_id, None)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """The versions' weights in percent (empty: every instance serves any request).
        Queued requests keep the version they picked."""
        self.weights = dict(weights)

    def pick(self) -> str | None:
        """A request's version (`VersionPicker`) among those with a ready instance; None when
        there is no rollout (one version or none)."""
        if len(self.weights) < 2:
            return None
        return self._picker.pick(self.weights, self.ready())

    def ready(self) -> set[str]:
        """The weighted versions with a ready (healthy, not draining) instance."""
        ready = {
            self.versions.get(i.id) for i in self._slots.instances if i.healthy and not i.draining
        }
        return {v for v in ready if v in self.weights}

    def of(self, free: Sequence[InstanceSlots], version: str | None) -> Sequence[InstanceSlots]:
        """The instances among `free` that run `version` (all of them when None)."""
        if version is None:
            return free
        return [i for i in free if self.versions.get(i.id) == version]
