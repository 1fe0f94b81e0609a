"""Run statistics: per-stage counts and times, device-seconds, and a bounded utilisation timeline.

Everything here has a fixed size whatever the number of clips (the timeline merges its bins
when it would pass `max_bins`), so a 100,000-clip run keeps flat memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuplane.batch.cache import StageStats


@dataclass(slots=True)
class StageMetrics:
    computed: int = 0
    cached: int = 0
    errors: int = 0
    compute_s: float = 0.0
    device_s: float = 0.0
    cache: StageStats = field(default_factory=StageStats)

    @property
    def done(self) -> int:
        return self.computed + self.cached

    def count(
        self, start: float, end: float, share: float, bytes_written: int
    ) -> tuple[float, float]:
        """One computed task, on `share` of a card: returns its (compute, device) seconds, to the
        microsecond, for the clip's journal record."""
        dt = max(0.0, end - start)
        self.computed += 1
        self.compute_s += dt
        self.device_s += dt * share
        self.cache.writes += 1 if bytes_written else 0
        self.cache.bytes_written += bytes_written
        return round(dt, 6), round(dt * share, 6)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "cache"}
        d["cache"] = asdict(self.cache) | {"hit_rate": self.cache.hit_rate}
        d["mean_compute_s"] = self.compute_s / self.computed if self.computed else 0.0
        return d


class BusyTimeline:
    """Busy share-seconds per device in time bins; bins double in width to stay bounded."""

    def __init__(self, t0: float, bin_s: float = 0.25, max_bins: int = 400) -> None:
        self.t0 = t0
        self.bin_s = bin_s
        self.max_bins = max_bins
        self.bins: dict[str, list[float]] = {}

    @classmethod
    def resume(cls, doc: Mapping[str, Any] | None, t0: float) -> BusyTimeline:
        """Continue an earlier invocation's `to_dict()`: with `t0` set back by the time the run
        already ran, this invocation's work lands after the earlier work."""
        tl = cls(t0)
        if doc:
            tl.bin_s = float(doc["bin_s"])
            tl.bins = {d: [u * tl.bin_s for u in row] for d, row in doc["utilisation"].items()}
        return tl

    def add(self, device: str, start: float, end: float, share: float) -> None:
        if end <= start or share <= 0:
            return
        while (end - self.t0) / self.bin_s >= self.max_bins:
            self._coarsen()
        row = self.bins.setdefault(device, [])
        a = max(0.0, start - self.t0)
        b = end - self.t0
        i = int(a / self.bin_s)
        while a < b:
            edge = (i + 1) * self.bin_s
            seg = min(b, edge) - a
            if len(row) <= i:
                row.extend([0.0] * (i + 1 - len(row)))
            row[i] += seg * share
            a = min(b, edge)
            i += 1

    def _coarsen(self) -> None:
        self.bin_s *= 2
        for dev, row in self.bins.items():
            self.bins[dev] = [sum(row[i : i + 2]) for i in range(0, len(row), 2)]

    def utilisation(self) -> dict[str, list[float]]:
        """Per device, busy fraction of the card in each bin (0..1)."""
        return {d: [v / self.bin_s for v in row] for d, row in sorted(self.bins.items())}

    def to_dict(self) -> dict[str, Any]:
        return {"bin_s": self.bin_s, "utilisation": self.utilisation()}
