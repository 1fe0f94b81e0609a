"""Rebuilding the slot table on takeover, and letting inherited slots drain: pure.

A gateway that becomes leader cannot see the requests the previous leader admitted, which
may still run. For each instance it counts as held by others (`ModelRouter.set_others`) the
larger of the previous leader's journal and the engine's own running count from its metrics;
an engine that reports none (llama.cpp's OpenAI server) counts as full. Later readings only
lower that count, never below what the engine still runs: the engine's count includes every
inherited request still running, so `min(inherited, running)` never under-counts them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

# (model, instance id) -> count
Counts = dict[tuple[str, str], int]


def inherited(capacity: int, journal: int | None, running: int | None) -> int:
    """Slots to count as held by the previous leader's requests when taking over."""
    if running is None:
        return capacity
    return min(capacity, max(journal or 0, running))


def drained(held: int, running: int | None) -> int:
    """What is left of `held` inherited slots once the engine says it runs `running`."""
    return held if running is None else min(held, running)


def encode_journal(in_flight: Mapping[tuple[str, str], int]) -> bytes:
    """The leader's journal: in flight per instance of each model, as JSON."""
    doc: dict[str, dict[str, int]] = {}
    for (model, iid), n in in_flight.items():
        doc.setdefault(model, {})[iid] = n
    return json.dumps(doc, sort_keys=True).encode()


def decode_journal(data: bytes) -> Counts:
    """A journal's counts; one that cannot be read counts for nothing (the engines decide)."""
    try:
        doc = json.loads(data)
        return {
            (str(model), str(iid)): int(n)
            for model, counts in doc.items()
            for iid, n in counts.items()
        }
    except (ValueError, AttributeError, TypeError):
        return {}
