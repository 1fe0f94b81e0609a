"""A running average that starts as a plain mean and settles into an EWMA.

The first samples are averaged with equal weight, so an early outlier does not dominate (an
EWMA seeded by its first sample would); after 1 / `min_weight` samples each new one weighs
`min_weight`, so the average follows a drifting workload.
"""

from __future__ import annotations

from dataclasses import dataclass


def sample_weight(n: int, min_weight: float) -> float:
    """The weight of the n-th sample (n >= 1)."""
    return max(min_weight, 1 / n)


@dataclass(slots=True)
class RunningMean:
    min_weight: float
    value: float = 0.0
    samples: int = 0

    def add(self, x: float) -> None:
        self.samples += 1
        self.value += sample_weight(self.samples, self.min_weight) * (x - self.value)
