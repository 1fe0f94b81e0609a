"""Right-sized slices per workload, and the replay that checks them against every sample.

Memory = p99 used (max for batch: a data job that runs out of memory loses its work) x headroom,
rounded up to the slice grid (1/`slice_fraction` of the card, 1/8 by default) or to the smallest
MIG profile that holds it, and raised to cover the recorded peak, so replaying the window never
yields a sample above the new limit. Compute = p95 share rounded up to `compute_step_pct`
(compute above it is throttled, not lost: the replay counts those minutes separately). A workload
whose need rounds to the whole card keeps the whole card.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuplane.audit.settings import AuditSettings
from gpuplane.audit.stats import Source, WorkloadStat, dataset


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A workload's recommended slice next to what it holds."""

    workload: str
    team: str
    kind: str
    node: str
    card: str
    card_mem_mib: int
    alloc_mem_mib: int
    alloc_cores_pct: int
    mem_mib: int
    cores_pct: int
    basis_mib: float  # p99 (max for batch) x headroom, before rounding
    peak_mib: float  # the highest sample: the limit covers it
    profile: str | None = None  # the MIG profile, when sizing to MIG profiles

    @property
    def whole(self) -> bool:
        return self.mem_mib >= self.card_mem_mib

    @property
    def gpu_milli(self) -> int:
        return 1000 if self.whole else self.cores_pct * 10

    @property
    def share(self) -> float:
        """Share of the card the new slice takes (max of memory and compute shares)."""
        return 1.0 if self.whole else max(self.mem_mib / self.card_mem_mib, self.cores_pct / 100)

    @property
    def alloc_share(self) -> float:
        return min(1.0, max(self.alloc_mem_mib / self.card_mem_mib, self.alloc_cores_pct / 100))


def grid_mem_mib(need_mib: float, card_mem_mib: int, settings: AuditSettings) -> int:
    """`need_mib` rounded up to the slice grid (at least one step, at most the card)."""
    step = card_mem_mib // settings.slice_fraction
    return min(card_mem_mib, max(step, math.ceil(need_mib / step - 1e-9) * step))


def _cores(share: float, settings: AuditSettings) -> int:
    step = settings.compute_step_pct
    return min(100, max(step, math.ceil(share * 100 / step - 1e-9) * step))


def recommend(stat: WorkloadStat, settings: AuditSettings) -> Recommendation:
    """The slice for one workload."""
    card = stat.card_mem_mib
    basis = (stat.mem_max if stat.kind == "batch" else stat.mem_p99) * settings.headroom
    need = max(basis, stat.mem_max)
    cores = _cores(stat.compute_p95, settings)
    profile = None
    if settings.mig_profiles:
        fits = [p for p in settings.mig() if p[2] >= need and p[1] / 7 >= stat.compute_p95]
        if fits:
            profile, sevenths, mem = fits[0]
            cores = math.ceil(sevenths * 100 / 7)
        else:
            mem = card
    else:
        mem = grid_mem_mib(need, card, settings)
    if mem >= card:
        mem, cores, profile = card, 100, None
    return Recommendation(
        workload=stat.workload,
        team=stat.team,
        kind=stat.kind,
        node=stat.node,
        card=stat.card,
        card_mem_mib=card,
        alloc_mem_mib=stat.alloc_mem_mib,
        alloc_cores_pct=stat.alloc_cores_pct,
        mem_mib=mem,
        cores_pct=cores,
        basis_mib=basis,
        peak_mib=stat.mem_max,
        profile=profile,
    )


@dataclass(frozen=True, slots=True)
class Replay:
    """Every sample since each workload's allocation against its recommended limits."""

    samples: int
    over_memory: dict[str, int]  # workload -> samples above the new memory limit (must be empty)
    throttled: dict[str, int]  # workload -> samples above the new compute share

    @property
    def exceeded(self) -> int:
        """Recommendations some sample exceeds in memory."""
        return len(self.over_memory)


def replay(
    source: Source, recs: Iterable[Recommendation], since: dict[str, int] | None = None
) -> Replay:
    """Count, per workload, the samples (from `since[workload]`, unix seconds) above its new
    memory limit and above its new compute share. One streaming pass, vectorised per batch."""
    by_name = {r.workload: r for r in recs}
    since = since or {}
    over: dict[str, int] = {}
    throttled: dict[str, int] = {}
    total = 0
    cols = ["workload", "time", "mem_used_mib", "compute_share"]
    for batch in dataset(source).to_batches(columns=cols):
        col = batch.column("workload")
        if not isinstance(col, pa.DictionaryArray):
            col = pc.dictionary_encode(col)
        names = col.dictionary.to_pylist()
        mem = np.full(len(names), np.inf)
        share = np.full(len(names), np.inf)
        start = np.zeros(len(names), np.int64)
        for i, n in enumerate(names):
            r = by_name.get(n)
            if r is not None:
                mem[i] = r.mem_mib
                share[i] = 1.0 if r.whole else r.cores_pct / 100
                start[i] = since.get(n, 0)
        idx = col.indices.to_numpy(zero_copy_only=False)
        t = batch.column("time").cast(pa.int64()).to_numpy()
        live = t >= start[idx]
        total += int(live.sum())
        used = batch.column("mem_used_mib").to_numpy(zero_copy_only=False)
        compute = batch.column("compute_share").to_numpy(zero_copy_only=False)
        for counts, above in (
            (over, live & (used > mem[idx])),
            (throttled, live & (compute > share[idx] + 1e-6)),
        ):
            if above.any():
                for i, n in zip(*np.unique(idx[above], return_counts=True), strict=True):
                    counts[names[i]] = counts.get(names[i], 0) + int(n)
    return Replay(total, over, throttled)
