"""Per-request version choice for a rollout: the pure core (no I/O, the RNG handed in).

A deployment in rollout serves several versions, each with a weight in percent (the control
plane's `canary` weights, the main version taking the rest). Each request picks one version by
weight among those with a ready instance (healthy, not draining); a version without one takes
no weight, and its share goes to the others in proportion to theirs (evenly when all of theirs
are 0), so nothing waits for an instance that cannot serve. The request then stays on that
version: its placement, its wait in the queue and a retry elsewhere consider only that
version's instances.

Independent random draws would miss a 50 % weight by more than 2 points over 1,000 requests
about one time in five (their spread is 1.6 points), so the picker is a smooth weighted round
robin (each request goes to the version furthest behind its share): over any run of requests
every version is within one request of its share. The injected RNG only sets the starting
credits, so gateways in front of the same deployment do not move in step.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping


class VersionPicker:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._credit: dict[str, float] = {}

    def pick(self, weights: Mapping[str, float], ready: Collection[str]) -> str | None:
        """The version for one request: by `weights` among the `ready` versions (None: no
        version is ready; a ready version absent from `weights` weighs 0)."""
        versions = sorted(set(ready))
        if not versions:
            return None
        shares = {v: max(0.0, weights.get(v, 0.0)) for v in versions}
        if not sum(shares.values()):
            shares = dict.fromkeys(versions, 1.0)
        total = sum(shares.values())
        # a version that was not ready comes back without the credit it missed
        self._credit = {v: self._credit.get(v, self._rng.random() * s) for v, s in shares.items()}
        for v, s in shares.items():
            self._credit[v] += s
        chosen = max(versions, key=lambda v: self._credit[v])
        self._credit[chosen] -= total
        return chosen
